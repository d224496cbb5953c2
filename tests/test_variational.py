"""The variational Bayes updates of emgmm._engine.variational against scikit-learn's
BayesianGaussianMixture (the oracle), from the same responsibilities.

scikit-learn is only used through its public estimator: the initial posterior is its
``max_iter=0`` fit from ``init_params='random'`` (whose responsibilities are rebuilt
here from the same random state), the E step's weighted log-probabilities are
``log predict_proba + score_samples``, and the lower bounds are ``lower_bounds_``.
emgmm's side is a reference loop over row blocks: blocked statistics centred on the
previous means, emgmm's log-density kernels plus the per-component offsets.
"""

import numpy as np
import pytest
from helpers import SKLEARN_VARIATIONAL_COVARIANCE_TYPES, make_blobs_data
from numpy.testing import assert_allclose
from scipy.special import logsumexp, xlogy
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture as SkBayesianGaussianMixture

from emgmm._engine.variational import (
    PRIOR_TYPES,
    DataMoments,
    VariationalModel,
    block_moments,
    log_prob_offsets,
    lower_bound,
    resolve_priors,
    resp_log_resp,
    update_posterior,
)
from emgmm._mixture.initialization import initial_responsibilities
from emgmm.covariance._log_density import log_gaussian_prob
from emgmm.covariance._m_step import m_step
from emgmm.covariance._statistics import block_statistics

K = 3
BLOCKS = (0, 37, 38, 200)  # starts of uneven row blocks, one of a single row
ATTRIBUTES = ("mean_precision_", "means_", "degrees_of_freedom_", "covariances_",
              "precisions_cholesky_", "weights_")


@pytest.fixture(scope="module")
def data():
    return make_blobs_data(311, 3, 3, spread=4.0, seed=3)


def _blocks(X):
    ends = BLOCKS[1:] + (len(X),)
    return [X[a:b] for a, b in zip(BLOCKS, ends, strict=False)]


def _moments(X, full):
    total = DataMoments(0, np.zeros(X.shape[1]), np.zeros(()))
    for block in _blocks(X):
        total = total + block_moments(block, full)
    return total


def _priors(X, covariance_type, prior_type, **given):
    return resolve_priors(_moments(X, covariance_type in ("full", "tied")), K,
                          covariance_type, prior_type, **given)


def _sklearn(covariance_type, prior_type, max_iter, seed=0, **given):
    return SkBayesianGaussianMixture(
        n_components=K, covariance_type=covariance_type,
        weight_concentration_prior_type=prior_type, init_params="random",
        random_state=seed, max_iter=max_iter, tol=0.0, **given)


def _statistics(X, resp_blocks, centers, covariance_type):
    stats = None
    for block, resp in zip(_blocks(X), resp_blocks, strict=False):
        part = block_statistics(block, resp, centers, covariance_type)
        stats = part if stats is None else stats + part
    return stats


def _e_step(X, params, priors, covariance_type):
    """Statistics around the means from emgmm's kernels plus the offsets, and
    ``sum r log r`` from them and (the oracle) from the responsibilities."""
    offsets = log_prob_offsets(params, priors.weight_concentration_prior_type,
                               covariance_type, X.shape[1])
    resp_blocks, log_likelihood, direct = [], 0.0, 0.0
    for block in _blocks(X):
        weighted = log_gaussian_prob(block, params.means, params.precisions_cholesky,
                                     covariance_type) + offsets
        log_norm = logsumexp(weighted, axis=1)
        resp = np.exp(weighted - log_norm[:, None])
        resp_blocks.append(resp)
        log_likelihood += log_norm.sum()
        direct += np.sum(xlogy(resp, resp))
    stats = _statistics(X, resp_blocks, params.means, covariance_type)
    stats.log_likelihood = log_likelihood
    entropy = resp_log_resp(stats, params.means, offsets, params.means,
                            params.precisions_cholesky, covariance_type)
    # the two differ by the rounding of sum r a ~ n |log N| (1e-16 of it here)
    assert entropy == pytest.approx(direct, rel=1e-9, abs=1e-14 * abs(log_likelihood))
    return stats, entropy


def update_from_statistics(stats, centers, reg_covar, priors, covariance_type):
    """The posterior from summed statistics around ``centers`` (as the estimator's
    update rule, without its recentring pass)."""
    _, xk, sk = m_step(stats, centers, reg_covar, covariance_type)
    return update_posterior(stats.nk + 10 * np.finfo(np.float64).eps, xk, sk, priors,
                            covariance_type)


