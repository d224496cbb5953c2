"""One component's kernels of the pairs schedule: the GIL-free BLAS and LAPACK calls
(emgmm/_runtime/lapack.py) and the statistics, M step and factor in place
(emgmm/covariance/_full_component.py).

Oracles: numpy and scipy on whole arrays, scikit-learn's precision Cholesky, the
M step of summed statistics (emgmm.covariance._m_step on SufficientStatistics).
"""

import ctypes
import threading

import numpy as np
import pytest
from helpers import random_spd
from numpy.testing import assert_allclose
from scipy import linalg

from emgmm._runtime import lapack
from emgmm.covariance import _cholesky as cholesky
from emgmm.covariance import _full_component as full_component
from emgmm.covariance._m_step import m_step
from emgmm.covariance._statistics import SufficientStatistics

DTYPES = (np.float64, np.float32)
TOL = {np.float64: 1e-12, np.float32: 2e-5}


@pytest.fixture(params=["capsules", "python wrappers"])
def routines(request, monkeypatch):
    """Every routine through scipy's Cython capsules, or through its Python
    wrappers (what serves where the capsules cannot be read)."""
    if request.param == "python wrappers":
        monkeypatch.setattr(lapack, "_routine", lambda name, dtype: None)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
def test_potrf_and_trtri_give_the_inverse_cholesky_factor(routines, dtype):
    rng = np.random.default_rng(0)
    S = random_spd(rng, 50, cond=100.0)
    a = np.array(S, dtype=dtype, order="F")
    a[np.triu_indices(50, 1)] = 7.0  # never read
    assert lapack.potrf_lower(a) == 0
    L = np.tril(a)
    assert_allclose(L, np.linalg.cholesky(S), rtol=TOL[dtype] * 100, atol=TOL[dtype])
    assert lapack.trtri_lower(a) == 0
    assert_allclose(np.tril(a) @ L, np.eye(50), atol=TOL[dtype] * 100)


def test_potrf_reports_the_first_minor_that_is_not_positive_definite(routines):
    S = np.diag([1.0, 2.0, -1.0, 3.0])
    assert lapack.potrf_lower(np.asfortranarray(S)) == 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [False, True])
