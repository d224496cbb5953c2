"""CASES.md C01-C08 and C11: reported failures of EM mixture tools that emgmm must pass.

emgmm semantics used below (documented in the estimator, differing from sklearn on
purpose from C02 on): ``lower_bounds_[i]`` is the mean log-likelihood computed in the E
step of iteration ``i + 1`` (sklearn's meaning); ``lower_bound_`` is the mean
log-likelihood of the returned parameters, i.e. ``score(X)``; ``n_init`` keeps the run
with the best ``lower_bound_``; a warm start on new data runs at least 2 iterations.
"""

import re
import warnings

import numpy as np
import pytest
from helpers import COVARIANCE_TYPES, not_converging, random_spd
from numpy.testing import assert_allclose, assert_array_equal
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from emgmm import GaussianMixture
from emgmm.covariance import log_density as _log_density

PARAMS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


def quiet_fit(est, X):
    with not_converging():
        return est.fit(X)


def quiet_fit_predict(est, X):
    with not_converging():
        return est.fit_predict(X)


def dense_covariances(gm):
    """(K, d, d) covariances from a fitted model, whatever its covariance_type."""
    K, d = gm.means_.shape
    c = np.asarray(gm.covariances_, dtype=np.float64)
    if gm.covariance_type == "full":
        return c
    if gm.covariance_type == "tied":
        return np.stack([c] * K)
    if gm.covariance_type == "diag":
        return np.stack([np.diag(v) for v in c])
    return np.stack([np.eye(d) * v for v in c])


def oracle_log_resp(gm, X):
    """log w_k + log N(x | mu_k, Sigma_k) normalised, with scipy from covariances_."""
    covs = dense_covariances(gm)
    lp = np.stack(
        [multivariate_normal(m, c).logpdf(X) for m, c in zip(gm.means_, covs,
                                                             strict=False)], axis=1
    ).reshape(len(X), -1) + np.log(gm.weights_)
    norm = logsumexp(lp, axis=1)
    return norm, lp - norm[:, None]


# ---------------------------------------------------------------------------- C01


@pytest.mark.parametrize("max_iter", [2, 100])
@pytest.mark.parametrize("n_init", [1, 5])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c01_fit_predict_equals_fit_then_predict(covariance_type, n_init,
                                                      max_iter):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 5))
    for seed in ((0, 1) if max_iter == 2 else (0,)):
        kw = dict(n_components=5, n_init=n_init, covariance_type=covariance_type,
                  max_iter=max_iter, random_state=seed)
        gm = GaussianMixture(**kw)
        labels = quiet_fit_predict(gm, X)
        # same object: the labels of the final E step are those of predict
        assert_array_equal(labels, gm.predict(X))
        # a fresh estimator: fit(X).predict(X)
        assert_array_equal(labels, quiet_fit(GaussianMixture(**kw), X).predict(X))
        # predict_proba equals the final E-step responsibilities (independent oracle)
        proba = gm.predict_proba(X)
        _, log_resp = oracle_log_resp(gm, X)
        assert_allclose(proba, np.exp(log_resp), rtol=1e-7, atol=1e-10)
        assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
        assert_array_equal(proba.argmax(axis=1), labels)


# ---------------------------------------------------------------------------- C02


@pytest.mark.slow
def test_case_c02_n_init_keeps_the_best_run():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(1000, 10))
    for seed in range(31):
        one = quiet_fit(GaussianMixture(n_components=2, n_init=1, random_state=seed), X)
        ten = quiet_fit(GaussianMixture(n_components=2, n_init=10, random_state=seed),
                        X)
        # the first run of n_init=10 is the n_init=1 run, so the best is at least as
        # good
        floor = one.lower_bound_ - 1e-12 * abs(one.lower_bound_)
        assert ten.lower_bound_ >= floor, seed
        for gm in (one, ten):
            # lower_bound_ is the score of the parameters that were kept
            assert_allclose(gm.lower_bound_, gm.score(X), rtol=1e-12)


