"""Degenerate components: the 'reinit' and 'raise' policies of ``on_degenerate``."""

import warnings

import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    PARAMS,
    SKLEARN_COVARIANCE_TYPES,
    assert_bound_monotone,
    assert_valid_model,
    assert_variances_at_least,
    min_eigenvalues,
    not_converging,
    type_settings,
)
from numpy.testing import assert_allclose
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from emgmm import GaussianMixture
from emgmm._engine import degenerate
from emgmm._engine.degenerate import initial_factors, reseed
from emgmm._engine.passes import Worst, smallest
from emgmm.covariance._cholesky import factorize

DUPLICATES = np.repeat([[0.0, 0.0], [10.0, 10.0]], 500, axis=0)


def fit_recording(gm, X):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm.fit(X)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_case_c08_duplicates_reinit(covariance_type):
    gm = GaussianMixture(5, covariance_type=covariance_type, random_state=0)
    messages = fit_recording(gm, DUPLICATES)
    assert_valid_model(gm)
    assert_bound_monotone(gm)
    proba = gm.predict_proba(DUPLICATES)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    reseeds = [(h["n_iter"], h["reseeded"]) for h in gm.history_ if h["reseeded"]]
    assert reseeds, "three of five components must starve on two distinct points"
    for n_iter, components in reseeds:
        assert any(f"EM iteration {n_iter}: components {components}" in m
                   for m in messages)
    # every re-seeded component sits on a data point, none at an arbitrary place
    for mean in gm.means_:
        assert np.min(np.abs(mean - [[0.0, 0.0], [10.0, 10.0]]).max(axis=1)) < 1e-6


def test_raise_gives_sklearn_error_naming_component():
    """The same message as scikit-learn, with the component added. (The initial
    covariances come from k-means labels, whose order depends on the seed: without
    a random_state the singleton was component 0 in ~3% of runs.)"""
    X = np.vstack([np.random.default_rng(0).normal(size=(50, 2)), [[30.0, 30.0]]])
    means = np.array([[0.0, 0.0], [30.0, 30.0]])
    kw = dict(covariance_type="full", reg_covar=0.0, means_init=means, max_iter=5,
              random_state=0)
    with pytest.raises(ValueError) as sk_info:
        SkGaussianMixture(2, **kw).fit(X)
    gm = GaussianMixture(2, on_degenerate="raise", **kw)
    with pytest.raises(ValueError) as info:
        gm.fit(X)
    message = str(info.value)
    assert "(component 1)" in message
    assert message.replace(" (component 1)", "") == str(sk_info.value)
    assert not hasattr(gm, "weights_")


def test_reinit_of_the_same_case():
    X = np.vstack([np.random.default_rng(0).normal(size=(50, 2)), [[30.0, 30.0]]])
    gm = GaussianMixture(2, reg_covar=0.0, means_init=[[0.0, 0.0], [30.0, 30.0]],
                         max_iter=50, random_state=0)
    messages = fit_recording(gm, X)
    assert gm.history_[0]["reseeded"] == [1]
    assert any("components [1]" in m and "reg_covar" in m for m in messages)
    assert_valid_model(gm)


