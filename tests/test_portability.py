"""The fallbacks of the Linux-only calls, tried here by taking those calls away.

Where ``os.preadv`` is missing (Windows; some builds of Python on macOS), blocks are
read with ``os.pread``, or with a seek and ``readinto`` under a lock; without
``/proc`` (macOS, Windows), the path of an open HDF5 file comes from its name, the
replacement of a memmap's file goes unseen, the memory budget comes from psutil or
``os.sysconf``, and a process's host is named by its host name alone. Each fixture
takes the Linux call away and counts the calls of its fallback, so that a test fails
when the fallback was not used; the results are those of the Linux path.
"""

import math
import os
import subprocess
import sys
from concurrent.futures import BrokenExecutor
from contextlib import closing

import h5py
import numpy as np
import pytest
from helpers import PARAMS, make_blobs_data, not_converging

from emgmm import GaussianMixture
from emgmm._io import sources as _sources
from emgmm._io.weights import as_weight_source
from emgmm._runtime import executor as _executor
from emgmm._runtime import memory as _memory
from emgmm._runtime import processes as _processes
from emgmm._runtime.worker_loss import explain_worker_loss
from emgmm.covariance import REGISTRY

N, D, K = 600, 5, 3


class Counter:
    """Wraps a function, counting its calls."""

    def __init__(self, function):
        self.function, self.calls = function, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.function(*args, **kwargs)


class CountingLock:
    """A lock that counts how often it was taken."""

    def __init__(self):
        import threading

        self._lock, self.calls = threading.Lock(), 0

    def __enter__(self):
        self._lock.acquire()
        self.calls += 1

    def __exit__(self, *exc):
        self._lock.release()


class ReadPath:
    """How :func:`emgmm._io.sources.read_exactly` reads: ``"preadv"`` (Linux),
    ``"pread"`` (``os.preadv`` taken away) or ``"seek"`` (``os.pread`` too, as on
    Windows). :meth:`enable` installs it; ``calls`` counts the reads it made."""

    def __init__(self, kind, monkeypatch):
        self.kind, self._monkeypatch = kind, monkeypatch
        self._counter = None

    def enable(self):
        mp = self._monkeypatch
        if self.kind == "preadv":
            self._counter = Counter(os.preadv)
            mp.setattr(os, "preadv", self._counter)
            return
        mp.delattr(os, "preadv")
        if self.kind == "pread":
            self._counter = Counter(os.pread)
            mp.setattr(os, "pread", self._counter)
        else:
            mp.delattr(os, "pread")
            self._counter = CountingLock()
            mp.setattr(_sources, "_SEEK_LOCK", self._counter)

    @property
    def calls(self):
        return self._counter.calls


@pytest.fixture(params=["preadv", "pread", "seek"])
def read_path(request, monkeypatch):
    return ReadPath(request.param, monkeypatch)


@pytest.fixture(scope="module")
def data():
    X = make_blobs_data(N, D, K, seed=36)
    X.setflags(write=False)
    return X


def fit(X, n_jobs, **kw):
    with not_converging():
        return GaussianMixture(K, random_state=0, max_iter=5, tol=0.0, n_jobs=n_jobs,
                               **kw).fit(X)


def assert_same_model(got, want):
    for name in PARAMS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name),
                                      err_msg=name)
    assert got.lower_bound_ == want.lower_bound_


# ------------------------------------------------------------------ reading blocks


@pytest.mark.parametrize("n_jobs", [1, None])
@pytest.mark.parametrize("kind", ["npy", "memmap"])
def test_fit_reads_the_same_blocks_without_preadv(tmp_path, data, read_path, kind,
                                                  n_jobs):
    """A .npy file and a memmap fitted with os.pread, or a seek and readinto under
    the lock (threads sharing the file: n_jobs=None), give the model of os.preadv
    bit for bit."""
    path = tmp_path / "X.npy"
    np.save(path, data)

    def source():
        return str(path) if kind == "npy" else np.load(path, mmap_mode="r")

    want = fit(source(), n_jobs)
    read_path.enable()
    got = fit(source(), n_jobs)
    assert read_path.calls > 0
    assert_same_model(got, want)


