"""Cases C09, C10, C13, C19, C20 and C21 of CASES.md: degenerate components, scale
limits, temp space, leftovers and workers killed for memory."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
import warnings
import weakref

import numpy as np
import psutil
import pytest
from helpers import (
    COVARIANCE_TYPES,
    IGNORE_NOT_CONVERGED,
    PARAMS,
    assert_bound_monotone,
    assert_valid_model,
    min_eigenvalues,
    not_converging,
)

from emgmm import GaussianMixture
from emgmm.runtime import memory as emgmm_memory
from emgmm.runtime.executor import TEMP_PREFIX

# ---------------------------------------------------------------------------- C09


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


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
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


# ---------------------------------------------------------------------------- C10


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c10_starved_component_after_warm_start(covariance_type):
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
def test_case_c10_200_components_small_blocks(covariance_type, block_size, max_iter):
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


# ---------------------------------------------------------------------------- C13


@pytest.fixture(scope="module")
def c13_npy(tmp_path_factory):
    """3000 x 6001: two identity blocks and one numeric column, as a .npy file
    written row block by row block (no 144 MB array in memory)."""
    path = tmp_path_factory.mktemp("c13") / "X.npy"
    n = 3000
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n,
                                                                            2 * n + 1))
    for s in range(0, n, 250):
        e = min(s + 250, n)
        block = np.zeros((e - s, 2 * n + 1))
        idx = np.arange(e - s)
        block[idx, s + idx] = 1.0
        block[idx, n + s + idx] = 1.0
        block[:, -1] = np.arange(s, e) / n
        X[s:e] = block
    X.flush()
    del X
    return path


def test_case_c13_refused_up_front_without_large_allocation(c13_npy):
    gm = GaussianMixture(200, covariance_type="full", random_state=0)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryError) as info:
            gm.fit(c13_npy)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "MiB" in message and "budget" in message
    need = float(message.split("needs about ")[1].split(" MiB")[0].replace(",", ""))
    assert need > 200 * 6001**2 * 8 / 2**20  # at least one copy of the covariances
    # nothing close to one data copy (144 MB) or one covariance (288 MB) was allocated
    assert peak < 16 * 2**20, peak
    assert not hasattr(gm, "weights_")


@pytest.mark.slow
def test_case_c13_diag_runs(c13_npy):
    gm = GaussianMixture(200, covariance_type="diag", max_iter=2, tol=0.0,
                         init_params="random_from_data", random_state=0)
    with not_converging():
        gm.fit(c13_npy)
    assert gm.means_.shape == (200, 6001)
    assert_valid_model(gm)


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_per_block_outputs_hold_the_result_and_about_one_block(covariance_type):
    """predict_proba fills one C-ordered result block by block: the traced peak is
    the result plus a few blocks' arrays, not a second copy of it (a list of parts
    and their concatenation took 2-3x the result), and every block lands in its
    rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200_000, 4))
    gm = GaussianMixture(50, covariance_type=covariance_type, max_iter=2,
                         init_params="random_from_data", random_state=0)
    with not_converging():
        gm.fit(X[:5000])
    tracemalloc.start()
    try:
        proba = gm.predict_proba(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert proba.shape == (200_000, 50) and proba.flags.c_contiguous
    assert peak < 1.5 * proba.nbytes, (peak, proba.nbytes)
    for rows in (slice(0, 2000), slice(57_000, 59_000), slice(198_000, None)):
        np.testing.assert_allclose(proba[rows], gm.predict_proba(X[rows]),
                                   rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gm.score_samples(X)[57_000:59_000],
                               gm.score_samples(X[57_000:59_000]), rtol=1e-12)


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # 3 iterations, tol=0
@pytest.mark.parametrize("n_jobs", [1, None])
def test_starting_model_and_statistics_are_freed_after_their_iteration(monkeypatch,
                                                                       n_jobs):
    """Only the current model (and for the M step the current statistics) stay in
    memory: the starting model and the statistics of the iteration before are freed,
    not held through the next pass (for 'full' each is K d^2 float64 values,
    gigabytes at d = 900)."""
    from emgmm.engine import update as _em
    from emgmm.mixture import base as gaussian_mixture

    refs = {"model": [], "stats": []}
    initial_model = GaussianMixture._initial_model

    def spy_model(self, *args, **kwargs):
        model = initial_model(self, *args, **kwargs)
        refs["model"].append(weakref.ref(model.precisions_cholesky))
        return model

    m_step = _em.m_step

    def spy_stats(stats, *args, **kwargs):
        refs["stats"].append(weakref.ref(stats))  # its sum_xx becomes the covariances
        return m_step(stats, *args, **kwargs)

    alive = []

    def spy_pass(*args, **kwargs):
        if len(refs["stats"]) == 1:  # the second iteration's pass
            alive.append((refs["model"][0]() is not None,
                          refs["stats"][0]() is not None))
        return statistics_pass(*args, **kwargs)

    statistics_pass = gaussian_mixture.rows_statistics_pass
    monkeypatch.setattr(GaussianMixture, "_initial_model", spy_model)
    monkeypatch.setattr(_em, "m_step", spy_stats)
    monkeypatch.setattr(gaussian_mixture, "rows_statistics_pass", spy_pass)
    X = np.random.default_rng(0).normal(size=(3000, 5))
    GaussianMixture(3, max_iter=3, tol=0, random_state=0, n_jobs=n_jobs).fit(X)
    assert alive == [(False, False)]


# ---------------------------------------------------------------------------- C19


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root and mount permission; skipped otherwise)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                               str(folder)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_case_c19_temp_folder_too_small(tiny_tmpfs, monkeypatch):
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(tiny_tmpfs))
    X = np.random.default_rng(0).normal(size=(5000, 100))  # 4 MB > 1 MiB
    gm = GaussianMixture(2, random_state=0, max_iter=3).fit(X[:500])
    before = {name: getattr(gm, name).copy() for name in PARAMS}
    with pytest.raises(OSError) as info:
        gm.set_params(n_jobs=2).fit(X)
    message = str(info.value)
    assert str(tiny_tmpfs) in message
    assert "JOBLIB_TEMP_FOLDER" in message and "temp_folder" in message
    assert "file-backed source" in message  # X is in memory: one more way out
    assert os.listdir(tiny_tmpfs) == []
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(gm, name), value)