def test_case_c02_kept_run_is_the_best_of_all_runs():
    """Each of the n_init runs reported by the callback: the kept one has the highest
    final score; ``lower_bounds_`` are the E-step bounds of that run."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(1000, 10))
    records = []
    gm = quiet_fit(
        GaussianMixture(n_components=2, n_init=4, random_state=3,
                        callback=records.append), X
    )
    assert sorted({r["init"] for r in records}) == [0, 1, 2, 3]
    # replay the runs one by one with one shared RandomState: same draws as n_init=4
    rs = np.random.RandomState(3)
    runs = [quiet_fit(GaussianMixture(n_components=2, random_state=rs),
                      X) for _ in range(4)]
    best = int(np.argmax([r.lower_bound_ for r in runs]))
    assert gm.lower_bound_ == pytest.approx(max(r.lower_bound_ for r in runs),
                                            rel=1e-12)
    assert_allclose(gm.lower_bounds_, runs[best].lower_bounds_, rtol=1e-12)
    assert_allclose(gm.means_, runs[best].means_, rtol=1e-10)
    per_init = [[r["lower_bound"] for r in records if r["init"] == i] for i in range(4)]
    assert_allclose(per_init[best], gm.lower_bounds_, rtol=1e-12)


@pytest.mark.parametrize("shift", [1e-4, 0.3])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c02_warm_start_on_new_data(covariance_type, shift):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(1000, 10))
    gm = quiet_fit(GaussianMixture(n_components=2, covariance_type=covariance_type,
                                   random_state=0, warm_start=True), X)
    means_before = gm.means_.copy()
    previous_bound = gm.lower_bounds_[-1]
    Y = X + shift
    quiet_fit(gm, Y)
    # the first change is measured against the previous fit's last bound
    # (scikit-learn's rule): a small shift may converge after one iteration
    assert gm.history_[0]["change"] == gm.lower_bounds_[0] - previous_bound
    assert len(gm.lower_bounds_) == gm.n_iter_
    assert_allclose(gm.lower_bound_, gm.score(Y), rtol=1e-12)
    # it did start from the previous parameters: the first E step of the warm run
    # scores the old parameters on the new data
    old = GaussianMixture(n_components=2, covariance_type=covariance_type,
                          weights_init=None, random_state=0)
    quiet_fit(old, X)
    assert_allclose(gm.lower_bounds_[0], old.score(Y), rtol=1e-10)
    assert np.all(np.isfinite(gm.means_))
    # EM from the old parameters improved the fit of the new data
    assert gm.lower_bound_ >= gm.lower_bounds_[0] - 1e-12 * abs(gm.lower_bounds_[0])
    assert not np.array_equal(gm.means_, means_before)


# ---------------------------------------------------------------------------- C03


@pytest.fixture(scope="module")
def c03_data():
    rng = np.random.default_rng(0)
    a = rng.multivariate_normal([2.0, 4.0], [[4.0, 1.0], [1.0, 4.0]], size=300)
    b = rng.multivariate_normal([0.0, 0.0], [[4.0, -1.0], [-1.0, 4.0]], size=100)
    return np.vstack([a, b])


def test_case_c03_tol_is_documented_as_mean_loglik_change():
    doc = GaussianMixture.__doc__
    m = re.search(r"\btol\b\s*:(.*?)(?=\n\s{4}\w+\s*:|\Z)", doc, re.S)
    assert m, "tol is not documented"
    text = " ".join(m.group(1).split()).lower()
    assert re.search(r"mean|average|per[- ]sample", text), text
    assert "log-likelihood" in text or "log likelihood" in text, text
    assert "change" in text or "difference" in text or "gain" in text, text


def test_case_c03_tol_semantics(c03_data):
    X = c03_data
    n_iters = []
    for tol in (1e-1, 1e-3, 1e-5, 1e-8):
        gm = quiet_fit(GaussianMixture(n_components=2, tol=tol, max_iter=10_000,
                                       random_state=0), X)
        assert gm.converged_
        lb = np.asarray(gm.lower_bounds_)
        # stopped at the first iteration whose change of the *mean* log-likelihood < tol
        changes = np.abs(np.diff(lb))
        if len(lb) >= 2:
            assert changes[-1] < tol
            assert np.all(changes[:-1] >= tol)
        n_iters.append(gm.n_iter_)
        if tol == 1e-8:
            assert_allclose(np.sort(gm.weights_), [0.25, 0.75], atol=0.05)
    assert n_iters == sorted(n_iters)
    assert n_iters[-1] > n_iters[0]


# ---------------------------------------------------------------------------- C04


@pytest.fixture(scope="module")
def three_blobs():
    rng = np.random.default_rng(0)
    centers = np.array([[0, 0, 0, 0], [10, 0, 0, 0], [0, 10, 0, 0]], dtype=float)
    return np.vstack([c + rng.standard_normal((300, 4)) for c in centers])


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c04_initialise_from_fitted_model(three_blobs, covariance_type):
    X = three_blobs
    A = quiet_fit(GaussianMixture(n_components=3, covariance_type=covariance_type,
                                  tol=1e-12, max_iter=1000, random_state=0), X)
    B = quiet_fit(GaussianMixture(n_components=3, covariance_type=covariance_type,
                                  weights_init=A.weights_, means_init=A.means_,
                                  precisions_init=A.precisions_), X)
    assert_allclose(B.lower_bounds_[0], A.score(X), rtol=1e-10)
    assert_allclose(B.lower_bounds_[0], A.lower_bound_, rtol=1e-10)
    # A is a fixed point of EM (converged to 1e-12): B stays there
    for name in PARAMS:
        assert_allclose(getattr(B, name), getattr(A, name), rtol=1e-8, atol=1e-12,
                        err_msg=name)
    # and with max_iter=0, B is exactly A's parameters
    C = quiet_fit(GaussianMixture(n_components=3, covariance_type=covariance_type,
                                  max_iter=0,
                                  weights_init=A.weights_, means_init=A.means_,
                                  precisions_init=A.precisions_), X)
    for name in PARAMS:
        assert_allclose(getattr(C, name), getattr(A, name), rtol=1e-10, atol=1e-14,
                        err_msg=name)
    assert_allclose(C.score(X), A.score(X), rtol=1e-12)


# ---------------------------------------------------------------------------- C05


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c05_which_factor_is_stored(three_blobs, covariance_type):
    gm = GaussianMixture(n_components=3, covariance_type=covariance_type,
                         random_state=0)
    gm.fit(three_blobs)
    U, P, C = gm.precisions_cholesky_, gm.precisions_, gm.covariances_
    d = three_blobs.shape[1]
    if covariance_type == "full":
        for u, p, c in zip(U, P, C, strict=False):
            assert_array_equal(np.tril(u, -1), 0.0)  # upper triangular
            assert_allclose(u @ u.T, p, rtol=1e-12, atol=1e-12 * np.abs(p).max())
            assert_allclose(p @ c, np.eye(d), atol=1e-10)
    elif covariance_type == "tied":
        assert_array_equal(np.tril(U, -1), 0.0)
        assert_allclose(U @ U.T, P, rtol=1e-12, atol=1e-12 * np.abs(P).max())
        assert_allclose(P @ C, np.eye(d), atol=1e-10)
    else:
        assert_allclose(U**2, P, rtol=1e-12)
        assert_allclose(P * C, 1.0, rtol=1e-10)
    doc = GaussianMixture.__doc__
    m = re.search(r"precisions_cholesky_\s*:(.*?)(?=\n\s{4}\w+\s*:|\Z)", doc, re.S)
    assert m, "precisions_cholesky_ is not documented"
    text = " ".join(m.group(1).split())
    assert re.search(r"(?i)upper", text), text
    assert re.search(r"U\s*@\s*U\.T|U\s*U\^T|U U\^\{?T\}?", text), text


# ---------------------------------------------------------------------------- C06


def _upper(P):
    return np.linalg.inv(np.linalg.cholesky(np.linalg.inv(P))).T


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("d", [5, 20, 128])
def test_case_c06_log_density_against_scipy(d, covariance_type):
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


# ---------------------------------------------------------------------------- C07


def _variances(gm):
    return np.diagonal(dense_covariances(gm), axis1=1, axis2=2)


def _check_variances(gm, reg_covar):
    """Every variance >= reg_covar (the data's own variance is >= 0). One rounding of
    the sum reg_covar + variance into the output dtype may fall 1 ulp below."""
    eps = np.finfo(gm.covariances_.dtype).eps
    assert np.all(_variances(gm) >= reg_covar * (1 - 2 * eps)), _variances(gm)
    if gm.covariance_type in ("full", "tied"):
        covs = dense_covariances(gm)
        eig = np.linalg.eigvalsh(covs)
        # eigenvalues of the *stored* matrix: rounding each entry to the output dtype
        # moves them by at most d * u * max|entry| (Weyl); for float32 entries of ~50
        # that is ~1e-5, more than reg_covar=1e-6 itself, so only that much is asked.
        d = covs.shape[-1]
        u = np.finfo(gm.covariances_.dtype).eps / 2
        slack = 2 * d * u * np.abs(covs).max(axis=(1, 2)) + 1e-6 * reg_covar
        assert np.all(eig >= reg_covar - slack[:, None]), eig


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c07_two_points_float32(covariance_type):
    X32 = np.array([[9999.0], [0.0]], dtype=np.float32)
    kw = dict(n_components=2, reg_covar=0.1, covariance_type=covariance_type,
              random_state=0)
    g32 = quiet_fit(GaussianMixture(**kw), X32)
    g64 = quiet_fit(GaussianMixture(**kw), X32.astype(np.float64))
    for gm in (g32, g64):
        _check_variances(gm, 0.1)
        assert np.all(np.isfinite(gm.means_)) and np.all(np.isfinite(gm.precisions_))
        assert_allclose(np.sort(gm.means_.ravel()), [0.0, 9999.0], rtol=1e-5, atol=1e-5)
    order32, order64 = np.argsort(g32.means_.ravel()), np.argsort(g64.means_.ravel())
    assert_allclose(g32.means_[order32], g64.means_[order64], rtol=1e-5, atol=1e-5)
    assert_allclose(g32.weights_[order32], g64.weights_[order64], rtol=1e-5)
    if covariance_type != "tied":
        assert_allclose(g32.covariances_[order32], g64.covariances_[order64], rtol=1e-5)
    else:
        assert_allclose(g32.covariances_, g64.covariances_, rtol=1e-5)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c07_exact_copies_far_apart_float32(covariance_type):
    locs = np.array([0.0, 1e3, 1e4])
    X32 = np.repeat(locs, 50).reshape(-1, 1).astype(np.float32)
    kw = dict(n_components=3, reg_covar=0.1, covariance_type=covariance_type,
              random_state=0)
    g32 = quiet_fit(GaussianMixture(**kw), X32)
    g64 = quiet_fit(GaussianMixture(**kw), X32.astype(np.float64))
    for gm in (g32, g64):
        _check_variances(gm, 0.1)
        got = np.sort(gm.means_.ravel()).astype(np.float64)
        # relative 1e-5 at 1e3 and 1e4; the location 0 to 1e-5 absolute (1e-9 of the
        # range)
        assert_allclose(got, locs, rtol=1e-5, atol=1e-5)
        assert_allclose(np.sort(gm.weights_), [1 / 3] * 3, rtol=1e-5)
    o32, o64 = np.argsort(g32.means_.ravel()), np.argsort(g64.means_.ravel())
    assert_allclose(g32.means_[o32], g64.means_[o64], rtol=1e-5, atol=1e-5)
    if covariance_type != "tied":
        assert_allclose(g32.covariances_[o32], g64.covariances_[o64], rtol=1e-5)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c07_spread_far_from_origin_float32(covariance_type):
    """Sibling: two clusters of spread 0.05 at 1e4 and 1e4 + 5 (float32 keeps ~1e-3
    resolution there). Variances from centred float64 statistics match the float64 fit
    of the same float32 values; E[x^2] - mu^2 in float32 would be off by ~1e8 * 6e-8."""
    rng = np.random.default_rng(0)
    X = np.concatenate([1e4 + 0.05 * rng.standard_normal(200),
                        1e4 + 5 + 0.05 * rng.standard_normal(200)])
    X32 = X.reshape(-1, 1).astype(np.float32)
    kw = dict(n_components=2, reg_covar=1e-6, covariance_type=covariance_type,
              random_state=0)
    g32 = quiet_fit(GaussianMixture(**kw), X32)
    g64 = quiet_fit(GaussianMixture(**kw), X32.astype(np.float64))
    o32, o64 = np.argsort(g32.means_.ravel()), np.argsort(g64.means_.ravel())
    assert_allclose(g32.means_[o32], g64.means_[o64], rtol=1e-7)
    v32, v64 = _variances(g32), _variances(g64)
    if covariance_type != "tied":
        v32, v64 = v32[o32], v64[o64]
    # the variance (~2.5e-3) of data whose float32 spacing is ~1e-3: rounding of x - mu
    # in float32 is <= u * |mu| ~ 6e-4 per row, unbiased; 1e-2 relative is a few times
    # that effect averaged over 200 rows, far below the 1e4 ** 2 * u ~ 6 of E[x^2]-mu^2.
    assert_allclose(v32, v64, rtol=1e-2)
    assert np.all(v32 > 0)


# ---------------------------------------------------------------------------- C08


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("init_params", ["kmeans", "k-means++", "random",
                                         "random_from_data"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c08_exact_duplicates(covariance_type, init_params, dtype):
    X = np.repeat([[0.0, 0.0], [10.0, 10.0]], 500, axis=0).astype(dtype)
    gm = GaussianMixture(n_components=5, covariance_type=covariance_type,
                         init_params=init_params, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # KMeans warns about 2 distinct points
        gm.fit(X)
    for name in PARAMS:
        assert np.all(np.isfinite(getattr(gm, name))), name
    _check_variances(gm, gm.reg_covar)
    assert_allclose(gm.weights_.sum(), 1.0, rtol=1e-6)
    proba = gm.predict_proba(X)
    assert not np.any(np.isnan(proba))
    assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    assert np.all(np.isfinite(gm.score_samples(X)))
    labels = gm.predict(X)
    # each location is one cluster, and the two are different
    assert len(set(labels[:500])) == 1 and len(set(labels[500:])) == 1
    assert labels[0] != labels[-1]


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("offset", [1e4, 1e6, 1e8])
def test_case_c07_float32_far_from_the_origin(offset, covariance_type):
    """A sibling of C07: float32 blobs (std 100) far from the origin, computed in
    float32, agree with the same values fitted in float64 to float32 precision
    (the rows and the means must be shifted by the same rounded centre)."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(size=(500, 2)) * 100 + offset,
                   rng.normal(size=(500, 2)) * 100 + offset + [800.0, 0.0]])
    X = X.astype(np.float32)
    kw = dict(n_components=2, covariance_type=covariance_type, tol=0.0, max_iter=20,
              means_init=X[[0, 600]].astype(np.float64), random_state=0)
    got = quiet_fit(GaussianMixture(**kw), X)
    want = quiet_fit(GaussianMixture(**kw), X.astype(np.float64))
    assert got.covariances_.dtype == np.float32
    assert_allclose(got.covariances_, want.covariances_, rtol=1e-6)
    # means are stored in float32, like scikit-learn's: half an ulp of the offset
    assert_allclose(got.means_, want.means_, rtol=0,
                    atol=np.spacing(np.float32(offset)))


