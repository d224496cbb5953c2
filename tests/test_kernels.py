"""The pure kernels (``emgmm.covariance._cholesky``, ``_log_density``, ``_estep``,
``_statistics``, ``_m_step``) against independent oracles.

Oracles:

* ``scipy.stats.multivariate_normal(mean, cov).logpdf`` for log-densities (eigh-based in
  scipy, a different algorithm from the Cholesky/triangular product in emgmm);
* ``numpy.linalg.slogdet`` / ``numpy.linalg.inv`` for determinants and precisions;
* plain numpy on the whole array (broadcasting + ``einsum``, no BLAS rank-k updates)
  for the sufficient statistics;
* ``np.average`` and ``np.cov(bias=True, aweights=r_k)`` for the M step.

All inputs are made read-only, so a kernel that writes into its inputs fails (C15).

float32 tolerances
------------------
float32 inputs are compared with the float64 oracle evaluated on the *same* float32
values (cast to float64), so only the rounding done inside the kernel is measured.
Tolerances are forward error bounds of the form ``c * u * S`` where ``u = 2**-24`` is
the float32 unit roundoff and ``S`` is the same quantity evaluated on absolute values
(so cancellation is accounted for), as in Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., ch. 3: a dot product of length ``m`` has error at most
``gamma_m * sum |a_i b_i|`` with ``gamma_m = m u / (1 - m u)``. Where the contract
promises float64 accumulation (sufficient statistics) the float32 part of the bound does
*not* grow with the number of rows: only the per-element rounding of ``x - c`` and of
the products is float32; the accumulation over ``n`` rows is charged ``gamma_n`` with
the float64 roundoff.
"""

import functools
import operator
import pickle
import re
import tracemalloc
import warnings

