"""Parallel EM: n_jobs, the two schedules, workers and their temporary files.

Determinism contract tested here: for a given schedule the fitted state is *bitwise*
identical for n_jobs=1, 2 and 4, for process and thread workers, and for HDF5 read
by the workers (the row and component partitions and the reduction order do not
depend on the workers, and every kernel computes a row or a component independently
of how many there are). The two schedules sum the same terms in a different order,
so they agree to 1e-12 relative, not bitwise.
"""

import glob
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import warnings

import h5py
import joblib
import numpy as np
import pytest
import scipy.linalg
from helpers import (
    COVARIANCE_TYPES,
    PARAMS,
    SKLEARN_COVARIANCE_TYPES,
    PlanSpy,
    assert_same_state,
    make_blobs_data,
    not_converging,
    quiet_fit,
    type_settings,
)
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.mixture import GaussianMixture as SkGaussianMixture
from threadpoolctl import threadpool_limits

import emgmm._engine.model as em
import emgmm._engine.passes as passes
import emgmm._runtime.blas as blas
import emgmm._runtime.executor as parallel
import emgmm._runtime.memory as memory
from emgmm import GaussianMixture
from emgmm._io.sources import ArraySource
from emgmm.covariance import REGISTRY as KINDS


def fit(X, **params):
    kw = dict(n_components=4, random_state=0, max_iter=6, tol=0.0, block_size=256)
    kw.update(params)
    with not_converging():  # tol=0
        return GaussianMixture(**kw).fit(X)




def emgmm_entries(folder):
    return [name for name in os.listdir(folder)
            if name.startswith(parallel.TEMP_PREFIX)]


@pytest.fixture(autouse=True)
def fine_split(monkeypatch):
    """Cut the small test models into several component slices and row pieces (the
    defaults keep a small model in one task), so the workers really share them."""
    monkeypatch.setattr(memory, "SLICE_BYTES", 8 * 25)
    monkeypatch.setattr(memory, "TASK_WORK", 2 * 10**4)


@pytest.fixture(scope="module")
def X():
    data = make_blobs_data(1500, 5, 4, seed=3)
    data.setflags(write=False)
    return data


@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_n_jobs_2_equals_n_jobs_1_bitwise(X, schedule, covariance_type, temp_folder):
    settings = type_settings(covariance_type, X.shape[1])
    one = fit(X, n_jobs=1, schedule=schedule, **settings)
    two = fit(X, n_jobs=2, schedule=schedule, **settings)
    assert_same_state(one, two)
    assert emgmm_entries(temp_folder) == []


def test_n_jobs_4_equals_n_jobs_1_bitwise(X):
    assert_same_state(fit(X, n_jobs=1), fit(X, n_jobs=4))


@pytest.mark.slow
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_schedules_agree(X, covariance_type):
    settings = type_settings(covariance_type, X.shape[1])
    rows = fit(X, n_jobs=2, schedule="rows", **settings)
    comps = fit(X, n_jobs=2, schedule="components", **settings)
    assert_same_state(rows, comps, rtol=1e-12)
    # fit_predict and the final E step do not depend on the schedule
    assert_array_equal(rows.predict(X), comps.predict(X))


@pytest.mark.slow
def test_component_buffer_is_bounded_and_split_is_fixed(X, monkeypatch):
    """A buffer of a few blocks (many row ranges) gives the model of one range
    holding every row; the splits follow the documented sizes."""
    big = fit(X, n_jobs=2, schedule="components", n_components=6, block_size=53)
    monkeypatch.setattr(memory, "BUFFER_BYTES", 8 * 6 * 540)
    assert memory.buffer_rows(1500, 6, 53) == 530  # three ranges
    small = fit(X, n_jobs=2, schedule="components", n_components=6, block_size=53)
    assert_same_state(big, small, rtol=1e-12)
    assert (memory.component_slices(6, 5, KINDS["full"])
            == [(k, k + 1) for k in range(6)])
    assert memory.component_slices(6, 5, KINDS["tied"]) == [(0, 6)]
    monkeypatch.undo()
    for K, d in [(200, 900), (200, 64), (20, 10), (1, 3000)]:
        slices = memory.component_slices(K, d, KINDS["full"])
        assert slices[0][0] == 0 and slices[-1][1] == K
        assert all(a < b for a, b in slices)
        assert all(s[1] == t[0] for s, t in zip(slices, slices[1:], strict=False))
        assert max(b - a for a, b in slices) * d * d * 8 <= max(memory.SLICE_BYTES,
                                                                d * d * 8)
    assert len(memory.component_slices(200, 900, KINDS["full"])) >= memory.MIN_SLICES
    assert len(memory.component_slices(20, 10, KINDS["full"])) == 1  # 16 kB of factors
    pieces = memory.range_pieces(100_000, 1000, 200, 64, KINDS["full"], 7)
    assert pieces[0] == (0, 12_000) and pieces[-1][1] == 100_000


