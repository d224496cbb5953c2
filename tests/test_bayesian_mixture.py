"""emgmm.BayesianGaussianMixture against scikit-learn's from the same initialisation.

Both start from the same responsibilities: scikit-learn's ``init_params`` with the
same ``random_state`` (k-means, random) on data of fewer than ``init_max_samples``
rows, where emgmm's initialisation is scikit-learn's. ``tol=0`` and a fixed
``max_iter`` make both run the same iterations (scikit-learn then warns). The
lower bounds must agree to 1e-9 relative and the fitted attributes, responsibilities
and scores to 1e-7, for both prior types, every covariance type, several blocks per
pass, file sources and two workers.
"""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    SKLEARN_VARIATIONAL_COVARIANCE_TYPES,
    VARIATIONAL_COVARIANCE_TYPES,
    cli_usage_error,
    make_blobs_data,
)
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture as SkBayesianGaussianMixture
from sklearn.utils.estimator_checks import check_estimator

from emgmm import (
    BayesianGaussianMixture,
    GaussianMixture,
    ModelFileError,
    load_model,
    save_model,
)
from emgmm._cli import command as cli
from emgmm._io.model_file import read_header

PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
ATTRIBUTES = ("weights_", "means_", "covariances_", "precisions_",
              "precisions_cholesky_", "mean_precision_", "degrees_of_freedom_",
              "mean_prior_", "covariance_prior_", "degrees_of_freedom_prior_",
              "mean_precision_prior_", "weight_concentration_prior_")


@pytest.fixture(scope="module")
def data():
    return make_blobs_data(400, 3, 3, spread=5.0, seed=21)


def _pair(max_iter=25, **params):
    params = {"n_components": 5, "random_state": 0, "max_iter": max_iter, "tol": 0.0,
              **params}
    return SkBayesianGaussianMixture(**params), params