import numpy as np
import pytest
from helpers import (
    SKLEARN_COVARIANCE_TYPES,
    quiet_fit,
    random_spd,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from emgmm import GaussianMixture
from emgmm._engine import estep as _estep
from emgmm.covariance import _cholesky, _log_density, _m_step, _statistics

U32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff 2**-24
U64 = float(np.finfo(np.float64).eps) / 2  # 2**-53
DTYPES = (np.float64, np.float32)


def gamma(m, u):
    return m * u / (1 - m * u)


def ro(*arrays):
    """Read-only copies (kernels must never write into their inputs)."""
    out = []
    for a in arrays:
        a = np.array(a)
        a.setflags(write=False)
        out.append(a)
    return out if len(out) > 1 else out[0]


def upper_factor(precision):
    """Independent upper factor: U = inv(chol(inv(P)))^T, so U U^T = P."""
    cov = np.linalg.inv(precision)
    L = np.linalg.cholesky(cov)
    return np.linalg.inv(L).T


def make_model(rng, K, d, covariance_type, dtype=np.float64, cond=10.0):
    """Random weights, means and precisions; returns params + dense per-k precisions.

    ``prec_dense[k]`` is the (d, d) precision of component k computed in float64 from
    the (possibly float32-rounded) Cholesky factor actually passed to the kernel, so the
    oracle sees exactly the kernel's input.
    """
    weights = rng.dirichlet(np.full(K, 3.0))
    means = rng.normal(scale=3.0, size=(K, d))
    if covariance_type == "full":
        U = np.stack([upper_factor(random_spd(rng, d, cond=cond)) for _ in range(K)])
    elif covariance_type == "tied":
        U = upper_factor(random_spd(rng, d, cond=cond))
    elif covariance_type == "diag":
        U = np.sqrt(rng.uniform(0.3, 3.0, size=(K, d)))
    else:
        U = np.sqrt(rng.uniform(0.3, 3.0, size=K))
    means = means.astype(dtype)
    U = U.astype(dtype)
    weights = weights.astype(dtype)
    U64_ = U.astype(np.float64)
    if covariance_type == "full":
        dense = np.stack([u @ u.T for u in U64_])
    elif covariance_type == "tied":
        dense = np.stack([U64_ @ U64_.T] * K)
    elif covariance_type == "diag":
        dense = np.stack([np.diag(u**2) for u in U64_])
    else:
        dense = np.stack([np.eye(d) * u**2 for u in U64_])
    return weights, means, U, dense


def oracle_log_prob(X, means, prec_dense):
    X = np.asarray(X, dtype=np.float64)
    return np.stack(
        [
            multivariate_normal(m.astype(np.float64),
                                np.linalg.inv(P)).logpdf(X).reshape(-1)
            for m, P in zip(means, prec_dense, strict=False)
        ],
        axis=1,
    )


def f32_log_prob_bound(X, means, prec_dense):
    """Forward error bound of log N in float32 arithmetic (see module docstring).

    The Mahalanobis term is a sum over d of squares of length-d dot products of
    ``(x - mu)`` with columns of U; kernels may form ``x - mu`` directly or expand the
    square around a shift inside the convex hull of the means, so the magnitudes are
    taken as ``|x| + |mu_k| + max_j |mu_j|`` (elementwise). The log-determinant is a sum
    of d logs of float32 entries.
    """
    X = np.abs(np.asarray(X, dtype=np.float64))
    means = np.abs(np.asarray(means, dtype=np.float64))
    d = X.shape[1]
    mmax = means.max(axis=0)
    out = np.empty((X.shape[0], len(means)))
    for k, P in enumerate(prec_dense):
        Uabs = np.abs(upper_factor(P))
        a = X + means[k] + mmax
        q = np.sum((a @ Uabs) ** 2, axis=1)
        logdet = np.sum(np.abs(np.log(np.diag(np.linalg.cholesky(P)))))
        out[:, k] = 0.5 * q + logdet + d
    return 2 * gamma(2 * d + 8, U32) * out


def data_for(rng, means, n, dtype):
    K, d = means.shape
    lab = rng.integers(K, size=n)
    X = means.astype(np.float64)[lab] + rng.normal(size=(n, d))
    return X.astype(dtype)


# ------------------------------------------------------------------ log_det_cholesky


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
@pytest.mark.parametrize("d", [1, 6])
def test_log_det_cholesky(covariance_type, dtype, d):
    rng = np.random.default_rng(10 + d)
    K = 4
    _, _, U, dense = make_model(rng, K, d, covariance_type, dtype)
    got = np.asarray(_cholesky.log_det_cholesky(ro(U), covariance_type, d))
    expected = np.array([0.5 * np.linalg.slogdet(P)[1] for P in dense])
    if covariance_type == "tied":
        # one shared precision: a scalar (sklearn's convention), equal for every k
        assert got.shape in ((), (1,), (K,))
    else:
        assert got.shape == (K,)
    # float64: slogdet (LU) vs sum of logs; float32: d logs of float32 entries, each
    # with error <= u (1 + |log|) if evaluated in float32 (exact-ish if upcast).
    if dtype == np.float64:
        atol = 1e-12 * (1 + np.abs(expected).max())
    else:
        atol = (d + 1) * U32 * (1 + np.abs(expected).max()) * 2
    assert_allclose(np.broadcast_to(got, expected.shape), expected, rtol=0, atol=atol)


# ------------------------------------------------------------------ log_gaussian_prob


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
@pytest.mark.parametrize("d", [1, 5, 20])
def test_log_gaussian_prob(covariance_type, dtype, d):
    rng = np.random.default_rng(100 + d)
    K, n = 3, 200
    weights, means, U, dense = make_model(rng, K, d, covariance_type, dtype)
    X = data_for(rng, means, n, dtype)
    X, means_ro, U_ro = ro(X, means, U)
    got = _log_density.log_gaussian_prob(X, means_ro, U_ro, covariance_type)
    assert got.shape == (n, K)
    expected = oracle_log_prob(X, means, dense)
    if dtype == np.float64:
        assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    else:
        bound = f32_log_prob_bound(X, means, dense)
        err = np.abs(got - expected)
        assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"
        # the bound is not vacuous: a small fraction of |log p| (O(d u) with the
        # magnitudes of x and the means, here ~1e-5 .. 1e-4)
        assert np.median(bound / np.abs(expected)) < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d, block", [(150, None), (20, 3), (7, 7), (9, 8)])
def test_full_dense_products_by_column_blocks(monkeypatch, dtype, d, block):
    """The dense 'full' products skip the zero triangle of U_k column block by column
    block: several blocks with a narrower last one, several component batches, a
    single block; against scipy's logpdf (float32: within the float32 bound)."""
    if block is not None:
        monkeypatch.setattr(_log_density, "TRIANGLE_BLOCK", block)
    rng = np.random.default_rng(d)
    K, n = 21, 150  # d=150: 16 + 5 components per batch of 1024 columns
    weights, means, U, dense = make_model(rng, K, d, "full", dtype, cond=30.0)
    X = data_for(rng, means, n, dtype)
    assert not _log_density._use_packed(d, K) or block is not None
    means64 = means.astype(np.float64)
    g = _log_density._shift(means64, weights.astype(np.float64)).astype(dtype)
    maha = _log_density._full_maha_dense(*ro(X, g, means64 - g,
                                        U.astype(np.float64)), np.arange(K),
                                    np.full((n, K), np.nan))
    logdet = _cholesky.log_det_cholesky(U.astype(np.float64), "full", d)
    got = -0.5 * (d * np.log(2 * np.pi) + maha) + logdet
    expected = oracle_log_prob(X, means, dense)
    if dtype == np.float64:
        assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    else:
        err = np.abs(got - expected)
        bound = f32_log_prob_bound(X, means, dense)
        assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_log_gaussian_prob_far_points_and_single_row(covariance_type):
    """Rows very far from every mean (log p ~ -1e6) and a block of one row."""
    rng = np.random.default_rng(7)
    K, d = 3, 4
    _, means, U, dense = make_model(rng, K, d, covariance_type)
    X = np.vstack([means[0] + 1e3, means[1] - 2e3, means[2] + 0.5])
    expected = oracle_log_prob(X, means, dense)
    got = _log_density.log_gaussian_prob(*ro(X, means, U), covariance_type)
    assert_allclose(got, expected, rtol=1e-10)
    one = _log_density.log_gaussian_prob(*ro(X[2:3], means, U), covariance_type)
    assert one.shape == (1, K)
    assert_allclose(one, expected[2:3], rtol=1e-10)


@pytest.mark.parametrize("margin", [None, 48.0])
@pytest.mark.parametrize("separation", [1e4, 1e6])
@pytest.mark.parametrize("covariance_type", ["tied", "diag", "spherical"])
def test_log_gaussian_prob_of_clusters_far_apart(covariance_type, separation, margin):
    """Two unit clusters at +-separation: the expansions around the mixture mean
    cancel (for 'tied' they lost 4e-8 and 5e-4 nats per row at 1e4 and 1e6), and the
    components they flag are recomputed, every pair or (with a margin) the pairs near
    each row's best, to the oracle's accuracy. ('full' in float64 takes triangular
    products around the mixture mean for such components: rounding relative to
    ``||x - g||``, 1e-9 nats here, as README states.)"""
    rng = np.random.default_rng(8)
    K, d = 2, 3
    _, _, U, dense = make_model(rng, K, d, covariance_type)
    means = np.array([np.full(d, separation), np.full(d, -separation)])
    X = np.vstack([means[0] + rng.normal(size=(40, d)),
                   means[1] + rng.normal(size=(40, d))])
    expected = oracle_log_prob(X, means, dense) + np.log(0.5)
    got = _estep.weighted_log_prob(*ro(X, np.full(K, 0.5), means, U), covariance_type,
                                   margin)
    near = np.arange(len(X)) // 40
    rows = np.arange(len(X))
    assert_allclose(got[rows, near], expected[rows, near], rtol=0, atol=1e-9)
    assert_allclose(got, expected, rtol=1e-9)


# ------------------------------------------------------------------
# estimate_log_prob_resp


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_estimate_log_prob_resp(covariance_type, dtype):
    rng = np.random.default_rng(3)
    K, d, n = 4, 5, 300
    weights, means, U, dense = make_model(rng, K, d, covariance_type, dtype)
    X = data_for(rng, means, n, dtype)
    # plus rows far away, where exp(log p) underflows: needs a real log-sum-exp
    X = np.vstack([X, (means[:2].astype(np.float64) + 300.0).astype(dtype)])
    log_norm, log_resp = _estep.estimate_log_prob_resp(*ro(X, weights, means, U),
                                                       covariance_type)
    assert log_norm.shape == (n + 2,) and log_resp.shape == (n + 2, K)
    weighted = oracle_log_prob(X, means, dense) + np.log(weights.astype(np.float64))
    exp_norm = logsumexp(weighted, axis=1)
    exp_resp = weighted - exp_norm[:, None]
    assert np.all(np.isfinite(log_norm)) and np.all(np.isfinite(log_resp))
    if dtype == np.float64:
        assert_allclose(log_norm, exp_norm, rtol=1e-10, atol=1e-10)
        assert_allclose(log_resp, exp_resp, rtol=1e-10, atol=1e-9)
        assert_allclose(np.exp(log_resp).sum(axis=1), 1.0, rtol=1e-12)
    else:
        # errors of log N (bound above) plus log of float32 weights (u each); the
        # normalisation and the log-sum-exp cannot amplify an absolute error: both are
        # 1-Lipschitz in the max-norm, log_resp = a - lse(a) at most doubles it.
        b = f32_log_prob_bound(X, means, dense).max(axis=1) + 2 * U32
        assert np.all(np.abs(log_norm - exp_norm) <= b)
        assert np.all(np.abs(log_resp - exp_resp) <= 2 * b[:, None])
        # responsibilities are normalised in float64 (returned float64)
        assert_allclose(np.exp(log_resp).sum(axis=1), 1.0, rtol=1e-12)


def test_exp_flushed_is_exp_above_the_floor_and_zero_below():
    """np.exp bit for bit from EXP_FLOOR up; 0 below (the underflowing and subnormal
    results included); -inf gives 0, NaN stays NaN; in place."""
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.uniform(-800.0, 5.0, 5000), np.linspace(-760.0, -690.0,
                                                                    701),
                        [_estep.EXP_FLOOR, np.nextafter(_estep.EXP_FLOOR, 0.0),
                         np.nextafter(_estep.EXP_FLOOR,
                                      -np.inf), 0.0, -np.inf, np.nan]])
    with np.errstate(under="ignore", invalid="ignore"):
        expected = np.where(a < _estep.EXP_FLOOR, 0.0, np.exp(a))
        assert (np.exp(a[a < _estep.EXP_FLOOR]) > 0.0).any()  # some really are flushed
    got = a.copy()
    assert _estep.exp_flushed(got) is got
    assert_array_equal(got, expected)
    assert np.exp(_estep.EXP_FLOOR) < 1e-300


def test_estimate_resp_flushes_only_responsibilities_below_the_floor():
    """Pairs whose log-responsibility lies between the subnormal range and EXP_FLOOR
    get 0; every other responsibility is exp(log_resp) of the log path."""
    weights = np.array([0.5, 0.5])
    means = np.array([[0.0], [1.0]])
    U = np.ones((2, 1, 1))
    # log r_i1 - log r_i0 = x - 1/2: from 0 down to beyond the subnormal range
    X = -np.linspace(0.0, 760.0, 1521)[:, None]
    log_norm, log_resp = _estep.estimate_log_prob_resp(X, weights, means, U, "full")
    log_norm2, resp = _estep.estimate_resp(X, weights, means, U, "full")
    assert_allclose(log_norm2, log_norm, rtol=1e-15)
    assert (log_resp[:, 1] < _estep.EXP_FLOOR).sum() > 100
    with np.errstate(under="ignore"):
        expected = np.where(log_resp >= _estep.EXP_FLOOR, np.exp(log_resp), 0.0)
    assert_allclose(resp, expected, rtol=1e-12, atol=0.0)


