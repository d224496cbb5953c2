"""Property-based test (hypothesis) of the degenerate-component policy.

Small random data sets with duplicated rows, constant columns, scales from 1e-6 to
1e6, ``n_components`` close to ``n_samples``, float32 and float64. For every one the
fitted model has finite parameters, positive definite covariances with eigenvalues
>= reg_covar (within rounding), weights summing to one, and a lower bound that does
not decrease between iterations, except right after an iteration that re-seeded a
component. The one exception allowed is scikit-learn's ill-defined covariance error
when no component is left healthy to recover from.
"""

import warnings

import numpy as np
import pytest
from helpers import SKLEARN_COVARIANCE_TYPES, assert_valid_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emgmm import GaussianMixture


@st.composite
def data_sets(draw):
    n = draw(st.integers(2, 40))
    d = draw(st.integers(1, 4))
    n_unique = draw(st.integers(1, n))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_unique, d))
    if draw(st.booleans()):  # few distinct values per column: many ties
        X = np.round(X)
    X = X[rng.integers(n_unique, size=n)]  # duplicated rows
    constant = draw(st.lists(st.booleans(), min_size=d, max_size=d))
    X[:, constant] = draw(st.floats(-3, 3))
    scale = 10.0 ** draw(st.floats(-6, 6))
    offset = draw(st.sampled_from([0.0, 1.0, 100.0]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    X = ((X + offset) * scale).astype(dtype)
    k = max(1, n - draw(st.integers(0, 3)))  # close to n_samples
    covariance_type = draw(st.sampled_from(SKLEARN_COVARIANCE_TYPES))
    init_params = draw(st.sampled_from(["kmeans", "random_from_data", "random"]))
    return X, k, covariance_type, init_params


def penalty(gm, nk_share):
    """``reg_covar / 2 * sum_k (N_k / n) tr(Lambda_k)`` per sample, the term whose
    addition makes regularised EM monotone.

    The M step with ``Sigma_k = S_k / N_k + c I`` maximises the expected complete
    log-likelihood minus ``c / 2 * N_k tr(Sigma_k^{-1})`` (``N_k`` from the E step),
    so EM's minorisation argument gives, for the parameters ``theta_t`` entering an
    iteration and ``theta_{t+1}`` leaving it,
    ``L(theta_{t+1}) - L(theta_t) >= pen_t(theta_{t+1}) - pen_t(theta_t)``: the
    plain lower bound may go down by the change of this penalty. For 'diag' and
    'spherical', scikit-learn's ``10 eps`` on ``N_k`` adds ``mu_kj^2 10 eps / N_k``
    to ``c`` (see ``emgmm.covariance._m_step.m_step``).
    """
    ct = gm.covariance_type
    prec = np.asarray(gm.precisions_, dtype=np.float64)
    means = np.asarray(gm.means_, dtype=np.float64)
    reg = gm.reg_covar
    eps = np.finfo(np.float64).eps
    n = gm._n_train
    if ct == "full":
        return reg / 2 * np.sum(nk_share * np.trace(prec, axis1=1, axis2=2))
    if ct == "tied":
        return reg / 2 * np.trace(prec)
    c = reg + means**2 * 10 * eps / np.maximum(nk_share * n, eps)[:, None]
    if ct == "diag":
        return 0.5 * np.sum(nk_share[:, None] * c * prec)
    return 0.5 * np.sum(nk_share * c.mean(axis=1) * prec * means.shape[1])


def iterate(gm, X, n_iter):
    """EM one iteration at a time (warm starts), keeping every iterate."""
    gm.set_params(warm_start=True, max_iter=1)
    gm._n_train = X.shape[0]
    steps = []
    for _ in range(n_iter):
        before = {name: getattr(gm, name, None) for name in ("precisions_", "means_")}
        gm.fit(X)
        steps.append((before, gm.lower_bounds_[0], gm.history_[0]["reseeded"],
                      gm.weights_.astype(np.float64).copy(),
                      {"precisions_": gm.precisions_, "means_": gm.means_}))
        assert_valid_model(gm)
    return steps


class _View:
    """Enough of an estimator for :func:`penalty`."""

    def __init__(self, gm, params):
        self.covariance_type = gm.covariance_type
        self.reg_covar = gm.reg_covar
        self._n_train = gm._n_train
        self.precisions_ = params["precisions_"]
        self.means_ = params["means_"]


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data_sets())
def test_policy_properties(case):
    X, k, covariance_type, init_params = case
    gm = GaussianMixture(k, covariance_type=covariance_type, init_params=init_params,
                         random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            steps = iterate(gm, X, 12)
        except ValueError as exc:
            assert "ill-defined empirical covariance" in str(exc)
            assert "increase reg_covar" in str(exc)
            return
    assert gm.means_.dtype == X.dtype
    eps = np.finfo(X.dtype).eps
    d = X.shape[1]
    # A variance S/N - shift^2 is rounded by about eps * max|x|^2 (it is computed
    # from squares of the data), which moves log(sigma^2) by that over sigma^2 >=
    # reg_covar for each of d dimensions: where components hold single points the
    # lower bound is only defined to that precision.
    variance_rounding = 4 * d * eps * float(np.abs(X).max()) ** 2 / gm.reg_covar
    # steps[t] = (theta_t, L(theta_t), re-seeded in iteration t, N^{(t)}/n, theta_{t+1})
    # (theta_0, the initialisation, is not kept: start at t = 1)
    for t in range(1, len(steps) - 1):
        theta_t, lb_t, reseeded, nk_share, theta_next = steps[t]
        lb_next = steps[t + 1][1]
        if reseeded:
            continue
        gain = (penalty(_View(gm, theta_next), nk_share)
                - penalty(_View(gm, theta_t), nk_share))
        tol = 8 * d * eps * (1.0 + abs(lb_t)) + variance_rounding
        assert lb_next - lb_t >= gain - tol, (t, lb_t, lb_next, gain)
    proba = gm.predict_proba(X)
    assert np.all(np.isfinite(proba))
    # rows of K responsibilities: exp(log r) is rounded relative to the size of the
    # log-densities it is normalised by, then to the data's dtype
    size = 1.0 + np.abs(gm.score_samples(X)).max()
    rtol = 32 * k * size * np.finfo(proba.dtype).eps
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=rtol)
