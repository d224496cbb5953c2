"""The relevance-refined E step of 'full' (``estimate_log_prob_resp(margin=)``).

Oracles: the definition ``log w_k + sum_j log U_k[j, j] - d/2 log(2 pi) - 1/2
||(x - mu_k) U_k||^2`` evaluated in extended precision (``np.longdouble``, no BLAS),
checked against ``scipy.stats.multivariate_normal.logpdf`` where the precisions are
well conditioned; ``scipy.special.logsumexp``. The contract under test:

* ``log_prob_norm`` equals the oracle's log-sum-exp;
* every pair whose oracle log-responsibility is above ``-margin`` equals the oracle
  (these are the pairs whose responsibility can reach ``resp_threshold``);
* every other pair stays below ``-margin`` + its error bound, i.e. its responsibility
  is below ``exp(-margin)`` up to that bound;
* the packed estimate's error never exceeds the bound the kernel uses to decide.
"""

import dataclasses
import tracemalloc

import numpy as np
import pytest
from helpers import (
    IGNORE_NOT_CONVERGED,
    SKLEARN_COVARIANCE_TYPES,
    not_converging,
    random_spd,
    sample_mixture,
)
from numpy.testing import assert_allclose, assert_array_equal
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from emgmm._engine import estep as _estep
from emgmm.covariance import _log_density, _packed_estimate
from emgmm.covariance._screen import ProjectionScreen

# the oracle needs a wider float than float64 (x86-64 long double: 64-bit mantissa)
needs_extended = pytest.mark.skipif(
    np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps,
    reason="np.longdouble is no wider than float64 on this platform")


def packed_estimate(weights, means, U, dtype=np.float64):
    """The :class:`PackedEstimate` of one dtype, or ``None`` (``build_all``)."""
    built = _packed_estimate.PackedEstimate.build_all(weights, means, U, (dtype,))
    return None if built is None else built[0]


def upper_factor(precision):
    L = np.linalg.cholesky(np.linalg.inv(precision))
    return np.linalg.inv(L).T


def oracle_weighted(X, weights, means, U):
    """Extended-precision evaluation of the definition, rounded to float64."""
    ld = np.longdouble
    Xl = X.astype(ld)
    d = X.shape[1]
    cols = []
    for w, m, u in zip(weights, means, U, strict=False):
        z = np.einsum("ij,jl->il", Xl - m.astype(ld), u.astype(ld))
        q = np.einsum("ij,ij->i", z, z)
        logdet = np.sum(np.log(np.diag(u).astype(ld)))
        cols.append(np.log(ld(w)) + logdet - ld(0.5) * d * np.log(2 * ld(np.pi))
                    - q / 2)
    return np.stack(cols, axis=1).astype(np.float64)


@needs_extended
def test_oracle_agrees_with_scipy_when_well_conditioned():
    rng = np.random.default_rng(1)
    weights, means, U = separated_model(rng, 5, 6, 3.0, 10.0)
    X = sample_mixture(rng, weights, means, U, 200)
    scipy_weighted = np.stack(
        [multivariate_normal(m, np.linalg.inv(u @ u.T)).logpdf(X)
         for m, u in zip(means, U, strict=True)],
        axis=1) + np.log(weights)
    assert_allclose(oracle_weighted(X, weights, means, U), scipy_weighted, rtol=1e-12)


def separated_model(rng, K, d, spread, cond, offset=0.0):
    means = rng.normal(scale=spread, size=(K, d)) + offset
    U = np.stack([upper_factor(random_spd(rng, d, cond=cond)) for _ in range(K)])
    weights = rng.dirichlet(np.full(K, 5.0))
    return weights, means, U


CASES = {
    # well separated, well conditioned: few pairs are refined
    "separated": dict(K=30, d=12, spread=6.0, cond=10.0, offset=0.0),
    # ill-conditioned precisions: the packed estimate is far off, the relevant pairs
    # must all be recomputed
    "ill_conditioned": dict(K=30, d=12, spread=6.0, cond=1e7, offset=0.0),
    # far from the origin: the expansion around the mixture mean cancels
    "far_from_origin": dict(K=30, d=12, spread=6.0, cond=100.0, offset=1e5),
}


@needs_extended
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("margin", [_log_density.relevance_margin(1e-20), 8.0])
def test_refined_estep_matches_oracle_where_it_matters(case, margin):
    rng = np.random.default_rng(7)
    c = CASES[case]
    weights, means, U = separated_model(rng, c["K"], c["d"], c["spread"], c["cond"],
                                        c["offset"])
    X = sample_mixture(rng, weights, means, U, 3000)
    log_norm, log_resp = _estep.estimate_log_prob_resp(X, weights, means, U, "full",
                                                        margin)
    weighted = oracle_weighted(X, weights, means, U)
    exp_norm = logsumexp(weighted, axis=1)
    exp_resp = weighted - exp_norm[:, None]
    assert_allclose(log_norm, exp_norm, rtol=1e-11, atol=1e-9)
    near = exp_resp > -margin + 1.0
    assert near.any(axis=1).all()
    assert_allclose(log_resp[near], exp_resp[near], rtol=1e-9, atol=1e-8)
    # the rest: responsibilities below exp(-margin) in both
    far = exp_resp < -margin - 1.0
    assert np.all(log_resp[far] < -margin + 1.0)
    # responsibilities of every pair agree in probability space
    assert_allclose(np.exp(log_resp), np.exp(exp_resp), rtol=0, atol=1e-12)
    # labels are the oracle's
    np.testing.assert_array_equal(log_resp.argmax(axis=1), exp_resp.argmax(axis=1))