# ------------------------------------------------------------------ block_statistics


def oracle_stats(X, resp, centers, covariance_type):
    """Whole-array numpy (broadcast + einsum) statistics; also |.| versions for
    bounds."""
    X = np.asarray(X, dtype=np.float64)
    r = np.asarray(resp, dtype=np.float64)
    c = np.asarray(centers, dtype=np.float64)
    diff = X[:, None, :] - c[None, :, :]  # (n, K, d)
    mag = np.abs(X)[:, None, :] + np.abs(c)[None, :, :]
    nk = r.sum(axis=0)
    sum_x = np.einsum("ik,ikj->kj", r, diff)
    scale_x = np.einsum("ik,ikj->kj", r, mag)
    if covariance_type in ("full", "tied"):
        sum_xx = np.einsum("ik,ikj,ikl->kjl", r, diff, diff)
        scale_xx = np.einsum("ik,ikj,ikl->kjl", r, mag, mag)
        if covariance_type == "tied":
            sum_xx, scale_xx = sum_xx.sum(axis=0), scale_xx.sum(axis=0)
    else:
        sum_xx = np.einsum("ik,ikj->kj", r, diff**2)
        scale_xx = np.einsum("ik,ikj->kj", r, mag**2)
    return nk, sum_x, sum_xx, scale_x, scale_xx


def stats_tolerances(X, dtype, scale_x, scale_xx, n):
    """Absolute bounds for sum_x and sum_xx: float32 rounding of x - c and of the
    products (a few u32 per element, independent of n) + float64 accumulation over n
    rows."""
    per_elem = 8 * U32 if dtype == np.float32 else 8 * U64
    acc = gamma(n + 2 * X.shape[1] + 8, U64)
    return (per_elem + acc) * scale_x, (per_elem + acc) * scale_xx


def assert_stats_match(stats, X, resp, centers, covariance_type):
    n = X.shape[0]
    nk, sum_x, sum_xx, scale_x, scale_xx = oracle_stats(X, resp, centers,
                                                        covariance_type)
    tol_x, tol_xx = stats_tolerances(X, X.dtype, scale_x, scale_xx, n)
    got_nk = np.asarray(stats.nk)
    assert got_nk.dtype == np.float64
    assert np.asarray(stats.sum_x).dtype == np.float64
    assert np.asarray(stats.sum_xx).dtype == np.float64
    assert_allclose(got_nk, nk, rtol=gamma(n, U64) * 2, atol=0)
    assert np.asarray(stats.sum_x).shape == sum_x.shape
    assert np.all(np.abs(stats.sum_x - sum_x) <= tol_x)
    got_xx = np.asarray(stats.sum_xx)
    assert got_xx.shape == sum_xx.shape
    if covariance_type in ("full", "tied"):
        # emgmm documents that only the upper triangle of the full/tied second moment is
        # meaningful (symmetrised in m_step); compare that triangle.
        iu = np.triu_indices(X.shape[1])
        got_xx = got_xx[..., iu[0], iu[1]]
        sum_xx, tol_xx = sum_xx[..., iu[0], iu[1]], tol_xx[..., iu[0], iu[1]]
    err = np.abs(got_xx - sum_xx)
    worst = np.max(err / np.where(tol_xx > 0, tol_xx, np.inf), initial=0.0)
    assert np.all(err <= tol_xx), f"max err/bound {worst:.3g}"


def random_resp(rng, n, K, zero_frac=0.3):
    resp = rng.dirichlet(np.full(K, 0.5), size=n)
    resp[rng.random((n, K)) < zero_frac] = 0.0  # exact zeros (skipped rows) ...
    resp[resp.sum(axis=1) == 0, 0] = 1.0
    resp /= resp.sum(axis=1, keepdims=True)  # ... rows still sum to one
    return resp


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_block_statistics(covariance_type, dtype):
    rng = np.random.default_rng(11)
    n, d, K = 2000, 4, 3
    X = rng.normal(size=(n, d)).astype(dtype)
    resp = random_resp(rng, n, K)
    centers = rng.normal(scale=0.5, size=(K, d))
    stats = _statistics.block_statistics(*ro(X, resp, centers), covariance_type)
    assert_stats_match(stats, X, resp, centers, covariance_type)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_block_statistics_float32_accumulates_in_float64(covariance_type):
    """4096 identical float32 rows: float32 accumulation drifts by ~1e-5 relative
    (systematic rounding of a growing partial sum); float64 accumulation does not."""
    n, K = 4096, 2
    v = np.array([0.1, -0.3, 0.7], dtype=np.float32)
    X = np.tile(v, (n, 1))
    resp = np.zeros((n, K))
    resp[:, 0] = 1.0
    centers = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    stats = _statistics.block_statistics(*ro(X, resp, centers), covariance_type)
    assert_stats_match(stats, X, resp, centers, covariance_type)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_block_statistics_far_from_origin_float32(covariance_type):
    """Data at 1e4 with spread 1, centres at the data mean: the centred statistics keep
    the relative accuracy of the spread (no E[x^2] - mu^2 cancellation)."""
    rng = np.random.default_rng(5)
    n, d, K = 500, 2, 2
    X = (1e4 + rng.normal(size=(n, d))).astype(np.float32)
    resp = random_resp(rng, n, K, zero_frac=0.0)
    centers = np.array(
        [np.average(X.astype(np.float64), weights=resp[:, k], axis=0) for k in range(K)]
    )
    stats = _statistics.block_statistics(*ro(X, resp, centers), covariance_type)
    _, _, sum_xx, _, _ = oracle_stats(X, resp, centers, covariance_type)
    got = np.asarray(stats.sum_xx)
    if covariance_type in ("full", "tied"):
        got = np.diagonal(got, axis1=-2, axis2=-1)
        sum_xx = np.diagonal(sum_xx, axis1=-2, axis2=-1)
    # x - c is rounded once (|x| = 1e4, so absolute error ~ u * 1e4 ~ 6e-4 per row on a
    # spread of 1): relative error of the second moment <= ~4 * 6e-4, not 1e8 * u.
    assert_allclose(got, sum_xx, rtol=4 * U32 * 1e4 * 2)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_block_statistics_far_from_origin_float64(covariance_type):
    """Clusters 10 apart at 1e12, unit spread, mixed responsibilities: the statistics
    keep the accuracy of the centred sums (against a long-double oracle, relative to
    ``sum_i r_ik |x_i - c_k|^2``), not of the offset. 'tied' summed ``R^T X - N_k
    c_k`` and ``R c``: off by 8e-3 of the spread in ``s_k`` and 2e-7 in the second
    moments."""
    rng = np.random.default_rng(3)
    n, d, K = 3000, 3, 4
    labels = rng.integers(0, K, n)
    centers = 1e12 + 10.0 * np.arange(K)[:, None] + rng.normal(size=(K, d))
    X = centers[labels] + rng.normal(size=(n, d))
    resp = 0.2 * rng.dirichlet(np.full(K, 0.3), size=n)
    resp[np.arange(n), labels] += 0.8
    stats = _statistics.block_statistics(*ro(X, resp, centers), covariance_type)
    L = np.longdouble
    R, diff = resp.astype(L), X.astype(L)[:, None, :] - centers.astype(L)[None]
    scale = np.einsum("ik,ikj->", R, diff**2)
    sum_x = np.einsum("ik,ikj->kj", R, diff)
    if covariance_type in ("full", "tied"):
        sum_xx = np.einsum("ik,ikj,ikl->kjl", R, diff, diff)
        if covariance_type == "tied":
            sum_xx = sum_xx.sum(axis=0)
        got, sum_xx = np.triu(stats.sum_xx), np.triu(sum_xx)
    else:
        sum_xx, got = np.einsum("ik,ikj->kj", R, diff**2), stats.sum_xx
    assert float(np.abs(stats.sum_x - sum_x).max()) <= 1e-11 * float(np.sqrt(scale))
    assert float(np.abs(got - sum_xx).max()) <= 1e-11 * float(scale)


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_block_statistics_of_data_at_1e150_do_not_overflow(covariance_type):
    """Data of scale 1e150 (squares ~1e300): the cancellation test of the expanded
    'diag' sums compared ``1e6 * sum_xx``, which overflowed (RuntimeWarnings from
    the workers); the statistics must be finite and match the centred sums
    (features from 24 on: the sparse path's threshold too)."""
    rng = np.random.default_rng(8)
    n, d, K = 400, 30, 3
    X = (rng.normal(size=(n, d)) + 5.0 * rng.integers(K, size=(n, 1))) * 1e150
    resp = random_resp(rng, n, K)
    centers = rng.normal(size=(K, d)) * 1e150
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        stats = _statistics.block_statistics(*ro(X, resp, centers), covariance_type)
    assert_stats_match(stats, X, resp, centers, covariance_type)