def _far_apart_clusters(offset, n=200, d=3, seed=0):
    """Two clusters of unit spread at +offset and -offset in every feature."""
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(size=(n, d)) + offset, rng.normal(size=(n, d)) - offset])
    return X, np.repeat([0, 1], n)


def _tied_oracle(X, resp, reg_covar):
    """scikit-learn's pooled initial covariance from its definition, each component
    centred on its own mean: sum_k sum_i r_ik (x_i - mu_k)(x_i - mu_k)^T, plus
    x_i x_i^T for rows without responsibility (scikit-learn's X^T X counts them),
    over sum_k N_k (with scikit-learn's 10 eps)."""
    nk = resp.sum(axis=0) + 10 * np.finfo(np.float64).eps
    means = resp.T @ X / nk[:, None]
    cov = np.zeros((X.shape[1], X.shape[1]))
    for k in range(resp.shape[1]):
        diff = X - means[k]
        cov += (diff.T * resp[:, k]) @ diff
    unowned = X[resp.sum(axis=1) == 0]
    cov += unowned.T @ unowned
    return cov / nk.sum() + reg_covar * np.eye(X.shape[1])


@pytest.mark.parametrize("offset", [0.0, 1e8])
@pytest.mark.parametrize("kind", ["one_hot", "soft", "seeds"])
def test_tied_initial_covariance_against_oracle(offset, kind):
    """The pooled 'tied' covariance of the initialisation equals its definition for
    the responsibilities of k-means ('one_hot'), 'random' ('soft') and k-means++ /
    random_from_data ('seeds': one row per component, the rest without
    responsibility), also with clusters at +-1e8 of unit spread, where scikit-learn's
    X^T X - sum_k N_k mu_k mu_k^T cancels to nothing; near the origin it is
    scikit-learn's value. Inputs are not modified."""
    from sklearn.mixture._gaussian_mixture import _estimate_gaussian_covariances_tied

    from emgmm.mixture.initialization import parameters_from_responsibilities

    X, labels = _far_apart_clusters(offset)
    rng = np.random.default_rng(1)
    resp = np.zeros((len(X), 2))
    if kind == "one_hot":
        resp[np.arange(len(X)), labels] = 1.0
    elif kind == "soft":
        resp = rng.uniform(size=(len(X), 2))
        resp /= resp.sum(axis=1, keepdims=True)
    else:
        resp[[5, 250], [0, 1]] = 1.0
    X_before, resp_before = X.copy(), resp.copy()
    X.flags.writeable = resp.flags.writeable = False
    _, means, cov = parameters_from_responsibilities(X, resp, 1e-6, "tied")
    assert_array_equal(X, X_before)
    assert_array_equal(resp, resp_before)
    assert_allclose(cov, _tied_oracle(X, resp, 1e-6), rtol=1e-10)
    if offset == 0.0:
        nk = resp.sum(axis=0) + 10 * np.finfo(np.float64).eps
        sklearn_cov = _estimate_gaussian_covariances_tied(resp, X, nk, means, 1e-6)
        assert_allclose(cov, sklearn_cov, rtol=1e-10)
    if kind == "one_hot":  # the within-cluster spread, about the identity
        assert_allclose(cov, np.eye(3), atol=0.2)