def test_refined_path_is_taken_for_separated_and_left_for_broad_components():
    rng = np.random.default_rng(3)
    weights, means, U = separated_model(rng, 30, 12, 6.0, 10.0)
    X = sample_mixture(rng, weights, means, U, 2000)
    margin = _log_density.relevance_margin(1e-20)
    estimate = packed_estimate(weights, means, U)
    assert estimate.weighted_refined(X, margin) is not None
    # 30 coinciding components with a thin direction (variance 1e-6): every pair is
    # relevant and the bound of the expansion (lambda_k ~ 1e6) exceeds the tolerance, so
    # the probe sends the block to the plain path
    Q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    cov = (Q * np.r_[1e-6, np.ones(11)]) @ Q.T
    thin = np.stack([upper_factor(np.linalg.inv(cov))] * 30)
    centre = rng.normal(size=(30, 12)) * 1e-9
    Xt = rng.multivariate_normal(np.zeros(12), cov, size=2000)
    estimate = packed_estimate(weights, centre, thin)
    assert estimate.weighted_refined(Xt, margin) is None
    # and the result is then the plain (all-exact) one
    got = _estep.estimate_log_prob_resp(Xt, weights, centre, thin, "full", margin)
    plain = _estep.estimate_log_prob_resp(Xt, weights, centre, thin, "full")
    assert_allclose(got[0], plain[0], rtol=0, atol=0)
    assert_allclose(got[1], plain[1], rtol=0, atol=0)


@needs_extended
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_estimate_error_within_its_bound(case, dtype):
    """|estimate - exact| <= the bound ``to_refine`` relies on, for every pair; in
    float32 the oracle is the definition on the float32 data."""
    rng = np.random.default_rng(11)
    c = CASES[case]
    weights, means, U = separated_model(rng, c["K"], c["d"], c["spread"], c["cond"],
                                        c["offset"])
    X = sample_mixture(rng, weights, means, U, 1500).astype(dtype)
    est = packed_estimate(weights, means, U, dtype)
    assert est.W.dtype == dtype
    y_norm = np.empty(len(X))
    approx = est.weighted(X, np.empty((len(X), len(means))), y_norm)
    X = X.astype(np.float64)
    exact = oracle_weighted(X, weights, means, U)
    y = np.linalg.norm(X - est.g, axis=1)
    assert_allclose(y_norm, y, rtol=100 * np.finfo(dtype).eps)
    bound = est.error_coef * (y[:, None] + est.m_norm) ** 2
    # the oracle itself carries float64 rounding: allow its own size on top
    slack = 1e-12 * np.abs(exact)
    assert np.all(np.abs(approx - exact) <= bound + slack)


@pytest.mark.parametrize("margin", [_log_density.relevance_margin(1e-9), 3.0, 0.0])
@pytest.mark.parametrize("largest_coef, uniform", [(1e-2, False), (3e-4, True)])
@pytest.mark.parametrize("chunk_bytes", [None, 8 * 1500 * 3])
def test_pairs_to_refine_follow_their_definition(margin, largest_coef, uniform,
                                                 chunk_bytes, monkeypatch):
    """``to_refine`` against its definition on the whole ``(n, K)`` array (numpy):
    the pairs with a bound ``e = c_k (||y|| + ||m_k||)^2`` above ``_REFINE_TOL`` and
    ``w + e >= max(w - e) - margin`` over the row, sorted by component, then row.
    Estimates spread over tens of nats, bounds from 1e-14 nats up to tens of nats
    (every bound evaluated) or below one nat (the candidates of the uniform bound),
    a zero weight (estimates of ``-inf``); column-major estimates and a slice of
    their first rows (the probe); candidates taken all at once or 3 (15 for the
    probe) components at a time."""
    if chunk_bytes is not None:
        monkeypatch.setattr(_packed_estimate, "BOUND_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(13)
    weights, means, U = separated_model(rng, 40, 3, 6.0, 10.0)
    est = packed_estimate(weights, means, U)
    n, K = 1500, 40
    est = dataclasses.replace(
        est, error_coef=10.0 ** rng.uniform(-16, np.log10(largest_coef), K),
        m_norm=rng.uniform(0.0, 10.0, K))
    every_bound = []
    near_best = _packed_estimate.PackedEstimate._near_best
    monkeypatch.setattr(_packed_estimate.PackedEstimate, "_near_best",
                        lambda self, *a: every_bound.append(1) or near_best(self, *a))
    weighted = np.asfortranarray(rng.normal(-50.0, 15.0, (n, K)))
    weighted[:, 3] = -np.inf
    y_norm = rng.gamma(2.0, 3.0, n)
    for rows in (slice(None), slice(0, 300)):
        w, y = weighted[rows], y_norm[rows]
        e = est.error_coef * (y[:, None] + est.m_norm) ** 2
        with np.errstate(invalid="ignore"):
            floor = (w - e).max(axis=1, keepdims=True) - margin
        mask = (w + e >= floor) & (e > _log_density._REFINE_TOL)
        # not every pair, several in some rows (with a margin); bounds on both sides
        # of the tolerance among the pairs within the margin
        assert mask.any() and not mask.all()
        assert margin == 0.0 or (mask.sum(axis=1) >= 2).any()
        assert ((w + e >= floor) & (e <= _log_density._REFINE_TOL)).any()
        expected = np.nonzero(mask.T)
        got = est.to_refine(w, y, margin)
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])
    assert len(every_bound) == (0 if uniform else 2)


