"""Cases C12, C15-C18 and C22-C24 of CASES.md: determinism, sharing data with joblib
workers, BLAS threads, and HDF5 in several processes.

(C19-C21, temporary space and leftovers after kills, live with the reliability tests.)
"""

import glob
import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap

import h5py
import joblib
import numpy as np
import pytest
from helpers import IGNORE_NOT_CONVERGED, make_blobs_data, quiet_fit
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.model_selection import GridSearchCV
from threadpoolctl import threadpool_info, threadpool_limits

import emgmm.runtime.executor as parallel
from emgmm import GaussianMixture
from emgmm.covariance import cholesky as _cholesky
from emgmm.covariance import log_density as _log_density
from emgmm.covariance import statistics as _statistics
from emgmm.engine import estep as _estep
from emgmm.io.sources import ArraySource, MemmapSource, as_source

STATE = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")
CORES = joblib.cpu_count()




def assert_same_state(a, b, rtol=None, precision_rtol=None):
    """Bitwise (rtol=None) or to ``rtol`` of each array's largest entry; the
    precisions (inverses) may get ``precision_rtol``."""
    for name in STATE:
        x, y = getattr(a, name), getattr(b, name)
        precisions = precision_rtol and name.startswith("precisions")
        tol = precision_rtol if precisions else rtol
        if tol is None:
            assert_array_equal(x, y, err_msg=name)
        else:
            assert_allclose(x, y, rtol=0, atol=tol * np.abs(y).max(), err_msg=name)
    if rtol is None:
        assert a.lower_bounds_ == b.lower_bounds_
    assert a.n_iter_ == b.n_iter_


def blas_threads():
    """BLAS threads this process would use now."""
    counts = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert counts, "no BLAS library found by threadpoolctl"
    return max(counts)


# --------------------------------------------------------------------------- C12


@pytest.fixture(scope="module")
def X_c12():
    return np.random.default_rng(0).normal(size=(1000, 100))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_case_c12_same_seed_same_answer(X_c12, schedule):
    """Fitted twice, n_jobs 1/2/4, BLAS 1 or 2 threads.

    Bitwise identical whenever each task runs with the same number of BLAS threads
    (n_jobs=2 and 4 give every worker one thread, like n_jobs=1 under a one-thread
    limit). A multi-threaded BLAS splits a product differently from a one-thread
    BLAS (OpenBLAS ``syrk``), so n_jobs=1 with 2 threads agrees with them to 1e-12
    relative (measured: 3e-16 of the largest entry).
    """
    def run(n_jobs, threads):
        with threadpool_limits(limits=threads, user_api="blas"):
            est = GaussianMixture(5, random_state=42, n_jobs=n_jobs, max_iter=15,
                                  schedule=schedule, block_size=256)
            return quiet_fit(est, X_c12)

    one_thread = run(1, 1)
    assert one_thread.n_iter_ >= 2
    for n_jobs, threads in [(1, 1), (2, 2), (4, 1)]:
        assert_same_state(run(n_jobs, threads), one_thread)
    two_threads = run(1, 2)
    assert_same_state(two_threads, one_thread, rtol=1e-12, precision_rtol=1e-10)
    assert_allclose(two_threads.lower_bounds_, one_thread.lower_bounds_, rtol=1e-12)


def test_case_c12_schedules_agree(X_c12):
    fits = [quiet_fit(GaussianMixture(5, random_state=42, n_jobs=2, max_iter=15,
                                      schedule=s, block_size=256), X_c12)
            for s in ("rows", "components")]
    assert_same_state(fits[0], fits[1], rtol=1e-12)


X_SMALL = make_blobs_data(300, 3, 3, seed=0)
BASE = dict(n_components=3, random_state=0, max_iter=10)


def small_fit(**params):
    return quiet_fit(GaussianMixture(**{**BASE, **params}), X_SMALL)


def records():
    out = []
    return out, out.append


class PlanSpy:
    """A callback recording what each fit chose (its ``'plan'`` event): the
    schedule, block size and workers."""

    wants_plan = True

    def __init__(self):
        self.plans = []

    def __call__(self, record):
        if record["event"] == "plan":
            self.plans.append(record)

    def __getitem__(self, key):
        return [plan[key] for plan in self.plans]


def _check_n_factors(mp, capsys):
    for q in (1, 2):
        gm = small_fit(covariance_type="factor", n_factors=q)
        assert gm.loadings_.shape == (3, 3, q)


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