def test_tied_kmeans_fit_of_clusters_far_apart():
    """'tied' from k-means on two clusters at +-1e8 of unit spread fits (scikit-learn
    fails here, with an 'ill-defined empirical covariance ... collapsed samples'
    message) and ends where a fit started from the exact parameters ends."""
    X, labels = _far_apart_clusters(1e8)
    got = quiet_fit(GaussianMixture(2, covariance_type="tied", random_state=0), X)
    means = np.stack([X[labels == k].mean(axis=0) for k in range(2)])
    diff = X - means[labels]
    cov = diff.T @ diff / len(X) + 1e-6 * np.eye(3)
    order = np.argsort(got.means_[:, 0])[::-1]  # the cluster at +1e8 first
    exact = quiet_fit(GaussianMixture(
        2, covariance_type="tied", weights_init=[0.5, 0.5], means_init=means,
        precisions_init=np.linalg.inv(cov)), X)
    assert_allclose(got.means_[order], exact.means_, rtol=1e-15)
    assert_allclose(got.covariances_, exact.covariances_, rtol=1e-9)
    assert_allclose(got.covariances_, cov, rtol=1e-9)
    assert got.lower_bound_ == pytest.approx(exact.lower_bound_, rel=1e-12)
    assert_array_equal(got.predict(X), order[labels])