def test_case_c19_temp_folder_missing(tmp_path, monkeypatch):
    missing = tmp_path / "does-not-exist"
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(missing))
    X = np.random.default_rng(0).normal(size=(500, 3))
    with pytest.raises(OSError, match="JOBLIB_TEMP_FOLDER") as info:
        GaussianMixture(2, n_jobs=2, random_state=0).fit(X)
    assert str(missing) in str(info.value)


def test_case_c19_no_file_backed_advice_for_file_backed_data(tmp_path, monkeypatch):
    """The component schedule's buffer needs the folder whatever the source: the
    message does not suggest a file-backed source to data that already is one."""
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(500, 3)))
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(tmp_path / "does-not-exist"))
    with pytest.raises(OSError, match="JOBLIB_TEMP_FOLDER") as info:
        GaussianMixture(2, n_jobs=2, schedule="components", random_state=0).fit(
            str(tmp_path / "X.npy"))
    assert "file-backed" not in str(info.value)


# ---------------------------------------------------------------------------- C20


def test_case_c20_exception_in_worker_leaves_no_temp_files(tmp_path, monkeypatch):
    temp = tmp_path / "joblib-temp"
    temp.mkdir()
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(temp))
    X = np.random.default_rng(0).normal(size=(3000, 4))

    def corrupt_shared_copy(record):
        # the workers' copy of X (not the user's array): a value whose squares
        # overflow makes a worker raise
        if record["n_iter"] == 2:
            (folder,) = [p for p in temp.iterdir() if p.name.startswith(TEMP_PREFIX)]
            state = os.stat(folder / "X.npy")
            shared = np.load(folder / "X.npy", mmap_mode="r+")
            shared[1234, 2] = 1e200
            shared.flush()
            del shared
            # behind the source's back: a file whose modification time changed
            # during the fit is refused as replaced before any row is read
            os.utime(folder / "X.npy", ns=(state.st_atime_ns, state.st_mtime_ns))

    gm = GaussianMixture(3, n_jobs=2, block_size=100, max_iter=10, tol=0.0,
                         random_state=0, callback=corrupt_shared_copy)
    with pytest.raises(ValueError, match=r"Row 1234 of X: .* at column 2;"):
        gm.fit(X)
    assert np.abs(X).max() < 1e3  # the user's array is untouched
    assert list(temp.iterdir()) == []
    assert not hasattr(gm, "weights_")