def _fit(estimator, X):
    """Fit, expecting the non-convergence warning of a run cut by ``max_iter``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X)
    unexpected = [w for w in caught if not issubclass(w.category, ConvergenceWarning)]
    assert unexpected == []
    return estimator


def _bounds(sk):
    # ('tied': scikit-learn 1.9.1's are arrays of shape (1,))
    return np.array([float(np.ravel(b)[0]) for b in sk.lower_bounds_])


def assert_same_fit(mine, sk, X, rtol=1e-7):
    assert_allclose(mine.lower_bounds_, _bounds(sk), rtol=1e-9)
    assert mine.lower_bound_ == pytest.approx(float(np.ravel(sk.lower_bound_)[0]),
                                              rel=1e-9)
    assert mine.n_iter_ == sk.n_iter_
    assert mine.converged_ == sk.converged_
    for name in ATTRIBUTES:
        theirs = np.asarray(getattr(sk, name), dtype=np.float64)
        ours = np.asarray(getattr(mine, name))
        assert ours.shape == theirs.shape, name
        assert_allclose(ours, theirs, rtol=rtol, atol=rtol * np.abs(theirs).max(),
                        err_msg=name)
    for ours, theirs in zip(np.atleast_2d(mine.weight_concentration_),
                            np.atleast_2d(sk.weight_concentration_), strict=False):
        assert_allclose(ours, theirs, rtol=rtol)
    assert_allclose(mine.predict_proba(X), sk.predict_proba(X), rtol=rtol, atol=1e-10)
    assert_allclose(mine.score_samples(X), sk.score_samples(X), rtol=rtol)
    assert mine.score(X) == pytest.approx(sk.score(X), rel=rtol)


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_same_fit_as_sklearn_in_blocks(data, covariance_type, prior_type):
    sk, params = _pair(covariance_type=covariance_type,
                       weight_concentration_prior_type=prior_type)
    mine = BayesianGaussianMixture(block_size=64, **params)
    assert_same_fit(_fit(mine, data), _fit(sk, data), data)
    assert len(mine.lower_bounds_) == 25
    assert_array_equal(mine.predict(data), sk.predict(data))


@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_same_fit_with_given_priors_and_random_init(data, covariance_type):
    d = data.shape[1]
    covariance_prior = {"full": np.eye(d) * 3.0 + 0.5, "tied": np.eye(d) * 3.0 + 0.5,
                        "diag": np.array([1.0, 2.0, 0.5]), "spherical": 2.0}
    sk, params = _pair(
        covariance_type=covariance_type, init_params="random",
        weight_concentration_prior_type="dirichlet_distribution",
        weight_concentration_prior=2.0, mean_precision_prior=0.1,
        mean_prior=[1.0, 0.0, -1.0], degrees_of_freedom_prior=d + 1.5,
        covariance_prior=covariance_prior[covariance_type])
    mine = BayesianGaussianMixture(block_size=100, **params)
    assert_same_fit(_fit(mine, data), _fit(sk, data), data)


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_same_convergence_and_choice_of_restart(data, covariance_type):
    params = {"n_components": 4, "covariance_type": covariance_type, "n_init": 3,
              "random_state": 3, "init_params": "random", "max_iter": 500}
    sk = SkBayesianGaussianMixture(**params).fit(data)
    mine = BayesianGaussianMixture(**params).fit(data)
    assert sk.converged_
    assert_same_fit(mine, sk, data)


@pytest.mark.slow
@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
@pytest.mark.parametrize("kind", ["npy", "h5_chunked"])
def test_file_sources_and_two_workers_give_the_same_fit(data, make_sources, kind,
                                                        covariance_type):
    sk, params = _pair(max_iter=10, covariance_type=covariance_type,
                       weight_concentration_prior_type="dirichlet_distribution")
    _fit(sk, data)
    source = make_sources(data, (kind,))[0].obj
    for n_jobs in (1, 2):
        mine = BayesianGaussianMixture(block_size=50, n_jobs=n_jobs, **params)
        assert_same_fit(_fit(mine, source), sk, data)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["h5_string", "memmap"])
def test_other_sources_and_the_component_schedule(data, make_sources, kind):
    sk, params = _pair(max_iter=10)
    _fit(sk, data)
    source = make_sources(data, (kind,))[0].obj
    mine = BayesianGaussianMixture(block_size=50, n_jobs=2, schedule="components",
                                   **params)
    assert_same_fit(_fit(mine, source), sk, data)


def test_warm_start_continues_as_sklearn(data):
    sk, params = _pair(max_iter=5, warm_start=True, covariance_type="diag")
    mine = BayesianGaussianMixture(**params)
    for _ in range(3):
        _fit(sk, data)
        _fit(mine, data)
    assert_same_fit(mine, sk, data)


def test_warm_started_single_iterations_converge_as_sklearn(data):
    """A loop of warm-started max_iter=1 fits measures each first change against
    the previous fit's bound, as scikit-learn's does: same n_iter_/converged_ at
    every call, up to the first that converges."""
    steps = {}
    for name, cls in (("sk", SkBayesianGaussianMixture),
                      ("mine", BayesianGaussianMixture)):
        model = cls(n_components=3, covariance_type="full", max_iter=1, tol=1e-3,
                    warm_start=True, random_state=0)
        steps[name] = []
        while len(steps[name]) < 200 and not (steps[name] and steps[name][-1][1]):
            _fit(model, data)
            steps[name].append((model.n_iter_, bool(model.converged_)))
    assert steps["mine"] == steps["sk"]
    assert steps["mine"][-1] == (1, True) and len(steps["mine"]) >= 2


def test_max_iter_zero_is_the_initial_posterior(data):
    sk, params = _pair(max_iter=0)
    mine = BayesianGaussianMixture(**params).fit(data)
    sk.fit(data)
    assert mine.lower_bounds_ == [] and mine.n_iter_ == 0
    for name in ATTRIBUTES:
        assert_allclose(getattr(mine, name), getattr(sk, name), rtol=1e-10,
                        atol=1e-12, err_msg=name)


def test_fit_predict_is_predict_and_sample_draws_from_the_fit(data):
    mine = BayesianGaussianMixture(n_components=3, random_state=0)
    labels = mine.fit_predict(data)
    assert_array_equal(labels, mine.predict(data))
    X, y = mine.sample(50)
    assert X.shape == (50, 3) and y.shape == (50,)


def test_float32_data_gives_scikit_learns_dtypes(data):
    """scikit-learn's BayesianGaussianMixture returns float64 for float32 data (its
    GaussianMixture keeps float32): emgmm's does as each of them does, also when it
    computes in float32."""
    X = data.astype(np.float32)
    mine = BayesianGaussianMixture(n_components=3, random_state=0).fit(X)
    sk = SkBayesianGaussianMixture(n_components=3, random_state=0).fit(X)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        assert getattr(mine, name).dtype == getattr(sk, name).dtype
    assert mine.score_samples(X).dtype == sk.score_samples(X).dtype
    assert mine.predict_proba(X).dtype == sk.predict_proba(X).dtype
    assert np.isfinite(mine.lower_bound_)
    assert_allclose(mine.score_samples(X), mine.score_samples(data), rtol=1e-5)


def test_unused_components_fall_back_to_the_prior(data):
    """The Dirichlet process empties the components the data do not need."""
    mine = BayesianGaussianMixture(n_components=10, random_state=0, max_iter=500,
                                   weight_concentration_prior=1e-3).fit(data)
    assert (mine.weights_ > 0.05).sum() == 3


@pytest.mark.parametrize(("params", "match"), [
    ({"degrees_of_freedom_prior": 1.5}, "should be greater than 2"),
    ({"mean_prior": [0.0, 1.0]}, r"'mean_prior' should have the shape of \(3,\)"),
    ({"covariance_prior": np.eye(2)}, r"should have the shape of \(3, 3\)"),
    ({"covariance_prior": -np.eye(3)}, "symmetric, positive-definite"),
    ({"covariance_type": "diag", "covariance_prior": [1.0, 0.0, 1.0]}, "positive"),
    ({"covariance_type": "spherical", "covariance_prior": [1.0]},
     r"should have the shape of \(\)"),
    ({"weight_concentration_prior": 0.0}, "'weight_concentration_prior' parameter"),
    ({"mean_precision_prior": "1"}, "'mean_precision_prior' parameter"),
    ({"weight_concentration_prior_type": "pitman_yor"}, "dirichlet_process"),
    ({"mean_prior": [0.0, np.nan, 1.0]}, "must be finite"),
])
def test_bad_priors_are_refused_naming_them(data, params, match):
    mine = BayesianGaussianMixture(**params)
    with pytest.raises(ValueError, match=match):
        mine.fit(data)
    assert not hasattr(mine, "means_")


def test_warm_start_with_other_shapes_is_refused(data):
    mine = BayesianGaussianMixture(n_components=2, warm_start=True,
                                   random_state=0).fit(data)
    other = clone(mine).set_params(n_components=3)
    other.__dict__.update({k: v for k, v in vars(mine).items() if k.endswith("_")})
    with pytest.raises(ValueError, match="does not match n_components=3"):
        other.fit(data)


ESTIMATORS = [BayesianGaussianMixture()] + [
    BayesianGaussianMixture(n_components=2, covariance_type=ct)
    for ct in VARIATIONAL_COVARIANCE_TYPES]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=repr)
def test_sklearn_estimator_checks(estimator):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(estimator, on_fail=None)
    assert len(results) >= 30
    failed = {r["check_name"]: repr(r["exception"]) for r in results
              if r["status"] == "failed"
              or (r["status"] == "skipped"
                  and "SCIPY_ARRAY_API is not set" not in str(r["exception"]))}
    assert failed == {}


# ------------------------------------------------------------------ model files

@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", VARIATIONAL_COVARIANCE_TYPES)
def test_model_file_round_trip(data, tmp_path, covariance_type, prior_type):
    mine = BayesianGaussianMixture(
        n_components=3, covariance_type=covariance_type, random_state=0,
        weight_concentration_prior_type=prior_type,
        mean_prior=[0.0, 1.0, 2.0]).fit(data)
    save_model(mine, tmp_path / "m.h5")
    loaded = load_model(tmp_path / "m.h5")
    assert type(loaded) is BayesianGaussianMixture
    assert read_header(tmp_path / "m.h5")["format"] == "emgmm.BayesianGaussianMixture"
    assert_array_equal(loaded.get_params()["mean_prior"], [0.0, 1.0, 2.0])
    for name in ATTRIBUTES + ("lower_bound_", "n_iter_", "converged_"):
        assert_allclose(getattr(loaded, name), getattr(mine, name), rtol=1e-15,
                        err_msg=name)
    for ours, theirs in zip(np.atleast_2d(loaded.weight_concentration_),
                            np.atleast_2d(mine.weight_concentration_), strict=False):
        assert_array_equal(ours, theirs)
    assert_array_equal(loaded.score_samples(data), mine.score_samples(data))
    # a warm start from the file continues as the fitted estimator does
    again = _fit(loaded.set_params(warm_start=True, max_iter=3, tol=0.0), data)
    _fit(mine.set_params(warm_start=True, max_iter=3, tol=0.0), data)
    assert_allclose(again.lower_bounds_, mine.lower_bounds_, rtol=1e-12)


@pytest.mark.parametrize("covariance_type", SKLEARN_VARIATIONAL_COVARIANCE_TYPES)
def test_sklearn_model_saved_loads_as_emgmm(data, tmp_path, covariance_type):
    sk = SkBayesianGaussianMixture(n_components=3, covariance_type=covariance_type,
                                   random_state=0, max_iter=300).fit(data)
    save_model(sk, tmp_path / "sk.h5")
    loaded = load_model(tmp_path / "sk.h5")
    assert_allclose(loaded.score_samples(data), sk.score_samples(data), rtol=1e-12)
    assert_allclose(loaded.predict_proba(data), sk.predict_proba(data), atol=1e-12)
    assert loaded.lower_bound_ == pytest.approx(float(np.ravel(sk.lower_bound_)[0]))


def test_damaged_posterior_in_a_model_file_is_named(data, tmp_path):
    mine = BayesianGaussianMixture(n_components=2, random_state=0).fit(data)
    path = tmp_path / "m.h5"
    save_model(mine, path)
    with h5py.File(path, "r+") as f:
        del f["variational/mean_precision"]
        f["variational/mean_precision"] = np.array([1.0, -2.0])
    with pytest.raises(ModelFileError, match="variational/mean_precision must be "
                                             "positive"):
        load_model(path)


# ------------------------------------------------------------------- command line

def test_every_parameter_has_a_flag_of_emgmm_fit_bayesian():
    params = set(BayesianGaussianMixture().get_params())
    flagged = {name for _, name, _ in cli._ESTIMATOR_FLAGS + cli._BAYESIAN_FLAGS}
    assert params - {"warm_start", "callback"} <= flagged
    assert flagged - params == set(cli._GAUSSIAN_ONLY)


def test_cli_fit_bayesian_is_the_estimator(data, tmp_path):
    npy, mean_prior = tmp_path / "x.npy", tmp_path / "mean.npy"
    np.save(npy, data)
    np.save(mean_prior, np.array([0.0, 1.0, -1.0]))
    out = tmp_path / "b.h5"
    argv = ["fit", str(npy), "-o", str(out), "-q", "--bayesian", "-k", "4",
            "--covariance-type", "diag", "--random-state", "2", "--block-size", "90",
            "--weight-concentration-prior-type", "dirichlet_distribution",
            "--weight-concentration-prior", "0.5", "--mean-precision-prior", "0.3",
            "--mean-prior", str(mean_prior), "--degrees-of-freedom-prior", "4.5",
            "--covariance-prior", "1.5"]
    with pytest.raises(ValueError, match="should have the shape of"):
        # (a number for covariance_prior is 'spherical''s; 'diag' takes a .npy file)
        BayesianGaussianMixture(covariance_type="diag", covariance_prior=1.5).fit(data)
    assert cli.main(argv) == 1
    np.save(tmp_path / "cov.npy", np.array([1.0, 2.0, 0.5]))
    argv[-1] = str(tmp_path / "cov.npy")
    assert cli.main(argv) == 0
    model = load_model(out)
    reference = BayesianGaussianMixture(
        n_components=4, covariance_type="diag", random_state=2,
        weight_concentration_prior_type="dirichlet_distribution",
        weight_concentration_prior=0.5, mean_precision_prior=0.3,
        mean_prior=[0.0, 1.0, -1.0], degrees_of_freedom_prior=4.5,
        covariance_prior=[1.0, 2.0, 0.5]).fit(data)
    assert_allclose(model.means_, reference.means_, rtol=1e-12)
    assert_allclose(model.lower_bounds_, reference.lower_bounds_, rtol=1e-12)
    assert_allclose(model.covariance_prior_, [1.0, 2.0, 0.5], rtol=0)
    # a warm start from the file continues it (the file says it is Bayesian)
    again = tmp_path / "again.h5"
    assert cli.main(["fit", str(npy), "-o", str(again), "-q", "--warm-start", str(out),
                     "--max-iter", "3"]) == 0
    assert type(load_model(again)) is BayesianGaussianMixture


@pytest.mark.parametrize(("extra", "match"), [
    (["--mean-precision-prior", "2"], "is a prior of BayesianGaussianMixture: add "
                                      "--bayesian"),
    (["--bayesian", "--on-degenerate", "raise"], "GaussianMixture parameter that "
                                                 "BayesianGaussianMixture has not"),
    (["--bayesian", "--warm-start", "GMM"], "is a GaussianMixture model: drop "
                                            "--bayesian"),
])
def test_cli_refuses_mixed_flags(data, tmp_path, capsys, extra, match):
    npy = tmp_path / "x.npy"
    np.save(npy, data)
    gmm = tmp_path / "g.h5"
    assert cli.main(["fit", str(npy), "-o", str(gmm), "-q", "-k", "2"]) == 0
    extra = [str(gmm) if a == "GMM" else a for a in extra]
    argv = ["fit", str(npy), "-o", str(tmp_path / "b.h5"), "-q"] + extra
    assert match in cli_usage_error(argv, capsys)
    assert not (tmp_path / "b.h5").exists()


@pytest.mark.slow
def test_benchmark_script_runs_and_agrees(tmp_path):
    """benchmarks/bench_bayesian.py at its --quick size: both fits ran and agreed."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_bayesian.py"
    out = tmp_path / "quick.json"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"full", "diag"}
    for row in results.values():
        assert row["sklearn_s"] > 0 and row["emgmm_s"] > 0
        assert row["max_rel_diff_lower_bounds"] < 1e-9