# --------------------------------------------------------------------------- C15


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_case_c15_kernels_never_write_into_inputs(covariance_type):
    rng = np.random.default_rng(0)
    n, d, K = 64, 6, 4
    X = rng.normal(size=(n, d))
    means = rng.normal(size=(K, d))
    cov = {"full": np.stack([np.eye(d) * 1.5] * K), "tied": np.eye(d) * 2.0,
           "diag": np.full((K, d), 1.5), "spherical": np.full(K, 1.5)}[covariance_type]
    u, _ = _cholesky.factorize(cov, covariance_type)
    weights = np.full(K, 1 / K)
    resp = rng.dirichlet(np.ones(K), size=n)
    inputs = [X, means, u, weights, resp, X.astype(np.float32)]
    copies = [a.copy() for a in inputs]
    for a in inputs:
        a.setflags(write=False)  # a write would raise
    for Xc in (X, inputs[-1]):
        _log_density.log_gaussian_prob(Xc, means, u, covariance_type, weights)
        _estep.estimate_log_prob_resp(Xc, weights, means, u, covariance_type)
        _statistics.block_statistics(Xc, resp, means, covariance_type, 0.1)
    for a, c in zip(inputs, copies, strict=False):
        assert_array_equal(a, c)


@pytest.fixture(scope="module")
def X_c15():
    X = make_blobs_data(4096, 150, 6, seed=1)
    X.setflags(write=False)
    return X


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_case_c15_read_only_inputs_both_sides_of_joblib_threshold(X_c15, schedule,
                                                                  temp_folder):
    """A read-only X; blocks of 0.5 MB and 2 MB (joblib memmaps arguments above 1 MB,
    read-only); the 6 x 150 x 150 factors (1.08 MB) reach the workers as read-only
    memmaps, and those memmaps do not pile up from one iteration to the next.
    n_jobs=2 equals n_jobs=1 bitwise on each side; the two sides agree to 1e-12
    (different block sums)."""
    before = X_c15.copy()
    results = {}
    footprints = []

    def footprint(record):
        files = [f for f in glob.glob(f"{temp_folder}/**", recursive=True)
                 if os.path.isfile(f)]
        footprints.append((len(files), sum(os.path.getsize(f) for f in files)))

    for block_size in (512, 2048):
        assert (block_size * 150 * 8 > 2**20) == (block_size == 2048)
        for n_jobs in (1, 2):
            est = GaussianMixture(6, random_state=0, max_iter=3, tol=0, n_jobs=n_jobs,
                                  block_size=block_size, schedule=schedule,
                                  callback=footprint if n_jobs == 2 else None)
            # one BLAS thread per task on both sides, for bitwise equality (C12)
            with threadpool_limits(limits=1, user_api="blas"):
                results[block_size, n_jobs] = quiet_fit(est, X_c15)
        assert_same_state(results[block_size, 1], results[block_size, 2])
    # the precisions are inverses of 150 x 150 covariances of condition ~1e3: they
    # carry the covariances' rounding (1e-15) times the condition number
    assert_same_state(results[512, 2], results[2048, 2], rtol=1e-12,
                      precision_rtol=1e-10)
    assert_array_equal(X_c15, before)
    assert len(footprints) == 6
    # the first iteration shares one (K, d, d) array fewer than the later ones
    # (measured: 2 files, then 3); from the second on the footprint stays the same
    for first in (0, 3):
        assert footprints[first] <= footprints[first + 1], footprints
        assert footprints[first + 1] == footprints[first + 2], footprints
    assert os.listdir(temp_folder) == []


# --------------------------------------------------------------------------- C16