@pytest.mark.parametrize("on_degenerate", ["reinit", "raise"])
def test_degenerate_initialisation(on_degenerate):
    """k-means puts 2 identical points in a cluster of its own: singular with
    reg_covar=0 before the first iteration."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(size=(100, 3)), np.full((2, 3), 50.0)])
    gm = GaussianMixture(2, reg_covar=0.0, random_state=0, on_degenerate=on_degenerate)
    if on_degenerate == "raise":
        with pytest.raises(ValueError, match=r"component 1"):
            gm.fit(X)
        return
    messages = fit_recording(gm, X)
    assert any(m.startswith("Initialisation: components [1]") for m in messages)
    assert_valid_model(gm)


def test_tied_not_positive_definite_raises_in_both_policies():
    X = np.tile([[1.0, 2.0, 3.0]], (20, 1)) + np.arange(20)[:, None] * [1.0, 1.0, 0.0]
    for policy in ("reinit", "raise"):
        with pytest.raises(ValueError, match="ill-defined empirical covariance"):
            GaussianMixture(2, covariance_type="tied", reg_covar=0.0,
                            on_degenerate=policy, random_state=0).fit(X)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_factorize_flags_singular_and_overflowing(covariance_type):
    d = 3
    good = {"full": np.eye(d), "tied": np.eye(d), "diag": np.ones(d),
            "spherical": 1.0}[covariance_type]
    tiny = {"full": 1e-310 * np.eye(d), "tied": 1e-310 * np.eye(d),
            "diag": np.array([1.0, 1e-310, 1.0]), "spherical": 1e-310}[covariance_type]
    singular = {"full": np.zeros((d, d)), "tied": np.zeros((d, d)),
                "diag": np.array([1.0, 0.0, 1.0]), "spherical": 0.0}[covariance_type]
    if covariance_type == "tied":
        for cov, bad in ((good, []), (tiny, [0]), (singular, [0])):
            u, got = factorize(np.array(cov), "tied")
            assert got == bad
        return
    cov = np.array([good, tiny, singular, good])
    u, bad = factorize(cov, covariance_type)
    assert bad == [1, 2]
    assert np.all(np.isfinite(u[[0, 3]])) and np.all(np.isnan(u[[1, 2]]))
    # float32 storage: the precision 1e40 of a 1e-40 variance overflows float32
    cov32 = np.array([good, good * 1e-40, good])
    assert factorize(cov32, covariance_type, np.float32)[1] == [1]
    assert factorize(cov32, covariance_type, np.float64)[1] == []


def test_reseed_prefers_unused_rows_and_pools_covariances():
    K, d = 3, 2
    weights = np.array([0.5, 0.5, 0.0])
    means = np.zeros((K, d))
    covs = np.array([np.eye(d), 3 * np.eye(d), np.zeros((d, d))])
    worst = Worst(3, np.array([-9.0, -8.0, -7.0]), np.array([11, 12, 13]),
                  np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]))
    used = [11]
    done = reseed(weights, means, covs, [2], worst, "full", used)
    assert done == [2]
    np.testing.assert_array_equal(means[2], [2.0, 2.0])  # row 11 was used before
    np.testing.assert_allclose(covs[2], 2 * np.eye(d))  # weighted pool of healthy ones
    assert used == [11, 12]
    np.testing.assert_allclose(weights.sum(), 1.0)
    np.testing.assert_allclose(weights, np.array([0.5, 0.5, 1 / 3]) / (1 + 1 / 3))


def test_reseed_tied_keeps_the_shared_covariance():
    weights = np.array([0.6, 0.4 - 1e-18, 1e-18])
    means = np.zeros((3, 2))
    cov = 2 * np.eye(2)
    worst = Worst(1, np.array([-5.0]), np.array([4]), np.array([[7.0, 8.0]]))
    assert reseed(weights, means, cov, [2], worst, "tied", []) == [2]
    np.testing.assert_array_equal(means[2], [7.0, 8.0])
    np.testing.assert_array_equal(cov, 2 * np.eye(2))


def test_initial_factors_pools_healthy_covariances():
    covs = np.array([np.eye(2), np.zeros((2, 2)), 3 * np.eye(2)])
    with pytest.warns(UserWarning, match=r"Initialisation: components \[1\]"):
        u = initial_factors(covs, "full", "reinit")
    np.testing.assert_allclose(covs[1], 2 * np.eye(2))
    np.testing.assert_allclose(u[1] @ u[1].T, np.linalg.inv(covs[1]))
    with pytest.raises(ValueError, match="component 0"):
        initial_factors(np.zeros((2, 2, 2)), "full", "reinit")


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_component_collapsed_is_a_clear_error(dtype, covariance_type):
    """Case C07's data with reg_covar=0: every cluster is one exact point. When no
    component is healthy to recover from, even 'reinit' raises scikit-learn's error
    (it suggests reg_covar); when rounding leaves positive variances the model is
    valid. Never a NaN model."""
    X = np.repeat([[0.0], [1e3], [1e4]], 50, axis=0).astype(dtype)
    gm = GaussianMixture(3, covariance_type=covariance_type, reg_covar=0.0,
                         random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            gm.fit(X)
        except ValueError as exc:
            assert "ill-defined empirical covariance" in str(exc)
            assert "increase reg_covar" in str(exc)
            assert not hasattr(gm, "weights_")
        else:
            assert_valid_model(gm)
    gm.set_params(reg_covar=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(X)
    assert gm.means_.dtype == dtype
    assert_valid_model(gm)


def test_smallest_equals_stable_argsort():
    """The worst rows are picked by one partition; the choice (ties in row order,
    NaN last, -inf first) must equal a stable sort's."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(1, 60))
        values = rng.integers(0, 5, size=n).astype(float)  # many ties
        if rng.random() < 0.3:
            values[rng.integers(n)] = np.nan
        if rng.random() < 0.3:
            values[rng.integers(n)] = -np.inf
        size = int(rng.integers(0, n + 3))
        np.testing.assert_array_equal(smallest(values, size),
                                      np.argsort(values, kind="stable")[:size])