def test_fortran_ordered_and_gathered_rows_without_preadv(tmp_path, data, read_path):
    """Column-wise reads (a Fortran-ordered memmap) and runs of gathered rows
    (``take_rows``) read the same bytes on every path."""
    path = tmp_path / "X.npy"
    np.save(path, np.asfortranarray(data))
    np.save(tmp_path / "C.npy", data)
    rows = np.array([0, 1, 2, 50, 51, 599])
    read_path.enable()
    with closing(_sources.as_source(str(path))) as fortran:
        assert fortran.order == "F"
        np.testing.assert_array_equal(fortran.read(10, 400), data[10:400])
    with closing(_sources.as_source(str(tmp_path / "C.npy"))) as c_order:
        np.testing.assert_array_equal(c_order.take_rows(rows), data[rows])
    assert read_path.calls > 0


def test_weights_read_the_same_without_preadv(tmp_path, read_path):
    """A .npy file of weights reads the same values on every path."""
    weights = np.random.default_rng(1).uniform(0.5, 2.0, size=N)
    path = tmp_path / "w.npy"
    np.save(path, weights)
    read_path.enable()
    with closing(as_weight_source(str(path), N)) as source:
        np.testing.assert_array_equal(source.read(0, N), weights)
        np.testing.assert_array_equal(source.read(17, 345), weights[17:345])
    assert read_path.calls > 0


def test_a_file_truncated_while_read_is_named_on_every_path(tmp_path, data, read_path):
    """The short read's error is the same on every path: an OSError that names the
    file and the bytes it holds."""
    path = tmp_path / "X.npy"
    np.save(path, data)
    read_path.enable()
    offset = np.load(path, mmap_mode="r").offset
    with open(path, "rb", buffering=0) as fh:
        out = np.empty((N, D))
        with pytest.raises(OSError, match=rf"The file {path} .*was truncated while "
                                          rf"emgmm was reading it: it holds "
                                          rf"{os.path.getsize(path)} bytes"):
            _sources.read_exactly(fh, out, offset + 8, str(path), str(path))
    assert read_path.calls > 0


def test_pread_copies_in_bounded_pieces(tmp_path, monkeypatch):
    """Without os.preadv, a read larger than ``_PREAD_BYTES`` takes several
    os.pread calls of at most that size, and fills the block."""
    values = np.arange(1000, dtype=np.float64)
    path = tmp_path / "v.bin"
    values.tofile(path)
    monkeypatch.delattr(os, "preadv")
    monkeypatch.setattr(_sources, "_PREAD_BYTES", 3000)
    sizes = []
    pread = os.pread

    def recording_pread(fd, n, offset):
        sizes.append(n)
        return pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", recording_pread)
    out = np.empty_like(values)
    with open(path, "rb", buffering=0) as fh:
        _sources.read_exactly(fh, out, 0, str(path), str(path))
    np.testing.assert_array_equal(out, values)
    assert sizes == [3000, 3000, 2000]


# ------------------------------------------------------------------ without /proc


class NoProc:
    """``/proc/self`` taken away (``PROC_SELF`` pointed at a missing folder), with the
    calls of the readers that consult it counted."""

    def __init__(self, tmp_path, monkeypatch):
        monkeypatch.setattr(_sources, "PROC_SELF", str(tmp_path / "no-proc"))
        self.mapped = Counter(_sources._mapped_file)
        self.descriptor = Counter(_sources._descriptor_path)
        monkeypatch.setattr(_sources, "_mapped_file", self.mapped)
        monkeypatch.setattr(_sources, "_descriptor_path", self.descriptor)


