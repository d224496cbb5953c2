"""Every constructor argument of GaussianMixture is used: for each one a check that
changing it changes what the fit does (CASES.md C12: "every constructor argument really
used"); ``PARAM_CHECKS`` must name every parameter of ``get_params()``.
"""

import os

import numpy as np
import pytest
from helpers import IGNORE_NOT_CONVERGED, PlanSpy, make_blobs_data, quiet_fit
from numpy.testing import assert_allclose, assert_array_equal

from emgmm import GaussianMixture

X_SMALL = make_blobs_data(300, 3, 3, seed=0)


BASE = dict(n_components=3, random_state=0, max_iter=10)


def small_fit(**params):
    return quiet_fit(GaussianMixture(**{**BASE, **params}), X_SMALL)


def records():
    out = []
    return out, out.append






def _check_n_components(mp, capsys):
    assert small_fit(n_components=2).means_.shape == (2, 3)


def _check_covariance_type(mp, capsys):
    assert small_fit(covariance_type="diag").covariances_.shape == (3, 3)
    assert small_fit(covariance_type="spherical").covariances_.shape == (3,)


def _check_n_factors(mp, capsys):
    assert small_fit(covariance_type="factor", n_factors=2).loadings_.shape == (3, 3, 2)
    assert small_fit(covariance_type="factor", n_factors=1).loadings_.shape == (3, 3, 1)


def _check_tol(mp, capsys):
    kw = dict(max_iter=100, init_params="random")
    assert small_fit(tol=1e-1, **kw).n_iter_ < small_fit(tol=1e-12, **kw).n_iter_


def _check_reg_covar(mp, capsys):
    cov = small_fit(reg_covar=10.0, covariance_type="diag").covariances_
    assert np.all(cov >= 10.0)
    assert np.any(small_fit(covariance_type="diag").covariances_ < 10.0)


def _check_max_iter(mp, capsys):
    assert small_fit(max_iter=1, tol=0).n_iter_ == 1
    assert small_fit(max_iter=4, tol=0).n_iter_ == 4


def _check_n_init(mp, capsys):
    seen, record = records()
    small_fit(n_init=3, callback=record)
    assert {r["init"] for r in seen} == {0, 1, 2}


def _check_init_params(mp, capsys):
    a = small_fit(init_params="kmeans", max_iter=1).lower_bounds_[0]
    b = small_fit(init_params="random", max_iter=1).lower_bounds_[0]
    assert a != b


def _init(K=3):
    means = X_SMALL[[0, 100, 200]][:K]
    return dict(weights_init=np.full(K, 1 / K), means_init=means,
                precisions_init=np.stack([np.eye(3)] * K))


def _check_weights_init(mp, capsys):
    init = _init()
    a = small_fit(**init, max_iter=1).lower_bounds_[0]
    b = small_fit(**{**init, "weights_init": np.array([0.6, 0.3, 0.1])},
                  max_iter=1).lower_bounds_[0]
    assert a != b
    with pytest.raises(ValueError, match="weights"):
        small_fit(weights_init=np.array([0.5, 0.6, 0.1]))


def _check_means_init(mp, capsys):
    est = small_fit(**_init(), max_iter=0)
    assert_array_equal(est.means_, X_SMALL[[0, 100, 200]])
    with pytest.raises(ValueError, match="means"):
        small_fit(means_init=np.zeros((2, 3)))


def _check_precisions_init(mp, capsys):
    init = _init()
    est = small_fit(**{**init, "precisions_init": np.stack([2 * np.eye(3)] * 3)},
                    max_iter=0)
    assert_allclose(est.precisions_, np.stack([2 * np.eye(3)] * 3))
    with pytest.raises(ValueError, match="precision"):
        small_fit(**{**init, "precisions_init": -np.stack([np.eye(3)] * 3)})


def _check_random_state(mp, capsys):
    a = small_fit(init_params="random", random_state=0, max_iter=1).lower_bounds_[0]
    b = small_fit(init_params="random", random_state=1, max_iter=1).lower_bounds_[0]
    c = small_fit(init_params="random", random_state=0, max_iter=1).lower_bounds_[0]
    assert a != b and a == c


def _check_warm_start(mp, capsys):
    est = small_fit(warm_start=True, max_iter=2, tol=0)
    first = est.lower_bound_
    quiet_fit(est, X_SMALL)
    assert_allclose(est.lower_bounds_[0], first, rtol=1e-10)
    cold = small_fit(warm_start=False, max_iter=2, tol=0)
    quiet_fit(cold, X_SMALL)
    assert cold.lower_bounds_[0] != pytest.approx(first, rel=1e-6)


def _check_verbose(mp, capsys):
    small_fit(verbose=0)
    assert capsys.readouterr().out == ""
    small_fit(verbose=1)
    assert "Initialization" in capsys.readouterr().out


def _check_verbose_interval(mp, capsys):
    small_fit(verbose=1, verbose_interval=1, max_iter=10, tol=0)
    one = capsys.readouterr().out.count("Iteration")
    small_fit(verbose=1, verbose_interval=5, max_iter=10, tol=0)
    five = capsys.readouterr().out.count("Iteration")
    assert (one, five) == (10, 2)