def _as_tuple(stats):
    return (
        np.array(stats.nk),
        np.array(stats.sum_x),
        np.array(stats.sum_xx),
        float(stats.log_likelihood),
    )


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_statistics_merge_equals_whole(covariance_type):
    """Statistics of blocks, merged with ``+``, equal the statistics of the whole array;
    ``+`` does not modify its operands; ``log_likelihood`` adds up."""
    rng = np.random.default_rng(2)
    n, d, K = 301, 3, 4
    X = rng.normal(size=(n, d))
    resp = random_resp(rng, n, K)
    centers = rng.normal(size=(K, d))
    X, resp, centers = ro(X, resp, centers)
    whole = _statistics.block_statistics(X, resp, centers, covariance_type)
    bounds = [0, 1, 8, 150, 299, n]
    parts = []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=False)):
        s = _statistics.block_statistics(X[a:b], resp[a:b], centers, covariance_type)
        s.log_likelihood = float(i + 1)
        parts.append(s)
    before = [_as_tuple(p) for p in parts]
    merged = functools.reduce(operator.add, parts)
    for p, b in zip(parts, before, strict=False):
        for x, y in zip(_as_tuple(p), b, strict=False):
            assert_array_equal(x, y)
    assert merged.log_likelihood == pytest.approx(sum(range(1, len(parts) + 1)))
    assert_stats_match(merged, X, resp, centers, covariance_type)
    assert_allclose(merged.nk, whole.nk, rtol=1e-13)


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 59), min_size=0, max_size=6, unique=True),
    covariance_type=st.sampled_from(SKLEARN_COVARIANCE_TYPES),
    seed=st.integers(0, 2**16),
)
def test_statistics_any_partition(cuts, covariance_type, seed):
    """Any partition of the rows, reduced in place with ``+=``, gives the statistics of
    the whole array (to rounding)."""
    rng = np.random.default_rng(seed)
    n, d, K = 60, 3, 3
    X, resp, centers = ro(rng.normal(size=(n, d)), random_resp(rng, n, K),
                          rng.normal(size=(K, d)))
    bounds = [0] + sorted(cuts) + [n]
    merged = None
    for a, b in zip(bounds[:-1], bounds[1:], strict=False):
        s = _statistics.block_statistics(X[a:b], resp[a:b], centers, covariance_type)
        if merged is None:
            merged = s
        else:
            merged += s  # the in-place reduction
    assert_stats_match(merged, X, resp, centers, covariance_type)


# ------------------------------------------------------------------ m_step


def oracle_m_step(X, resp, reg_covar, covariance_type):
    """np.average / np.cov(bias=True, aweights=r_k) on the whole array."""
    X = np.asarray(X, dtype=np.float64)
    K, d = resp.shape[1], X.shape[1]
    nk = resp.sum(axis=0)
    weights = nk / nk.sum()
    means = np.stack([np.average(X, axis=0, weights=resp[:, k]) for k in range(K)])
    covs = np.stack(
        [np.cov(X, rowvar=False, bias=True, aweights=resp[:, k]).reshape(d, d)
         for k in range(K)]
    )
    if covariance_type == "full":
        cov = covs + reg_covar * np.eye(d)
    elif covariance_type == "tied":
        cov = np.einsum("k,kij->ij", nk, covs) / nk.sum() + reg_covar * np.eye(d)
    elif covariance_type == "diag":
        cov = np.diagonal(covs, axis1=1, axis2=2) + reg_covar
    else:
        cov = np.diagonal(covs, axis1=1, axis2=2).mean(axis=1) + reg_covar
    return weights, means, cov


