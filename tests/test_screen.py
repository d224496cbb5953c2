"""The certified screen of the 'full' E step (emgmm/covariance/_screen.py).

Oracles: the definition of the weighted log-density in long double (bounds), the
unscreened E step (every pair computed) and the unscreened fit from the same start
(the screen switched off by making it refuse every block).
"""

import warnings

import numpy as np
import pytest
from helpers import assert_screens_equal, random_spd, sample_mixture
from numpy.testing import assert_allclose
from scipy.special import logsumexp

from emgmm import GaussianMixture
from emgmm._cli.demo import extract_patches, gray_images, remove_dc
from emgmm._engine import estep as _estep
from emgmm.covariance import _log_density, _screen
from emgmm.covariance._screen import ProjectionScreen, exact_pairs

MARGIN = _log_density.relevance_margin(1e-20)
LD_EPS = float(np.finfo(np.longdouble).eps)
needs_extended = pytest.mark.skipif(
    np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps,
    reason="np.longdouble is no wider than float64 on this platform")


def upper_factor(covariance):
    """U upper triangular with U U^T = covariance^-1."""
    return np.linalg.inv(np.linalg.cholesky(covariance)).T.copy()


def oracle_weighted(X, weights, means, U):
    """``log w_k + log N(x | mu_k, U_k U_k^T)`` in long double (not rounded)."""
    ld = np.longdouble
    d = X.shape[1]
    cols = []
    for w, m, u in zip(weights, means, U, strict=False):
        z = np.einsum("ij,jl->il", X.astype(ld) - m.astype(ld), u.astype(ld))
        logdet = np.sum(np.log(np.diag(u).astype(ld)))
        cols.append(np.log(ld(w)) + logdet - ld(0.5) * d * np.log(2 * ld(np.pi))
                    - np.einsum("ij,ij->i", z, z) / 2)
    return np.stack(cols, axis=1)


def random_model(rng, K, d, spread, cond, offset=0.0):
    means = rng.normal(scale=spread, size=(K, d)) + offset
    U = np.stack([upper_factor(random_spd(rng, d, cond=cond)) for _ in range(K)])
    return rng.dirichlet(np.full(K, 5.0)), means, U


CASES = {
    "separated": dict(K=8, d=40, spread=3.0, cond=10.0),
    "overlapping": dict(K=8, d=40, spread=1.0, cond=10.0),
    "ill_conditioned": dict(K=8, d=40, spread=3.0, cond=1e10),
    "far_from_origin": dict(K=8, d=40, spread=3.0, cond=100.0, offset=1e6),
}


def case_model(case, seed=0, n=400):
    rng = np.random.default_rng(seed)
    weights, means, U = random_model(rng, **CASES[case])
    return sample_mixture(rng, weights, means, U, n), weights, means, U


@needs_extended
@pytest.mark.parametrize("seed", range(12))
def test_exact_pairs_are_within_their_rounding_bounds(seed):
    """pair_values' bound holds against the long-double definition, over random
    models (condition numbers up to 1e12, data near and far from the origin,
    float32 data): what the screen's rejection limit subtracts from a row's top
    pair."""
    rng = np.random.default_rng(seed)
    K, d = int(rng.integers(2, 6)), int(rng.integers(3, 60))
    cond = 10.0 ** rng.uniform(0, 12)
    offset = [0.0, 1e3, 1e6][seed % 3]
    weights, means, U = random_model(rng, K, d, 10.0 ** rng.uniform(-2, 1), cond,
                                     offset)
    X = sample_mixture(rng, weights, means, U, 200)
    if seed % 4 == 3:
        X = X.astype(np.float32)
    exact = oracle_weighted(X.astype(np.float64), weights, means, U)
    screen = ProjectionScreen.build(weights, means, U, 2)
    comps = np.repeat(np.arange(K), len(X))
    rows = np.tile(np.arange(len(X)), K)
    values, errors = exact_pairs(X, means, U, screen.offset, comps, rows,
                                 screen.u_norm)
    off = np.abs(values - exact[rows, comps].astype(np.float64))
    # (the offsets' own rounding is bounded apart, in offset_err)
    assert np.all(off <= errors + screen.offset_err[comps]), (off - errors).max()
    assert np.all(errors < 1e-6 * (1.0 + np.abs(values)) + 1e-9 * cond)


