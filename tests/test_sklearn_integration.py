"""emgmm.GaussianMixture inside scikit-learn tooling, compared with sklearn's own."""

import inspect
import io
import pickle
import re

import joblib
import numpy as np
import pytest
from helpers import (
    SKLEARN_COVARIANCE_TYPES,
    covariance_type_params,
    make_blobs_data,
    type_settings,
)
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.base import clone
from sklearn.decomposition import PCA
from sklearn.mixture import GaussianMixture as SkGaussianMixture
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from emgmm import BayesianGaussianMixture, GaussianMixture
from emgmm._mixture.base import BaseMixture

PARAMS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")

# keyword-only extras of emgmm (CONTRACT) that must exist with these defaults
EXTRA_DEFAULTS = {
    "n_jobs": None,
    "working_memory": None,
    "block_size": None,
    "init_max_samples": 100_000,
    "compute_dtype": None,
    "on_degenerate": "reinit",
    "callback": None,
}


@pytest.fixture(scope="module")
def X():
    return make_blobs_data(300, 5, 3, seed=21)


def test_constructor_matches_sklearn():
    """Every sklearn parameter, same order (positional use), same default."""
    sk = inspect.signature(SkGaussianMixture).parameters
    em = inspect.signature(GaussianMixture).parameters
    for name, p in sk.items():
        assert name in em, name
        assert em[name].default == p.default, name
        assert em[name].kind == p.kind, name
    for name, default in EXTRA_DEFAULTS.items():
        assert name in em, name
        assert em[name].default == default, name
        assert em[name].kind == inspect.Parameter.KEYWORD_ONLY, name
    assert set(SkGaussianMixture().get_params()) <= set(GaussianMixture().get_params())


@pytest.mark.parametrize("estimator", [GaussianMixture, BayesianGaussianMixture])
def test_constraints_cover_the_constructor_and_extend_the_base(estimator):
    """Each parameter is validated; the base's constraints (the parameters both
    estimators share) are the estimator's, not copied from its sibling."""
    constraints = estimator._parameter_constraints
    assert set(constraints) == set(inspect.signature(estimator).parameters)
    for name, constraint in BaseMixture._parameter_constraints.items():
        assert constraints[name] is constraint, name


def test_pipeline_scaler_pca_gmm(X):
    kw = dict(n_components=3, random_state=0)
    pipe_em = make_pipeline(StandardScaler(), PCA(n_components=3),
                            GaussianMixture(**kw))
    pipe_sk = make_pipeline(StandardScaler(), PCA(n_components=3),
                            SkGaussianMixture(**kw))
    labels_em = pipe_em.fit_predict(X)
    labels_sk = pipe_sk.fit_predict(X)
    assert_array_equal(labels_em, labels_sk)
    pipe_em.fit(X)
    pipe_sk.fit(X)
    assert_array_equal(pipe_em.predict(X), pipe_sk.predict(X))
    assert_allclose(pipe_em.predict_proba(X), pipe_sk.predict_proba(X), rtol=1e-7,
                    atol=1e-12)
    assert_allclose(pipe_em.score_samples(X), pipe_sk.score_samples(X), rtol=1e-7)
    assert_allclose(pipe_em.score(X), pipe_sk.score(X), rtol=1e-7)
    gm = pipe_em[-1]
    assert gm.n_features_in_ == 3
    assert_array_equal(pipe_em.predict(X), labels_em)


@pytest.mark.slow
def test_grid_search_over_n_components_and_covariance_type(X):
    grid = {"n_components": [1, 2, 3, 4],
            "covariance_type": list(SKLEARN_COVARIANCE_TYPES)}  # both estimators
    cv = KFold(3, shuffle=True, random_state=0)
    gs_em = GridSearchCV(GaussianMixture(random_state=0), grid, cv=cv).fit(X)
    gs_sk = GridSearchCV(SkGaussianMixture(random_state=0), grid, cv=cv).fit(X)
    assert gs_em.best_params_ == gs_sk.best_params_
    assert gs_em.cv_results_["params"] == gs_sk.cv_results_["params"]
    for split in range(3):
        key = f"split{split}_test_score"
        assert_allclose(gs_em.cv_results_[key], gs_sk.cv_results_[key], rtol=1e-7)
    best = gs_em.best_estimator_
    assert isinstance(best, GaussianMixture)
    assert best.n_components == gs_em.best_params_["n_components"]
    assert_allclose(best.score(X), gs_sk.best_estimator_.score(X), rtol=1e-7)
    # the winner is the true structure: 3 components
    assert gs_em.best_params_["n_components"] == 3