def traced_peak(func, *args, **kwargs):
    """``func(*args, **kwargs)`` and the peak of the memory it allocated (bytes)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = func(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before


def test_m_step_full_reads_the_upper_triangle_with_one_model_sized_temporary():
    """'full' M step from the upper triangle of S_k (the lower one holds garbage
    here), allocating its covariances and (d, d) temporaries only: the model may be
    gigabytes (it took five (K, d, d) arrays)."""
    rng = np.random.default_rng(5)
    K, d = 40, 150
    S = np.stack([random_spd(rng, d) for _ in range(K)]) * 50.0
    garbage = np.tril(rng.normal(size=(K, d, d)), -1)
    stats = _statistics.SufficientStatistics(rng.uniform(20, 60, K),
                                             rng.normal(size=(K, d)),
                                             np.triu(S) + garbage, 0.0, 1000)
    centers = rng.normal(size=(K, d))
    (weights, means, cov), peak = traced_peak(_m_step.m_step, stats, centers, 1e-6,
                                              "full")
    assert peak < 1.25 * S.nbytes
    nk = stats.nk + 10 * np.finfo(np.float64).eps
    shift = stats.sum_x / nk[:, None]
    expected = S / nk[:, None, None] - shift[:, :, None] * shift[:, None, :]
    expected[:, np.arange(d), np.arange(d)] += 1e-6
    assert_array_equal(cov, np.swapaxes(cov, 1, 2))
    assert_allclose(cov, expected, rtol=1e-13, atol=1e-13 * np.abs(expected).max())
    assert_allclose(means, centers + shift, rtol=1e-15)
    assert_allclose(weights, nk / nk.sum(), rtol=1e-15)
    # overwrite=True: the same model, formed in the statistics' memory
    (w2, m2, cov2), peak = traced_peak(_m_step.m_step, stats, centers, 1e-6, "full",
                                       overwrite=True)
    assert peak < 0.25 * S.nbytes
    assert np.shares_memory(cov2, stats.sum_xx)
    assert_array_equal(cov2, cov)
    assert_array_equal(m2, means)
    assert_array_equal(w2, weights)


@pytest.mark.parametrize("chunk_bytes", [None, 3000])  # one chunk / 17-row chunks
def test_packed_sums_over_row_chunks_equal_whole_array_products(chunk_bytes,
                                                                monkeypatch):
    """``R^T [y_j y_l, y, 1]`` over the kept pairs against numpy on the whole array."""
    if chunk_bytes is not None:
        monkeypatch.setattr(_log_density, "PACKED_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(8)
    n, d, K = 203, 5, 7
    X = rng.normal(size=(n, d))
    g = rng.normal(size=d)
    resp = np.asfortranarray(rng.dirichlet(np.ones(K), size=n))
    kept = (rng.random((n, K)) < 0.7).T
    out = np.full((K, d * (d + 1) // 2 + d + 1), np.nan)
    acc = _statistics._packed_sums(X, resp, g, kept, out)
    assert acc is out
    Y = X - g
    iu = np.triu_indices(d)
    R = np.where(kept.T, resp, 0.0)
    expected = np.concatenate([np.einsum("ik,ij,il->kjl", R, Y, Y)[:, iu[0], iu[1]],
                               R.T @ Y, R.sum(axis=0)[:, None]], axis=1)
    assert_allclose(acc, expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kept_share", [0.02, 0.6])  # gathered rows / packed product
def test_full_statistics_add_into_the_sums_of_earlier_blocks(kept_share):
    """block_statistics(out=...) adds a 'full' block into the sums: equal to the sum of
    the blocks' own statistics (bitwise, upper triangles), and for gathered rows
    without a (K, d, d) array per block."""
    rng = np.random.default_rng(6)
    n, d, K = 600, 40, 30
    X = rng.normal(size=(3 * n, d))
    keep = rng.random((3 * n, K)) < kept_share
    keep[np.arange(3 * n), rng.integers(K, size=3 * n)] = True  # a pair in every row
    resp = rng.random((3 * n, K)) * np.where(keep, 1.0, 1e-30)
    resp /= resp.sum(axis=1, keepdims=True)
    resp = np.asfortranarray(resp)
    centers = rng.normal(scale=0.3, size=(K, d))
    parts = [_statistics.block_statistics(X[i:i + n], resp[i:i + n], centers, "full",
                                          1e-20)
             for i in range(0, 3 * n, n)]
    total = _statistics.block_statistics(X[:n], resp[:n], centers, "full", 1e-20)
    for i in (n, 2 * n):
        total, peak = traced_peak(_statistics.block_statistics, X[i:i + n],
                                  resp[i:i + n],
                                  centers, "full", 1e-20, out=total)
    expected = parts[0] + parts[1] + parts[2]
    iu = np.triu_indices(d)
    assert total.n_samples == 3 * n
    assert_array_equal(total.nk, expected.nk)
    assert_array_equal(total.sum_x, expected.sum_x)
    assert_array_equal(total.sum_xx[:, iu[0], iu[1]], expected.sum_xx[:, iu[0], iu[1]])
    share = np.count_nonzero(resp > 1e-20) / resp.size
    assert (share < _statistics._GATHER_DENSITY) == (kept_share < 0.1)
    if kept_share < 0.1:
        assert peak < 0.25 * total.sum_xx.nbytes


@pytest.mark.slow
def test_full_statistics_from_packed_sums_take_no_model_sized_temporaries(monkeypatch):
    """Dense 'full' responsibilities (the packed product): the centred second moments
    are formed a few components at a time and added into the sums, with no (K, d, d)
    temporaries (it took five: the block's sums, the cross terms, and the Cholesky
    factors and their inverses of the accuracy check)."""
    monkeypatch.setattr(_log_density, "PACKED_CHUNK_BYTES", 4 * 2**20)
    rng = np.random.default_rng(8)
    n, d, K = 600, 64, 200
    X = rng.normal(size=(n, d))
    centers = rng.normal(scale=0.3, size=(K, d))
    resp = np.asfortranarray(random_resp(rng, n, K))
    X, resp, centers = ro(X, resp, centers)
    assert np.count_nonzero(resp > 1e-20) / resp.size > _statistics._GATHER_DENSITY
    total = _statistics.SufficientStatistics(np.zeros(K), np.zeros((K, d)),
                                         np.zeros((K, d, d)), 0.0, 0)
    total, peak = traced_peak(_statistics.block_statistics, X, resp, centers, "full",
                              1e-20,
                              out=total)
    # the packed sums (about one (K, d, d)), one packed row chunk (<= 4 MiB) and
    # chunk-sized work arrays
    assert peak < 2.5 * total.sum_xx.nbytes
    assert_stats_match(total, X, np.where(resp > 1e-20, resp, 0.0), centers, "full")


def test_packed_moments_recompute_tight_far_components_in_any_chunk(monkeypatch):
    """Components whose expanded sums cancel (clusters of spread 1e-3 at 100 and 200
    from the data) are recomputed centred wherever they fall among the chunks of
    components (here 3 per chunk), the others added from the packed sums: the same
    statistics, bitwise, as one chunk for all."""
    rng = np.random.default_rng(9)
    n, d, K = 900, 6, 12
    far = [4, 10]  # in the second and the fourth chunk
    X = rng.normal(size=(n, d))
    centers = rng.normal(scale=0.3, size=(K, d))
    resp = rng.random((n, K)) + 0.1
    for j, k in enumerate(far):
        rows = slice(100 * j, 100 * j + 100)
        X[rows] = 100.0 * (j + 1) + 1e-3 * rng.normal(size=(100, d))
        centers[k] = 100.0 * (j + 1)
        resp[:, k] = 1e-15
        resp[rows] = 1e-15
        resp[rows, k] = 1.0
    resp = np.asfortranarray(resp / resp.sum(axis=1, keepdims=True))
    X, resp, centers = ro(X, resp, centers)
    whole = _statistics.block_statistics(X, resp, centers, "full", 1e-20)
    monkeypatch.setattr(_statistics, "MOMENT_CHUNK_BYTES", 3 * 8 * d * d)
    g = _log_density._shift(centers, resp.sum(axis=0))
    sums = np.zeros(K), np.zeros((K, d)), np.zeros((K, d, d))
    acc = _statistics._packed_sums(X, resp, g, (resp > 1e-20).T)
    redo = _statistics._add_packed_moments(acc, centers, g, *sums)
    assert_array_equal(redo, far)
    chunked = _statistics.block_statistics(X, resp, centers, "full", 1e-20)
    iu = np.triu_indices(d)
    assert_array_equal(chunked.nk, whole.nk)
    assert_array_equal(chunked.sum_x, whole.sum_x)
    assert_array_equal(chunked.sum_xx[:, iu[0], iu[1]], whole.sum_xx[:, iu[0], iu[1]])
    # the recomputed components to rounding (the others carry the cancellation the
    # packed sums accept, up to _PACKED_MAX_CANCELLATION times the unit roundoff)
    nk, sum_x, sum_xx, scale_x, scale_xx = oracle_stats(X, resp, centers, "full")
    tol_x, tol_xx = stats_tolerances(X, X.dtype, scale_x, scale_xx, n)
    assert_allclose(chunked.nk[far], nk[far], rtol=gamma(n, U64) * 2, atol=0)
    assert np.all(np.abs(chunked.sum_x[far] - sum_x[far]) <= tol_x[far])
    got_xx, sum_xx, tol_xx = (np.triu(a[far]) for a in (chunked.sum_xx, sum_xx, tol_xx))
    assert np.all(np.abs(got_xx - sum_xx) <= tol_xx)


@pytest.mark.parametrize("shift", [0.0, 1.5, 3.0])
def test_packed_moments_kept_for_ill_conditioned_components(shift):
    """Data nearly flat along a direction (the last feature equals the first to 1e-6:
    every S_k has a condition number ~1e12, and even centred sums amplify their
    rounding ~1e12-fold): the components of these rows keep their packed sums (their
    expanded terms are within twice the centred ones in every feature), while a tight
    cluster (spread 1e-3) 3 away from them is recomputed centred; all within the
    rounding bounds of the whole-array oracle. With ``shift``, one component's rows
    and centre lie that far off the others in one feature only: its expanded terms
    there are 2.6x (1.5) or 9.7x (3.0) the centred ones (at most 1.24x in the
    others), and it is recomputed: the rule asks for every feature, at most twice."""
    rng = np.random.default_rng(10)
    n, d, K = 900, 6, 8
    tight, shifted = 5, 2
    X = rng.normal(size=(n, d))
    X[:, -1] = X[:, 0] + 1e-6 * rng.normal(size=n)
    centers = rng.normal(scale=0.3, size=(K, d))
    centers[:, -1] = centers[:, 0]
    resp = random_resp(rng, n, K)
    rows = slice(0, 50)
    X[rows] = 3.0 + 1e-3 * rng.normal(size=(50, d))
    centers[tight] = 3.0
    resp[:, tight] = 1e-15
    resp[rows] = 1e-15
    resp[rows, tight] = 1.0
    if shift:
        moved = slice(100, 200)
        X[moved, 3] += shift
        resp[:, shifted] = 1e-15
        resp[moved] = 1e-15
        resp[moved, shifted] = 1.0
        centers[shifted] = X[moved].mean(axis=0)
    resp = np.asfortranarray(resp / resp.sum(axis=1, keepdims=True))
    X, resp, centers = ro(X, resp, centers)
    # the centred sums' own amplification, sum_j S_jj (S^-1)_jj, is far beyond 1e6
    S = oracle_stats(X, resp, centers, "full")[2]
    amplification = np.einsum("kjj,kjj->k", S, np.linalg.inv(S))
    assert np.all(np.delete(amplification, tight) > 1e9)
    g = _log_density._shift(centers, resp.sum(axis=0))
    acc = _statistics._packed_sums(X, resp, g, (resp > 1e-20).T)
    sums = np.zeros(K), np.zeros((K, d)), np.zeros((K, d, d))
    expected = sorted([tight, shifted]) if shift else [tight]
    assert_array_equal(_statistics._add_packed_moments(acc, centers, g, *sums),
                       expected)
    stats = _statistics.block_statistics(X, resp, centers, "full", 1e-20)
    assert_stats_match(stats, X, np.where(resp > 1e-20, resp, 0.0), centers, "full")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_m_step(covariance_type, dtype):
    rng = np.random.default_rng(4)
    n, d, K = 1500, 4, 3
    A = rng.normal(size=(d, d))
    X = (rng.normal(size=(n, d)) @ A + 2.0).astype(dtype)
    resp = random_resp(rng, n, K, zero_frac=0.2)
    # centres: previous means, i.e. near but not at the weighted means
    centers = np.stack(
        [np.average(X.astype(np.float64), axis=0, weights=resp[:, k]) for k in range(K)]
    ) + rng.normal(scale=0.1, size=(K, d))
    reg = 1e-3
    X, resp, centers = ro(X, resp, centers)
    stats = _statistics.block_statistics(X, resp, centers, covariance_type)
    weights, means, cov = _m_step.m_step(stats, centers, reg, covariance_type)
    ew, em, ec = oracle_m_step(X, resp, reg, covariance_type)
    assert cov.shape == ec.shape and means.shape == em.shape
    assert weights.shape == ew.shape
    assert_allclose(weights.sum(), 1.0, rtol=1e-14)
    if dtype == np.float64:
        assert_allclose(weights, ew, rtol=1e-12)
        assert_allclose(means, em, rtol=1e-10, atol=1e-12)
        assert_allclose(cov, ec, rtol=1e-10, atol=1e-12)
    else:
        # propagate the sufficient-statistics bounds: mean error <= tol_x / N_k,
        # covariance error <= tol_xx / N_k + 2 |m| tol_x / N_k + (tol_x / N_k)^2 with m
        # = s_k / N_k the shift from the centre (elementwise; averaged for
        # tied/spherical).
        _, sum_x, _, scale_x, scale_xx = oracle_stats(X, resp, centers, covariance_type)
        tol_x, tol_xx = stats_tolerances(X, X.dtype, scale_x, scale_xx, n)
        nk = resp.sum(axis=0)
        em_err = tol_x / nk[:, None]
        m = np.abs(sum_x) / nk[:, None]
        assert np.all(np.abs(means - em) <= em_err + 1e-12)
        if covariance_type == "full":
            cov_err = (tol_xx / nk[:, None, None]
                       + 2 * m[:, :, None] * em_err[:, None, :]
                       + em_err[:, :, None] * em_err[:, None, :] * 2)
        elif covariance_type == "tied":
            per_k = 2 * np.einsum("k,ki,kj->ij", nk, m,
                                  em_err) + np.einsum("k,ki,kj->ij", nk, em_err, em_err)
            cov_err = (tol_xx + per_k) / nk.sum()
        else:
            cov_err = tol_xx / nk[:, None] + 2 * m * em_err + em_err**2
            if covariance_type == "spherical":
                cov_err = cov_err.mean(axis=1)
        assert np.all(np.abs(cov - ec) <= cov_err + 1e-12), np.max(np.abs(cov - ec)
                                                                    / cov_err)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_m_step_covariances_do_not_change_when_the_data_are_shifted(covariance_type):
    """A five-point component of spread 0.01 beside a large one, then everything moved
    by 1e6: the covariances must stay those of the unshifted data (to the rounding of
    the shifted values, ~1e-10 absolute on deviations of ~1e-2). 'diag' and
    'spherical' once added scikit-learn's ``mu^2 * 10 eps / N_k``, computed as
    ``mu^2 (N_k + 10 eps - N_k) / N_k``: 5x the variance at the shift 1e6."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(500, 2)), 50 + 0.01 * rng.normal(size=(5, 2))])
    resp = np.zeros((505, 2))
    resp[:500, 0] = resp[500:, 1] = 1.0
    covs = []
    for offset in (0.0, 1e6):
        Y = X + offset
        centers = np.array([[0.0, 0.0], [50.0, 50.0]]) + offset
        stats = _statistics.block_statistics(*ro(Y, resp, centers), covariance_type)
        covs.append(_m_step.m_step(stats, centers, 0.0, covariance_type)[2])
    assert_allclose(covs[1], covs[0], rtol=1e-5)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_m_step_empty_component_keeps_its_centre(covariance_type):
    """A component with no responsibility: mean = its centre (c + 0 / (10 eps)),
    covariance = reg_covar, weight ~ 0, all finite."""
    rng = np.random.default_rng(8)
    n, d, K = 100, 3, 3
    X = rng.normal(size=(n, d))
    resp = random_resp(rng, n, K, zero_frac=0.0)
    resp[:, 2] = 0.0
    resp /= resp.sum(axis=1, keepdims=True)
    centers = rng.normal(size=(K, d)) + 5.0
    reg = 1e-2
    stats = _statistics.block_statistics(*ro(X, resp, centers), covariance_type)
    weights, means, cov = _m_step.m_step(stats, ro(centers), reg, covariance_type)
    assert np.all(np.isfinite(weights)) and np.all(np.isfinite(means))
    assert np.all(np.isfinite(cov))
    assert weights[2] < 1e-12
    assert_allclose(means[2], centers[2], rtol=1e-14)
    if covariance_type == "full":
        assert_allclose(cov[2], reg * np.eye(d), rtol=1e-12, atol=1e-15)
    elif covariance_type in ("diag", "spherical"):
        assert_allclose(cov[2], reg, rtol=1e-12)
    ew, em, ec = oracle_m_step(X, resp[:, :2], reg, covariance_type)
    assert_allclose(means[:2], em, rtol=1e-10)


