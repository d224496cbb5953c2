"""The certified screen of the 'factor' E step (emgmm/covariance/_factor_screen.py)
and its gathered-pair kernels (emgmm/covariance/_factor_pairs.py).

Oracles: the Woodbury log-density of the packed parameters in long double (bounds
and pair values), the dense kernels of every pair (statistics, E step) and the
unscreened fit from the same start (the screen switched off by ``screen.ENABLED``).
"""

import warnings

import numpy as np
import pytest
from helpers import assert_screens_equal
from numpy.testing import assert_allclose
from scipy.special import logsumexp

from emgmm import GaussianMixture
from emgmm._engine import estep
from emgmm.covariance import _factor_screen as factor_screen
from emgmm.covariance import _screen as screen
from emgmm.covariance._factor_log_density import projections
from emgmm.covariance._factor_pairs import pair_statistics, pair_values
from emgmm.covariance._factor_parameters import factorize
from emgmm.covariance._factor_screen import FactorScreen
from emgmm.covariance._factor_statistics import block_statistics
from emgmm.covariance._log_density import relevance_margin

MARGIN = relevance_margin(1e-20)
needs_extended = pytest.mark.skipif(
    np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps,
    reason="np.longdouble is no wider than float64 on this platform")


def factor_model(rng, K, d, q, spread, snr, offset=0.0):
    """Weights, means, loadings (K, d, q) and noise variances (K, d): factors of
    variance up to ``snr`` times the noise."""
    means = rng.normal(scale=spread, size=(K, d)) + offset
    W = rng.normal(size=(K, d, q)) * np.sqrt(np.geomspace(snr, 1.0, q) / d)
    psi = rng.uniform(0.05, 0.2, size=(K, d))
    W *= np.sqrt(psi.mean(axis=1))[:, None, None] * np.sqrt(d)
    return rng.dirichlet(np.full(K, 5.0)), means, W, psi


def sample(rng, weights, means, W, psi, n):
    labels = rng.choice(len(weights), size=n, p=weights)
    z = rng.normal(size=(n, W.shape[2]))
    X = means[labels] + np.einsum("nq,ndq->nd", z, W[labels])
    return X + rng.normal(size=X.shape) * np.sqrt(psi[labels])


CASES = {
    "separated": dict(K=8, d=80, q=4, spread=1.0, snr=30.0),
    "overlapping": dict(K=8, d=80, q=4, spread=0.05, snr=30.0),
    "ill_conditioned": dict(K=8, d=80, q=6, spread=1.0, snr=1e8),
    "far_from_origin": dict(K=8, d=80, q=4, spread=1.0, snr=30.0, offset=1e4),
}


def case_model(case, seed=0, n=500):
    rng = np.random.default_rng(seed)
    weights, means, W, psi = factor_model(rng, **CASES[case])
    X = sample(rng, weights, means, W, psi, n)
    # rows far along the largest factor of a component, and between two means
    X[:5] = means[0] + 50.0 * W[0][:, 0]
    X[5:10] = 0.5 * (means[1] + means[2])
    return X, weights, means, factorize(W, psi)


def oracle_weighted(X, weights, means, precision):
    """``log w_k + log N(x | mu_k, Sigma_k)`` in long double, from the factorisation
    as the kernels define it (``Sigma^-1 = Psi^-1 - G G^T``)."""
    ld = np.longdouble
    d = X.shape[1]
    cols = []
    for k in range(len(weights)):
        u = X.astype(ld) - means[k].astype(ld)
        p = np.einsum("ij,jl->il", u, precision.projection[k].astype(ld))
        m = ((u * u * precision.inv_noise[k].astype(ld)).sum(axis=1)
             - (p * p).sum(axis=1))
        log_det = -(np.log(precision.inv_noise[k].astype(ld)).sum() + 2 * np.log(
            np.diagonal(precision.cholesky_inv[k]).astype(ld)).sum())
        cols.append(np.log(ld(weights[k])) - (log_det + d * np.log(2 * ld(np.pi))) / 2
                    - np.maximum(m, 0) / 2)
    return np.stack(cols, axis=1)


@needs_extended
@pytest.mark.parametrize("case", sorted(CASES))
def test_screen_bounds_are_upper_bounds_of_every_pair(case):
    X, weights, means, precision = case_model(case)
    scr = FactorScreen.build(weights, means, precision)
    ub = scr.upper_bounds(X, np.empty((len(X), len(weights)), order="F"))
    exact = oracle_weighted(X, weights, means, precision)
    # offset_err: the bound holds up to the offsets' rounding, which the rejection
    # limit adds
    assert np.all(ub + scr.offset_err >= exact)
    # and it is not vacuous: far pairs are bounded well below the row's best
    if case == "separated":
        assert np.mean(ub < exact.max(axis=1, keepdims=True) - MARGIN) > 0.5