def sklearn_init(X, K, covariance_type, seed=0):
    """weights/means/precisions from a random hard assignment (independent of emgmm)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(len(X)) % K)
    d = X.shape[1]
    weights = np.bincount(labels, minlength=K) / len(X)
    means = np.stack([X[labels == k].mean(axis=0) for k in range(K)])
    covs = np.stack([np.cov(X[labels == k], rowvar=False, bias=True) for k in range(K)])
    covs += 1e-6 * np.eye(d)
    if covariance_type == "full":
        prec = np.linalg.inv(covs)
    elif covariance_type == "tied":
        prec = np.linalg.inv(np.einsum("k,kij->ij", weights, covs))
    elif covariance_type == "diag":
        prec = 1.0 / np.diagonal(covs, axis1=1, axis2=2)
    else:
        prec = 1.0 / np.diagonal(covs, axis1=1, axis2=2).mean(axis=1)
    if (prec.ndim >= 2 and prec.shape[-1] == prec.shape[-2]
            and covariance_type != "diag"):
        prec = (prec + np.swapaxes(prec, -1, -2)) / 2
    return dict(weights_init=weights, means_init=means, precisions_init=prec)


@pytest.mark.slow
@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_both_schedules_match_sklearn(X, covariance_type):
    init = sklearn_init(X, 4, covariance_type)
    common = dict(n_components=4, covariance_type=covariance_type, tol=0, max_iter=5,
                  **init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = SkGaussianMixture(**common).fit(X)
        fits = [GaussianMixture(**common, n_jobs=2, schedule=s, block_size=97).fit(X)
                for s in ("rows", "components")]
    for est in fits:
        assert_allclose(est.lower_bounds_, ref.lower_bounds_, rtol=1e-9)
        for name in PARAMS:
            assert_allclose(getattr(est, name), getattr(ref, name), rtol=1e-7,
                            atol=1e-12 * np.abs(getattr(ref, name)).max(), err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_hdf5_under_process_workers(X, tmp_path, schedule, temp_folder):
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("g/x", data=X, chunks=(64, X.shape[1]), compression="gzip")
    assert joblib.parallel.get_active_backend()[0].__class__.__name__ == "LokyBackend"
    ref = fit(X, n_jobs=1, schedule=schedule, block_size=64)
    got = fit(f"{path}:/g/x", n_jobs=2, schedule=schedule, block_size=64)
    assert_same_state(ref, got)
    assert emgmm_entries(temp_folder) == []


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_model_and_its_prepared_estimates_reach_workers_as_memory_maps(dtype,
                                                                      temp_folder):
    """The model's large arrays and those of its prepared packed estimates (a tuple:
    float32 and float64 for float32 data) go to process workers as read-only memory
    maps of one file each, equal to the originals; the files go with the executor."""
    rng = np.random.default_rng(0)
    K, d = 200, 64  # float32 W: 1.7 MB, above SHARE_BYTES
    model = em.Model(np.full(K, 1.0 / K), rng.normal(size=(K, d)), None,
                     np.tile(np.eye(d), (K, 1, 1)), "full")
    prepared = model.prepare(dtype)
    assert len(prepared) == (2 if dtype == np.float32 else 1)
    executor = parallel.Executor(None, 2)
    try:
        (shared,) = executor._share_large_arguments([(model,)])
        (got,) = shared
        for array in (got.precisions_cholesky, *(e.W for e in got.prepared),
                      *(e.u for e in got.prepared)):
            assert isinstance(array, np.memmap) and not array.flags.writeable
        for before, after in zip(prepared, got.prepared, strict=False):
            assert_array_equal(after.W, before.W)
            assert_array_equal(after.u, before.u)
        # one file per array: u, shared by the model and its estimates, once
        assert len(executor._shared) == 1 + len(prepared)
    finally:
        executor.__exit__(None, None, None)
    assert emgmm_entries(temp_folder) == []


@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_threading_backend(X, schedule, temp_folder):
    ref = fit(X, n_jobs=1, schedule=schedule)
    seen = []
    with joblib.parallel_config(backend="threading"):
        executor = parallel.Executor(None, 2)
        got = fit(X, n_jobs=2, schedule=schedule,
                  callback=lambda r: r["event"] == "iteration"
                  and seen.append(sorted(os.listdir(temp_folder))))
    assert executor.n_workers == 2
    assert_same_state(ref, got)
    # threads share the array: X is not written to the temporary folder
    assert all(not any(n.startswith("emgmm") and os.path.exists(
        os.path.join(temp_folder, n, "X.npy")) for n in names) for names in seen)
    assert os.listdir(temp_folder) == []


@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_no_temp_folder_left_after_fit(X, schedule, temp_folder):
    during = []
    fit(X, n_jobs=2, schedule=schedule,
        callback=lambda r: r["event"] == "iteration"
        and during.append(emgmm_entries(temp_folder)))
    # between iterations only the folder holding X (shared once) exists
    assert during and all(len(names) == 1 for names in during)
    assert os.listdir(temp_folder) == []


def test_temp_folder_parameter_wins_over_the_environment(X, temp_folder, tmp_path,
                                                         monkeypatch):
    """The folder is the estimator's ``temp_folder``, else ``JOBLIB_TEMP_FOLDER``,
    else the system's (joblib's documented choice): X and the component schedule's
    buffer go into the parameter's folder, none into the environment's."""
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    assert parallel.joblib_temp_folder() == str(temp_folder)
    assert parallel.joblib_temp_folder(chosen) == str(chosen)
    assert parallel.shared_memory_folder(2**30, chosen) == str(chosen)
    during = []
    fit(X, n_jobs=2, schedule="components", temp_folder=chosen,
        callback=lambda r: r["event"] == "iteration"
        and during.append((emgmm_entries(chosen), emgmm_entries(temp_folder))))
    assert during and all(len(mine) == 1 and not theirs for mine, theirs in during)
    assert os.listdir(chosen) == [] and os.listdir(temp_folder) == []
    monkeypatch.delenv("JOBLIB_TEMP_FOLDER")
    assert parallel.joblib_temp_folder() == tempfile.gettempdir()


@pytest.mark.parametrize("n_jobs", [None, 2])
def test_a_temp_folder_that_does_not_exist_is_refused_at_fit(X, tmp_path, n_jobs):
    """Also when no file would go there (n_jobs=None), so that a typo shows; the
    estimator stays unfitted."""
    missing = tmp_path / "no-such-folder"
    gm = GaussianMixture(2, n_jobs=n_jobs, temp_folder=missing, random_state=0)
    with pytest.raises(OSError, match=r"no-such-folder is not usable \(No such"):
        gm.fit(X)
    assert not hasattr(gm, "means_")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError, match=r"a-file is not usable \(Not a directory"):
        gm.set_params(temp_folder=tmp_path / "a-file").fit(X)


@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_no_temp_folder_left_after_a_worker_raised(X, schedule, temp_folder):
    """A value whose squares overflow (1e200), written into the workers' copy of X at
    a late row (the copy of a checked array is not checked for NaN again): a worker
    raises."""
    class Spoiling(ArraySource):
        """The array whose copy for the workers is spoilt once it is written."""

        def copy_for_workers(self, parent):
            folder, source = super().copy_for_workers(parent)
            state = os.stat(source.filename)
            mm = np.load(source.filename, mmap_mode="r+")
            mm[1400, 2] = 1e200
            mm.flush()
            del mm
            # behind the source's back: a file whose modification time changed since
            # the source was made is refused as replaced before any row is read
            os.utime(source.filename, ns=(state.st_atime_ns, state.st_mtime_ns))
            return folder, source

    est = GaussianMixture(4, n_jobs=2, schedule=schedule, block_size=53, random_state=0,
                          max_iter=3)
    with pytest.raises(ValueError, match=r"Row 1400 of X: .* at column 2;"):
        est.fit(Spoiling(np.asarray(X)))
    assert not hasattr(est, "means_")  # the estimator keeps its previous state
    assert os.listdir(temp_folder) == []


@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_nan_late_in_npy_file_under_workers(X, tmp_path, schedule, temp_folder):
    bad = np.array(X)
    bad[1499, 0] = np.nan
    path = tmp_path / "bad.npy"
    np.save(path, bad)
    before = path.read_bytes()
    # given initial parameters: the first read of the file is by the workers
    est = GaussianMixture(4, n_jobs=2, schedule=schedule, block_size=53,
                          **sklearn_init(X, 4, "full"))
    with pytest.raises(ValueError, match=r"bad\.npy, row 1499, column 0"):
        est.fit(path)
    assert os.listdir(temp_folder) == []
    assert path.read_bytes() == before


def test_schedule_choice_and_refusal():
    # K=200, d=64 'full': 3.3 MB of statistics per task -> rows
    assert memory.choose_schedule("auto", 200, 64, KINDS["full"], 2, 1e6)[0] == "rows"
    # K=200, d=900: 649 MB per task -> components (needs several workers)
    assert memory.statistics_nbytes(200, 900, KINDS["full"]) == 200 * 900 * 901 // 2 * 8
    assert (memory.choose_schedule("auto", 200, 900, KINDS["full"], 2, 1e6)[0]
            == "components")
    assert memory.choose_schedule("auto", 200, 900, KINDS["full"], 1, 1e6)[0] == "rows"
    # only the component schedule fits the budget -> components
    rows_need = memory.schedule_nbytes("rows", 50, 200, KINDS["full"], 8)
    comp_need = memory.schedule_nbytes("components", 50, 200, KINDS["full"], 8)
    assert comp_need < rows_need
    budget_mib = (comp_need + rows_need) / 2 / 2**20
    assert memory.choose_schedule("auto", 50, 200, KINDS["full"], 8,
                                  budget_mib)[0] == "components"
    with pytest.raises(MemoryError, match=r"'rows' schedule with 8 worker.*budget of"):
        memory.choose_schedule("rows", 50, 200, KINDS["full"], 8, budget_mib)
    # the estimator refuses before writing X or starting workers
    X = np.zeros((200, 6001))
    est = GaussianMixture(200, memory_limit=1024, n_jobs=2)
    with pytest.raises(MemoryError,
                       match=r"needs about [\d,]+ MiB .*budget of 1,024 MiB"):
        est.fit(X)
    factor = GaussianMixture(200, covariance_type="factor", n_factors=1000,
                             memory_limit=1024, n_jobs=2)
    with pytest.raises(MemoryError, match=r"features, a smaller n_factors, a cheaper"):
        factor.fit(X)


def test_schedule_is_validated(X):
    with pytest.raises(ValueError, match="schedule"):
        GaussianMixture(2, schedule="columns").fit(X)


# ------------------------------------------------------------ threads of one process


class ThreadSpy:
    """A callback recording each fit's row threads (its ``'plan'`` event), and the
    data of a fit whose row tasks record the BLAS threads they read under."""

    wants_plan = True

    def __init__(self):
        self.row_threads, self.task_blas = [], []

    def __call__(self, record):
        if record["event"] == "plan":
            self.row_threads.append(record["row_threads"])

    def source(self, X):
        spy = self

        class Recording(ArraySource):
            def _read(self, start, stop):
                # (the row tasks' threads; the initialisation reads in this one)
                if threading.current_thread() is not threading.main_thread():
                    spy.task_blas.append(parallel.blas_thread_count())
                return super()._read(start, stop)

        return Recording(np.asarray(X))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_row_threads_equal_serial_bitwise(X, covariance_type, monkeypatch):
    """n_jobs=None runs the row tasks of a pass in threads (one BLAS thread each) when
    BLAS may use several threads; the result is the serial one, bit for bit."""
    from threadpoolctl import threadpool_limits

    settings = type_settings(covariance_type, X.shape[1])
    monkeypatch.setattr(memory, "ROW_THREAD_MIN_WORK", 1)
    spy = ThreadSpy()
    before = parallel.blas_thread_count()
    with threadpool_limits(limits=2, user_api="blas"):
        threaded = fit(spy.source(X), n_jobs=None, **settings,
                       callback=spy)
        threaded_blas = set(spy.task_blas)
        assert parallel.blas_thread_count() == 2  # restored after the fit
        explicit_one = fit(X, n_jobs=1, **settings, callback=spy)
    with threadpool_limits(limits=1, user_api="blas"):
        serial = fit(X, n_jobs=None, **settings, callback=spy)
    assert parallel.blas_thread_count() == before
    assert spy.row_threads == [min(2, joblib.cpu_count()), 0, 0]
    assert_same_state(explicit_one, serial)
    if joblib.cpu_count() > 1:
        # every task of the threaded fit ran with one BLAS thread
        assert threaded_blas == {1}, spy.task_blas
    assert_same_state(threaded, serial)


@pytest.mark.parametrize("n_jobs", [2, None])
def test_own_blas_calls_limited_while_tasks_run_concurrently(X, n_jobs, monkeypatch):
    """While workers (n_jobs=2) or row threads (n_jobs=None) run the passes, the
    fitting process's own BLAS calls between passes (M step) use one task's share of
    the cores; the user's limit is back after the fit."""
    from threadpoolctl import threadpool_limits

    monkeypatch.setattr(memory, "ROW_THREAD_MIN_WORK", 1)
    seen = []
    with threadpool_limits(limits=2, user_api="blas"):
        fit(X, n_jobs=n_jobs,
            callback=lambda record: seen.append(parallel.blas_thread_count()))
        after = parallel.blas_thread_count()
    share = 1 if n_jobs is None else max(1, joblib.cpu_count() // 2)
    if joblib.cpu_count() > 1:
        assert seen and set(seen) == {share}
    assert after == 2


def test_blas_limit_restored_after_executors_closing_out_of_order(X, tmp_path):
    """Fits may run in several threads of one process, and their executors may close
    in any order (A opens, B opens, A closes, B closes). The process-wide limit holds
    until the last one closes, then the limit from before the first is back (not
    the limit B found while A was open)."""
    from threadpoolctl import threadpool_limits

    from emgmm._io.sources import MemmapSource

    np.save(tmp_path / "x.npy", X)
    source = MemmapSource.from_npy(tmp_path / "x.npy")
    with threadpool_limits(limits=2, user_api="blas"):
        a, b = parallel.Executor(source, 2), parallel.Executor(source, 2)
        share = a.blas_threads
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert parallel.blas_thread_count() == share
        b.__exit__(None, None, None)
        assert parallel.blas_thread_count() == 2


@pytest.mark.parametrize("n_jobs", [None, 1])
def test_tiny_tasks_run_with_one_blas_thread(X, n_jobs, monkeypatch):
    """Tasks below ROW_THREAD_MIN_WORK multiply-adds run with one BLAS thread, in
    this process too (a second BLAS thread on such small products is slower); the
    limit is lifted after the fit. Larger tasks of an explicit n_jobs=1 run with one
    BLAS thread too (n_jobs=1 means one core, issue 29.1)."""
    from threadpoolctl import threadpool_limits

    seen = []

    def record(_):
        seen.append(parallel.blas_thread_count())

    assert memory.tasks_are_tiny(len(X), 6, 4, X.shape[1], KINDS["full"])
    with threadpool_limits(limits=2, user_api="blas"):
        fit(X, n_jobs=n_jobs, callback=record)
        assert seen and set(seen) == {1}
        assert parallel.blas_thread_count() == 2
        if n_jobs == 1:
            seen.clear()
            monkeypatch.setattr(memory, "ROW_THREAD_MIN_WORK", 1)
            fit(X, n_jobs=1, callback=record)
            assert seen and set(seen) == {1}
            assert parallel.blas_thread_count() == 2


def test_single_blas_thread_inside_and_the_limit_restored_after():
    """One BLAS thread inside the context, the limit from before after it; under a
    pass's hold of one thread, nothing changes."""
    with threadpool_limits(limits=2, user_api="blas"):
        with blas.single_blas_thread():
            assert parallel.blas_thread_count() == 1
            with blas.single_blas_thread():  # nested
                assert parallel.blas_thread_count() == 1
            assert parallel.blas_thread_count() == 1
        assert parallel.blas_thread_count() == 2
        blas.hold_process_limit(1)
        try:
            with blas.single_blas_thread():
                assert parallel.blas_thread_count() == 1
            assert parallel.blas_thread_count() == 1
        finally:
            blas.release_process_limit()
        assert parallel.blas_thread_count() == 2
    assert blas._LIMIT["holders"] == 0


def test_single_blas_thread_holds_in_the_main_thread_only():
    """OpenBLAS ignores a limit set from another thread once the main thread has set
    one: a hold released last by another thread could not restore the limit. Other
    threads take no hold; the main thread's hold restores the limit also when a thread
    that entered the context while it was held leaves last."""
    inside, go, holders = threading.Event(), threading.Event(), []

    def worker():
        with blas.single_blas_thread():
            holders.append(blas._LIMIT["holders"])
            inside.set()
            go.wait()

    with threadpool_limits(limits=2, user_api="blas"):
        with blas.single_blas_thread():
            assert parallel.blas_thread_count() == 1
            t = threading.Thread(target=worker)
            t.start()
            inside.wait()
        go.set()
        t.join()
        assert holders == [1]  # the main thread's hold only
        assert parallel.blas_thread_count() == 2
    assert blas._LIMIT["holders"] == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_starts_without_the_parents_holds():
    read, write = os.pipe()
    blas.hold_process_limit(1)
    try:
        pid = os.fork()
        if pid == 0:  # the child: report its holds, take and release one
            try:
                held = blas._LIMIT["holders"]
                with blas.single_blas_thread():
                    pass
                os.write(write, f"{held} {blas._LIMIT['holders']}".encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    finally:
        blas.release_process_limit()
    assert os.read(read, 64).decode() == "0 0"
    os.close(read)
    os.close(write)


@pytest.mark.skipif(joblib.cpu_count() < 2, reason="BLAS runs one thread anyway")
@pytest.mark.parametrize("n_jobs", [1, None])
def test_per_component_products_run_on_one_blas_thread(n_jobs, monkeypatch):
    """The refined E step's recomputations and the gathered statistics (one product
    per component, a few hundred rows each) run with one BLAS thread, also under an
    explicit n_jobs=1 (whose whole fit runs on one BLAS thread, issue 29.1); the fit
    equals the one under a process-wide limit of one thread."""
    from contextlib import contextmanager

    from emgmm.covariance import _screen, _statistics

    seen = {"loops": [], "callback": set()}
    single = _statistics.single_blas_thread

    @contextmanager
    def spying_single_blas_thread():
        with single():
            seen["loops"].append(parallel.blas_thread_count())
            yield

    # (the exact recomputations are screen.exact_pairs, also the packed estimate's)
    for module in (_screen, _statistics):
        monkeypatch.setattr(module, "single_blas_thread", spying_single_blas_thread)
    monkeypatch.setattr(memory, "ROW_THREAD_MIN_WORK", 1)
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=30.0, size=(6, 5))
    X = np.repeat(centres, 200, axis=0) + rng.normal(size=(1200, 5))
    params = dict(n_components=6, covariance_type="full", compute_dtype="float32")
    with threadpool_limits(limits=2, user_api="blas"):
        got = fit(X, n_jobs=n_jobs, **params, callback=lambda _: seen["callback"].add(
            parallel.blas_thread_count()))
    assert len(seen["loops"]) > 10 and set(seen["loops"]) == {1}
    if n_jobs == 1:
        assert seen["callback"] == {1}  # n_jobs=1: one core, one BLAS thread
    with threadpool_limits(limits=1, user_api="blas"):
        serial = fit(X, n_jobs=1, **params)
    assert_same_state(got, serial)


@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_passes_call_no_scipy_blas_wrapper(covariance_type, monkeypatch):
    """scipy's BLAS wrappers hold the GIL while they run, so row threads calling them
    would take turns: the passes use numpy's products only (refined E step, gathered
    statistics, 'tied' factor products and second moments)."""
    def refuse(*args, **kwargs):
        raise AssertionError("scipy.linalg.get_blas_funcs called in a pass")

    monkeypatch.setattr(memory, "ROW_THREAD_MIN_WORK", 1)
    rng = np.random.default_rng(1)
    centres = rng.normal(scale=30.0, size=(6, 5))
    X = np.repeat(centres, 200, axis=0) + rng.normal(size=(1200, 5))
    reference = fit(X, n_jobs=1, n_components=6, covariance_type=covariance_type)
    monkeypatch.setattr(scipy.linalg, "get_blas_funcs", refuse)
    monkeypatch.setattr(scipy.linalg.blas, "get_blas_funcs", refuse)
    for dtype in ("float64", "float32"):
        got = fit(X, n_jobs=None, n_components=6, covariance_type=covariance_type,
                  compute_dtype=dtype)
        assert np.isfinite(got.lower_bound_)
    assert_same_state(fit(X, n_jobs=1, n_components=6, covariance_type=covariance_type),
                      reference)


def test_row_threads_only_for_enough_work_and_small_statistics():
    assert memory.row_threads_worthwhile(100_000, 8, 200, 64, KINDS["full"])
    assert memory.row_threads_worthwhile(1_000_000, 64, 64, 64, KINDS["diag"])
    # tiny tasks: thread start-up would cost more than the work
    assert not memory.row_threads_worthwhile(20_000, 8, 3, 2, KINDS["full"])
    # d=900, K=200: 649 MB of statistics per task; the products keep BLAS threads
    assert not memory.row_threads_worthwhile(1_000_000, 64, 200, 900, KINDS["full"])


def test_row_threads_off_for_tiny_fits_and_under_a_blas_limit(X, monkeypatch):
    from threadpoolctl import threadpool_limits

    spy = ThreadSpy()
    fit(X, n_jobs=None, callback=spy)    # 1500 rows: far below ROW_THREAD_MIN_WORK
    monkeypatch.setattr(memory, "ROW_THREAD_MIN_WORK", 1)
    with threadpool_limits(limits=1, user_api="blas"):
        fit(X, n_jobs=None, callback=spy)  # the user's limit of one BLAS thread
    fit(X, n_jobs=2, callback=spy)       # two workers: no threads inside them
    with joblib.parallel_config(n_jobs=1):
        fit(X, n_jobs=None, callback=spy)  # joblib's n_jobs=1 (not None) resolves first
    assert spy.row_threads == [0, 0, 0, 0]


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_block_rows_within_budget(covariance_type):
    """Blocks fit working_memory; 'diag'/'spherical' blocks also fit the streaming
    working set, and the others keep the larger blocks their per-block work needs."""
    n, d, K = 1_000_000, 64, 64
    per_row = KINDS["full"].bytes_per_row(d, K, 8)
    rows = memory.block_rows(n, d, K, 8, 1024, covariance_type=KINDS[covariance_type])
    assert rows * per_row <= 1024 * 2**20
    n_blocks = -(-n // rows)
    assert n_blocks % memory.BLOCK_MULTIPLE == 0
    if KINDS[covariance_type].streams_blocks:  # 'diag', 'spherical'
        assert rows * per_row <= memory.STREAMING_BLOCK_MIB * 2**20
    else:
        assert rows >= memory.MIN_BLOCK_ROWS
    small = memory.block_rows(n, d, K, 8, 4, covariance_type=KINDS[covariance_type])
    assert small * per_row <= 4 * 2**20


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_block_rows_follow_the_chunks(covariance_type):
    """Blocks of an HDF5 dataset chunked by rows hold whole chunks: a multiple of the
    chunk rows when a block holds several, one chunk when a chunk exceeds the block
    (for 'diag' beyond its streaming working set too) but fits working_memory,
    without a warning; beyond working_memory, a warning that gives the budget in rows
    (the 'diag' streaming cap is not the user's working_memory)."""
    import warnings

    n, d, K = 200_000, 50, 4
    per_row = KINDS["full"].bytes_per_row(d, K, 4)
    plain = memory.block_rows(n, d, K, 4, 1024, covariance_type=KINDS[covariance_type])
    for chunk in (max(1, plain // 3), plain + 1, 2 * plain + 7):
        if chunk * per_row > 1024 * 2**20:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rows = memory.block_rows(n, d, K, 4, 1024, chunk_rows=chunk,
                                     covariance_type=KINDS[covariance_type])
        assert rows % chunk == 0 and rows * per_row <= 1024 * 2**20, (chunk, rows)
    budget = int(8 * 2**20 // per_row)
    with pytest.warns(UserWarning,
                      match=rf"exceeds the {budget} rows that fit working_memory"):
        rows = memory.block_rows(n, d, K, 4, 8, chunk_rows=2 * budget,
                                 covariance_type=KINDS[covariance_type])
    assert rows <= budget


_RELEASE_SCRIPT = """
import threading
import numpy as np
from emgmm._runtime import memory as _memory

def resident():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmRSS:"))

retained, pins = [], []

def blocks():
    big = [np.ones(2**19) for _ in range(40)]        # 40 blocks of 4 MiB, touched
    pins.append([np.ones(1024) for _ in range(40)])  # outlive the blocks
    before = resident()
    del big
    retained.append(160 * 2**20 - (before - resident()))

for _ in range(2):  # the first round's frees raise the mmap threshold
    worker = threading.Thread(target=blocks)
    worker.start()
    worker.join()
before = resident()
released = _memory.release_free_memory()
print(retained[-1], released, before - resident())
"""


@pytest.mark.skipif(memory._MALLOC_TRIM is None, reason="glibc's malloc_trim only")
def test_release_free_memory_returns_what_a_thread_freed():
    """Blocks that a worker thread frees stay resident in its glibc arena (once a
    freed block has raised the allocator's mmap threshold above the block size);
    release_free_memory hands them back to the system. In a fresh interpreter with
    glibc's default allocator settings: any MALLOC_* variable (dask's LocalCluster
    leaves MALLOC_TRIM_THRESHOLD_ in os.environ) fixes the mmap threshold, and the
    blocks are then unmapped as they are freed."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", _RELEASE_SCRIPT], capture_output=True,
                         text=True, check=True, timeout=120, env=env)
    retained, released, returned = out.stdout.split()
    assert int(retained) > 100 * 2**20
    assert released == "True"
    assert int(returned) > 100 * 2**20


@pytest.mark.parametrize("threshold, expected", [(1, 4), (2**40, 0)])
def test_passes_release_memory_after_large_blocks_only(monkeypatch, threshold,
                                                       expected):
    """Every pass (3 iterations and the final scoring pass) releases the free memory
    once its blocks took RELEASE_MIN_BYTES; passes over small blocks do not (the
    release and the page faults after it would cost more than they give back)."""
    calls = []
    monkeypatch.setattr(passes, "RELEASE_MIN_BYTES", threshold)
    monkeypatch.setattr(passes, "release_free_memory", lambda: calls.append(1))
    X = make_blobs_data(1500)
    fit(X, max_iter=3)
    assert len(calls) == expected


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


def test_case_c12_both_schedules_give_the_same_model(X_c12):
    fits = [quiet_fit(GaussianMixture(5, random_state=42, n_jobs=2, max_iter=15,
                                      schedule=s, block_size=256), X_c12)
            for s in ("rows", "components")]
    assert_same_state(fits[0], fits[1], rtol=1e-12, precision_rtol=1e-12)


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
