"""Floating point: float32 fits whose variances would round below zero, data far
from the origin, 'tied' initialisations of clusters far apart, and data beyond the
range of the compute dtype (CASES.md C07).
"""

import warnings

import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    assert_variances_at_least,
    quiet_fit,
    type_settings,
    variances,
)
from numpy.testing import assert_allclose, assert_array_equal

from emgmm import GaussianMixture
from emgmm.covariance import get_covariance_type


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c07_two_float32_points_keep_variances_above_reg_covar(covariance_type):
    X32 = np.array([[9999.0], [0.0]], dtype=np.float32)
    kw = dict(n_components=2, reg_covar=0.1, random_state=0,
              **type_settings(covariance_type, X32.shape[1]))
    g32 = quiet_fit(GaussianMixture(**kw), X32)
    g64 = quiet_fit(GaussianMixture(**kw), X32.astype(np.float64))
    for gm in (g32, g64):
        assert_variances_at_least(gm, 0.1)
        assert np.all(np.isfinite(gm.means_)) and np.all(np.isfinite(gm.precisions_))
        assert_allclose(np.sort(gm.means_.ravel()), [0.0, 9999.0], rtol=1e-5, atol=1e-5)
    order32, order64 = np.argsort(g32.means_.ravel()), np.argsort(g64.means_.ravel())
    assert_allclose(g32.means_[order32], g64.means_[order64], rtol=1e-5, atol=1e-5)
    assert_allclose(g32.weights_[order32], g64.weights_[order64], rtol=1e-5)
    if not get_covariance_type(covariance_type).shared:
        assert_allclose(g32.covariances_[order32], g64.covariances_[order64], rtol=1e-5)
    else:
        assert_allclose(g32.covariances_, g64.covariances_, rtol=1e-5)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c07_exact_copies_far_apart_float32(covariance_type):
    locs = np.array([0.0, 1e3, 1e4])
    X32 = np.repeat(locs, 50).reshape(-1, 1).astype(np.float32)
    kw = dict(n_components=3, reg_covar=0.1, random_state=0,
              **type_settings(covariance_type, X32.shape[1]))
    g32 = quiet_fit(GaussianMixture(**kw), X32)
    g64 = quiet_fit(GaussianMixture(**kw), X32.astype(np.float64))
    for gm in (g32, g64):
        assert_variances_at_least(gm, 0.1)
        got = np.sort(gm.means_.ravel()).astype(np.float64)
        # relative 1e-5 at 1e3 and 1e4; the location 0 to 1e-5 absolute (1e-9 of the
        # range)
        assert_allclose(got, locs, rtol=1e-5, atol=1e-5)
        assert_allclose(np.sort(gm.weights_), [1 / 3] * 3, rtol=1e-5)
    o32, o64 = np.argsort(g32.means_.ravel()), np.argsort(g64.means_.ravel())
    assert_allclose(g32.means_[o32], g64.means_[o64], rtol=1e-5, atol=1e-5)
    if not get_covariance_type(covariance_type).shared:
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
    kw = dict(n_components=2, reg_covar=1e-6, random_state=0,
              **type_settings(covariance_type, X32.shape[1]))
    g32 = quiet_fit(GaussianMixture(**kw), X32)
    g64 = quiet_fit(GaussianMixture(**kw), X32.astype(np.float64))
    o32, o64 = np.argsort(g32.means_.ravel()), np.argsort(g64.means_.ravel())
    assert_allclose(g32.means_[o32], g64.means_[o64], rtol=1e-7)
    v32, v64 = variances(g32), variances(g64)
    if not get_covariance_type(covariance_type).shared:
        v32, v64 = v32[o32], v64[o64]
    # the variance (~2.5e-3) of data whose float32 spacing is ~1e-3: rounding of x - mu
    # in float32 is <= u * |mu| ~ 6e-4 per row, unbiased; 1e-2 relative is a few times
    # that effect averaged over 200 rows, far below the 1e4 ** 2 * u ~ 6 of E[x^2]-mu^2.
    assert_allclose(v32, v64, rtol=1e-2)
    assert np.all(v32 > 0)


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
    kw = dict(n_components=2, tol=0.0, max_iter=20,
              means_init=X[[0, 600]].astype(np.float64), random_state=0,
              **type_settings(covariance_type, X.shape[1]))
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

    from emgmm._mixture.initialization import parameters_from_responsibilities

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


@pytest.mark.parametrize("dtype,scale,match", [
    (np.float32, 1e20, "does not fit in float32 attributes"),
    (np.float64, 1e160, "not finite: the data's variances overflow float64")])
def test_data_beyond_the_dtypes_range_is_refused_before_the_first_pass(dtype, scale,
                                                                     match):
    rng = np.random.default_rng(0)
    X = (np.vstack([rng.normal(c, 1.0, (300, 3)) for c in (0, 6, 12)]) * scale)
    X = X.astype(dtype)
    iterations = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one numpy RuntimeWarning on the way
        with pytest.raises(ValueError, match=match):
            GaussianMixture(3, random_state=0,
                            callback=lambda record: iterations.append(record)).fit(X)
    assert iterations == []


def test_clusters_far_apart_but_tight_are_not_refused():
    """The check is on the components' variances, not the data's spread: float32
    clusters at -1e20 and +1e20 with unit spread fit float32 attributes."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, (300, 2)) for c in (-1e20, 1e20)]).astype(
        np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            GaussianMixture(2, random_state=0, max_iter=3).fit(X)
        except ValueError as exc:
            assert "does not fit in float32 attributes" not in str(exc)