# ------------------------------------------------------------------- checkpoints

class Stop(Exception):
    pass


def _stop_at(init, n_iter):
    def callback(record):
        if record["init"] == init and record["n_iter"] == n_iter:
            raise Stop

    return callback


@pytest.mark.parametrize(("prior_type", "init", "n_iter"), [
    ("dirichlet_process", 0, 3), ("dirichlet_process", 1, 2),
    ("dirichlet_distribution", 1, 4)])
def test_checkpoint_resumes_to_the_uninterrupted_fit(data, tmp_path, prior_type, init,
                                                     n_iter):
    path = tmp_path / "ck.npz"
    params = {"n_components": 4, "n_init": 2, "max_iter": 6, "tol": 0.0,
              "random_state": 0, "init_params": "random",
              "weight_concentration_prior_type": prior_type}
    reference = _fit(BayesianGaussianMixture(**params), data)
    with pytest.raises(Stop):
        _fit(BayesianGaussianMixture(**params, checkpoint=path,
                                     callback=_stop_at(init, n_iter)), data)
    assert path.exists()
    seen = []
    resumed = BayesianGaussianMixture(
        **params, checkpoint=path, callback=lambda r: seen.append((r["init"],
                                                                   r["n_iter"])))
    _fit(resumed, data)
    assert seen[0] == (init, n_iter + 1)
    assert not path.exists()
    assert_allclose(resumed.lower_bounds_, reference.lower_bounds_, rtol=1e-12)
    assert resumed.lower_bound_ == pytest.approx(reference.lower_bound_, rel=1e-12)
    for name in ATTRIBUTES:
        assert_allclose(getattr(resumed, name), getattr(reference, name), rtol=1e-12,
                        err_msg=name)