@pytest.mark.parametrize("gap", [0.5, 1.9, 2.1])
def test_pairs_to_refine_reach_twice_the_uniform_bound_below_the_best(gap):
    """The uniform-bound candidates reach ``margin + 2 E_i`` below the row's best:
    two components whose bounds both equal the row's uniform bound ``E`` (0.16 nats),
    the second ``margin + gap E`` below the first. By the definition it is kept while
    ``w_2 + e >= w_1 - e - margin``, i.e. for gap <= 2 (a candidate limit of
    ``margin + E`` would drop it at 1.9)."""
    base = packed_estimate(np.full(2, 0.5), np.zeros((2, 2)),
                                        np.tile(np.eye(2), (2, 1, 1)))
    c, y, margin = 1e-2, 2.0, 3.0
    est = dataclasses.replace(base, error_coef=np.full(2, c), m_norm=np.full(2, y))
    bound = 4.0 * c * y**2  # e = c (y + ||m||)^2, also E = 2 c ||m||^2 + 2 c y^2
    w = np.asfortranarray([[0.0, -margin - gap * bound]])
    comps, rows = est.to_refine(w, np.array([y]), margin)
    assert_array_equal(rows, 0)
    assert_array_equal(comps, [0, 1] if gap <= 2.0 else [0])


@pytest.mark.parametrize("inexact", [0, 5])
def test_pairs_to_refine_of_broad_components_take_memory_of_the_pairs_kept(inexact):
    """Broad components (every pair within the margin of its row's best, all of them
    candidates): beyond the ``(n, K)`` mask, to_refine allocates a few chunks of
    candidate indices and bounds and a few copies of the pairs kept, not arrays over
    every pair (8 bytes each, ~7 of them: the first pass of the benchmark's A took
    96 MB per block that way). Bounds below ``_REFINE_TOL`` but on ``inexact`` of
    the 200 components, whose pairs are kept."""
    rng = np.random.default_rng(3)
    weights, means, U = separated_model(rng, 200, 3, 6.0, 10.0)
    est = packed_estimate(weights, means, U)
    n, K = 10_000, 200
    coef = np.full(K, 1e-14)
    coef[rng.choice(K, inexact, replace=False)] = 1e-3
    est = dataclasses.replace(est, error_coef=coef, m_norm=rng.uniform(0.0, 1.0, K))
    weighted = np.asfortranarray(rng.normal(-50.0, 1.0, (n, K)))
    y_norm = rng.uniform(0.0, 1.0, n)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        comps, rows = est.to_refine(weighted, y_norm,
                                    _log_density.relevance_margin(1e-9))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert comps.size == inexact * n
    kept = comps.nbytes + rows.nbytes
    assert peak - before < n * K + 4 * kept + 12 * _packed_estimate.BOUND_CHUNK_BYTES