@needs_extended
@pytest.mark.parametrize("case", sorted(CASES))
def test_pair_values_are_within_their_rounding_bounds(case):
    X, weights, means, precision = case_model(case, seed=1)
    scr = FactorScreen.build(weights, means, precision)
    rng = np.random.default_rng(2)
    comps = np.sort(rng.integers(len(weights), size=300))
    rows = rng.integers(len(X), size=300)
    values, errors = pair_values(X, means, precision, scr.offset, comps, rows,
                                 scr.u_norm)
    exact = oracle_weighted(X, weights, means, precision)[rows, comps]
    # the offsets' own rounding is offset_err's, not the pairs'
    assert np.all(np.abs(values - exact) <= errors + scr.offset_err[comps])
    # and tight: relative to the scale of the pair's two terms (~ snr d)
    rel = 1e-4 if case == "ill_conditioned" else 1e-9
    assert np.all(errors <= rel * (np.abs(exact) + 1.0))


@needs_extended
@pytest.mark.parametrize("case", sorted(CASES))
def test_screened_estep_computes_every_pair_that_may_reach_the_threshold(case):
    """Every pair within the margin of its row's best (in long double) is computed
    and equal to it, as the dense E step computes it; the others are computed or
    -inf, and -inf only below the margin."""
    X, weights, means, precision = case_model(case)
    scr = FactorScreen.build(weights, means, precision)
    got = scr.weighted_refined(X, MARGIN, max_density=1.0)
    exact = oracle_weighted(X, weights, means, precision).astype(np.float64)
    dense = estep.weighted_log_prob(X, weights, means, _packed(precision), "factor")
    best = exact.max(axis=1, keepdims=True)
    computed = np.isfinite(got)
    assert computed[exact >= best - MARGIN].all()
    limit = np.broadcast_to(best - MARGIN, got.shape)
    assert np.all(exact[~computed] < limit[~computed])
    # the rows far along a factor of snr 1e8 cancel ~1e11 in m: both kernels lose
    # ~1e-2 nats there (the centred one less)
    tol = dict(rtol=0, atol=0.05) if case == "ill_conditioned" else dict(rtol=1e-11)
    assert_allclose(got[computed], exact[computed], **tol)
    assert_allclose(got[computed], dense[computed], **tol)
    assert_allclose(logsumexp(got, axis=1), logsumexp(dense, axis=1), **tol)
    if case == "separated":
        assert computed.mean() < 0.5, computed.sum(axis=1).mean()


def _packed(precision):
    from emgmm.covariance._factor import pack_precision
    return pack_precision(precision)


def test_screen_refuses_coinciding_components_and_the_dense_path_runs():
    rng = np.random.default_rng(3)
    weights, means, W, psi = factor_model(rng, K=5, d=70, q=3, spread=1.0, snr=5.0)
    means[:] = means[0]
    precision = factorize(W, psi)
    X = sample(rng, weights, means, W, psi, 700)
    scr = FactorScreen.build(weights, means, precision)
    assert scr.weighted_refined(X, MARGIN) is None


@pytest.mark.parametrize("threshold", [0.0, 1e-3])
def test_pair_statistics_equal_the_dense_statistics(threshold):
    """Summed over the gathered rows of each component, the statistics equal the
    dense sums over every pair, also re-centred on other centres."""
    X, weights, means, precision = case_model("separated", seed=4, n=400)
    rng = np.random.default_rng(5)
    resp = rng.dirichlet(np.full(len(weights), 0.2), size=len(X))
    resp[resp < 1e-2] = 0.0  # sparse, as after a screened E step
    centers = means + rng.normal(scale=0.1, size=means.shape)
    dense = block_statistics(X, resp, centers, precision,
                             projections(X, means, precision, weights),
                             threshold)
    got = pair_statistics(X, resp, centers, means, precision, threshold)
    for name in ("nk", "sum_x", "sum_xx", "sum_xz", "sum_z", "sum_zz"):
        a, b = getattr(got, name), getattr(dense, name)
        assert_allclose(a, b, rtol=1e-10, atol=1e-10 * np.abs(b).max(), err_msg=name)
    assert got.n_samples == dense.n_samples == len(X)


def _pair_problem(case, seed, n, pair_seed, n_pairs):
    """A case model with sparse responsibilities (as after a screened E step), other
    centres, ``n_pairs`` random pairs sorted by component and the model's screen:
    ``(X, weights, means, precision, resp, centers, comps, rows, screen)``."""
    X, weights, means, precision = case_model(case, seed=seed, n=n)
    rng = np.random.default_rng(pair_seed)
    resp = rng.dirichlet(np.full(len(weights), 0.2), size=len(X))
    resp[resp < 1e-2] = 0.0
    centers = means + rng.normal(scale=0.1, size=means.shape)
    comps = np.sort(rng.integers(len(weights), size=n_pairs))
    rows = rng.integers(len(X), size=n_pairs)
    return (X, weights, means, precision, resp, centers, comps, rows,
            FactorScreen.build(weights, means, precision))