def _initial(X, priors, covariance_type, seed):
    resp = initial_responsibilities(X, K, "random", np.random.RandomState(seed))
    centers = X[:K].astype(np.float64)  # any centres: the statistics are shifted
    resp_blocks = _blocks(resp)
    stats = _statistics(X, resp_blocks, centers, covariance_type)
    return update_from_statistics(stats, centers, 1e-6, priors, covariance_type)


def _fit_reference(X, covariance_type, prior_type, n_iter, seed=0, **given):
    priors = _priors(X, covariance_type, prior_type, **given)
    params = _initial(X, priors, covariance_type, seed)
    bounds = []
    for _ in range(n_iter):
        stats, entropy = _e_step(X, params, priors, covariance_type)
        params = update_from_statistics(stats, params.means, 1e-6, priors,
                                        covariance_type)
        bounds.append(lower_bound(params, entropy, prior_type, covariance_type,
                                  X.shape[1]))
    return params, bounds


def _bounds(sk):
    """``lower_bounds_`` as floats: with 'tied', scikit-learn 1.9.1's are arrays of
    shape (1,) (its ``_log_wishart_norm`` of a scalar ``nu``)."""
    return [float(np.ravel(b)[0]) for b in sk.lower_bounds_]


def _assert_same_posterior(params, sk, prior_type, rtol):
    if prior_type == "dirichlet_process":
        for mine, theirs in zip(params.weight_concentration, sk.weight_concentration_,
                                strict=False):
            assert_allclose(mine, theirs, rtol=rtol)
    else:
        assert_allclose(params.weight_concentration, sk.weight_concentration_,
                        rtol=rtol)
    mine = {
        "mean_precision_": params.mean_precision,
        "means_": params.means,
        "degrees_of_freedom_": params.degrees_of_freedom,
        "covariances_": params.covariances,
        "precisions_cholesky_": params.precisions_cholesky,
        "weights_": params.weights,
    }
    for name in ATTRIBUTES:
        theirs = getattr(sk, name)
        assert np.shape(mine[name]) == np.shape(theirs), name
        scale = np.max(np.abs(theirs))
        assert_allclose(mine[name], theirs, rtol=rtol, atol=rtol * scale,
                        err_msg=name)


def test_moments_merged_over_blocks_equal_the_whole_array(data):
    full = _moments(data, True)
    diag = _moments(data, False)
    assert full.n_samples == diag.n_samples == len(data)
    assert_allclose(full.mean, data.mean(axis=0), rtol=1e-13)
    assert_allclose(full.scatter / (len(data) - 1), np.cov(data.T), rtol=1e-12)
    assert_allclose(diag.scatter / (len(data) - 1), np.var(data, axis=0, ddof=1),
                    rtol=1e-12)
    assert_allclose(diag.mean, full.mean, rtol=0)