@pytest.mark.parametrize("d", [1, 2, 12, 64])
def test_abs_spectral_bound_is_an_upper_bound_close_to_the_radius(d):
    """Against numpy's eigvalsh of |Lambda| (symmetric): never below, within 1% above,
    and exact for diagonal and block-diagonal (reducible) matrices; NaN on overflow."""
    rng = np.random.default_rng(d)
    A = np.abs(np.stack([np.linalg.inv(random_spd(rng, d, cond=c))
                         for c in (1.0, 10.0, 1e4, 1e8)]))
    diag = np.diag(rng.uniform(0.5, 3.0, d))
    block = np.zeros((d, d))
    block[:d // 2, :d // 2] = 1.0
    block[d // 2:, d // 2:] = 2.0
    A = np.concatenate([A, diag[None], block[None]])
    radius = np.linalg.eigvalsh(A).max(axis=1)
    bound = _packed_estimate._abs_spectral_bound(A.copy())
    assert np.all(bound >= radius)
    assert np.all(bound <= radius * 1.01)
    assert_allclose(bound[-2:], radius[-2:], rtol=1e-13)
    A[0, 0, 0] = np.inf
    assert np.isnan(_packed_estimate._abs_spectral_bound(A)[0])


def test_packed_estimate_error_coefficient_uses_the_spectral_bound():
    """The coefficient is that of the documented bound: gamma_{T+3} lambda_k plus the
    float64 part, (T + 4) u32 for float32; ``rho_k`` caps ``lambda_k``."""
    rng = np.random.default_rng(5)
    weights, means, U = separated_model(rng, 6, 10, 3.0, 100.0)
    d = 10
    Lam = np.abs(U @ np.swapaxes(U, 1, 2))
    radius = np.linalg.eigvalsh(Lam).max(axis=1)
    absU = np.abs(U)
    rho = (absU @ np.swapaxes(absU, 1, 2)).sum(axis=2).max(axis=1)
    T = d * (d + 1) // 2 + d + 1
    for dtype, m in ((np.float64, T + 3), (np.float32, T + 4)):
        u = np.finfo(dtype).eps / 2
        g64 = (2 * d + 2) * 2.0**-53
        est = packed_estimate(weights, means, U, dtype)
        expected = 0.5 * (m * u * radius + g64 * (radius + rho))
        assert_allclose(est.error_coef, expected, rtol=0.02)
        assert np.all(radius < rho)


@needs_extended
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_refined_estep_matches_oracle_where_it_matters(case):
    """float32 compute: the estimate runs in float32, the pairs that matter are
    recomputed in float64, so they equal the definition on the float32 data."""
    rng = np.random.default_rng(7)
    c = CASES[case]
    weights, means, U = separated_model(rng, c["K"], c["d"], c["spread"], c["cond"],
                                        c["offset"])
    X32 = sample_mixture(rng, weights, means, U, 3000).astype(np.float32)
    margin = _log_density.relevance_margin(1e-20)
    est = packed_estimate(weights, means, U, np.float32)
    refined = est.weighted_refined(X32, margin)
    assert refined is not None  # the probe keeps the packed path
    weighted = oracle_weighted(X32.astype(np.float64), weights, means, U)
    exp_norm = logsumexp(weighted, axis=1)
    exp_resp = weighted - exp_norm[:, None]
    log_norm, log_resp = _estep.estimate_log_prob_resp(X32, weights, means, U, "full",
                                                        margin, (est,))
    near = exp_resp > -margin + 1.0
    assert_allclose(refined[near], weighted[near], rtol=1e-12, atol=1e-9)
    assert_allclose(log_norm, exp_norm, rtol=1e-11, atol=1e-9)
    assert_allclose(log_resp[near], exp_resp[near], rtol=1e-9, atol=1e-8)
    assert np.all(log_resp[exp_resp < -margin - 1.0] < -margin + 1.0)


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # 5 iterations, tol=0
def test_refined_statistics_equal_exact_ones():
    """A fit with the default resp_threshold equals one with every pair exact."""
    from emgmm import GaussianMixture

    rng = np.random.default_rng(5)
    weights, means, U = separated_model(rng, 20, 8, 5.0, 30.0)
    X = sample_mixture(rng, weights, means, U, 4000)
    kw = dict(n_components=20, covariance_type="full", max_iter=5, tol=0.0,
              random_state=0, init_params="k-means++")
    fast = GaussianMixture(**kw).fit(X)
    exact = GaussianMixture(**kw, resp_threshold=0.0).fit(X)
    assert_allclose(fast.lower_bounds_, exact.lower_bounds_, rtol=1e-12)
    assert_allclose(fast.means_, exact.means_, rtol=1e-10, atol=1e-10)
    assert_allclose(fast.covariances_, exact.covariances_, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("K, d", [(20, 8), (6, 100)])
def test_float32_compute_fit_equals_float64_fit_of_the_rounded_data(K, d, schedule):
    """compute_dtype='float32' changes only the data's rounding: its fit equals the
    float64 fit of the float32-rounded data, and its held-out score is within 1e-5
    relative of the float64 fit's. d = 8 takes the packed estimate, d = 100 the
    triangular one; the component schedule refines around each slice's best."""
    from emgmm import GaussianMixture

    rng = np.random.default_rng(5)
    weights, means, U = separated_model(rng, K, d, 5.0, 30.0)
    X = sample_mixture(rng, weights, means, U, 4000)
    X_test = sample_mixture(rng, weights, means, U, 2000)
    kw = dict(n_components=K, covariance_type="full", max_iter=5, tol=0.0,
              weights_init=weights, means_init=means,
              precisions_init=np.matmul(U, np.swapaxes(U, 1, 2)))
    with not_converging():  # tol=0
        f32 = GaussianMixture(**kw, compute_dtype="float32",
                              schedule=schedule).fit(X)
        rounded = GaussianMixture(**kw).fit(X.astype(np.float32).astype(np.float64))
        f64 = GaussianMixture(**kw).fit(X)
    assert_allclose(f32.lower_bounds_, rounded.lower_bounds_, rtol=1e-11)
    assert_allclose(f32.means_, rounded.means_, rtol=0, atol=1e-9)
    assert_allclose(f32.covariances_, rounded.covariances_, rtol=0, atol=1e-9)
    assert_allclose(f32.score(X_test), f64.score(X_test), rtol=1e-5)


@needs_extended
def test_float32_two_components_take_the_refined_path():
    """In float32 every row's best pair is recomputed (its bound exceeds the
    tolerance); with K=2 that alone is half the pairs, which must not send every
    block to the plain float32 products."""
    rng = np.random.default_rng(2)
    weights, means, U = separated_model(rng, 2, 3, 20.0, 10.0)
    X32 = sample_mixture(rng, weights, means, U, 2000).astype(np.float32)
    margin = _log_density.relevance_margin(1e-20)
    refined = packed_estimate(weights, means, U, np.float32) \
        .weighted_refined(X32, margin)
    assert refined is not None
    weighted = oracle_weighted(X32.astype(np.float64), weights, means, U)
    near = weighted - logsumexp(weighted, axis=1)[:, None] > -margin + 1.0
    assert_allclose(refined[near], weighted[near], rtol=1e-12, atol=1e-9)


@needs_extended
def test_float32_data_take_the_float64_estimate_where_float32_bounds_are_too_coarse(
        monkeypatch):
    """Overlapping components (every pair within the margin): every float32 estimate
    would need the float64 recomputation, so the probe refuses it; the float64
    estimate of the same float32 data is taken (its bounds are below the tolerance),
    not the plain float32 products, and equals the definition on the float32 data
    where it matters."""
    rng = np.random.default_rng(7)
    weights, means, U = separated_model(rng, 30, 12, 0.5, 10.0)
    X32 = sample_mixture(rng, weights, means, U, 3000).astype(np.float32)
    margin = _log_density.relevance_margin(1e-20)
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", np.float32)
    assert [np.dtype(e.dtype) for e in prepared] == [np.float32, np.float64]
    assert prepared[0].weighted_refined(X32, margin) is None

    def plain(*args, **kwargs):
        raise AssertionError("the plain path was taken")

    monkeypatch.setattr(_estep, "log_prob", plain)
    weighted = _estep.weighted_log_prob(X32, weights, means, U, "full", margin,
                                         prepared)
    exact = oracle_weighted(X32.astype(np.float64), weights, means, U)
    near = exact - logsumexp(exact, axis=1)[:, None] > -margin + 1.0
    assert near.sum() > 10 * len(X32)
    assert_allclose(weighted[near], exact[near], rtol=1e-12, atol=1e-9)


def test_float32_blocks_that_every_estimate_refuses_take_the_plain_path_in_float64():
    """Four unit clusters and a broad component (variance 2e16) at 2e6: the shift g
    (the mixture mean) lies ~6e5 from the tight components, and both estimates would
    need too many recomputations. The plain path then runs in float64 on the float32
    data and equals the definition (its float32 products were off by up to ~0.1 nats
    per row, 3e-5 relative in the mean)."""
    rng = np.random.default_rng(0)
    n, d = 4000, 6
    X32 = (rng.standard_normal((n, d))
           + np.repeat(np.eye(d)[:4] * 6, n // 4, axis=0)).astype(np.float32)
    means = np.vstack([np.eye(d)[:4] * 6, 2e6 * np.eye(d)[1]])
    cov = np.repeat(np.eye(d)[None], 5, 0)
    cov[4, 1, 1] = 2e16
    U = np.linalg.inv(np.linalg.cholesky(cov)).transpose(0, 2, 1).copy()
    weights = np.r_[np.full(4, 0.7 / 4), 0.3]
    margin = _log_density.relevance_margin(1e-20)
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", np.float32)
    assert [np.dtype(e.dtype) for e in prepared] == [np.float32, np.float64]
    assert all(e.weighted_refined(X32, margin) is None for e in prepared)
    weighted = _estep.weighted_log_prob(X32, weights, means, U, "full", margin,
                                         prepared)
    exact = oracle_weighted(X32.astype(np.float64), weights, means, U)
    near = exact - logsumexp(exact, axis=1)[:, None] > -margin + 1.0
    assert_allclose(weighted[near], exact[near], rtol=1e-12, atol=1e-9)
    assert_allclose(logsumexp(weighted, axis=1), logsumexp(exact, axis=1), rtol=1e-12)


# d = 100: no packed products; float32 data get the TriangularEstimate (two column
# blocks of the triangle, widths 64 and 36)
WIDE_CASES = {
    "separated": dict(K=8, d=100, spread=6.0, cond=10.0, offset=0.0),
    "ill_conditioned": dict(K=8, d=100, spread=6.0, cond=1e5, offset=0.0),
    "far_from_origin": dict(K=8, d=100, spread=6.0, cond=100.0, offset=1e4),
}


def broad_and_tight_model(d):
    """Three tight components (sd 1e-2) near 1e4 e_1 and a broad one (sd 1e3, half
    the weight) at the origin: the shift g (the mixture mean) lies ~5e3 from the
    tight ones, where the plain float32 products lost up to 0.04 nats per row."""
    means = np.zeros((4, d))
    means[1:, 0] = 1e4
    means[2, 1], means[3, 2] = 0.1, -0.1
    scales = np.array([1e3, 1e-2, 1e-2, 1e-2])
    U = np.stack([np.eye(d) / s for s in scales])
    return np.array([0.5, 0.2, 0.15, 0.15]), means, U


def wide_model(case, rng):
    if case == "broad_and_tight":
        return broad_and_tight_model(100)
    c = WIDE_CASES[case]
    return separated_model(rng, c["K"], c["d"], c["spread"], c["cond"], c["offset"])


@needs_extended
@pytest.mark.parametrize("case", sorted(WIDE_CASES) + ["broad_and_tight"])
def test_triangular_estimate_error_within_its_bound(case):
    """|estimate - exact| <= the bound ``to_refine`` relies on, for every pair of
    float32 data with d = 100 (the oracle: the definition on the float32 data)."""
    rng = np.random.default_rng(12)
    weights, means, U = wide_model(case, rng)
    X32 = sample_mixture(rng, weights, means, U, 400).astype(np.float32)
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", np.float32)
    assert len(prepared) == 2  # after the screen (tests/test_screen.py)
    est = prepared[1]
    assert isinstance(est, _packed_estimate.TriangularEstimate)
    y_norm = np.empty(len(X32))
    approx = est.weighted(X32, np.empty((len(X32), len(means)), order="F"), y_norm)
    X = X32.astype(np.float64)
    exact = oracle_weighted(X, weights, means, U)
    assert_allclose(y_norm, np.linalg.norm(X - est.g, axis=1), rtol=1e-14)
    bound = est._bounds(approx.T, _packed_estimate._EACH_COMPONENT, y_norm).T
    slack = 1e-12 * np.abs(exact)  # the oracle's own float64 rounding
    assert np.all(np.abs(approx - exact) <= bound + slack)
    # and not vacuous where the estimate is good: each row's best pair within 0.1
    # nats (0.04 at most here; its actual error 2e-5)
    if case == "separated":
        assert bound[np.arange(len(X)), exact.argmax(axis=1)].max() < 0.1


@needs_extended
@pytest.mark.parametrize("case", sorted(WIDE_CASES) + ["broad_and_tight"])
def test_float32_wide_refined_estep_matches_oracle_where_it_matters(case):
    """float32 data with d = 100: every pair that can reach the threshold equals
    the definition on the float32 data to float64 accuracy (the plain float32
    products were off by up to 0.04 nats per row on "broad_and_tight")."""
    rng = np.random.default_rng(13)
    weights, means, U = wide_model(case, rng)
    X32 = sample_mixture(rng, weights, means, U, 1500).astype(np.float32)
    margin = _log_density.relevance_margin(1e-20)
    log_norm, log_resp = _estep.estimate_log_prob_resp(X32, weights, means, U, "full",
                                                        margin)
    weighted = oracle_weighted(X32.astype(np.float64), weights, means, U)
    exp_norm = logsumexp(weighted, axis=1)
    exp_resp = weighted - exp_norm[:, None]
    assert_allclose(log_norm, exp_norm, rtol=1e-12, atol=1e-9)
    near = exp_resp > -margin + 1.0
    assert_allclose(log_resp[near], exp_resp[near], rtol=1e-9, atol=1e-8)
    assert_allclose(np.exp(log_resp), np.exp(exp_resp), rtol=0, atol=1e-12)


def test_wide_estimates_only_for_float32_data():
    """Float64 data with d = 100 have no estimate, only the screen (their plain path
    is exact); a model whose factors float32 cannot hold has none either."""
    rng = np.random.default_rng(14)
    weights, means, U = wide_model("separated", rng)
    for model, dtype in (((weights, means, U), np.float64),
                         ((weights, means, U * 1e40), np.float32)):
        prepared = _packed_estimate.prepare_log_prob(*model, "full", dtype)
        assert [type(e) for e in prepared] == [ProjectionScreen]
    assert _packed_estimate.prepare_log_prob(weights, means, U, "diag",
                                             np.float32) is None


def test_float32_wide_blocks_the_triangular_estimate_refuses_take_the_float64_path():
    """Coinciding broad components (every pair relevant): the probe refuses the
    triangular estimate and the block takes the plain path in float64, equal to
    float64 compute on the same values."""
    rng = np.random.default_rng(15)
    d, K = 100, 6
    U = np.stack([np.eye(d)] * K)
    means = rng.normal(size=(K, d)) * 1e-3
    weights = np.full(K, 1.0 / K)
    X32 = rng.normal(size=(800, d)).astype(np.float32)
    margin = _log_density.relevance_margin(1e-20)
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", np.float32)
    assert prepared[0].weighted_refined(X32, margin) is None
    got = _estep.weighted_log_prob(X32, weights, means, U, "full", margin, prepared)
    in64 = _estep.weighted_log_prob(X32.astype(np.float64), weights, means, U, "full")
    assert_array_equal(got, in64)


@pytest.mark.parametrize("scale", [1e-17, 1e22, 1e30])
def test_float32_estimate_is_refused_or_kept_by_the_range_of_float32(scale):
    """The float32 estimate is only used where float32 can hold its weights as
    normal numbers and its products cannot overflow; otherwise the block takes the
    plain float32 path. The fit of data at that scale equals the float64 fit of the
    rounded data, as at scale 1."""
    from emgmm import GaussianMixture

    rng = np.random.default_rng(3)
    weights, means, U = separated_model(rng, 3, 2, 20.0, 10.0)
    X = sample_mixture(rng, weights, means, U, 1500) * scale
    means, U = means * scale, U / scale
    kw = dict(n_components=3, max_iter=3, tol=0.0, weights_init=weights,
              means_init=means, precisions_init=np.matmul(U, np.swapaxes(U, 1, 2)),
              reg_covar=0.0)
    with not_converging():  # tol=0
        f32 = GaussianMixture(**kw, compute_dtype="float32").fit(X)
        rounded = GaussianMixture(**kw).fit(X.astype(np.float32).astype(np.float64))
    assert np.isfinite(f32.lower_bounds_).all()
    assert_allclose(f32.lower_bounds_, rounded.lower_bounds_, rtol=1e-6)
    # precisions of 1e34 (beyond float32's max * eps), 1e-44 or 1e-60 (subnormal or
    # zero in float32): no estimate for float32 data (the plain float32 path, as for
    # any d), not the float64 one either; float64 keeps its own
    assert _packed_estimate.prepare_log_prob(weights, means, U, "full",
                                             np.float32) is None
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", np.float64)
    assert [np.dtype(e.dtype) for e in prepared] == [np.float64]


@pytest.mark.parametrize("dtype", [np.float32, "float32", np.dtype(np.float32)])
# (the row's float32 products on the plain path overflow, as they may there)
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
def test_float32_estimate_leaves_only_the_rows_too_far_for_its_products(
        dtype, monkeypatch):
    """A row so far from the mixture mean that its float32 products could overflow
    (``y_limit``) takes the plain path alone, which stays finite, without trying
    the float64 estimate: float32 compute treats such rows alike for every number
    of features (the plain path's check refuses them in a fit). The block's other
    rows keep the refined estimate: they are what they are without that row (the
    whole block once took the plain float32 path, 9e-4 nats off)."""
    rng = np.random.default_rng(4)
    weights, means, U = separated_model(rng, 3, 2, 20.0, 10.0)
    X32 = sample_mixture(rng, weights, means, U, 600).astype(np.float32)
    margin = _log_density.relevance_margin(1e-20)
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", dtype)
    assert [np.dtype(e.dtype) for e in prepared] == [np.float32, np.float64]
    alone = np.delete(prepared[0].weighted_refined(X32, margin), 550, axis=0)
    X32[550] = 1e30  # within float32's range; its square is not
    with pytest.raises(_packed_estimate.BeyondRange):
        prepared[0].weighted_refined(X32, margin)
    assert prepared[1].weighted_refined(X32, margin) is not None
    tried = []
    refined = _packed_estimate.PackedEstimate.weighted_refined
    monkeypatch.setattr(_packed_estimate.PackedEstimate, "weighted_refined",
                        lambda self, *a: tried.append(self.dtype) or refined(self, *a))
    weighted = _estep.weighted_log_prob(X32, weights, means, U, "full", margin,
                                        prepared)
    assert set(tried) == {prepared[0].dtype}
    assert_allclose(np.delete(weighted, 550, axis=0), alone, rtol=1e-6)
    log_norm, _ = _estep.estimate_log_prob_resp(X32, weights, means, U, "full",
                                                 margin, prepared)
    assert_allclose(np.delete(log_norm, 550), logsumexp(alone, axis=1), rtol=1e-13)
    assert log_norm[550] < -1e50


def test_the_far_rows_split_allocates_what_the_memory_model_counts_for_it():
    """A block with a row too far for the float32 estimate is split in two (a copy of
    the block in two parts, and their results): the peak of that path exceeds the
    peak of the same block without the far row by at most what the memory model adds
    per row for it (one row in the compute dtype, 2 K float64 values and 16 bytes of
    norms and masks; CovarianceType.bytes_per_row), measured with tracemalloc."""
    rng = np.random.default_rng(5)
    n, d, K = 20_000, 8, 6
    weights, means, U = separated_model(rng, K, d, 20.0, 10.0)
    X32 = sample_mixture(rng, weights, means, U, n).astype(np.float32)
    margin = _log_density.relevance_margin(1e-20)
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", np.float32)
    split_bytes = n * (d * X32.itemsize + 2 * K * 8 + 16)
    peaks = []
    for far in (False, True):
        block = X32.copy()
        if far:
            block[n // 2] = 1e30
        tracemalloc.start()
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                _estep.weighted_log_prob(block, weights, means, U, "full", margin,
                                         prepared)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] - peaks[0] <= 1.05 * split_bytes, (peaks, split_bytes)


def test_a_row_at_the_range_limit_takes_the_plain_path_alone(monkeypatch):
    """A row whose float32 ``x - g`` lies beyond ``y_limit`` while its float64 one
    does not (built at the limit): the rows sent to the plain path are found with
    room for the estimate's own rounding, so it goes there alone, not with its
    whole block (which the float64 norm alone missed)."""
    limit = float(np.sqrt(np.float64(np.finfo(np.float32).max) / 4.0))
    x = np.float32(limit - 1e13)
    b = 1e6
    a = float(limit - np.float64(x) + b / 2)  # y_limit = x - 10 (rho = 1)
    means = np.array([[a + b, 0.0], [-a + b, 0.0], [b, 3.0]])
    weights = np.array([0.25, 0.25, 0.5])
    U = np.stack([np.eye(2)] * 3)
    prepared = _packed_estimate.prepare_log_prob(weights, means, U, "full", np.float32)
    rng = np.random.default_rng(0)
    X = (means[2] + rng.normal(size=(600, 2))).astype(np.float32)
    X[550] = [x, 0.0]
    assert prepared[0].row_norms(X[550:551])[0] <= prepared[0].y_limit
    with pytest.raises(_packed_estimate.BeyondRange):
        prepared[0].weighted_refined(X, 48.0)
    plain = []
    log_prob = _estep.log_prob
    monkeypatch.setattr(_estep, "log_prob",
                        lambda X, *a, **k: plain.append(len(X)) or log_prob(X, *a, **k))
    with np.errstate(over="ignore", invalid="ignore"):
        got = _estep.weighted_log_prob(X, weights, means, U, "full", 48.0, prepared)
    assert plain == [1]
    alone = _estep.weighted_log_prob(np.delete(X, 550, axis=0), weights, means, U,
                                     "full", 48.0, prepared)
    assert_array_equal(np.delete(got, 550, axis=0), alone)


def test_relevance_margin():
    assert _log_density.relevance_margin(0.0) is None
    assert _log_density.relevance_margin(1e-20) == pytest.approx(np.log(1e20) + 2.0)
    # below the float64 range every non-zero responsibility counts
    assert _log_density.relevance_margin(1e-320) == pytest.approx(745.2 + 2.0)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
@pytest.mark.parametrize("margin", [None, 48.0])
@pytest.mark.parametrize("chunk_bytes", [None, 512])
def test_estimate_resp_is_exp_of_log_resp(covariance_type, margin, chunk_bytes,
                                          monkeypatch):
    """The one-exponential responsibilities equal exp(log_resp) and sum to one; a
    zero weight gives zero responsibilities. Also over many row chunks (16 rows)."""
    if chunk_bytes is not None:
        monkeypatch.setattr(_log_density, "CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(_log_density, "PACKED_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(2)
    weights, means, U = separated_model(rng, 6, 4, 3.0, 10.0)
    weights[2] = 0.0
    X = sample_mixture(rng, np.r_[weights[:2], 0.0, weights[3:]] / weights.sum(),
                       means, U, 500)
    if covariance_type == "tied":
        U = U[0]
    elif covariance_type == "diag":
        U = np.abs(U[:, np.arange(4), np.arange(4)])
    elif covariance_type == "spherical":
        U = np.abs(U[:, 0, 0])
    log_norm, log_resp = _estep.estimate_log_prob_resp(X, weights, means, U,
                                                        covariance_type, margin)
    log_norm2, resp = _estep.estimate_resp(X, weights, means, U, covariance_type,
                                           margin)
    assert_allclose(log_norm2, log_norm, rtol=1e-14)
    assert_allclose(resp, np.exp(log_resp), rtol=1e-12, atol=1e-300)
    assert_allclose(resp.sum(axis=1), 1.0, rtol=1e-14)
    assert np.all(resp[:, 2] == 0.0)


@needs_extended
@pytest.mark.parametrize("margin", [None, 48.0, _estep.SCORE_MARGIN])
@pytest.mark.parametrize("condition", [1e8, 1e12])
@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_ill_conditioned_precisions_are_exact(covariance_type, condition, margin):
    """Covariances of condition number up to 1e12 whose axes lie at 45 degrees: in
    ``y^T Lambda y``, terms ~1e12 cancel to ~1, while ``(x - mu) U`` stays accurate.
    Every pair within the margin (or with a responsibility above float64's
    underflow) must match a long-double oracle to 1e-9 nats: the plain 'full' path
    once expanded such forms into packed products and was 2e-4 nats off at 1e12
    (2e-6 at 1e10), in the exact mode too."""
    rng = np.random.default_rng(5)
    R = np.array([[1.0, 1.0], [-1.0, 1.0]]) / np.sqrt(2.0)
    cov = R @ np.diag([np.sqrt(condition), 1.0 / np.sqrt(condition)]) @ R.T
    covs = np.stack([cov, 2.0 * cov])
    means = np.array([[0.0, 0.0], [3.0, -1.0]])
    weights = np.array([0.4, 0.6])
    X = rng.multivariate_normal([0.0, 0.0], cov, size=2000)
    if covariance_type == "tied":
        covs = np.stack([cov, cov])
    U = np.stack([np.linalg.inv(np.linalg.cholesky(c)).T for c in covs])
    factor = U[0] if covariance_type == "tied" else U
    got = _estep.weighted_log_prob(X, weights, means, factor, covariance_type,
                                   margin)
    expected = oracle_weighted(X, weights, means, U)
    # margin None: every pair with a responsibility above float64's underflow; the
    # far ones (~5e5 nats down, terms ~1e12 in (x - mu) U) to their own rounding
    relevant = expected >= expected.max(axis=1, keepdims=True) - (
        _log_density._LOG_RANGE if margin is None else margin)
    assert_allclose(got[relevant], expected[relevant], rtol=1e-15, atol=1e-9)
    if margin is None:
        assert_allclose(got[~relevant], expected[~relevant], rtol=1e-12)
    log_prob_norm, _ = _estep.estimate_resp(X, weights, means, factor,
                                            covariance_type, margin)
    assert_allclose(log_prob_norm, logsumexp(expected, axis=1), rtol=0, atol=1e-9)