@pytest.mark.parametrize("chunk_rows", [1, 7])
def test_gathered_rows_by_chunks_equal_the_whole_gather(monkeypatch, chunk_rows):
    """Each component's gathered rows taken a few at a time (GATHER_CHUNK_BYTES,
    also a last, shorter chunk): the pairs' values and bounds and the statistics
    equal those of one gather of all its rows to 1e-12, and the dense sums."""
    from emgmm.covariance import _factor_pairs as factor_pairs

    X, weights, means, precision, resp, centers, comps, rows, scr = _pair_problem(
        "separated", 4, 400, 6, 300)
    whole = (pair_values(X, means, precision, scr.offset, comps, rows, scr.u_norm),
             pair_statistics(X, resp, centers, means, precision))
    monkeypatch.setattr(factor_pairs, "GATHER_CHUNK_BYTES", 8 * X.shape[1] * chunk_rows)
    values, errors = pair_values(X, means, precision, scr.offset, comps, rows,
                                 scr.u_norm)
    assert_allclose(values, whole[0][0], rtol=1e-12)
    assert_allclose(errors, whole[0][1], rtol=1e-12)
    got = pair_statistics(X, resp, centers, means, precision)
    dense = block_statistics(X, resp, centers, precision,
                             projections(X, means, precision, weights))
    for name in ("nk", "sum_x", "sum_xx", "sum_xz", "sum_z", "sum_zz"):
        a, b = getattr(got, name), getattr(whole[1], name)
        assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max(), err_msg=name)
        c = getattr(dense, name)
        assert_allclose(a, c, rtol=1e-10, atol=1e-10 * np.abs(c).max(), err_msg=name)


def test_first_pairs_set_the_same_limit_for_the_full_screen():
    """Computing three pairs per row first changes which pairs are computed, never
    their values or the rows' totals ('full' screen)."""
    from test_screen import case_model as full_case

    X, weights, means, U = full_case("overlapping")
    one = screen.ProjectionScreen.build(weights, means, U, 4)
    three = screen.ProjectionScreen.build(weights, means, U, 4)
    three.first_pairs = 3
    a = one.weighted_refined(X, MARGIN, max_density=1.0)
    b = three.weighted_refined(X, MARGIN, max_density=1.0)
    both = np.isfinite(a) & np.isfinite(b)
    assert_allclose(a[both], b[both], rtol=1e-13)
    assert_allclose(logsumexp(a, axis=1), logsumexp(b, axis=1), rtol=1e-13)


# ------------------------------------------------------------------- whole fits


def blobs(d=72, K=8, q=3, n=1600, seed=0):
    rng = np.random.default_rng(seed)
    weights, means, W, psi = factor_model(rng, K, d, q, spread=0.6, snr=20.0)
    return sample(rng, weights, means, W, psi, n)


def fit(X, **kw):
    params = dict(n_components=8, covariance_type="factor", n_factors=3, max_iter=6,
                  tol=0.0, random_state=0)
    params.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning with tol=0
        return GaussianMixture(**params).fit(X)


def unscreened(monkeypatch, X, **kw):
    with monkeypatch.context() as m:
        m.setattr(screen, "ENABLED", False)
        return fit(X, **kw)


def assert_same_fit(a, b, lb_rtol=1e-12, rtol=1e-10):
    assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=lb_rtol)
    assert_allclose(a.weights_, b.weights_, rtol=rtol, atol=1e-14)
    assert_allclose(a.means_, b.means_, rtol=rtol, atol=rtol * np.abs(b.means_).max())
    for name in ("noise_variance_",):
        assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol)
    cov_a = a.loadings_ @ np.swapaxes(a.loadings_, 1, 2)
    cov_b = b.loadings_ @ np.swapaxes(b.loadings_, 1, 2)
    assert_allclose(cov_a, cov_b, rtol=rtol, atol=rtol * np.abs(cov_b).max())


def counted(monkeypatch):
    """Count the pairs the screen computes (the screen's exact pairs, spied on)."""
    calls = {"pairs": 0, "rows": 0}
    real = FactorScreen.upper_bounds

    def spy(self, X, out, roots=None):
        calls["rows"] += len(X)
        return real(self, X, out, roots)

    monkeypatch.setattr(FactorScreen, "upper_bounds", spy)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, dict(n_jobs=2), dict(block_size=97),
                                dict(sample_weight=True)])
