"""BLAS threads: ``n_jobs=1`` keeps a fit, predict and score_samples on one core
(one BLAS thread while they run, threadpoolctl's threadpool_info inside, the limit
restored after), and workers times their BLAS threads stay within the cores, also
inside GridSearchCV (CASES.md C18)."""

import concurrent.futures
import glob
import json
import os

import joblib
import numpy as np
import pytest
from helpers import make_blobs_data, quiet_fit
from sklearn.model_selection import GridSearchCV
from threadpoolctl import threadpool_info, threadpool_limits

import emgmm
import emgmm._runtime.executor as parallel
from emgmm import GaussianMixture
from emgmm._io.sources import MemmapSource


def _blas_threads():
    return [info["num_threads"] for info in threadpool_info()
            if info["user_api"] == "blas"]


def _threads_seen_in(method, **params):
    seen = []

    def callback(info):
        seen.append(_blas_threads())

    X = np.random.default_rng(0).standard_normal((20000, 32))
    gm = emgmm.GaussianMixture(5, max_iter=2, tol=0, random_state=0, callback=callback,
                               **params)
    with pytest.warns(Warning):  # (not converged in 2 iterations)
        gm.fit(X)
    return seen


@pytest.fixture
def two_blas_threads():
    if not _blas_threads():
        pytest.skip("no BLAS loaded")
    with threadpool_limits(limits=2, user_api="blas"):
        if max(_blas_threads()) < 2:
            pytest.skip("BLAS runs one thread here")
        yield


def test_n_jobs_1_runs_one_blas_thread(two_blas_threads):
    seen = _threads_seen_in("fit", n_jobs=1)
    assert seen and all(threads == [1] * len(threads) for threads in seen), seen
    assert max(_blas_threads()) == 2  # restored after the fit


def test_parallel_config_n_jobs_1_runs_one_blas_thread(two_blas_threads):
    with joblib.parallel_config(n_jobs=1):
        seen = _threads_seen_in("fit")
    assert seen and all(threads == [1] * len(threads) for threads in seen), seen


CORES = joblib.cpu_count()


def blas_threads():
    """BLAS threads this process would use now."""
    counts = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert counts, "no BLAS library found by threadpoolctl"
    return max(counts)


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
def test_case_c18_blas_threads_within_cores_inside_grid_search(tmp_path, inner_n_jobs):
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


def test_predict_with_n_jobs_1_runs_one_blas_thread():
    if not _blas_threads():
        pytest.skip("no BLAS loaded")
    from emgmm._io import sources

    X = np.random.default_rng(0).standard_normal((3000, 8))
    gm = emgmm.GaussianMixture(3, random_state=0, n_jobs=1, max_iter=3, tol=1e3).fit(X)
    seen = []

    class Recording(sources.ArraySource):
        def _read(self, start, stop):
            seen.append(_blas_threads())
            return super()._read(start, stop)

    with threadpool_limits(limits=2, user_api="blas"):
        if max(_blas_threads()) < 2:
            pytest.skip("BLAS runs one thread here")
        gm.predict(Recording(X))
        gm.score_samples(Recording(X))
        assert max(_blas_threads()) == 2
    assert seen and all(t == [1] * len(t) for t in seen), seen


def test_over_ranges_covers_every_item_once_in_order_on_one_blas_thread():
    """Ranges partition the items in order (cut by work when given), run in threads
    of this process with one BLAS thread each, and one after the other when called
    from another thread (a row thread)."""
    import threading

    from emgmm._runtime.blas import over_ranges

    seen = []
    together = threading.Barrier(3, timeout=30)  # (broken unless 3 threads run)

    def record(start, stop):
        together.wait()
        seen.append((threading.get_ident(), _blas_threads()))
        return list(range(start, stop))

    parts = over_ranges(record, 10, 3)
    assert [k for part in parts for k in part] == list(range(10))
    assert len(parts) == 3 and len({ident for ident, _ in seen}) == 3
    assert all(max(threads, default=1) == 1 for _, threads in seen)
    work = np.array([9.0, 0, 0, 0, 0, 0, 0, 0, 1.0, 8.0])
    parts = over_ranges(lambda a, b: (int(a), int(b)), 10, 2, work=work)
    assert parts == [(0, 1), (1, 10)]
    skewed = over_ranges(lambda a, b: list(range(a, b)), 3, 3,
                         work=np.array([100.0, 0, 0]))
    assert [k for part in skewed for k in part] == [0, 1, 2]  # (some ranges empty)

    from_thread = []
    worker = threading.Thread(target=lambda: from_thread.append(
        over_ranges(lambda a, b: threading.get_ident(), 10, 4)))
    worker.start()
    worker.join()
    assert len(from_thread[0]) == 1


def test_loops_take_a_hold_s_threads_else_as_many_as_blas(two_blas_threads):
    """Without a hold, loops over components take as many threads as BLAS may use
    (a threadpoolctl limit bounds them); a hold's ``loop_threads`` (the executor's)
    outlasts the one-thread holds of the loops themselves, the smallest of nested
    holds that name it holds until the last release; a worker's ``limit_blas`` is
    back at its value after a loop inside it."""
    from emgmm._runtime import blas

    assert blas.held_threads() == 2
    with threadpool_limits(limits=1, user_api="blas"):
        assert blas.held_threads() == 1
    blas.hold_process_limit(1, loop_threads=4)
    try:
        assert blas.held_threads() == 4
        with blas.single_blas_thread():  # (as every loop of over_ranges takes)
            assert max(_blas_threads()) == 1
        blas.over_ranges(lambda start, stop: None, 8, 2)
        assert blas.held_threads() == 4
        blas.hold_process_limit(1, loop_threads=3)
        blas.release_process_limit()
        assert blas.held_threads() == 3
    finally:
        blas.release_process_limit()
    assert blas.held_threads() == 2 and max(_blas_threads()) == 2
    with blas.limit_blas(1):
        assert blas.held_threads() == 1
    with blas.limit_blas(2):
        blas.over_ranges(lambda start, stop: None, 8, 2)
        assert max(_blas_threads()) == 2
    assert blas.threads_for_loop(blas.THREADED_WORK - 1) == 1
    assert blas.threads_for_loop(blas.THREADED_WORK) == 2
    # a row thread's loops run in that thread (over_ranges): one, without a lookup
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(blas.threads_for_loop, blas.THREADED_WORK).result() == 1


@pytest.mark.parametrize("limit", [None, 1])
@pytest.mark.parametrize("row_threads", [True, False])
def test_executor_gives_its_loops_the_cores_of_its_pass(two_blas_threads, tmp_path,
                                                       limit, row_threads):
    """Inside an executor, loops take its component threads: its row threads, or,
    for a pass without them (large statistics), as many as BLAS may use; one under
    a limit of one BLAS thread; restored after."""
    from emgmm._io.sources import as_source
    from emgmm._runtime import blas

    path = tmp_path / "X.npy"
    np.save(path, np.zeros((10, 3)))
    with threadpool_limits(limits=limit, user_api="blas"):
        before = blas.held_threads()
        executor = parallel.Executor(as_source(str(path)), None)
        if not row_threads:
            executor.row_threads = 0  # (as the estimators set it before entering)
        with executor:
            assert executor.component_threads == (1 if limit == 1 else 2)
            assert blas.held_threads() == executor.component_threads
        assert blas.held_threads() == before