@pytest.mark.parametrize("init_params", ["random", "k-means++", "random_from_data"])
def test_tied_initialisation_too_ill_conditioned_says_why(init_params):
    """The other initialisations pool the spread between the clusters at +-1e8 (or
    around the origin) into the one 'tied' covariance, which float64 cannot factor
    then: the error (scikit-learn's, which speaks of collapsed components) says so and
    points to 'kmeans'."""
    X, _ = _far_apart_clusters(1e8)
    gm = GaussianMixture(2, covariance_type="tied", init_params=init_params,
                         random_state=0)
    with pytest.raises(ValueError, match="ill-defined empirical covariance") as info:
        quiet_fit(gm, X)
    assert (f"one matrix pooled over all components, and init_params={init_params!r} "
            "pools the spread") in str(info.value)
    message = str(info.value)
    assert "init_params='kmeans' pools only the spread within clusters" in message


# ---------------------------------------------------------------------------- C11


@pytest.fixture(scope="module")
def c11_data():
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=4.0, size=(5, 4))
    return centers[rng.integers(5, size=1000)] + rng.standard_normal((1000, 4))


def _c11_init(X):
    """A fixed initialisation (independent of row order) for the permutation check."""
    rng = np.random.default_rng(1)
    means = X[rng.choice(len(X), 5, replace=False)]
    return dict(weights_init=np.full(5, 0.2), means_init=means,
                precisions_init=np.stack([np.eye(4) * 0.5] * 5))