def test_trmm_multiplies_by_the_lower_triangle(routines, dtype, transpose):
    rng = np.random.default_rng(1)
    a = np.asfortranarray(rng.normal(size=(30, 30)).astype(dtype))
    b = np.asfortranarray(rng.normal(size=(30, 7)).astype(dtype))
    low = np.tril(a).astype(np.float64)
    expected = (low.T if transpose else low) @ b.astype(np.float64)
    got = lapack.trmm_left_lower(a, b.copy(order="F"), transpose=transpose)
    assert_allclose(got, expected, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_syrk_adds_into_the_lower_triangle_only(routines, dtype):
    rng = np.random.default_rng(2)
    g = np.asfortranarray(rng.normal(size=(20, 9)).astype(dtype))
    c = np.asfortranarray(np.full((20, 20), 3.0, dtype=dtype))
    lapack.syrk_lower_add(c, g, alpha=-0.5)
    expected = 3.0 - 0.5 * g.astype(np.float64) @ g.T.astype(np.float64)
    lower = np.tril_indices(20)
    assert_allclose(c[lower], expected[lower], rtol=TOL[dtype] * 10)
    assert np.all(c[np.triu_indices(20, 1)] == 3.0)


def test_arrays_that_are_not_column_major_are_refused():
    with pytest.raises(ValueError, match="Fortran-ordered"):
        lapack.potrf_lower(np.eye(3)[:, ::-1])
    with pytest.raises(ValueError, match="writable"):
        b = np.asfortranarray(np.ones((3, 2)))
        b.flags.writeable = False
        lapack.trmm_left_lower(np.asfortranarray(np.eye(3)), b)


def test_operands_of_other_shapes_or_dtypes_are_refused():
    f = np.asfortranarray
    with pytest.raises(ValueError, match="do not match"):
        lapack.trmm_left_lower(f(np.eye(3)), f(np.ones((4, 2))))
    with pytest.raises(ValueError, match="do not match"):
        lapack.trmm_left_lower(f(np.eye(3)), f(np.ones((3, 2), np.float32)))
    with pytest.raises(ValueError, match="do not match"):
        lapack.syrk_lower_add(f(np.zeros((3, 3), np.float32)), f(np.ones((3, 2))))


def test_sizes_beyond_lapacks_integers_are_refused():
    with pytest.raises(OverflowError, match="32-bit"):
        lapack._int(2**31)


def test_the_capsule_routines_run_in_threads_at_once():
    """Calls through the capsules release the GIL: two threads factorising
    overlap (each call is long enough to be seen running while the other runs)."""
    rng = np.random.default_rng(3)
    S = random_spd(rng, 400, cond=10.0)
    inside, overlapped = [0], [False]
    lock = threading.Lock()
    original = lapack._routine("potrf", np.float64)

    def traced(*args):
        with lock:
            inside[0] += 1
            overlapped[0] |= inside[0] > 1
        try:
            original(*args)
        finally:
            with lock:
                inside[0] -= 1

    def work():
        for _ in range(30):
            a = np.array(S, order="F")
            traced(b"L", lapack._int(400), a.ctypes.data, lapack._int(400),
                   ctypes.byref(ctypes.c_int(0)))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlapped[0]


def test_mirror_upper_copies_the_strict_upper_triangle(monkeypatch):
    monkeypatch.setattr(cholesky, "MIRROR_TILE", 7)
    rng = np.random.default_rng(4)
    for d in (1, 6, 7, 8, 30):
        a = rng.normal(size=(d, d))
        expected = np.triu(a) + np.triu(a, 1).T
        cholesky.mirror_upper(a)
        assert np.array_equal(a, expected)


@pytest.mark.parametrize("threads", [False, True])
def test_the_initial_model_kernels_invert_and_factor(monkeypatch, threads):
    """The upper factors of precisions and the covariances of factors (potri of the
    flipped factor), in threads or not, against numpy."""
    if threads:
        monkeypatch.setattr(cholesky, "THREADED_FLOPS", 0)
    rng = np.random.default_rng(6)
    P = np.stack([random_spd(rng, 20, cond=1e4) for _ in range(5)])
    U = cholesky.upper_factors_of_precisions(P, "full")
    assert np.all(np.tril(U, -1) == 0.0)
    assert_allclose(U @ np.swapaxes(U, 1, 2), P, rtol=1e-12, atol=1e-12)
    S = cholesky.covariances_of_factors(U)
    assert_allclose(S, np.linalg.inv(P), rtol=1e-9, atol=1e-12)
    assert np.array_equal(S, np.swapaxes(S, 1, 2))
    P[3, 0, 0] = -1.0
    with pytest.raises(ValueError, match="component 3 is not positive definite"):
        cholesky.upper_factors_of_precisions(P, "full")


def test_statistics_m_step_and_factor_of_one_component_match_the_oracles():
    """add_moments over chunks, then m_step_in_place, equal the M step of summed
    statistics; factor_in_place equals scikit-learn's precision Cholesky."""
    rng = np.random.default_rng(5)
    d, n = 12, 300
    X = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + 5.0
    r = rng.uniform(0.0, 1.0, n)
    centre = X.mean(axis=0) + 0.3
    y = X - centre
    S, s, nk = np.zeros((d, d)), np.zeros(d), 0.0
    for a, b in ((0, 100), (100, 250), (250, 300)):
        nk += full_component.add_moments(y[a:b].copy(), r[a:b], S, s)
    stats = SufficientStatistics(np.array([r.sum()]), (r @ y)[None],
                                 ((y * r[:, None]).T @ y)[None], 0.0, n)
    weights, means, covariances = m_step(stats, centre[None], 1e-4, "full")
    assert nk == pytest.approx(r.sum(), rel=1e-14)
    delta = full_component.m_step_in_place(S, s, nk, 1e-4)
    assert_allclose(centre + delta, means[0], rtol=1e-13)
    assert_allclose(S, covariances[0], rtol=1e-12, atol=1e-12)
    assert np.array_equal(S, S.T)
    U = np.empty((d, d))
    assert full_component.factor_in_place(S, U, limit=1e300)
    expected = linalg.solve_triangular(np.linalg.cholesky(S), np.eye(d),
                                       lower=True).T
    assert_allclose(U, expected, rtol=1e-11, atol=1e-13)
    assert np.all(np.tril(U, -1) == 0.0)


def test_a_covariance_that_is_not_positive_definite_gives_a_nan_factor():
    U = np.empty((3, 3))
    assert not full_component.factor_in_place(np.diag([1.0, -1.0, 1.0]), U, 1e300)
    assert np.isnan(U).all()
    assert not full_component.factor_in_place(np.eye(3) * 1e-40, U, limit=1e10)


def test_a_process_held_to_one_thread_runs_the_component_loop_in_it(monkeypatch):
    """n_jobs=1 holds the process to one BLAS thread: the loops over components
    then run in the calling thread, not in threads of their own."""
    import threading

    from emgmm._runtime.blas import hold_process_limit, release_process_limit

    monkeypatch.setattr(cholesky, "THREADED_FLOPS", 0)
    seen = set()
    hold_process_limit(1)
    try:
        cholesky.each_component(lambda k: seen.add(threading.get_ident()), 8, 4)
    finally:
        release_process_limit()
    assert seen == {threading.get_ident()}