KILLED_FIT = textwrap.dedent("""
    import os, signal, sys, json
    import numpy as np, psutil
    from emgmm import GaussianMixture

    def die(record):
        if record["n_iter"] == 2:
            kids = [p.pid for p in psutil.Process().children(recursive=True)]
            with open(sys.argv[1], "w") as fh:
                json.dump(kids, fh)
            os.kill(os.getpid(), signal.SIGKILL)

    X = np.random.default_rng(0).normal(size=(4000, 3))
    GaussianMixture(2, n_jobs=2, max_iter=10, tol=0.0, random_state=0,
                    callback=die).fit(X)
""")


def _reap(pids):
    """End the (orphaned) worker processes a killed fit started."""
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(5)
        except psutil.Error:
            pass


def test_case_c20_stray_folders_removed_only_in_their_own_host_and_namespace(tmp_path):
    """A dead process's folder is removed only when it was made on this host and in
    this PID namespace: in a container sharing the folder, the same pid number is
    another process (whose live folder an earlier version deleted)."""
    from emgmm.runtime import executor as _parallel

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ours = _parallel.process_space()
    other = "0" * 8 if ours != "0" * 8 else "1" * 8
    names = {
        f"{TEMP_PREFIX}{dead.pid}-{ours}-abc123": False,  # removed
        f"{TEMP_PREFIX}{dead.pid}-{other}-abc123": True,  # another namespace: kept
        f"{TEMP_PREFIX}{os.getpid()}-{ours}-abc123": True,  # alive: kept
        f"{TEMP_PREFIX}{dead.pid}-0123456789ab": False,  # earlier versions' names
    }
    for name in names:
        (tmp_path / name).mkdir()
    _parallel.remove_stray_folders(str(tmp_path))
    assert {p.name for p in tmp_path.iterdir()} == {n for n,
                                                    kept in names.items() if kept}


@pytest.mark.slow
def test_case_c20_killed_fit_leaves_identifiable_folder(tmp_path):
    temp = tmp_path / "joblib-temp"
    temp.mkdir()
    script = tmp_path / "killed_fit.py"
    script.write_text(KILLED_FIT)
    kids_file = tmp_path / "kids.json"
    env = dict(os.environ, JOBLIB_TEMP_FOLDER=str(temp))
    log = tmp_path / "stderr.txt"
    # output to a file, not a pipe: the orphaned workers would keep a pipe open
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, str(script), str(kids_file)], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        proc.wait(timeout=300)
        assert proc.returncode == -signal.SIGKILL, log.read_text()
        stray = [p.name for p in temp.iterdir() if p.name.startswith(TEMP_PREFIX)]
        # identifiable by name: emgmm-<pid of the dead fit>-<space>-<id>
        assert len(stray) == 1
        assert stray[0].startswith(f"{TEMP_PREFIX}{proc.pid}-")
        # the next run works and removes the folder of the dead fit
        os.environ["JOBLIB_TEMP_FOLDER"] = str(temp)
        try:
            X = np.random.default_rng(0).normal(size=(4000, 3))
            gm = GaussianMixture(2, n_jobs=2, max_iter=10, random_state=0).fit(X)
        finally:
            del os.environ["JOBLIB_TEMP_FOLDER"]
        assert_valid_model(gm)
        assert not [p for p in temp.iterdir() if p.name.startswith(TEMP_PREFIX)]
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        if kids_file.exists():
            _reap(json.loads(kids_file.read_text()))