# ------------------------------------------------------------------ precision factors


def dense_covs(rng, K, d, covariance_type, cond=50.0):
    if covariance_type == "full":
        return np.stack([random_spd(rng, d, cond=cond) for _ in range(K)])
    if covariance_type == "tied":
        return random_spd(rng, d, cond=cond)
    if covariance_type == "diag":
        return rng.uniform(0.1, 5.0, size=(K, d))
    return rng.uniform(0.1, 5.0, size=K)


def as_dense(a, covariance_type, K, d):
    a = np.asarray(a, dtype=np.float64)
    if covariance_type == "full":
        return a
    if covariance_type == "tied":
        return a[None]
    if covariance_type == "diag":
        return np.stack([np.diag(v) for v in a])
    return np.stack([np.eye(d) * v for v in a])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_factorize(covariance_type, dtype):
    rng = np.random.default_rng(21)
    K, d = 3, 6
    cov = dense_covs(rng, K, d, covariance_type).astype(dtype)
    U, bad = _cholesky.factorize(ro(cov), covariance_type, dtype)
    assert bad == []
    assert U.shape == cov.shape and U.dtype == dtype
    Ud = as_dense(U, covariance_type, K, d)
    Cd = as_dense(cov, covariance_type, K, d)
    for u, c in zip(Ud, Cd, strict=False):
        # upper triangular with a positive diagonal: the unique factor U U^T = inv(cov)
        assert_array_equal(np.tril(u, -1), 0.0)
        assert np.all(np.diag(u) > 0)
        P = np.linalg.inv(c)
        if dtype == np.float64:
            assert_allclose(u @ u.T, P, rtol=1e-10, atol=1e-12 * np.abs(P).max())
        else:
            # Cholesky + triangular inverse are backward stable: the computed factor is
            # exact for a covariance within ~d u |cov| of the input, so the precision
            # error is <= c d u kappa(cov) |P| (Higham thm 10.3, 8.5); c = 8.
            kappa = np.linalg.cond(c)
            atol = 8 * d * U32 * kappa * np.abs(P).max()
            assert_allclose(u @ u.T, P, rtol=0, atol=atol)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_factorize_failure_names_component(covariance_type):
    rng = np.random.default_rng(22)
    K, d = 4, 3
    cov = dense_covs(rng, K, d, covariance_type)
    if covariance_type == "full":
        cov[2] = np.diag([1.0, -1.0, 1.0])
        match = r"(?i)component\W+2\b"
    elif covariance_type == "tied":
        cov = np.diag([1.0, 0.0, 1.0])
        match = r"(?i)ill-defined empirical covariance"
    elif covariance_type == "diag":
        cov[2, 1] = 0.0
        match = r"(?i)component\W+2\b"
    else:
        cov[2] = -1.0
        match = r"(?i)component\W+2\b"
    U, bad = _cholesky.factorize(ro(cov), covariance_type)
    tied = covariance_type == "tied"
    assert bad == [0 if tied else 2]
    assert np.isnan(U if tied else U[2]).all()
    if not tied:
        assert np.isfinite(np.delete(U, 2, axis=0)).all()
    message = _cholesky.ill_defined_message(None if tied else bad[0], cov.dtype, cov)
    assert re.search(match, message) and "reg_covar" in message


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_precisions_cholesky_from_precisions(covariance_type, dtype):
    rng = np.random.default_rng(23)
    K, d = 3, 5
    P = dense_covs(rng, K, d, covariance_type).astype(dtype)
    U = _cholesky.precisions_cholesky_from_precisions(ro(P), covariance_type)
    assert U.shape == P.shape and U.dtype == dtype
    for u, p in zip(as_dense(U, covariance_type, K, d), as_dense(P, covariance_type, K,
                                                                 d), strict=False):
        assert_array_equal(np.tril(u, -1), 0.0)
        assert np.all(np.diag(u) > 0)
        if dtype == np.float64:
            assert_allclose(u @ u.T, p, rtol=1e-12, atol=1e-13 * np.abs(p).max())
        else:
            # backward-stable Cholesky: |U U^T - P| <= gamma_{d+1} |U| |U|^T (Higham
            # 10.1)
            bound = 2 * gamma(d + 1, U32) * (np.abs(u) @ np.abs(u).T)
            assert np.all(np.abs(u @ u.T - p) <= bound)
    # round trip with the covariance route: inv(P) as covariance gives the same factor
    if dtype == np.float64:
        if covariance_type in ("full", "tied"):
            C = np.linalg.inv(P)
        else:
            C = 1.0 / P
        U2, bad = _cholesky.factorize(ro(C), covariance_type)
        assert bad == []
        assert_allclose(U2, U, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_precisions_cholesky_from_precisions_not_pd(covariance_type):
    P = np.diag([1.0, -2.0, 1.0])
    if covariance_type == "full":
        P = np.stack([np.eye(3), P])
    with pytest.raises(ValueError):
        _cholesky.precisions_cholesky_from_precisions(ro(P), covariance_type)


# ------------------------------------------- 'diag'/'spherical': E step products reused


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_block_statistics_from_e_step_products(covariance_type, dtype):
    """The M step on the centred products of the E step (another shift than its own)
    gives the statistics of the oracle."""
    rng = np.random.default_rng(12)
    n, d, K = 2000, 4, 3
    weights, means, U, _ = make_model(rng, K, d, covariance_type)
    X = data_for(rng, means, n, dtype)
    resp = random_resp(rng, n, K)
    products = _log_density.centred_products(X, means, weights)
    stats = _statistics.block_statistics(*ro(X, resp, means), covariance_type,
                                     products=products)
    assert_stats_match(stats, X, resp, means, covariance_type)


@pytest.mark.parametrize("kept_share", [0.005, 0.5])  # sparse / dense product
@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_block_statistics_leave_out_pairs_below_threshold(covariance_type, kept_share):
    """Pairs with r_ik <= resp_threshold are left out of N_k, s_k and S_k, both when
    few pairs are kept (gathered rows for 'full', the sparse product for 'diag' and
    'spherical') and when many are (the masked dense products)."""
    rng = np.random.default_rng(13)
    n, K = 3000, 100
    d = 4 if covariance_type == "full" else _statistics.SPARSE_MIN_FEATURES
    threshold = 1e-10
    X = rng.normal(size=(n, d))
    centers = rng.normal(scale=0.5, size=(K, d))
    resp = rng.random((n, K)) + 0.1
    # the pairs to leave out get 1e-11 of their share: their sum over the rows,
    # ~1.5e-8 per component, is far above the rounding of the kept statistics
    leave = rng.random((n, K)) >= kept_share
    leave[np.arange(n), rng.integers(K, size=n)] = False  # every row keeps a pair
    resp[leave] *= 1e-11
    resp /= resp.sum(axis=1, keepdims=True)
    kept = np.where(resp > threshold, resp, 0.0)
    share = np.count_nonzero(kept) / kept.size
    if covariance_type == "full":
        assert (share < _statistics._GATHER_DENSITY) == (kept_share < 0.1)
    else:
        assert (share < _statistics._sparse_share(2 * d + 1)) == (kept_share < 0.1)
    stats = _statistics.block_statistics(*ro(X, np.asfortranarray(resp), centers),
                                     covariance_type, resp_threshold=threshold)
    nk, sum_x, sum_xx, scale_x, scale_xx = oracle_stats(X, kept, centers,
                                                        covariance_type)
    tol_x, tol_xx = stats_tolerances(X, X.dtype, scale_x, scale_xx, n)
    assert_allclose(stats.nk, nk, rtol=gamma(n, U64) * 2, atol=0)
    assert np.all(np.abs(stats.sum_x - sum_x) <= tol_x)
    got_xx = np.asarray(stats.sum_xx)
    if covariance_type == "full":
        got_xx = np.triu(got_xx)
        sum_xx, tol_xx = np.triu(sum_xx), np.triu(tol_xx)
    assert np.all(np.abs(got_xx - sum_xx) <= tol_xx)


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_block_statistics_keep_every_pair_below_sparse_min_features(covariance_type):
    """With fewer than SPARSE_MIN_FEATURES features 'diag'/'spherical' keep every pair
    (masking them would cost more than the product saves)."""
    rng = np.random.default_rng(14)
    n, K, d = 2000, 20, _statistics.SPARSE_MIN_FEATURES - 1
    X = rng.normal(size=(n, d))
    centers = rng.normal(scale=0.5, size=(K, d))
    resp = rng.random((n, K)) * np.where(rng.random((n, K)) < 0.05, 1.0, 1e-11)
    resp /= resp.sum(axis=1, keepdims=True)
    stats = _statistics.block_statistics(*ro(X, np.asfortranarray(resp), centers),
                                     covariance_type, resp_threshold=1e-9)
    assert_stats_match(stats, X, resp, centers, covariance_type)


def test_full_statistics_broad_component_keeps_shift_near_data():
    """A broad component of small weight keeps a pair on every row; the shift of the
    packed sums stays the mixture mean by responsibility mass, so the heavy
    component's expanded sums do not cancel (a shift by kept pairs lost ~1e-10)."""
    rng = np.random.default_rng(1)
    d, off = 3, 600.0
    X = np.vstack([rng.normal(size=(1980, d)), off + off * rng.normal(size=(20, d))])
    U, _ = _cholesky.factorize(np.array([np.eye(d), off**2 * np.eye(d)]), "full")
    _, resp = _estep.estimate_resp(X, np.array([0.99, 0.01]),
                                    np.array([np.zeros(d), np.full(d, off)]), U, "full")
    assert np.count_nonzero(resp > 1e-20) / resp.size > _statistics._GATHER_DENSITY
    centers = np.array([np.full(d, 0.01), np.full(d, off)])
    stats = _statistics.block_statistics(*ro(X, resp, centers), "full",
                                         resp_threshold=1e-20)
    assert_stats_match(stats, X, np.where(resp > 1e-20, resp, 0.0), centers, "full")


@pytest.mark.parametrize("margin", [None, 48.0])
@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_tight_component_far_from_shift_is_exact(covariance_type, margin):
    """A component of variance 1e-10 on points 1e3 from the mixture mean: the expanded
    log-density and second moments cancel ~1e13-fold; the kernels recompute that
    component directly (log-density to 1e-9 nats plus 1e-15 relative for the pairs
    at ~1e16 nats, statistics exactly zero). With a margin, only the pairs within it
    of their row's best need be exact; the others must stay out of it."""
    rng = np.random.default_rng(13)
    d = 5
    tight = np.full(d, 1000.3)
    X = np.vstack([np.tile(tight, (50, 1)), rng.normal(size=(200, d))])
    means = np.vstack([tight, rng.normal(scale=0.1, size=d)])
    weights = np.array([0.23, 0.77])
    var = np.array([1e-10, 1.0])
    if covariance_type == "diag":
        U = np.sqrt(1.0 / np.repeat(var[:, None], d, axis=1))
    else:
        U = np.sqrt(1.0 / var)
    prec_dense = np.stack([np.eye(d) / v for v in var])
    X, means, U, weights = ro(X, means, U, weights)
    got = _estep.weighted_log_prob(X, weights, means, U, covariance_type, margin)
    expected = oracle_log_prob(X, means, prec_dense) + np.log(weights)
    if margin is None:
        assert_allclose(got, expected, rtol=1e-15, atol=1e-9)
    else:
        relevant = expected >= expected.max(axis=1, keepdims=True) - margin
        assert_allclose(got[relevant], expected[relevant], rtol=1e-15, atol=1e-9)
        best = np.broadcast_to(got.max(axis=1, keepdims=True), got.shape)
        assert np.all(got[~relevant] < best[~relevant] - margin + 1.0)
    log_prob_norm, resp = _estep.estimate_resp(X, weights, means, U, covariance_type,
                                                margin)
    assert_allclose(log_prob_norm, logsumexp(expected, axis=1), rtol=0, atol=1e-9)
    stats = _statistics.block_statistics(X, resp, means, covariance_type,
                                     products=_log_density.centred_products(X, means,
                                                                            weights))
    assert_array_equal(stats.sum_xx[0], 0.0)
    assert_array_equal(stats.sum_x[0], 0.0)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_statistics_pickle_round_trip(covariance_type):
    """Statistics sent from a worker ('full': upper triangles only) give the same M
    step, bitwise, in about half the bytes."""
    rng = np.random.default_rng(14)
    n, d, K = 500, 32, 3
    X = rng.normal(size=(n, d))
    resp = random_resp(rng, n, K)
    centers = rng.normal(size=(K, d))
    stats = _statistics.block_statistics(X, resp, centers, covariance_type)
    data = pickle.dumps(stats, protocol=5)
    back = pickle.loads(data)
    for a, b in zip(_m_step.m_step(stats, centers, 1e-6, covariance_type),
                    _m_step.m_step(back, centers, 1e-6, covariance_type), strict=False):
        assert_array_equal(a, b)
    assert back.n_samples == n and back.log_likelihood == stats.log_likelihood
    if covariance_type == "full":
        full_bytes = len(pickle.dumps(_as_tuple(stats), protocol=5))  # every entry
        assert len(data) < 0.6 * full_bytes


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_needs_recentring(covariance_type):
    """Flagged: a component whose squared mean shift is 1e12 times its regularised
    variance. Not flagged: a one-point component (variance 0 + reg_covar, shift 1e-40),
    nor a component without weight."""
    X = np.array([[5.0], [5.0 + 1e-8], [5.0 - 1e-8], [0.0], [3.0]])
    resp = np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 0]], float)
    centers = np.array([[5.01], [0.0], [7.0]])
    for reg, flagged in ((1e-20, True), (1e-6, False)):
        stats = _statistics.block_statistics(X, resp, centers, covariance_type)
        _, means, cov = _m_step.m_step(stats, centers, reg, covariance_type)
        got = _m_step.needs_recentring(stats, means, cov, covariance_type)
        assert got.shape == (3,)
        assert got[0] == (flagged and covariance_type != "tied"), reg
        assert not got[2]  # no weight
    one_point = _statistics.block_statistics(X[3:4], resp[3:4], centers,
                                             covariance_type)
    _, means, cov = _m_step.m_step(one_point, centers, 1e-6, covariance_type)
    assert not _m_step.needs_recentring(one_point, means, cov, covariance_type).any()