def test_clone_get_params_set_params(X):
    cb = lambda record: None  # noqa: E731
    gm = GaussianMixture(n_components=3, covariance_type="diag", reg_covar=1e-4,
                         block_size=17, random_state=4, callback=cb)
    params = gm.get_params()
    assert params["n_components"] == 3 and params["block_size"] == 17
    assert params["callback"] is cb
    c = clone(gm)
    assert c is not gm
    assert c.get_params() == params
    gm.fit(X)
    c2 = clone(gm)
    assert not hasattr(c2, "means_")  # clone is unfitted
    assert c2.get_params() == params
    assert gm.set_params(n_components=2, covariance_type="spherical") is gm
    assert gm.n_components == 2 and gm.covariance_type == "spherical"
    assert gm.get_params()["covariance_type"] == "spherical"
    with pytest.raises(ValueError):
        gm.set_params(not_a_parameter=1)
    # clone of a fitted estimator refits to the same model
    c3 = clone(GaussianMixture(n_components=3, random_state=4)).fit(X)
    c4 = GaussianMixture(n_components=3, random_state=4).fit(X)
    for name in PARAMS:
        assert_array_equal(getattr(c3, name), getattr(c4, name))


def _normalise(msg):
    return re.sub(r"\{([^{}]*)\}",
                  lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}",
                  msg)


def test_invalid_parameters_rejected_like_sklearn(X):
    for bad in (dict(n_components=0), dict(covariance_type="banana"), dict(tol=-1.0),
                dict(init_params="nope"), dict(reg_covar=-1.0), dict(n_init=0)):
        with pytest.raises(ValueError) as sk_info:
            SkGaussianMixture(**bad).fit(X)
        gm = GaussianMixture(**bad)
        with pytest.raises(ValueError) as em_info:
            gm.fit(X)
        name = next(iter(bad))
        assert f"'{name}' parameter of GaussianMixture must be" in str(em_info.value)
        # identical text, except that the order in which a set of options is printed
        # follows the set's iteration order (not part of the message's meaning), and
        # that emgmm has one more covariance type, 'factor'
        em_text = _normalise(str(em_info.value)).replace("'factor', ", "")
        assert em_text == _normalise(str(sk_info.value))
        assert not hasattr(gm, "means_")


@pytest.mark.slow
@pytest.mark.parametrize("covariance_type", ["full", "tied"])
@pytest.mark.parametrize("d", [3, 128])
def test_a_lower_factor_set_by_hand_is_refused(covariance_type, d):
    """Parameters set as attributes, scikit-learn style, with the lower factor of
    ``numpy.linalg.cholesky(precisions)``: scikit-learn's products take any ``L``
    with ``L L^T`` the precisions, emgmm's triangular ones read the upper triangle
    only (25 nats off at d=128); refused naming the component and the entry, and
    the upper factor of the same precisions scores as scikit-learn does."""
    rng = np.random.default_rng(0)
    Q = rng.normal(size=(2, d, d))
    P = Q @ Q.transpose(0, 2, 1) / d + 0.1 * np.eye(d)
    if covariance_type == "tied":
        P = P[:1]
    Z = rng.normal(size=(50, d))
    means = rng.normal(size=(2, d)) * 0.1
    models = []
    for cls in (GaussianMixture, SkGaussianMixture):
        gm = cls(2, covariance_type=covariance_type).fit(rng.normal(size=(20 * d, d)))
        gm.weights_, gm.means_ = np.array([0.5, 0.5]), means
        gm.precisions_ = P[0] if covariance_type == "tied" else P
        gm.covariances_ = np.linalg.inv(gm.precisions_)
        models.append(gm)
    lower = np.linalg.cholesky(models[0].precisions_)
    models[0].precisions_cholesky_ = lower
    which = "precisions_cholesky_" + ("" if covariance_type == "tied" else r"\[0\]")
    for method in ("score_samples", "predict", "predict_proba"):
        with pytest.raises(ValueError, match=which + r" is not upper triangular: entry "
                                                     r"\[1, 0\]"):
            getattr(models[0], method)(Z)
    flip = lambda a: a[..., ::-1, ::-1]  # noqa: E731 (the upper factor: U U^T = P)
    upper = flip(np.linalg.cholesky(flip(models[0].precisions_)))
    models[0].precisions_cholesky_ = upper
    models[1].precisions_cholesky_ = upper
    assert_allclose(models[0].score_samples(Z), models[1].score_samples(Z), rtol=1e-10)