@needs_extended
@pytest.mark.parametrize("seed", range(12))
def test_bounds_are_upper_bounds_of_every_pair(seed):
    """ub_ik >= the long-double definition for every pair, over random models
    (condition numbers up to 1e12, data near and far from the origin, float32 data),
    for p = 1, 5 and p = d (then Q is square and the bound is the distance itself up
    to its rounding margin: the tightest test of that margin)."""
    rng = np.random.default_rng(seed)
    K, d = int(rng.integers(2, 9)), int(rng.integers(3, 30))
    cond = 10.0 ** rng.uniform(0, 12)
    offset = [0.0, 1e3, 1e6][seed % 3]
    weights, means, U = random_model(rng, K, d, 10.0 ** rng.uniform(-2, 1), cond,
                                     offset)
    X = sample_mixture(rng, weights, means, U, 300)
    if seed % 4 == 3:
        X = X.astype(np.float32)
    exact = oracle_weighted(X.astype(np.float64), weights, means, U)
    for p in (1, 5, d):
        screen = ProjectionScreen.build(weights, means, U, p)
        ub = screen.upper_bounds(X, np.empty((len(X), K)))
        slack = ub - exact
        assert np.all(slack >= -4 * LD_EPS * np.abs(exact)), (p, slack.min())
        if p == d:
            # tight: within the rounding margin of the distance itself
            assert np.all(slack <= 1e-6 * (1.0 + np.abs(exact))), (p, slack.max())


def test_screen_built_in_threads_equals_the_serial_one(monkeypatch):
    """The per-component terms of a 'full' screen formed in threads (one BLAS thread
    each) equal those formed in one thread."""
    from emgmm._runtime import blas

    rng = np.random.default_rng(3)
    weights, means, U = random_model(rng, 9, 20, 1.0, 1e6, 0.0)
    with blas.single_blas_thread():
        serial = ProjectionScreen.build(weights, means, U, 4)
    monkeypatch.setattr(blas, "THREADED_WORK", 0)
    blas.hold_process_limit(1, loop_threads=3)
    try:
        threaded = ProjectionScreen.build(weights, means, U, 4)
    finally:
        blas.release_process_limit()
    assert_screens_equal(threaded, serial)


@pytest.mark.parametrize("case", sorted(CASES))
def test_screened_estep_computes_every_pair_that_may_reach_the_threshold(case):
    """Every pair within the margin of its row's best (by the unscreened E step) is
    computed and equal to it; every other pair is either computed or -inf, and -inf
    only below the margin; log-likelihoods and responsibilities agree."""
    X, weights, means, U = case_model(case)
    screen = ProjectionScreen.build(weights, means, U, 4)
    got = screen.weighted_refined(X, MARGIN, max_density=1.0)
    dense = _estep.weighted_log_prob(X, weights, means, U, "full")
    best = dense.max(axis=1, keepdims=True)
    near = dense >= best - MARGIN
    computed = np.isfinite(got)
    assert computed[near].all()
    # the two compute each pair with different roundings (centred on mu_k here, on
    # the mixture mean there), amplified by the condition number
    rtol = 1e-10 if case == "ill_conditioned" else 1e-12
    assert_allclose(got[computed], dense[computed], rtol=rtol)
    assert np.all(dense[~computed] < (best - MARGIN + 1e-9 * np.abs(best))
                  .repeat(got.shape[1], 1)[~computed])
    assert_allclose(logsumexp(got, axis=1), logsumexp(dense, axis=1), rtol=rtol)
    resp = np.exp(got - logsumexp(got, axis=1)[:, None])
    expected = np.exp(dense - logsumexp(dense, axis=1)[:, None])
    kept = expected > 1e-20
    assert_allclose(resp[kept], expected[kept], rtol=100 * rtol)
    if case != "overlapping":
        # the screen prunes most pairs of separated components
        assert computed.mean() < 0.5, computed.sum(axis=1).mean()


