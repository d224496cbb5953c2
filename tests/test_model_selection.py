"""GaussianMixtureIC: every candidate's criterion equals a separate fit's, the chosen
model is the separate fit of the best candidate, planted mixtures give back their
number of components, and the estimator works in Pipeline and GridSearchCV."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import make_blobs_data
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

from emgmm import GaussianMixture
from emgmm._mixture.model_selection import FITTED_ATTRIBUTES, GaussianMixtureIC


@pytest.fixture(scope="module")
def planted():
    """Four well separated clusters in 3 features."""
    return make_blobs_data(800, 3, 4, spread=10.0, seed=11)


def _separate(k, kind, **params):
    return GaussianMixture(n_components=k, covariance_type=kind, random_state=0,
                           **params)


@pytest.mark.parametrize("criterion", ["bic", "aic"])
def test_criteria_and_choice_equal_separate_fits(planted, criterion):
    selector = GaussianMixtureIC(2, 5, covariance_type=["full", "diag"],
                                 criterion=criterion, random_state=0).fit(planted)
    assert selector.criteria_.shape == (4, 2)
    assert_array_equal(selector.n_components_grid_, [2, 3, 4, 5])
    assert selector.covariance_types_ == ("full", "diag")
    separate = {}
    for i, k in enumerate(selector.n_components_grid_):
        for j, kind in enumerate(selector.covariance_types_):
            model = _separate(k, kind).fit(planted)
            score = getattr(model, criterion)(planted)  # its own pass over X
            assert_allclose(selector.criteria_[i, j], score, rtol=1e-10)
            separate[k, kind] = model
    i, j = np.unravel_index(np.argmin(selector.criteria_), selector.criteria_.shape)
    chosen = separate[selector.n_components_grid_[i], selector.covariance_types_[j]]
    assert selector.n_components_ == chosen.n_components
    assert selector.covariance_type_ == chosen.covariance_type
    assert selector.best_criterion_ == selector.criteria_.min()
    for name in FITTED_ATTRIBUTES:
        assert_allclose(getattr(selector, name), getattr(chosen, name), rtol=1e-12,
                        err_msg=name)
    assert_array_equal(selector.predict(planted), chosen.predict(planted))
    assert_allclose(selector.score_samples(planted), chosen.score_samples(planted),
                    rtol=1e-12)
    # one read of X per iteration of the longest candidate (and its final scoring),
    # where the loop of separate fits reads it once per iteration of every candidate
    iterations = [m.n_iter_ for m in separate.values()]
    assert selector.n_passes_ == max(iterations) + 1
    assert selector.rows_read_ == selector.n_passes_ * len(planted)
    assert sum(iterations) + len(iterations) > 2 * selector.n_passes_


@pytest.mark.parametrize(("n_centers", "n_features"), [(1, 2), (3, 2), (5, 4)])
def test_bic_recovers_the_planted_number_of_components(n_centers, n_features):
    X = make_blobs_data(300 * n_centers, n_features, n_centers, spread=12.0,
                        seed=n_centers)
    selector = GaussianMixtureIC(1, 8, covariance_type="all", random_state=0).fit(X)
    assert selector.n_components_ == n_centers
    assert selector.criteria_.shape == (8, 4)
    # fewer components than planted explain the data far worse
    assert (selector.criteria_[:n_centers - 1] > selector.best_criterion_ + 100).all()


def test_file_sources_give_the_in_memory_choice(planted, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, planted)
    in_memory = GaussianMixtureIC(2, 5, random_state=0).fit(planted)
    on_disk = GaussianMixtureIC(2, 5, random_state=0).fit(str(path))
    assert on_disk.n_components_ == in_memory.n_components_
    assert_allclose(on_disk.criteria_, in_memory.criteria_, rtol=1e-12)
    assert on_disk.n_features_in_ == planted.shape[1]


def test_two_workers_on_a_file_give_the_separate_fits(planted, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, planted)
    selector = GaussianMixtureIC(3, 5, covariance_type=["tied", "spherical"],
                                 random_state=0, n_jobs=2,
                                 block_size=100).fit(str(path))
    for i, k in enumerate(selector.n_components_grid_):
        for j, kind in enumerate(selector.covariance_types_):
            model = _separate(k, kind).fit(planted)
            assert_allclose(selector.criteria_[i, j], model.bic(planted), rtol=1e-10)


def test_a_failing_candidate_fails_the_fit_without_hanging(planted):
    X = np.vstack([planted, np.repeat(planted[:1] + 50.0, 30, axis=0)])
    selector = GaussianMixtureIC(4, 6, reg_covar=0.0, on_degenerate="raise",
                                 random_state=0)
    with pytest.raises(ValueError, match="ill-defined empirical covariance"):
        selector.fit(X)
    assert not hasattr(selector, "criteria_")


def test_candidates_that_cannot_fit_in_memory_are_refused_up_front(planted):
    selector = GaussianMixtureIC(1, 30, covariance_type="all", memory_limit=0.05)
    with pytest.raises(MemoryError, match="120 candidates fitted side by side need"):
        selector.fit(planted)


def test_in_pipeline_and_grid_search(planted):
    pipe = Pipeline([("scale", StandardScaler()),
                     ("gmm", GaussianMixtureIC(2, 5, random_state=0))]).fit(planted)
    assert pipe.named_steps["gmm"].n_components_ == 4
    assert pipe.predict(planted).shape == (len(planted),)
    search = GridSearchCV(GaussianMixtureIC(1, 5, random_state=0),
                          {"covariance_type": ["full", "spherical"]}, cv=3)
    search.fit(planted)
    assert search.best_estimator_.n_components_ == 4
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()


@pytest.mark.parametrize(("params", "match"), [
    ({"min_components": 3, "max_components": 2}, "min_components <= max_components"),
    ({"min_components": 0}, "1 <= min_components"),
    ({"criterion": "icl"}, "criterion must be 'bic' or 'aic'"),
    ({"covariance_type": ["full", "full"]}, "list of distinct ones"),
    ({"covariance_type": "banded"}, "covariance_type must be one of"),
    ({"max_components": 801}, "exceeds the number of samples"),
])
def test_bad_parameters_are_refused_before_fitting(planted, params, match):
    selector = GaussianMixtureIC(**params)
    with pytest.raises(ValueError, match=match):
        selector.fit(planted)
    assert not hasattr(selector, "criteria_")


@pytest.mark.slow
def test_sklearn_estimator_checks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(GaussianMixtureIC(1, 2), on_fail=None)
    assert len(results) >= 30
    failed = {r["check_name"]: repr(r["exception"]) for r in results
              if r["status"] == "failed"
              or (r["status"] == "skipped"
                  and "SCIPY_ARRAY_API is not set" not in str(r["exception"]))}
    assert failed == {}


@pytest.mark.slow
def test_benchmark_script_runs(tmp_path):
    """benchmarks/bench_selection.py at its --quick size: both ways chose alike and
    the shared pass read the file fewer times."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_selection.py"
    out = tmp_path / "quick.json"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["same_choice"]
    assert result["shared_passes"] < result["loop_passes_at_least"]