KILLED_PARALLEL_FIT = textwrap.dedent("""
    import json, os, signal, sys, warnings
    import psutil
    from emgmm import GaussianMixture
    from sklearn.exceptions import ConvergenceWarning

    data, checkpoint, kids = sys.argv[1:4]

    def callback(record):
        # the killed run: its processes, once its workers exist, then SIGKILL
        if record["n_iter"] == 2 and not os.path.exists(kids):
            kids_now = {p.pid: [" ".join(p.cmdline()), p.create_time()]
                        for p in psutil.Process().children(recursive=True)}
            with open(kids, "w") as fh:
                json.dump(kids_now, fh)
            os.kill(os.getpid(), signal.SIGKILL)

    warnings.simplefilter("ignore", ConvergenceWarning)
    gm = GaussianMixture(3, n_jobs=2, max_iter=5, tol=0.0, random_state=0,
                         checkpoint=checkpoint, callback=callback).fit(data)
    print(f"resumed fit: {gm.n_iter_} iterations", file=sys.stderr)
""")


def _alive(kids):
    """The processes of ``kids`` (``{pid: (command line, start time)}``) that still
    run: zombies have ended, and a process of a recorded id but another start time
    is another process."""
    alive = []
    for pid, (_, started) in kids.items():
        try:
            proc = psutil.Process(pid)
            if (proc.create_time() == started
                    and proc.status() != psutil.STATUS_ZOMBIE):
                alive.append(proc)
        except psutil.Error:
            pass
    return alive


def _wait_gone(kids, seconds):
    """The processes of ``kids`` (:func:`_alive`) still running after up to
    ``seconds``."""
    alive = _alive(kids)
    for _ in range(int(seconds * 10)):
        if not alive:
            break
        time.sleep(0.1)
        alive = _alive(kids)
    return alive


def _end(procs):
    """Kill the processes ``procs`` (of :func:`_alive`) and wait for them."""
    for proc in procs:
        try:
            proc.kill()
            proc.wait(5)
        except psutil.Error:
            pass


def _run_killed_parallel_fit(tmp_path, stderr):
    """Run a fit with two loky workers, SIGKILLed in its third iteration; its
    processes (workers, resource trackers) as the fit saw them, ``{pid: (command
    line, start time)}``."""
    data = tmp_path / "X.npy"
    np.save(data, np.random.default_rng(0).normal(size=(2000, 5)))
    script = tmp_path / "fit.py"
    script.write_text(KILLED_PARALLEL_FIT)
    args = [sys.executable, str(script), str(data), str(tmp_path / "fit.ckpt"),
            str(tmp_path / "kids.json")]
    proc = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=stderr,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL
    kids = {int(pid): tuple(seen) for pid, seen in
            json.loads((tmp_path / "kids.json").read_text()).items()}
    names = " ".join(cmdline for cmdline, _ in kids.values())
    assert "popen_loky" in names and "resource_tracker" in names  # it had workers
    return args, kids


@pytest.mark.slow
def test_case_c20_killed_parallel_fit_takes_its_workers_along(tmp_path):
    """Issue 36.3: after SIGKILL of a fit, its loky workers and resource trackers
    end within 10 seconds (they stayed, orphaned, until loky's idle timeout of
    5 minutes and longer, each holding its memory)."""
    kids = {}
    try:
        with open(tmp_path / "stderr.txt", "w") as err:
            _, kids = _run_killed_parallel_fit(tmp_path, err)
        left = _wait_gone(kids, 10)
        assert not left, [kids[p.pid][0] for p in left]
    finally:
        _end(_alive(kids))