def test_screen_refuses_blocks_of_broad_components_and_the_dense_path_is_exact():
    """Coinciding components: every pair survives the probe, the screen refuses and
    weighted_log_prob takes the dense path."""
    rng = np.random.default_rng(5)
    d, K = 100, 6
    U = np.stack([np.eye(d)] * K)
    means = rng.normal(size=(K, d)) * 1e-3
    weights = np.full(K, 1.0 / K)
    X = rng.normal(size=(800, d))
    screen = ProjectionScreen.build(weights, means, U)
    assert screen.weighted_refined(X, MARGIN) is None
    got = _estep.weighted_log_prob(X, weights, means, U, "full", MARGIN, (screen,))
    assert_allclose(got, _estep.weighted_log_prob(X, weights, means, U, "full"),
                    rtol=0, atol=0)


def test_rows_whose_distances_overflow_are_never_pruned_unseen():
    """Bounds that overflow to NaN let their pairs survive (computed as the dense
    path computes them); a pair whose lower bound is +inf is -inf there too."""
    X, weights, means, U = case_model("separated", n=50)
    X[7] = 1e200
    screen = ProjectionScreen.build(weights, means, U, 4)
    with np.errstate(over="ignore", invalid="ignore"):
        got = screen.weighted_refined(X, MARGIN)
        dense = _estep.weighted_log_prob(X, weights, means, U, "full")
    assert_allclose(np.delete(got, 7, 0)[np.isfinite(np.delete(got, 7, 0))],
                    np.delete(dense, 7, 0)[np.isfinite(np.delete(got, 7, 0))],
                    rtol=1e-12)
    assert not np.isfinite(dense[7]).any() and not np.isfinite(got[7]).any()


# ------------------------------------------------------------------- whole fits


class Counting:
    """Counts the pairs the screen set to -inf and the pairs it computed."""

    def __init__(self, monkeypatch):
        self.pruned = self.computed = 0
        original = ProjectionScreen.weighted_refined

        def counted(screen, X, margin, out=None):
            got = original(screen, X, margin, out)
            if got is not None:
                finite = np.count_nonzero(np.isfinite(got))
                self.computed += finite
                self.pruned += got.size - finite
            return got

        monkeypatch.setattr(ProjectionScreen, "weighted_refined", counted)


def patches(side, n, seed=0):
    """``n`` DC-removed ``side`` x ``side`` patches of the sample images."""
    rng = np.random.default_rng(seed)
    images = list(gray_images().values())
    parts = [extract_patches(img[::2, ::2], side) for img in images]
    X = np.concatenate(parts)
    return remove_dc(X[np.sort(rng.choice(len(X), n, replace=False))]) * 255.0


def blobs(d, K, spread, n=1200, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    weights, means, U = random_model(rng, K, d, spread, 30.0, offset)
    return sample_mixture(rng, weights, means, U, n)


DATA = {
    "separated_blobs": lambda: blobs(100, 8, 3.0),
    "overlapping_blobs": lambda: blobs(100, 8, 0.3),
    "far_apart": lambda: blobs(100, 6, 1e3, offset=1e4),
    "patches14": lambda: patches(14, 1500),
    "patches30": lambda: patches(30, 700),
}


def fit(X, K, **kw):
    """A fit of the screened E step of the row (and component) schedules; the pairs
    schedule's are in test_pairs_schedule.py."""
    params = dict(n_components=K, covariance_type="full", max_iter=8, tol=0.0,
                  random_state=0, reg_covar=1e-3, init_params="random_from_data",
                  schedule="rows")
    params.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning with tol=0
        return GaussianMixture(**params).fit(X)


def assert_same_fit(a, b, lb_rtol=1e-12, rtol=1e-10):
    assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=lb_rtol)
    assert_allclose(a.weights_, b.weights_, rtol=rtol, atol=1e-14)
    scale = np.abs(b.means_).max()
    assert_allclose(a.means_, b.means_, rtol=rtol, atol=rtol * scale)
    cscale = np.abs(b.covariances_).max()
    assert_allclose(a.covariances_, b.covariances_, rtol=rtol, atol=rtol * cscale)


@pytest.fixture(scope="module")
def references():
    """Unscreened fits, computed once per (data, K, extra parameters)."""
    return {}