def test_n_jobs_zero_is_refused_naming_the_parameter(X):
    """joblib refuses n_jobs=0 mid-fit ("n_jobs == 0 in Parallel has no meaning"),
    without naming the estimator's parameter; emgmm refuses it up front."""
    gm = GaussianMixture(2, n_jobs=0)
    with pytest.raises(ValueError, match=r"'n_jobs' parameter of GaussianMixture must "
                                         r"be .*Got 0 instead"):
        gm.fit(X)
    assert not hasattr(gm, "means_")
    assert GaussianMixture(2, n_jobs=-2, random_state=0).fit(X).n_iter_ >= 1


@pytest.mark.parametrize("covariance_type",
                         covariance_type_params(slow_beyond_sklearn=True))
def test_pickle_and_joblib_round_trips(X, tmp_path, covariance_type):
    gm = GaussianMixture(n_components=3, **type_settings(covariance_type, X.shape[1]),
                         random_state=0).fit(X)
    expected = (gm.predict(X), gm.predict_proba(X), gm.score_samples(X), gm.score(X))

    def check(other):
        assert type(other) is GaussianMixture
        assert other.get_params() == gm.get_params()
        for name in PARAMS + ("lower_bound_", "n_iter_", "converged_",
                              "n_features_in_"):
            assert_array_equal(getattr(other, name), getattr(gm, name), err_msg=name)
        assert_array_equal(other.lower_bounds_, gm.lower_bounds_)
        got = (other.predict(X), other.predict_proba(X), other.score_samples(X),
               other.score(X))
        for a, b in zip(got, expected, strict=False):
            assert_array_equal(a, b)
        assert_array_equal(other.sample(5)[0], gm.sample(5)[0])

    check(pickle.loads(pickle.dumps(gm)))
    path = tmp_path / "gm.joblib"
    joblib.dump(gm, path)
    check(joblib.load(path))
    buf = io.BytesIO()
    joblib.dump(gm, buf, compress=3)
    buf.seek(0)
    check(joblib.load(buf))
    # an unfitted estimator round-trips too
    u = pickle.loads(pickle.dumps(GaussianMixture(n_components=2, block_size=3)))
    assert u.get_params() == GaussianMixture(n_components=2, block_size=3).get_params()


def test_feature_names_in_from_dataframe(X):
    # scikit-learn reads feature names through narwhals, which needs a real dataframe
    # library; none is a dependency of emgmm, so this runs only where pandas exists.
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    sk = SkGaussianMixture(n_components=3, random_state=0).fit(df)
    gm = GaussianMixture(n_components=3, random_state=0).fit(df)
    assert_array_equal(gm.feature_names_in_, sk.feature_names_in_)
    assert_array_equal(gm.predict(df), sk.predict(df))
    gm2 = GaussianMixture(n_components=3, random_state=0).fit(X)
    assert not hasattr(gm2, "feature_names_in_")
    with pytest.warns(UserWarning, match="feature names"):
        gm.predict(X)  # fitted with names, predicted without: sklearn's warning


@pytest.mark.parametrize("change", [dict(n_components=5), dict(covariance_type="diag")])
def test_warm_start_refuses_a_model_of_another_shape(change):
    X = make_blobs_data(300, 3, 3, seed=0)
    gm = GaussianMixture(3, warm_start=True, random_state=0).fit(X)
    before = pickle.dumps(gm.__dict__)
    gm.set_params(**change)
    with pytest.raises(ValueError, match="warm_start=True continues the fitted model"):
        gm.fit(X)
    gm.set_params(n_components=3, covariance_type="full")
    assert pickle.dumps(gm.__dict__) == before


def test_warm_start_refuses_another_feature_count():
    X = make_blobs_data(300, 3, 3, seed=0)
    gm = GaussianMixture(3, warm_start=True, random_state=0).fit(X)
    with pytest.raises(ValueError, match="warm_start=True continues the fitted model"):
        gm.fit(X[:, :2])
    assert gm.n_features_in_ == 3


def test_warm_start_into_another_type_names_the_missing_arrays():
    """A fitted 'factor' model warm-started as 'full': the error names the arrays the
    fitted model does not have, not a shape of ()."""
    X = make_blobs_data(300, 3, 3, seed=0)
    gm = GaussianMixture(3, covariance_type="factor", n_factors=1, warm_start=True,
                         random_state=0).fit(X)
    gm.set_params(covariance_type="full")
    with pytest.raises(ValueError, match=r"warm_start=True continues the fitted model "
                                         r"\(means of shape \(3, 3\), .* missing"):
        gm.fit(X)
