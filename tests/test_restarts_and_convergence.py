"""n_init, warm starts and tol: which run is kept, what the lower bounds mean, when a
fit has converged (CASES.md C01-C03).

emgmm semantics used below (documented in the estimator, differing from sklearn on
purpose from C02 on): ``lower_bounds_[i]`` is the mean log-likelihood computed in the E
step of iteration ``i + 1`` (sklearn's meaning); ``lower_bound_`` is the mean
log-likelihood of the returned parameters, i.e. ``score(X)``; ``n_init`` keeps the run
with the best ``lower_bound_``; a warm start on new data runs at least 2 iterations.
"""

import re

import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    dense_covariances,
    quiet_fit,
    quiet_fit_predict,
    type_settings,
)
from numpy.testing import assert_allclose, assert_array_equal
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from emgmm import GaussianMixture


def oracle_log_resp(gm, X):
    """log w_k + log N(x | mu_k, Sigma_k) normalised, with scipy from covariances_."""
    covs = dense_covariances(gm)
    lp = np.stack(
        [multivariate_normal(m, c).logpdf(X) for m, c in zip(gm.means_, covs,
                                                             strict=False)], axis=1
    ).reshape(len(X), -1) + np.log(gm.weights_)
    norm = logsumexp(lp, axis=1)
    return norm, lp - norm[:, None]


@pytest.mark.parametrize("max_iter", [2, 100])
@pytest.mark.parametrize("n_init", [1, 5])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c01_fit_predict_equals_fit_then_predict(covariance_type, n_init,
                                                      max_iter):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 5))
    for seed in ((0, 1) if max_iter == 2 else (0,)):
        kw = dict(n_components=5, n_init=n_init, max_iter=max_iter, random_state=seed,
                  **type_settings(covariance_type, X.shape[1]))
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
def test_case_c02_warm_start_on_new_data_runs_two_iterations(covariance_type, shift):
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


def test_case_c03_tol_bounds_the_change_of_the_mean_log_likelihood(c03_data):
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


@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("covariance_type, params", [("diag", {}),
                                                     ("factor", {"n_factors": 1})])
def test_records_count_the_pass_that_sums_the_statistics_again(covariance_type,
                                                               params, schedule):
    """A tight cluster at 1e4 (standard deviation 1e-3) whose starting mean is 1
    away: the first M step's subtraction of that shift would lose every digit of
    its variances, so the first iteration sums its statistics again around the
    new means (2 passes); the next ones start from there (1 pass). The lower
    bound does not decrease."""
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(size=(200, 4)),
                        1e4 + rng.normal(scale=1e-3, size=(200, 4))])
    gm = GaussianMixture(2, covariance_type=covariance_type, max_iter=4, tol=0.0,
                         means_init=[np.zeros(4), np.full(4, 1e4 - 1.0)],
                         reg_covar=1e-12, random_state=0, schedule=schedule,
                         **params)
    quiet_fit(gm, X)
    assert [h["passes"] for h in gm.history_] == [2, 1, 1, 1]
    assert np.all(np.diff(gm.lower_bounds_) >= 0.0)