def unscreened(references, monkeypatch, name, X, K, **kw):
    key = (name, K, tuple((k, np.asarray(v).tobytes()) for k, v in sorted(kw.items())))
    if key not in references:
        with monkeypatch.context() as m:
            m.setattr(_screen, "ENABLED", False)
            references[key] = fit(X, K, n_jobs=1, **kw)
    return references[key]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DATA))
def test_screened_fit_equals_unscreened_fit(name, monkeypatch, references):
    """Same start, same resp_threshold: lower bounds to 1e-12, parameters to 1e-10,
    and the screen pruned pairs (it was used)."""
    X = DATA[name]()
    K = 8 if name != "patches30" else 5
    ref = unscreened(references, monkeypatch, name, X, K)
    counting = Counting(monkeypatch)
    got = fit(X, K, n_jobs=1)
    assert counting.pruned > counting.computed, (counting.pruned, counting.computed)
    assert_same_fit(got, ref)


@pytest.mark.slow
@pytest.mark.parametrize("kw", [dict(n_jobs=2), dict(block_size=97),
                                dict(block_size=350, n_jobs=2),
                                dict(schedule="components", n_jobs=2),
                                dict(schedule="components", block_size=200)],
                         ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_screened_fit_equals_unscreened_across_workers_blocks_and_schedules(
        kw, monkeypatch, references):
    """Against the unscreened fit of the same schedule and block size in one
    process. With workers the lower bounds agree to 2e-12 only: on these patches
    (covariances of condition ~1e8) the unscreened fits of the two schedules
    differ by 1.09e-12 (rounding of the sums, amplified through the factors), and
    the screened ones in workers and in one process by 6.4e-13 (their blocks
    refused or screened, computed centred on the mixture mean or on mu_k)."""
    X = DATA["patches14"]()
    same = {k: v for k, v in kw.items() if k != "n_jobs"}
    ref = unscreened(references, monkeypatch, "patches14", X, 8, **same)
    assert_same_fit(fit(X, 8, **kw), ref, lb_rtol=2e-12 if "n_jobs" in kw else 1e-12)


def test_screened_fit_with_parameters_jumping_between_iterations(monkeypatch,
                                                                 references):
    """means_init far off the data: the first M step moves every mean across the
    data, and the screen of each iteration is built afresh from its model."""
    X = DATA["separated_blobs"]()
    rng = np.random.default_rng(3)
    means_init = X[rng.choice(len(X), 8, replace=False)] + 40.0
    ref = unscreened(references, monkeypatch, "jump", X, 8, means_init=means_init)
    counting = Counting(monkeypatch)
    got = fit(X, 8, means_init=means_init, n_jobs=1)
    assert counting.pruned > 0
    assert_same_fit(got, ref)


@pytest.mark.slow
def test_float32_compute_screened_equals_unscreened(monkeypatch):
    """float32 compute: the screen's exact pairs are float64 products of the float32
    rows, as the refinement of the unscreened float32 path is."""
    X = DATA["patches14"]().astype(np.float32)
    with monkeypatch.context() as m:
        m.setattr(_screen, "ENABLED", False)
        ref = fit(X, 8, n_jobs=1, compute_dtype="float32")
    got = fit(X, 8, n_jobs=1, compute_dtype="float32")
    assert_same_fit(got, ref, lb_rtol=1e-10, rtol=1e-8)


def test_resp_threshold_zero_computes_every_pair_of_the_em_passes(monkeypatch):
    """With resp_threshold=0 the EM passes never call the screen: only the final
    scoring pass does (its margin is SCORE_MARGIN whatever the threshold), one call
    per block, against one per block and pass with the default threshold."""
    X = DATA["separated_blobs"]()
    calls = []
    original = ProjectionScreen.weighted_refined
    monkeypatch.setattr(ProjectionScreen, "weighted_refined",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    blocks = -(-len(X) // 300)
    fit(X, 4, resp_threshold=0.0, max_iter=2, block_size=300, n_jobs=1)
    assert len(calls) == blocks
    calls.clear()
    fit(X, 4, max_iter=2, block_size=300, n_jobs=1)
    assert len(calls) == 3 * blocks