@pytest.fixture
def no_proc(tmp_path, monkeypatch):
    return NoProc(tmp_path, monkeypatch)


def test_without_proc_the_readers_find_nothing(tmp_path, data, no_proc):
    """The fixture works: the descriptor of an open file and a memmap's address are
    not found (on Linux, with /proc, they are)."""
    path = tmp_path / "X.npy"
    np.save(path, data)
    mm = np.load(path, mmap_mode="r")
    with open(path, "rb") as fh:
        assert _sources._descriptor_path(fh.fileno()) is None
    assert _sources._mapped_file(mm.ctypes.data) is None


@pytest.mark.parametrize("n_jobs", [1, None])
@pytest.mark.parametrize("kind", ["memmap", "hdf5 dataset"])
def test_fit_without_proc_is_the_same(tmp_path, data, monkeypatch, kind, n_jobs):
    """A memmap (its file's identity unknown) and an open HDF5 dataset (its file's
    path from its name, not its descriptor) fit the same model without /proc."""
    np.save(tmp_path / "X.npy", data)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_dataset("X", data=data)

    def fitted():
        if kind == "memmap":
            return fit(np.load(tmp_path / "X.npy", mmap_mode="r"), n_jobs)
        with h5py.File(tmp_path / "X.h5", "r") as f:
            return fit(f["X"], n_jobs)

    want = fitted()
    proc = NoProc(tmp_path, monkeypatch)
    got = fitted()
    assert (proc.mapped if kind == "memmap" else proc.descriptor).calls > 0
    assert_same_model(got, want)


@pytest.mark.parametrize("what", ["deleted", "replaced by another file"])
def test_hdf5_file_deleted_or_replaced_is_seen_without_proc(tmp_path, data, no_proc,
                                                            what):
    """Without the descriptor's link, its identity is compared with the file at its
    name: a deleted or replaced file is still refused, with the same message."""
    path = tmp_path / "X.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=data)
    with h5py.File(path, "r") as f:
        os.unlink(path)
        if what != "deleted":
            with h5py.File(path, "w") as g:
                g.create_dataset("X", data=data[:10] + 100.0)
        with pytest.raises(FileNotFoundError,
                           match=f"HDF5 file {path} was {what} while it was open"):
            fit(f["X"], 1)
    assert no_proc.descriptor.calls > 0


def test_hdf5_relative_name_after_chdir_without_proc(tmp_path, data, monkeypatch):
    """What is weaker without /proc: a file opened by a relative name before the
    working directory changed has no path here; it is refused with a message that
    says so (with /proc, its descriptor's link gives the path and the fit runs)."""
    (tmp_path / "a").mkdir()
    with h5py.File(tmp_path / "a" / "X.h5", "w") as f:
        f.create_dataset("X", data=data)
    monkeypatch.chdir(tmp_path / "a")
    with h5py.File("X.h5", "r") as f:
        monkeypatch.chdir(tmp_path)
        if os.path.isdir("/proc/self/fd"):
            assert_same_model(fit(f["X"], 1), fit(data, 1))
        proc = NoProc(tmp_path, monkeypatch)
        with pytest.raises(FileNotFoundError, match="opened by the relative name "
                                                    "X.h5, the working directory"):
            fit(f["X"], 1)
    assert proc.descriptor.calls > 0


def test_memmap_replaced_without_proc(tmp_path, data, no_proc):
    """What is weaker without /proc: a memmap's file replaced by one of the same size
    is read from the new file (with /proc the replacement is refused); a shorter
    file is still refused by its size."""
    path = tmp_path / "X.npy"
    np.save(path, data)
    mm = np.load(path, mmap_mode="r")
    os.unlink(path)
    np.save(path, data[::-1])
    assert_same_model(fit(mm, 1), fit(np.ascontiguousarray(data[::-1]), 1))
    assert no_proc.mapped.calls > 0
    os.unlink(path)
    np.save(path, data[:10])
    with pytest.raises(ValueError, match="truncated or replaced after the memmap"):
        fit(mm, 1)