C11_FIT = dict(n_components=5, tol=0.0, max_iter=10, random_state=0)


@pytest.fixture(scope="module")
def c11_reference(c11_data):
    return quiet_fit(GaussianMixture(**C11_FIT), c11_data)


def _assert_c11(gm, ref, rtol):
    # Another block size adds the same float64 terms in another order. Each sum then
    # moves by a few ulps of the size of its terms: for an off-diagonal covariance
    # entry that is the product of the two standard deviations, not the entry, which
    # can be 1e-5 of it. So "1e-12 relative" is measured against the largest entry of
    # each array (norm-wise), and elementwise wherever that is the stricter bound.
    for name in PARAMS:
        expected = np.asarray(getattr(ref, name))
        assert_allclose(getattr(gm, name), expected, rtol=rtol,
                        atol=rtol * np.abs(expected).max(), err_msg=name)
    assert_allclose(gm.lower_bounds_, ref.lower_bounds_, rtol=rtol)
    lb = np.asarray(gm.lower_bounds_)
    assert np.all(np.diff(lb) >= -1e-12 * np.abs(lb[1:]))


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 7, 128, 1000])
@pytest.mark.parametrize("kind", ["ndarray", "memmap", "npy", "h5", "h5_chunked"])
def test_case_c11_statistics_across_blocks(make_sources, c11_data, c11_reference, kind,
                                           block_size):
    if block_size == 1 and kind in ("npy", "h5"):
        pytest.skip("1-row blocks: covered by ndarray, memmap and h5_chunked "
                    "(run time)")
    src = make_sources.one(c11_data, kind)
    gm = quiet_fit(GaussianMixture(**C11_FIT, block_size=block_size), src.obj)
    _assert_c11(gm, c11_reference, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [7, 1000])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c11_rows_permuted(c11_data, covariance_type, block_size):
    X = c11_data
    perm = np.random.default_rng(3).permutation(len(X))
    kw = dict(C11_FIT, covariance_type=covariance_type, **_c11_init(X))
    if covariance_type != "full":
        P = kw["precisions_init"]
        kw["precisions_init"] = {"tied": P[0], "diag": np.diagonal(P, axis1=1, axis2=2),
                                 "spherical": P[:, 0, 0]}[covariance_type]
    ref = quiet_fit(GaussianMixture(**kw), X)
    gm = quiet_fit(GaussianMixture(**kw, block_size=block_size), X[perm])
    _assert_c11(gm, ref, rtol=1e-10)
    assert_array_equal(gm.predict(X[perm]), ref.predict(X)[perm])