def test_moments_of_data_far_from_the_origin_keep_their_spread():
    # the one-pass E[x^2] - mean^2 would leave nothing of a unit spread at 1e9
    rng = np.random.default_rng(1)
    X = 1e9 + rng.normal(size=(500, 2))
    # (to the rounding of the float64 copies at 1e9, 6e-8 absolute)
    assert_allclose(_moments(X, True).scatter / 499, np.cov(X.T), rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_default_priors_equal_sklearn(data, covariance_type):
    sk = _sklearn(covariance_type, "dirichlet_process", 0).fit(data)
    priors = _priors(data, covariance_type, "dirichlet_process")
    assert priors.weight_concentration_prior == sk.weight_concentration_prior_
    assert priors.mean_precision_prior == sk.mean_precision_prior_
    assert priors.degrees_of_freedom_prior == sk.degrees_of_freedom_prior_
    assert_allclose(priors.mean_prior, sk.mean_prior_, rtol=1e-13)
    assert np.shape(priors.covariance_prior) == np.shape(sk.covariance_prior_)
    assert_allclose(priors.covariance_prior, sk.covariance_prior_, rtol=1e-12)


def test_given_priors_are_kept_and_a_small_dof_is_refused(data):
    given = {"weight_concentration_prior": 0.3, "mean_precision_prior": 2.0,
             "mean_prior": [1.0, 2.0, 3.0], "degrees_of_freedom_prior": 4.5,
             "covariance_prior": np.array([0.5, 1.0, 2.0])}
    priors = _priors(data, "diag", "dirichlet_distribution", **given)
    assert priors.weight_concentration_prior == 0.3
    assert priors.mean_precision_prior == 2.0
    assert priors.degrees_of_freedom_prior == 4.5
    assert_allclose(priors.mean_prior, [1.0, 2.0, 3.0], rtol=0)
    assert_allclose(priors.covariance_prior, [0.5, 1.0, 2.0], rtol=0)
    with pytest.raises(ValueError, match="should be greater than 2, but got 2.000"):
        _priors(data, "full", "dirichlet_process", degrees_of_freedom_prior=2.0)


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_initial_posterior_equals_sklearn(data, covariance_type, prior_type):
    sk = _sklearn(covariance_type, prior_type, 0, seed=5).fit(data)
    priors = _priors(data, covariance_type, prior_type)
    params = _initial(data, priors, covariance_type, seed=5)
    _assert_same_posterior(params, sk, prior_type, 1e-10)


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_offsets_and_kernels_give_sklearn_weighted_log_prob(data, covariance_type,
                                                            prior_type):
    with pytest.warns(ConvergenceWarning):
        sk = _sklearn(covariance_type, prior_type, 3, seed=1).fit(data)
    params = VariationalModel(sk.weights_, sk.means_, sk.covariances_,
                              sk.precisions_cholesky_, covariance_type,
                              weight_concentration=sk.weight_concentration_,
                              mean_precision=sk.mean_precision_,
                              degrees_of_freedom=sk.degrees_of_freedom_)
    offsets = log_prob_offsets(params, prior_type, covariance_type, data.shape[1])
    mine = log_gaussian_prob(data, sk.means_, sk.precisions_cholesky_,
                             covariance_type) + offsets
    proba = sk.predict_proba(data)
    kept = proba > 1e-200  # log(predict_proba) is exact to rounding there
    assert kept.sum() > len(data)
    theirs = np.log(proba, where=kept, out=np.zeros_like(proba)) \
        + sk.score_samples(data)[:, None]
    assert_allclose(mine[kept], theirs[kept], rtol=1e-11, atol=1e-10)
    assert_allclose(logsumexp(mine, axis=1), sk.score_samples(data), rtol=1e-12)


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_blocked_iterations_equal_sklearn(data, covariance_type, prior_type):
    n_iter = 6
    with pytest.warns(ConvergenceWarning):
        sk = _sklearn(covariance_type, prior_type, n_iter, seed=2).fit(data)
    params, bounds = _fit_reference(data, covariance_type, prior_type, n_iter, seed=2)
    assert_allclose(bounds, _bounds(sk), rtol=1e-10)
    _assert_same_posterior(params, sk, prior_type, 1e-10)


@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_given_priors_iterate_as_sklearn(data, covariance_type):
    d = data.shape[1]
    cov = {"full": np.eye(d) * 2.0 + 0.3, "tied": np.eye(d) * 2.0 + 0.3,
           "diag": np.array([0.5, 1.0, 2.0]), "spherical": 1.5}[covariance_type]
    given = {"weight_concentration_prior": 5.0, "mean_precision_prior": 0.2,
             "mean_prior": [0.5, -1.0, 2.0], "degrees_of_freedom_prior": 3.5,
             "covariance_prior": cov}
    with pytest.warns(ConvergenceWarning):
        sk = _sklearn(covariance_type, "dirichlet_distribution", 4, seed=4,
                      **given).fit(data)
    params, bounds = _fit_reference(data, covariance_type, "dirichlet_distribution", 4,
                                    seed=4, **given)
    assert_allclose(bounds, _bounds(sk), rtol=1e-10)
    _assert_same_posterior(params, sk, "dirichlet_distribution", 1e-10)


@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_resp_log_resp_from_statistics_around_any_centres(data, covariance_type):
    """Centres away from the means, some responsibilities exactly zero."""
    rng = np.random.default_rng(7)
    means = data[[3, 50, 100]] + rng.normal(size=(K, 3))
    log_weights = np.log([0.2, 0.3, 0.5])
    u = {"full": np.triu(rng.normal(size=(K, 3, 3)) * 0.2) + np.eye(3),
         "tied": np.triu(rng.normal(size=(3, 3)) * 0.2) + np.eye(3),
         "diag": rng.uniform(0.5, 2.0, size=(K, 3)),
         "spherical": rng.uniform(0.5, 2.0, size=K)}[covariance_type]
    weighted = log_gaussian_prob(data, means, u, covariance_type) + log_weights
    weighted[:10, 1] = -np.inf
    log_norm = logsumexp(weighted, axis=1)
    resp = np.exp(weighted - log_norm[:, None])
    centers = means + rng.normal(size=(K, 3))
    stats = block_statistics(data, resp, centers, covariance_type)
    stats.log_likelihood = log_norm.sum()
    direct = np.sum(xlogy(resp, resp))
    mine = resp_log_resp(stats, centers, log_weights, means, u, covariance_type)
    assert mine == pytest.approx(direct, rel=1e-10, abs=1e-14 * abs(log_norm.sum()))