def _upper(P):
    return np.linalg.inv(np.linalg.cholesky(np.linalg.inv(P))).T


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
@pytest.mark.parametrize("d", [5, 20, 128])
def test_case_c06_log_density_equals_scipys(d, covariance_type):
    rng = np.random.default_rng(d)
    K, n = 3, 40
    means = rng.normal(size=(K, d))
    if covariance_type == "full":
        P = np.stack([random_spd(rng, d, cond=30.0) * 2.0 for _ in range(K)])
        U = np.stack([_upper(p) for p in P])
        prec_init = P
    elif covariance_type == "tied":
        p = random_spd(rng, d, cond=30.0) * 2.0
        P, U, prec_init = np.stack([p] * K), _upper(p), p
    elif covariance_type == "diag":
        v = rng.uniform(0.2, 5.0, size=(K, d))
        P, U, prec_init = np.stack([np.diag(x) for x in v]), np.sqrt(v), v
    else:
        v = rng.uniform(0.2, 5.0, size=K)
        P, U, prec_init = np.stack([np.eye(d) * x for x in v]), np.sqrt(v), v
    X = means[rng.integers(K, size=n)] + rng.normal(size=(n, d))
    expected = np.stack(
        [multivariate_normal(m, np.linalg.inv(p)).logpdf(X)
         for m, p in zip(means, P, strict=True)], axis=1
    )
    # the kernel, per component
    got = _log_density.log_gaussian_prob(X, means, U, covariance_type)
    assert_allclose(got, expected, rtol=1e-10)
    # the estimator, initialised with these parameters and no EM iteration
    weights = np.full(K, 1.0 / K)
    gm = quiet_fit(GaussianMixture(n_components=K, covariance_type=covariance_type,
                                   max_iter=0,
                                   weights_init=weights, means_init=means,
                                   precisions_init=prec_init), X)
    assert_allclose(gm.score_samples(X), logsumexp(expected + np.log(weights), axis=1),
                    rtol=1e-10)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_case_c15_kernels_never_write_into_inputs(covariance_type):
    rng = np.random.default_rng(0)
    n, d, K = 64, 6, 4
    X = rng.normal(size=(n, d))
    means = rng.normal(size=(K, d))
    cov = {"full": np.stack([np.eye(d) * 1.5] * K), "tied": np.eye(d) * 2.0,
           "diag": np.full((K, d), 1.5), "spherical": np.full(K, 1.5)}[covariance_type]
    u, _ = _cholesky.factorize(cov, covariance_type)
    weights = np.full(K, 1 / K)
    resp = rng.dirichlet(np.ones(K), size=n)
    inputs = [X, means, u, weights, resp, X.astype(np.float32)]
    copies = [a.copy() for a in inputs]
    for a in inputs:
        a.setflags(write=False)  # a write would raise
    for Xc in (X, inputs[-1]):
        _log_density.log_gaussian_prob(Xc, means, u, covariance_type, weights)
        _estep.estimate_log_prob_resp(Xc, weights, means, u, covariance_type)
        _statistics.block_statistics(Xc, resp, means, covariance_type, 0.1)
    for a, c in zip(inputs, copies, strict=False):
        assert_array_equal(a, c)