def test_screened_fit_equals_the_unscreened_fit(monkeypatch, kw):
    X = blobs()
    if kw.pop("sample_weight", False):
        kw["sample_weight"] = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    sw = kw.pop("sample_weight", None)
    calls = counted(monkeypatch)
    got = _fit_weighted(X, sw, **kw)
    assert calls["rows"] > 0 or "n_jobs" in kw  # the screen ran (here)
    assert_same_fit(got, _unscreened_weighted(monkeypatch, X, sw, **kw))


def _fit_weighted(X, sample_weight, **kw):
    params = dict(n_components=8, covariance_type="factor", n_factors=3, max_iter=6,
                  tol=0.0, random_state=0)
    params.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GaussianMixture(**params).fit(X, sample_weight=sample_weight)


def _unscreened_weighted(monkeypatch, X, sample_weight, **kw):
    with monkeypatch.context() as m:
        m.setattr(screen, "ENABLED", False)
        return _fit_weighted(X, sample_weight, **kw)


@pytest.mark.slow
def test_screened_float32_fit_equals_the_unscreened_float32_fit(monkeypatch):
    X = blobs(seed=2).astype(np.float32)
    assert_same_fit(fit(X), unscreened(monkeypatch, X), lb_rtol=1e-6, rtol=1e-4)


@pytest.mark.slow
def test_screened_warm_start_continues_as_the_unscreened_one(monkeypatch):
    X = blobs(seed=3)
    a = fit(X, max_iter=3)
    a.set_params(warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.fit(X)
    with monkeypatch.context() as m:
        m.setattr(screen, "ENABLED", False)
        b = fit(X, max_iter=3)
        b.set_params(warm_start=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b.fit(X)
    assert_same_fit(a, b)


def test_screen_is_built_only_from_min_features(monkeypatch):
    X = blobs(d=40)
    calls = counted(monkeypatch)
    fit(X, max_iter=2)
    assert calls["rows"] == 0
    monkeypatch.setattr(factor_screen, "MIN_FEATURES", 8)
    fit(X, max_iter=2)
    assert calls["rows"] > 0


@pytest.mark.slow
def test_screened_fit_resumed_from_a_checkpoint_equals_the_uninterrupted_one(
        tmp_path, monkeypatch):
    X = blobs(seed=4)
    straight = fit(X)
    path = tmp_path / "ck.npz"

    def stop(record):
        if record["n_iter"] == 3:
            raise KeyboardInterrupt

    calls = counted(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        fit(X, checkpoint=path, callback=stop)
    assert calls["rows"] > 0 and path.exists()
    resumed = fit(X, checkpoint=path)
    np.testing.assert_array_equal(resumed.lower_bounds_, straight.lower_bounds_)
    np.testing.assert_array_equal(resumed.loadings_, straight.loadings_)


@pytest.mark.parametrize("threads", [2, 3])
def test_pair_kernels_in_threads_equal_the_serial_ones(monkeypatch, threads):
    """Components in ranges of threads (``over_ranges``, cut by their gathered rows):
    the pairs' values, bounds and statistics are bitwise those of one thread."""
    from emgmm._runtime import blas

    X, weights, means, precision, resp, centers, comps, rows, scr = _pair_problem(
        "overlapping", 7, 600, 8, 900)

    def run():
        return (pair_values(X, means, precision, scr.offset, comps, rows, scr.u_norm),
                pair_statistics(X, resp, centers, means, precision, 1e-3))

    serial = run()
    monkeypatch.setattr(blas, "THREADED_WORK", 0)
    blas.hold_process_limit(1, loop_threads=threads)
    try:
        assert blas.threads_for_loop(1) == threads
        (values, errors), stats = run()
    finally:
        blas.release_process_limit()
    np.testing.assert_array_equal(values, serial[0][0])
    np.testing.assert_array_equal(errors, serial[0][1])
    for name in ("nk", "sum_x", "sum_xx", "sum_xz", "sum_z", "sum_zz"):
        np.testing.assert_array_equal(getattr(stats, name),
                                      getattr(serial[1], name), err_msg=name)


def test_screen_built_in_threads_equals_the_serial_one(monkeypatch):
    """The screen's per-component terms formed in threads equal those formed in one."""
    from emgmm._runtime import blas

    _, weights, means, precision = case_model("ill_conditioned", seed=9, n=50)
    serial = FactorScreen.build(weights, means, precision)
    monkeypatch.setattr(blas, "THREADED_WORK", 0)
    blas.hold_process_limit(1, loop_threads=3)
    try:
        threaded = FactorScreen.build(weights, means, precision)
    finally:
        blas.release_process_limit()
    assert_screens_equal(threaded, serial)