def test_case_c16_x_written_once_per_fit(temp_folder):
    """200+ tasks share one 50 MB in-memory X: one dump per fit (one file, neither
    rewritten nor joined by others from one iteration to the next); nothing left
    afterwards."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(16384, 400))  # 50 MB
    assert X.nbytes >= 50 * 10**6
    spy = PlanSpy()
    footprints = []

    def footprint(record):
        spy(record)
        if record["event"] == "iteration":
            files = [f for f in glob.glob(f"{temp_folder}/**", recursive=True)
                     if os.path.isfile(f)]
            footprints.append(sorted((f, os.stat(f).st_size, os.stat(f).st_mtime_ns)
                                     for f in files))

    footprint.wants_plan = True
    # (arguments above joblib's 1 MB threshold: the 1 MB factors of C15)
    est = GaussianMixture(2, covariance_type="diag", n_jobs=2, block_size=64,
                          max_iter=3, tol=0, weights_init=[0.5, 0.5], means_init=X[:2],
                          precisions_init=np.ones((2, 400)), callback=footprint)
    quiet_fit(est, X)
    assert (3 + 1) * spy["n_tasks"][0] >= 200  # passes: 3 iterations, final score
    assert len(footprints) == 3
    x_files = [f for f, size, _ in footprints[0] if size >= X.nbytes]
    assert len(x_files) == 1, footprints[0]  # X was shared through the folder, once
    assert footprints[-1] == footprints[0], footprints  # nothing rewritten or added
    assert os.listdir(temp_folder) == []


# --------------------------------------------------------------------------- C17


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_case_c17_task_payload_small_whatever_n(schedule, monkeypatch, temp_folder):
    sizes = {}
    real_map = parallel.Executor.map

    def measuring_map(self, func, task_args):
        for args in task_args:
            payload = len(pickle.dumps((func, self.worker_source, args),
                                       protocol=pickle.HIGHEST_PROTOCOL))
            sizes[n] = max(sizes.get(n, 0), payload)
        if self.n_workers > 1:  # X never travels by value to process workers
            assert not isinstance(self.worker_source, ArraySource)
        return real_map(self, func, task_args)

    monkeypatch.setattr(parallel.Executor, "map", measuring_map)
    rng = np.random.default_rng(0)
    for n in (20_000, 400_000):  # 1.6 MB and 32 MB in memory
        X = rng.normal(size=(n, 10))
        est = GaussianMixture(3, n_jobs=2, max_iter=2, block_size=4096,
                              schedule=schedule, random_state=0, init_max_samples=2000)
        quiet_fit(est, X)
    assert max(sizes.values()) < 64 * 1024, sizes
    assert sizes[400_000] <= sizes[20_000] + 1024, sizes  # does not grow with n


# --------------------------------------------------------------------------- C18


class ProbeSource(MemmapSource):
    """A .npy source whose reads record the reading process and its BLAS threads."""

    probe_dir = None

    def _read(self, start, stop):
        record = {"pid": os.getpid(), "blas": blas_threads()}
        path = os.path.join(self.probe_dir, f"{os.getpid()}-{start}.json")
        with open(path, "w") as fh:
            json.dump(record, fh)
        return super()._read(start, stop)


def read_records(folder):
    out = []
    for path in glob.glob(os.path.join(folder, "*.json")):
        with open(path) as fh:
            out.append(json.load(fh))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_case_c18_blas_threads_times_workers_within_cores(tmp_path, schedule):
    X = make_blobs_data(2000, 6, 3, seed=2)
    path = tmp_path / "x.npy"
    np.save(path, X)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    source = ProbeSource.from_npy(path)
    source.probe_dir = str(probe_dir)
    est = GaussianMixture(3, n_jobs=2, block_size=250, max_iter=3, tol=0,
                          schedule=schedule, random_state=0)
    with threadpool_limits(limits=CORES, user_api="blas"):
        quiet_fit(est, source)
    workers = [r for r in read_records(probe_dir) if r["pid"] != os.getpid()]
    assert workers, "the blocks were not read by worker processes"
    pids = {r["pid"] for r in workers}
    assert len(pids) <= 2
    assert 2 * max(r["blas"] for r in workers) <= CORES


class ExecutorProbe:
    """An EM callback recording, in the process running ``fit``, the executor that
    fit uses (same joblib context) and the BLAS threads there."""

    def __init__(self, folder, n_jobs):
        self.folder, self.n_jobs = folder, n_jobs

    def __call__(self, record):
        ex = parallel.Executor(None, self.n_jobs)
        out = {"pid": os.getpid(), "n_workers": ex.n_workers,
               "blas_threads": ex.blas_threads, "blas": blas_threads()}
        name = f"{os.getpid()}-{record['init']}-{record['n_iter']}-{id(self)}.json"
        with open(os.path.join(self.folder, name), "w") as fh:
            json.dump(out, fh)


@pytest.mark.parametrize("inner_n_jobs", [None, 2])
def test_case_c18_inside_grid_search(tmp_path, inner_n_jobs):
    X = make_blobs_data(400, 3, 3, seed=4)
    est = GaussianMixture(n_jobs=inner_n_jobs, max_iter=3, tol=0, random_state=0,
                          callback=ExecutorProbe(str(tmp_path), inner_n_jobs))
    search = GridSearchCV(est, {"n_components": [1, 2, 3]}, cv=2, n_jobs=2)
    quiet_fit(search, X)
    recs = [r for r in read_records(tmp_path) if r["pid"] != os.getpid()]
    assert recs, "GridSearchCV did not fit in worker processes"
    pids = {r["pid"] for r in recs}
    assert len(pids) <= 2
    # in-process passes use the process's BLAS threads; worker passes blas_threads
    per_process = max(r["n_workers"] * (r["blas"] if r["n_workers"] == 1
                                        else r["blas_threads"]) for r in recs)
    assert len(pids) * per_process <= CORES, recs


# --------------------------------------------------------------------------- C22


def test_case_c22_open_h5py_dataset_with_process_workers(tmp_path):
    X = make_blobs_data(1000, 3, 3, seed=5)
    path = tmp_path / "c22.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/x", data=X)
    ref = quiet_fit(GaussianMixture(3, random_state=0, n_jobs=1, block_size=128), X)
    with h5py.File(path, "r") as f:
        ds = f["data/x"]
        with pytest.raises(TypeError):
            pickle.dumps(ds)  # why the workers must open the file themselves
        got = quiet_fit(GaussianMixture(3, random_state=0, n_jobs=2, block_size=128),
                        ds)
        assert ds.id.valid and ds[0, 0] == X[0, 0]  # the user's handle still works
    assert_same_state(got, ref)


# --------------------------------------------------------------------------- C23


def checksum_task(source, start, stop, *, blas_threads):
    return os.getpid(), hashlib.sha256(source.read(start, stop).tobytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["loky", "multiprocessing"])
def test_case_c23_compressed_hdf5_read_concurrently_after_parent_read(tmp_path,
                                                                      backend):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 8))
    path = tmp_path / "c23.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=X, chunks=(256, 8), compression="gzip")
    ranges = [(s, min(s + 2500, 20_000)) for s in range(0, 20_000, 2500)]
    with h5py.File(path, "r") as parent:
        head = parent["x"][100:300]  # the parent has read before the workers start
        assert_array_equal(head, X[100:300])
        serial = [hashlib.sha256(parent["x"][s:e].tobytes()).hexdigest()
                  for s, e in ranges]
        source = as_source(f"{path}:/x")
        source.read(0, 10)  # and the source's own handle is open in the parent
        pids = set()
        with joblib.parallel_config(backend=backend):
            with parallel.Executor(source, 2) as executor:
                assert executor.n_workers == 2
                for _ in range(50):
                    out = list(executor.map(checksum_task, ranges))
                    pids |= {pid for pid, _ in out}
                    assert [c for _, c in out] == serial
        source.close()
    assert os.getpid() not in pids


# --------------------------------------------------------------------------- C24


def env_task(source, *, blas_threads):
    return os.getpid(), os.environ.get("HDF5_USE_FILE_LOCKING")


def test_case_c24_workers_open_while_parent_holds_file(tmp_path):
    X = make_blobs_data(1500, 4, 3, seed=6)
    path = tmp_path / "c24.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=X, chunks=(100, 4))
    ref = quiet_fit(GaussianMixture(3, random_state=0, block_size=100), X)
    with h5py.File(path, "r") as held:
        for _ in range(3):
            got = quiet_fit(GaussianMixture(3, random_state=0, block_size=100,
                                            n_jobs=2),
                            f"{path}:/x")
            assert_same_state(got, ref)
        assert_array_equal(held["x"][:5], X[:5])
        # one locking setting for parent and workers
        with parallel.Executor(as_source(f"{path}:/x"), 2) as executor:
            settings = set(v for _, v in executor.map(env_task, [()] * 4))
        assert settings == {os.environ.get("HDF5_USE_FILE_LOCKING")}


WRITER = textwrap.dedent("""
    import sys, time, h5py
    f = h5py.File(sys.argv[1], "a")
    print("open", flush=True)
    sys.stdin.readline()
    f.close()
""")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE",
                    reason="file locking disabled in this environment")
def test_case_c24_lock_failure_names_hdf5_use_file_locking(tmp_path):
    path = tmp_path / "locked.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.ones((100, 2)))
    source = as_source(f"{path}:/x")  # opened before the writer: workers will fail
    source.close()
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="TRUE")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        with pytest.raises(OSError, match="HDF5_USE_FILE_LOCKING"):
            GaussianMixture(2, n_jobs=2).fit(f"{path}:/x")
        with pytest.raises(OSError, match="HDF5_USE_FILE_LOCKING"):
            with parallel.Executor(source, 2) as executor:
                list(executor.map(checksum_task, [(0, 50), (50, 100)]))
    finally:
        writer.communicate("close\n", timeout=30)
        writer.stdout.close()  # (left open, its pipe is a ResourceWarning)
    # after the writer closed the file, the fit works (one component: the data
    # are constant rows)
    quiet_fit(GaussianMixture(1, n_jobs=2, random_state=0), f"{path}:/x")