# -------------------------------------------------------------- available memory


@pytest.fixture
def no_meminfo(tmp_path, monkeypatch):
    """/proc/meminfo taken away."""
    monkeypatch.setattr(_memory, "MEMINFO", str(tmp_path / "no-meminfo"))


def test_memory_from_psutil_without_meminfo(no_meminfo, monkeypatch):
    """psutil's ``available`` (macOS, Windows): positive and finite."""
    psutil = pytest.importorskip("psutil")
    virtual_memory = Counter(psutil.virtual_memory)
    monkeypatch.setattr(psutil, "virtual_memory", virtual_memory)
    available = _memory.available_memory()
    assert virtual_memory.calls == 1
    assert 0 < available < math.inf and isinstance(available, int)


def test_memory_from_sysconf_without_psutil(no_meminfo, monkeypatch):
    """Without psutil, the free pages of os.sysconf; where the system tells only
    the physical pages (macOS), all of them; positive and finite either way."""
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil fails
    sysconf = os.sysconf
    page = sysconf("SC_PAGE_SIZE")
    asked = []

    def recording_sysconf(name):
        asked.append(name)
        return sysconf(name)

    monkeypatch.setattr(os, "sysconf", recording_sysconf)
    assert _memory.available_memory() == sysconf("SC_AVPHYS_PAGES") * page
    assert "SC_AVPHYS_PAGES" in asked

    def without_free_pages(name):
        if name == "SC_AVPHYS_PAGES":
            raise ValueError("unrecognized configuration name")
        return sysconf(name)

    monkeypatch.setattr(os, "sysconf", without_free_pages)
    total = _memory.available_memory()
    assert total == sysconf("SC_PHYS_PAGES") * page and 0 < total < math.inf


def test_memory_unknown_refuses_nothing(no_meminfo, monkeypatch, data):
    """Without psutil nor os.sysconf the budget is unknown (``inf``): a fit runs,
    and a dead worker's message says the memory is unknown, not how much is
    available."""
    monkeypatch.setitem(sys.modules, "psutil", None)
    monkeypatch.delattr(os, "sysconf")
    assert _memory.available_memory() == math.inf
    schedule, _ = _memory.choose_schedule("auto", K, D, REGISTRY["full"], 2)
    assert schedule == "rows"
    assert_same_model(fit(data, 1), fit(data, 1, memory_limit=1e6))
    with pytest.raises(MemoryError, match="memory available is unknown here") as info:
        with explain_worker_loss(2**20, 2**20, 2):
            raise BrokenExecutor("worker died")
    assert "available now" not in str(info.value)


# ------------------------------------------------------------ stray temp folders


@pytest.fixture
def fresh_space():
    """``process_space`` computed again in the test, and again after it."""
    _executor.process_space.cache_clear()
    yield
    _executor.process_space.cache_clear()


def _dead_pid():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def _strays(tmp_path, space):
    """Folders of a dead and of a live process in ``space``; ``{name: kept}``."""
    names = {f"{_executor.TEMP_PREFIX}{_dead_pid()}-{space}-abc123": False,
             f"{_executor.TEMP_PREFIX}{os.getpid()}-{space}-abc123": True}
    for name in names:
        (tmp_path / name).mkdir()
    return names


def _left(tmp_path):
    return {p.name for p in tmp_path.iterdir()}