def test_docstring_examples_run():
    import doctest

    import emgmm._mixture.model_selection as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_cancelled_shared_passes_end_every_member():
    """What a Ctrl-C during GaussianMixtureIC.fit does to the candidates' threads:
    each ends at its next pass instead of running its fit to the end."""
    import threading

    from emgmm._engine.model import Model
    from emgmm._engine.shared_pass import FitCancelled, SharedPasses

    model = Model(np.ones(1), np.zeros((1, 2)), np.ones((1, 2)), np.ones((1, 2)),
                  "diag")
    passes = SharedPasses(None, [], 1, n_members=2)  # (no round can run: 2 members)
    raised = []

    def member():
        try:
            passes.score_pass(None, None, None, model, np.float64, False)
        except FitCancelled as exc:
            raised.append(exc)

    thread = threading.Thread(target=member)
    thread.start()
    while not passes._waiting:
        pass
    passes.cancel()
    thread.join(timeout=10)
    assert not thread.is_alive() and len(raised) == 1
    with pytest.raises(FitCancelled):
        passes.score_pass(None, None, None, model, np.float64, False)


@pytest.mark.parametrize(("params", "match"), [
    ({"tol": -1.0}, "'tol' parameter"),
    ({"max_iter": -3}, "'max_iter' parameter"),
    ({"init_params": "bogus"}, "'init_params' parameter"),
    ({"n_init": 0}, "'n_init' parameter"),
    ({"on_degenerate": "x"}, "'on_degenerate' parameter"),
])
def test_invalid_shared_parameters_raise_before_any_fit(params, match):
    """The candidates' parameters are checked as GaussianMixture checks them (their
    fits run on the shared passes, not through GaussianMixture.fit)."""
    X = np.random.default_rng(0).normal(size=(50, 2))
    with pytest.raises(ValueError, match=match):
        GaussianMixtureIC(1, 2, **params).fit(X)


def test_a_random_state_instance_gives_reproducible_criteria():
    """The candidates' threads do not draw from one shared RandomState: each gets a
    seed of its own from it, in grid order."""
    X = np.random.default_rng(1).normal(size=(300, 2))
    tables = [GaussianMixtureIC(1, 4, covariance_type=["full", "diag"], max_iter=5,
                                init_params="random",
                                random_state=np.random.RandomState(0)).fit(X).criteria_
              for _ in range(3)]
    assert_array_equal(tables[0], tables[1])
    assert_array_equal(tables[0], tables[2])


def test_the_error_of_one_candidate_is_raised_not_the_others_cancellation():
    """Candidates with K > init_max_samples raise at initialisation; that error ends
    the other candidates' fits (cancelled at their next pass), and it is what the
    selector raises, not the cancellation of an earlier candidate of the grid."""
    X = np.random.default_rng(2).normal(size=(200, 2))
    with pytest.raises(ValueError, match="init_max_samples=3 is below n_components"):
        GaussianMixtureIC(1, 6, max_iter=200, tol=0, init_max_samples=3).fit(X)


def test_predict_on_a_dataframe_does_not_warn():
    pandas = pytest.importorskip("pandas")
    X = np.random.default_rng(3).normal(size=(100, 2))
    frame = pandas.DataFrame(X, columns=["a", "b"])
    selector = GaussianMixtureIC(1, 2, random_state=0).fit(frame)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels = selector.predict(frame)
    assert_array_equal(labels,
                       GaussianMixtureIC(1, 2, random_state=0).fit(X).predict(X))