@pytest.mark.parametrize("case", ["shift 1e-2, reg 1e-20",
                                  "at 1000, shift 1, reg 1e-6"])
@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_tight_component_whose_mean_moves_far_keeps_its_variance(covariance_type,
                                                                 schedule, case):
    """A component of spread 1e-8 whose mean moves by 1e-2 in one M step: summed
    around the old mean, its variance (1e-16) is lost to the subtraction of the
    squared shift (1e-4); or one at 1000 whose mean moves by 0.99, where the rounding
    of the shift itself (~1e-13) costs the regularised variance (1e-6) its digits.
    emgmm sums that pass again around the new means. Oracle: the two-pass weighted
    variance of the same responsibilities (scikit-learn's E step from the same
    start)."""
    rng = np.random.default_rng(0)
    if case.startswith("shift"):
        X = np.concatenate([5 + 1e-8 * rng.standard_normal(500),
                            rng.standard_normal(500)])[:, None]
        weights, means, reg, prec = [0.5, 0.5], [[5.01], [0.0]], 1e-20, 1e4
    else:
        X = np.concatenate([1000 + 1e-8 * rng.standard_normal(300),
                            rng.standard_normal(300)])[:, None]
        weights, means, reg, prec = [0.1, 0.9], [[1000.99], [0.0]], 1e-6, 1.0
    precisions = {"full": [[[prec]], [[1.0]]], "diag": [[prec], [1.0]],
                  "spherical": [prec, 1.0], "tied": [[1.0]]}[covariance_type]
    kw = dict(n_components=2, covariance_type=covariance_type, reg_covar=reg,
              max_iter=1, tol=0.0, weights_init=np.array(weights),
              means_init=np.array(means), precisions_init=np.array(precisions))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = GaussianMixture(**kw, schedule=schedule).fit(X)
        sk = SkGaussianMixture(**kw)
        sk._initialize_parameters(X, np.random.RandomState(0))
    _, log_resp = sk._e_step(X)
    resp = np.exp(log_resp)
    nk = resp.sum(axis=0)
    means = resp.T @ X / nk[:, None]
    var = np.array([resp[:, k] @ (X[:, 0] - means[k, 0]) ** 2 / nk[k]
                    for k in range(2)])
    if covariance_type == "tied":
        var = np.array([(var * nk).sum() / nk.sum()])
    var += reg
    assert gm.history_[0]["reseeded"] == []
    np.testing.assert_allclose(np.ravel(gm.covariances_), var, rtol=1e-6 if reg < 1e-6
                               else 1e-9)
    np.testing.assert_allclose(gm.means_, means, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_components_starving_again_are_kept_and_the_fit_converges(covariance_type):
    """Components with less than a thousandth of one sample's weight (started far
    from the data, with many components for the rows) are re-seeded once; starving
    again, they are kept (as scikit-learn keeps them), so the fit converges instead
    of re-seeding on every iteration."""
    X = np.random.default_rng(0).normal(size=(40, 4))
    means = np.concatenate([X[:20], np.full((10, 4), 1e3)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = GaussianMixture(30, covariance_type=covariance_type, random_state=0,
                             max_iter=100, means_init=means).fit(X)
    reseeded = [k for record in gm.history_ for k in record["reseeded"]]
    assert reseeded, "the case must starve some component"
    assert len(reseeded) == len(set(reseeded))
    assert gm.converged_
    assert_valid_model(gm)


def test_a_k_means_singleton_is_kept_as_scikit_learn_keeps_it():
    """A k-means cluster of one row starts a component with N_k just below 1 after
    the first E step: a legitimate component, which scikit-learn keeps. With the
    defaults emgmm keeps it too (no re-seed, no warning); only a component the data
    have left (N_k < 1e-3) is starved."""
    from sklearn.cluster import KMeans

    X = np.random.default_rng(0).normal(size=(60, 2))
    for seed in (0, 2, 3, 4):
        sizes = np.bincount(KMeans(12, n_init=1, random_state=seed).fit(X).labels_)
        assert sizes.min() == 1, "the case must start a singleton"
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # a re-seed warns
            warnings.simplefilter("ignore", ConvergenceWarning)  # (tol=0)
            gm = GaussianMixture(12, random_state=seed, max_iter=30, tol=0).fit(X)
        assert [k for record in gm.history_ for k in record["reseeded"]] == []


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("init_params", ["kmeans", "k-means++", "random",
                                         "random_from_data"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c08_exact_duplicates_give_a_finite_model_of_two_clusters(
        covariance_type, init_params, dtype):
    X = np.repeat([[0.0, 0.0], [10.0, 10.0]], 500, axis=0).astype(dtype)
    gm = GaussianMixture(n_components=5, **type_settings(covariance_type, X.shape[1]),
                         init_params=init_params, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # KMeans warns about 2 distinct points
        gm.fit(X)
    for name in PARAMS:
        assert np.all(np.isfinite(getattr(gm, name))), name
    assert_variances_at_least(gm, gm.reg_covar)
    assert_allclose(gm.weights_.sum(), 1.0, rtol=1e-6)
    proba = gm.predict_proba(X)
    assert not np.any(np.isnan(proba))
    assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    assert np.all(np.isfinite(gm.score_samples(X)))
    labels = gm.predict(X)
    # each location is one cluster, and the two are different
    assert len(set(labels[:500])) == 1 and len(set(labels[500:])) == 1
    assert labels[0] != labels[-1]


def c09a_data():
    rng = np.random.default_rng(0)
    centers = [(0, 0), (5, 0), (0, 5), (5, 5)]
    X = np.vstack([rng.normal(c, 0.01, size=(50, 2)) for c in centers])
    return np.vstack([X, [[20.0, 20.0]]])


def c09b_data():
    rng = np.random.default_rng(0)
    cloud = 3.0 * rng.normal(size=(200, 30))
    flat = rng.normal(size=(20, 2)) @ rng.normal(size=(2, 30)) + 10.0
    return np.vstack([cloud, flat])


@pytest.mark.parametrize("make", [c09a_data, c09b_data], ids=["singleton", "flat"])
def test_case_c09_raise_names_component_and_reg_covar(make):
    X = make()
    gm = GaussianMixture(5 if make is c09a_data else 3, reg_covar=0.0, random_state=0,
                         on_degenerate="raise")
    with pytest.raises(ValueError, match=r"ill-defined empirical covariance "
                                         r"\(component \d+\).*increase reg_covar"):
        gm.fit(X)
    assert not hasattr(gm, "weights_")


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
@pytest.mark.parametrize("make", [c09a_data, c09b_data], ids=["singleton", "flat"])
def test_case_c09_reinit_gives_finite_model(make, covariance_type):
    X = make()
    gm = GaussianMixture(5 if make is c09a_data else 3, covariance_type=covariance_type,
                         reg_covar=0.0, random_state=0, max_iter=40)
    if make is c09b_data and covariance_type == "full":
        # the flat cluster takes every re-seed back (it was re-seeded 20 times in 40
        # iterations, and the fit returned its last re-seed, unconverged)
        # (the flat cluster's starting covariance is singular too)
        with pytest.warns(UserWarning, match="re-seeded"), \
                pytest.warns(UserWarning, match=r"Initialisation: components \[1\] "
                             "had a covariance that is not positive definite"), \
                pytest.raises(ValueError, match=r"component \d+ is degenerate again "
                              r"after 10 consecutive re-seeds.*increase reg_covar"):
            gm.fit(X)
        assert not hasattr(gm, "weights_")
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm.fit(X)
    # (no monotonicity check: with reg_covar=0 the likelihood is unbounded here and
    # the variances of collapsed components are set by rounding floors, not by EM)
    assert_valid_model(gm)
    reseeded = [k for h in gm.history_ for k in h["reseeded"]]
    texts = " ".join(str(w.message) for w in caught)
    for k in reseeded:
        assert f"components [{k}" in texts or f", {k}" in texts
    if reseeded:
        assert "reg_covar" in texts
    proba = gm.predict_proba(X)
    assert np.all(np.isfinite(proba))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)


def test_case_c09_singleton_recovery_converges():
    """A singleton that no component can hold with reg_covar=0 is used for one
    re-seed only: the fit converges instead of re-seeding on it forever."""
    gm = GaussianMixture(5, reg_covar=0.0, random_state=0, max_iter=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(c09a_data())
    assert gm.converged_
    assert any(h["reseeded"] for h in gm.history_)
    assert_valid_model(gm)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_case_c10_component_starved_by_a_warm_start_is_reseeded(covariance_type):
    rng = np.random.default_rng(0)
    centers = [(-5, 0), (0, 5), (5, 0)]
    batch1 = np.vstack([rng.normal(c, 0.5, size=(200, 2)) for c in centers])
    batch2 = np.vstack([rng.normal(c, 0.5, size=(200, 2)) for c in centers[:2]])
    gm = GaussianMixture(3, covariance_type=covariance_type, warm_start=True,
                         random_state=0, max_iter=200)
    gm.fit(batch1)
    assert_valid_model(gm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm.fit(batch2)
    assert_valid_model(gm)
    assert_bound_monotone(gm)
    # the component of the missing blob starved and was re-seeded on the data,
    # neither left at the origin with variance reg_covar nor with weight 0
    assert gm.history_[0]["reseeded"]
    assert any("re-seeded" in str(w.message) for w in caught)
    assert np.all(gm.weights_ > 0.01)
    assert np.all(np.linalg.norm(gm.means_, axis=1) > 1.0)
    assert np.all(min_eigenvalues(gm) > 100 * gm.reg_covar)
    # every component explains part of the new data
    assert np.all(np.linalg.norm(gm.means_ - np.array([[0.0, 5.0]]), axis=1).min() < 1)


@pytest.mark.slow
@pytest.mark.parametrize("covariance_type,block_size,max_iter",
                         [("diag", 16, 5), ("full", 256, 2)])
def test_case_c10_200_components_in_small_blocks_stay_finite(
        covariance_type, block_size, max_iter):
    rng = np.random.default_rng(0)
    centers = rng.uniform(-10, 10, size=(30, 6))
    X = centers[rng.integers(30, size=20_000)] + 0.3 * rng.normal(size=(20_000, 6))
    records = []
    gm = GaussianMixture(200, covariance_type=covariance_type, block_size=block_size,
                         max_iter=max_iter, tol=0.0, random_state=0,
                         callback=records.append)
    with not_converging():
        gm.fit(X)
    assert len(records) == max_iter
    assert all(np.isfinite(r["lower_bound"]) for r in records)
    assert_valid_model(gm)
    assert_bound_monotone(gm)
    # no component parked at the origin (not a blob centre) with variance reg_covar
    at_origin = np.linalg.norm(gm.means_, axis=1) < 1e-3
    tiny = min_eigenvalues(gm) < 10 * gm.reg_covar
    assert not np.any(at_origin & tiny)


def _reseed_warnings(fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    return [str(w.message) for w in caught if "re-seeded" in str(w.message)]


def test_reseed_warning_for_a_starved_component_does_not_advise_reg_covar():
    rng = np.random.default_rng(0)
    centers = [(-5, 0), (0, 5), (5, 0)]
    batch1 = np.vstack([rng.normal(c, 0.5, size=(200, 2)) for c in centers])
    batch2 = np.vstack([rng.normal(c, 0.5, size=(200, 2)) for c in centers[:2]])
    gm = GaussianMixture(3, warm_start=True, random_state=0, max_iter=200).fit(batch1)
    (message,) = _reseed_warnings(lambda: gm.fit(batch2))
    assert "weight below a thousandth of one sample" in message
    assert "reg_covar" not in message
    assert "fewer components" in message


def test_reseed_warning_for_a_collapsed_covariance_advises_reg_covar():
    rng = np.random.default_rng(0)
    clusters = [rng.normal(c, 0.3, size=(50, 2))
                for c in ((0, 0), (6, 0), (0, 6), (6, 6))]
    X = np.vstack(clusters + [np.array([[30.0, 30.0]])])
    messages = _reseed_warnings(lambda: GaussianMixture(
        5, reg_covar=0.0, random_state=0, max_iter=50).fit(X))
    collapsed = [m for m in messages if "not positive definite" in m]
    assert collapsed and all("increase reg_covar" in m for m in collapsed), messages
    assert not any("weight below a thousandth" in m for m in collapsed)


def _history(reseeds):
    """Iteration records re-seeding component 0 at the given iterations."""
    last = max(reseeds)
    return [{"n_iter": i, "reseeded": [0] if i in reseeds else []}
            for i in range(1, last + 1)]


def test_reseed_streaks_count_consecutive_collapses_only():
    # every other iteration: one streak of 5
    assert degenerate.reseed_streaks(_history([2, 4, 6, 8, 10]), 11)[0] == 5
    # ten re-seeds, each after the component had settled: never more than 1
    spaced = list(range(3, 60, 6))
    assert len(spaced) == 10
    assert degenerate.reseed_streaks(_history(spaced), spaced[-1] + 1)[0] == 1
    # a streak ends when the component settles for longer than the gap
    assert degenerate.reseed_streaks(_history([2, 4, 6]), 12)[0] == 0