def test_stray_folders_without_proc(tmp_path, monkeypatch, fresh_space):
    """Without the boot id and the PID namespace, the host name names the space (not
    the one of Linux): a dead process's folder there is removed, a live one's kept,
    another space's kept."""
    linux = _executor.process_space()
    reads = Counter(_executor._read_text)
    monkeypatch.setattr(_executor, "_read_text", reads)
    monkeypatch.setattr(_executor, "BOOT_ID", str(tmp_path / "no-boot-id"))
    monkeypatch.setattr(_executor, "PID_NAMESPACE", str(tmp_path / "no-ns"))
    _executor.process_space.cache_clear()
    space = _executor.process_space()
    assert reads.calls == 1 and len(space) == 8
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert space != linux
    folders = tmp_path / "temp"
    folders.mkdir()
    names = _strays(folders, space)
    another = linux if linux != space else "0" * 8
    other = f"{_executor.TEMP_PREFIX}{_dead_pid()}-{another}-a1"
    (folders / other).mkdir()
    _executor.remove_stray_folders(str(folders))
    assert _left(folders) == {n for n, kept in names.items() if kept} | {other}


def test_stray_folders_judged_without_signals(tmp_path, monkeypatch):
    """Where os.kill(pid, 0) would signal (Windows), psutil says which processes
    exist: a dead process's folder is removed, a live one's kept."""
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(_processes, "_PROBE_BY_SIGNAL", False)
    exists = Counter(psutil.pid_exists)
    monkeypatch.setattr(psutil, "pid_exists", exists)
    names = _strays(tmp_path, _executor.process_space())
    _executor.remove_stray_folders(str(tmp_path))
    assert _left(tmp_path) == {n for n, kept in names.items() if kept}
    assert exists.calls == 2


def test_stray_folders_kept_without_signals_nor_psutil(tmp_path, monkeypatch):
    """Without either, no process is known dead: every folder is kept, and no
    signal is sent."""
    monkeypatch.setattr(_processes, "_PROBE_BY_SIGNAL", False)
    monkeypatch.setitem(sys.modules, "psutil", None)
    kill = Counter(os.kill)
    monkeypatch.setattr(os, "kill", kill)
    names = _strays(tmp_path, _executor.process_space())
    _executor.remove_stray_folders(str(tmp_path))
    assert _left(tmp_path) == set(names)
    assert kill.calls == 0


# ------------------------------------------------------------------ all at once


@pytest.mark.parametrize("n_jobs", [1, None])
@pytest.mark.parametrize("kind", ["npy", "memmap", "hdf5 dataset", "hdf5 path"])
def test_fit_with_every_linux_call_taken_away(tmp_path, data, monkeypatch, kind,
                                              n_jobs):
    """As on Windows without psutil: no os.preadv nor os.pread, no /proc, no
    os.sysconf, no signal 0. Every source fits the model of the Linux path."""
    np.save(tmp_path / "X.npy", data)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_dataset("X", data=data)

    def fitted():
        if kind == "npy":
            return fit(str(tmp_path / "X.npy"), n_jobs)
        if kind == "memmap":
            return fit(np.load(tmp_path / "X.npy", mmap_mode="r"), n_jobs)
        if kind == "hdf5 path":
            return fit(f"{tmp_path / 'X.h5'}:X", n_jobs)
        with h5py.File(tmp_path / "X.h5", "r") as f:
            return fit(f["X"], n_jobs)

    want = fitted()
    seek = ReadPath("seek", monkeypatch)
    seek.enable()
    proc = NoProc(tmp_path, monkeypatch)
    monkeypatch.setattr(_memory, "MEMINFO", str(tmp_path / "no-meminfo"))
    monkeypatch.setitem(sys.modules, "psutil", None)
    monkeypatch.delattr(os, "sysconf")
    monkeypatch.setattr(_processes, "_PROBE_BY_SIGNAL", False)
    got = fitted()
    assert _memory.available_memory() == math.inf  # the budget refused nothing
    # the fallbacks of the readers that this source uses (an HDF5 path uses none)
    used = {"npy": [seek], "memmap": [seek, proc.mapped],
            "hdf5 dataset": [proc.descriptor], "hdf5 path": []}[kind]
    assert all(counter.calls > 0 for counter in used)
    assert_same_model(got, want)