@pytest.mark.slow
def test_case_c20_run_after_a_killed_fit_prints_only_its_own_lines(tmp_path):
    """Issue 36.3: the stderr shared by a killed fit and its resumed run (a
    terminal) gets, from the resumed run's start on, nothing but that run's own
    lines: the killed fit's processes have ended and said what they had to say
    before, not loky's resource tracker warnings about the killed fit's folders
    at some point of the resumed run (when its orphaned workers timed out; ended
    here once the resumed run is done, in the place of loky's 5 minutes)."""
    kids = {}
    log = tmp_path / "stderr.txt"
    try:
        with open(log, "w") as err:
            args, kids = _run_killed_parallel_fit(tmp_path, err)
        _wait_gone(kids, 10)
        start = log.stat().st_size
        with open(log, "a") as err:
            resumed = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=err,
                                     timeout=300)
        _end(p for p in _alive(kids) if "popen_loky" in kids[p.pid][0])
        _wait_gone(kids, 10)
        with open(log) as fh:
            fh.seek(start)
            lines = fh.read()
        assert resumed.returncode == 0, lines
        assert lines == "resumed fit: 5 iterations\n"
    finally:
        _end(_alive(kids))


# ---------------------------------------------------------------------------- C21


def _loky_workers():
    workers = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "loky" in cmdline and "resource_tracker" not in cmdline:
            workers.append(child)
    return workers


@pytest.mark.slow
@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # fits of 2 and 3 iterations
@pytest.mark.parametrize("memory", ["tight", "plenty"])
def test_case_c21_worker_killed_for_memory(tmp_path, monkeypatch, memory):
    """Workers SIGKILLed in the middle of a pass, as the out-of-memory killer does.

    (Workers killed while idle between two passes are replaced by joblib without
    losing work, so the kill comes from the progress callback of the second pass,
    after its first of 40 tasks: the others are still running or queued.) The
    message blames the out-of-memory killer when the fit's estimate is a fair part
    of the memory available ("tight": 1 MiB available); with far more available,
    it names the likelier causes.
    """
    if memory == "tight":
        # the machine as the message sees it after the kill: 1 MiB available (the
        # fit's own check takes memory_limit instead)
        meminfo = tmp_path / "meminfo"
        meminfo.write_text("MemTotal: 4096 kB\nMemAvailable: 1024 kB\n")
        monkeypatch.setattr(emgmm_memory, "MEMINFO", str(meminfo))
    temp = tmp_path / "joblib-temp"
    temp.mkdir()
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(temp))
    X = np.random.default_rng(0).normal(size=(200_000, 8))
    gm = GaussianMixture(2, random_state=0, max_iter=2).fit(X[:1000])
    before = {name: getattr(gm, name).copy() for name in PARAMS}
    before_bounds = list(gm.lower_bounds_)
    killed = []

    def kill_workers():
        workers = _loky_workers()
        for worker in workers:
            os.kill(worker.pid, signal.SIGKILL)
        killed.extend(psutil.wait_procs(workers, timeout=10)[0])

    class KillDuringSecondPass:
        wants_progress = True
        passes_done = 0

        def __call__(self, record):
            if record["event"] == "iteration":
                self.passes_done += 1
            elif self.passes_done == 1 and record["done"] == 1 and not killed:
                kill_workers()

    gm.set_params(n_jobs=2, max_iter=3, tol=0.0, block_size=5000,
                  memory_limit=4096, callback=KillDuringSecondPass())
    with pytest.raises(MemoryError) as info:
        gm.fit(X)
    assert killed
    message = str(info.value)
    if memory == "tight":
        assert "likely cause is the operating system's out-of-memory killer" in message
    else:
        assert "far below the memory available now" in message
        assert "out-of-memory" not in message
    assert "MiB" in message and "n_jobs" in message
    assert info.value.__cause__ is not None
    # previous fitted state kept, temporary files removed
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(gm, name), value)
    assert gm.lower_bounds_ == before_bounds
    assert list(temp.iterdir()) == [], list(temp.iterdir())
    # and the next fit works
    gm.set_params(callback=None, max_iter=2).fit(X[:20_000])
    assert_valid_model(gm)