def _check_n_jobs(mp, capsys):
    spy = PlanSpy()
    small_fit(n_jobs=1, callback=spy)
    small_fit(n_jobs=2, callback=spy)
    assert spy["n_workers"] == [1, 2]


def _check_temp_folder(mp, capsys, tmp_path):
    seen = []
    small_fit(n_jobs=2, temp_folder=tmp_path, callback=lambda r: seen.extend(
        p.name for p in tmp_path.iterdir()))
    assert seen and all(name.startswith("emgmm-") for name in seen)
    assert list(tmp_path.iterdir()) == []


def _check_working_memory(mp, capsys):
    spy = PlanSpy()
    small_fit(working_memory=1000, callback=spy)
    small_fit(working_memory=0.01, callback=spy)
    assert spy["block_size"][0] == 300 and spy["block_size"][1] < 300


def _check_block_size(mp, capsys):
    spy = PlanSpy()
    small_fit(block_size=7, callback=spy)
    assert spy["block_size"] == [7]
    assert spy["n_tasks"] == [-(-300 // 7)]


def _check_memory_limit(mp, capsys):
    small_fit(memory_limit=1.0)
    with pytest.raises(MemoryError, match="budget"):
        small_fit(memory_limit=1e-4)


def _check_schedule(mp, capsys):
    spy = PlanSpy()
    for schedule in ("rows", "components", "auto"):
        small_fit(schedule=schedule, callback=spy)
    assert spy["schedule"] == ["rows", "components", "rows"]


def _check_init_max_samples(mp, capsys):
    a = small_fit(max_iter=1).lower_bounds_[0]
    b = small_fit(init_max_samples=20, max_iter=1).lower_bounds_[0]
    assert a != b


def _check_compute_dtype(mp, capsys):
    a = small_fit(compute_dtype="float64", tol=0, max_iter=3).means_
    b = small_fit(compute_dtype="float32", tol=0, max_iter=3).means_
    assert not np.array_equal(a, b)
    assert_allclose(a, b, rtol=1e-4)


def _check_resp_threshold(mp, capsys):
    kw = dict(tol=0, max_iter=3, init_params="random")
    assert not np.array_equal(small_fit(**kw).covariances_,
                              small_fit(resp_threshold=0.3, **kw).covariances_)


def _check_on_degenerate(mp, capsys):
    # a component initialised far from the data is starved (N_k < 1) and, with
    # reg_covar=0, its covariance is not positive definite
    init = _init()
    init["means_init"] = init["means_init"].copy()
    init["means_init"][2] = 1e3
    kw = dict(BASE, **init, reg_covar=0.0)
    with pytest.warns(UserWarning, match="re-seeded"):
        GaussianMixture(**kw, on_degenerate="reinit").fit(X_SMALL)
    with pytest.raises(ValueError, match="ill-defined"):
        GaussianMixture(**kw, on_degenerate="raise").fit(X_SMALL)


def _checkpoint_seen(tmp_path, **params):
    path = tmp_path / f"ckpt{len(os.listdir(tmp_path))}.npz"
    seen, record = records()
    small_fit(checkpoint=path, tol=0, max_iter=4,
              callback=lambda r: record(path.exists()), **params)
    return seen, path.exists()


def _check_checkpoint(mp, capsys, tmp_path):
    # written during the fit, removed when it completes
    assert _checkpoint_seen(tmp_path) == ([True] * 4, False)


def _check_checkpoint_interval(mp, capsys, tmp_path):
    assert _checkpoint_seen(tmp_path, checkpoint_interval=1e6) == ([False] * 4, False)


def _check_callback(mp, capsys):
    seen, record = records()
    est = small_fit(callback=record, tol=0, max_iter=4)
    assert [r["n_iter"] for r in seen] == [1, 2, 3, 4]
    assert [r["lower_bound"] for r in seen] == est.lower_bounds_


def _stream_means(**params):
    est = GaussianMixture(**{**BASE, **params})
    for part in np.array_split(X_SMALL, 3):
        est.partial_fit(part)
    return est.means_


def _check_learning_decay(mp, capsys):
    assert not np.allclose(_stream_means(learning_decay=0.6),
                           _stream_means(learning_decay=1.0), rtol=1e-6)


def _check_learning_offset(mp, capsys):
    assert not np.allclose(_stream_means(learning_offset=0.0),
                           _stream_means(learning_offset=100.0), rtol=1e-6)


PARAM_CHECKS = {name[len("_check_"):]: f for name, f in globals().items()
                if name.startswith("_check_")}


def test_case_c12_every_constructor_argument_has_a_check():
    params = set(GaussianMixture().get_params())
    missing = params - set(PARAM_CHECKS)
    assert not missing, ("add a _check_<param> showing these parameters are used: "
                         f"{missing}")
    assert not set(PARAM_CHECKS) - params


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # fits of 10 iterations or fewer
@pytest.mark.parametrize("param", sorted(PARAM_CHECKS))
def test_case_c12_constructor_argument_is_used(param, monkeypatch, capsys, tmp_path):
    check = PARAM_CHECKS[param]
    if "tmp_path" in check.__code__.co_varnames[:check.__code__.co_argcount]:
        check(monkeypatch, capsys, tmp_path)
    else:
        check(monkeypatch, capsys)