def test_checkpoint_of_other_priors_or_of_a_gaussian_mixture_is_refused(data,
                                                                        tmp_path):
    path = tmp_path / "ck.npz"
    params = {"n_components": 3, "max_iter": 5, "tol": 0.0, "random_state": 0}
    with pytest.raises(Stop):
        _fit(BayesianGaussianMixture(**params, mean_prior=[0.0, 0.0, 0.0],
                                     checkpoint=path, callback=_stop_at(0, 2)), data)
    with pytest.raises(ValueError, match="differs in: mean_prior"):
        BayesianGaussianMixture(**params, mean_prior=[1.0, 0.0, 0.0],
                                checkpoint=path).fit(data)
    gaussian = tmp_path / "gmm.npz"
    with pytest.raises(Stop):
        _fit(GaussianMixture(**params, checkpoint=gaussian, callback=_stop_at(0, 2)),
             data)
    with pytest.raises(ValueError, match="other parameters"):
        BayesianGaussianMixture(**params, checkpoint=gaussian).fit(data)


def test_docstring_examples_run():
    import doctest

    import emgmm._mixture.bayesian_mixture as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_nan_in_a_file_is_named_by_row_before_any_fit(data, tmp_path):
    """The priors' pass reads every row first: its check names the row."""
    X = data.copy()
    X[17, 1] = np.nan
    path = tmp_path / "x.npy"
    np.save(path, X)
    mine = BayesianGaussianMixture(n_components=2, random_state=0, block_size=10)
    with pytest.raises(ValueError, match="row 17"):
        mine.fit(str(path))
    assert not hasattr(mine, "means_")


def test_warm_start_with_the_other_prior_type_is_refused(data):
    mine = BayesianGaussianMixture(n_components=2, warm_start=True,
                                   random_state=0).fit(data)
    mine.set_params(weight_concentration_prior_type="dirichlet_distribution")
    with pytest.raises(ValueError, match="weight concentration prior is not"):
        mine.fit(data)
