"""Temporary files and folders: a fit with workers leaves nothing in /dev/shm or the
temporary folder (joblib's memmapping folders included), however many fits a process
runs; a temporary folder too small or missing is a prompt error naming it (CASES.md
C19); an exception in a worker or a killed fit leaves nothing behind, or folders
that the next run identifies by name and removes (C20)."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import psutil
import pytest
from helpers import (
    PARAMS,
    assert_valid_model,
)

import emgmm
from emgmm import GaussianMixture
from emgmm._runtime.executor import TEMP_PREFIX


def _folders():
    """joblib's and emgmm's temporary folders of this process, wherever they are."""
    pid = os.getpid()
    found = set()
    for parent in {"/dev/shm", tempfile.gettempdir(),
                   os.environ.get("JOBLIB_TEMP_FOLDER", tempfile.gettempdir())}:
        for pattern in (f"joblib_memmapping_folder_{pid}_*", f"emgmm-{pid}-*"):
            found.update(glob.glob(os.path.join(parent, pattern)))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("source", ["array", "npy"])
def test_fits_with_workers_leave_no_folders(tmp_path, source):
    X = np.random.default_rng(0).standard_normal((4000, 3))
    data = X
    if source == "npy":
        np.save(tmp_path / "x.npy", X)
        data = str(tmp_path / "x.npy")
    before = _folders()
    for seed in range(3):
        emgmm.GaussianMixture(3, n_jobs=2, max_iter=4, tol=1e3,
                              random_state=seed).fit(data)
    gm = emgmm.GaussianMixture(3, n_jobs=2, max_iter=4, tol=1e3, random_state=0)
    gm.fit(data)
    gm.predict(data)
    gm.score_samples(data)
    assert _folders() - before == set()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_any_fit_removes_what_a_killed_fit_left_in_shared_memory():
    """A killed pairs fit leaves its shared model in /dev/shm (gigabytes at the
    workload's size): the next fit, of any schedule and without workers, removes
    it."""
    import subprocess
    import sys

    from emgmm._runtime import executor

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    name = (f"{executor.TEMP_PREFIX}{int(dead.stdout)}-{executor.process_space()}"
            "-0123456789ab")
    stray = os.path.join(executor.SHARED_MEMORY, name)
    os.makedirs(stray)
    try:
        X = np.random.default_rng(0).normal(size=(200, 3))
        emgmm.GaussianMixture(2, random_state=0).fit(X)
        assert not os.path.exists(stray)
    finally:
        if os.path.exists(stray):
            os.rmdir(stray)


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


def test_case_c19_temp_folder_too_small_is_an_error_naming_it(tiny_tmpfs, monkeypatch):
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


def test_case_c19_missing_temp_folder_is_an_error_naming_it(tmp_path, monkeypatch):
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
    from emgmm._runtime import executor as _parallel

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
