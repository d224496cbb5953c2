"""Running passes over the data with joblib, sharing the data by file reference.

Workers never receive the data by value: file-backed sources travel as their
description (path, dataset name) and reopen the file read-only; an in-memory array is
written once per fit to a ``.npy`` file in joblib's temporary folder and travels as
that file's path. The folder is removed when the fit ends, also when it raises.
BLAS threads per worker are limited so that workers x threads <= cores, counting the
cores this process may use: all of them at the top level, the BLAS budget joblib gave
it when it is itself a worker (e.g. emgmm inside ``GridSearchCV(n_jobs=2)``).
"""

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import socket
import tempfile
import uuid

import numpy as np
from joblib import Parallel, cpu_count, delayed, effective_n_jobs
from joblib.parallel import get_active_backend

from .blas import blas_thread_count, hold_process_limit, release_process_limit
from .parent_watch import run_watched
from .processes import pid_alive
from .workspace import per_thread

TEMP_PREFIX = "emgmm-"

#: Task arguments larger than this (joblib's ``max_nbytes``) travel as files.
SHARE_BYTES = 2**20
_STRAY = re.compile(rf"^{TEMP_PREFIX}(\d+)-([0-9a-f]{{8}})-[0-9a-f]+$")
# emgmm-<pid>-<12 hex> of earlier versions, without the space: judged by the pid
_STRAY_UNTAGGED = re.compile(rf"^{TEMP_PREFIX}(\d+)-[0-9a-f]{{12}}$")


def joblib_temp_folder(temp_folder=None):
    """The folder a fit's temporary files go into: ``temp_folder`` (the estimators'
    parameter, joblib's ``temp_folder`` of ``Parallel``) when given, else the
    ``JOBLIB_TEMP_FOLDER`` environment variable, else the system temporary folder
    (``tempfile.gettempdir()``: on disk, so the copy of an in-memory array does not
    take memory), as joblib documents its own choice.

    joblib has no public getter of ``parallel_config(temp_folder=...)``, so that
    setting is not read here; the estimators take the folder as a parameter.

    Parameters
    ----------
    temp_folder : str, os.PathLike or None
        A path-like folder is taken as its ``os.fspath``.

    Returns
    -------
    str
    """
    if temp_folder is not None:
        return os.fspath(temp_folder)
    return os.environ.get("JOBLIB_TEMP_FOLDER") or tempfile.gettempdir()


#: joblib's backends of worker processes on this host (they see this host's files),
#: by class name: joblib's backend classes are not public API.
#: Where :func:`shared_memory_folder` puts files that workers map and write, when
#: no temporary folder is set for joblib: a memory-backed file system (Linux).
SHARED_MEMORY = "/dev/shm"


def shared_memory_folder(nbytes, temp_folder=None):
    """The parent folder of files that worker processes map and write on every pass
    (the model of a fit): the temporary folder when one is set (``temp_folder`` or
    ``JOBLIB_TEMP_FOLDER``, see :func:`joblib_temp_folder`), else ``SHARED_MEMORY``
    where it exists with room for ``nbytes`` and a quarter more (its pages are
    memory, written back to no disk; as joblib's own default for its memory maps),
    else the system temporary folder."""
    if temp_folder is not None or os.environ.get("JOBLIB_TEMP_FOLDER"):
        return joblib_temp_folder(temp_folder)
    try:
        if (os.access(SHARED_MEMORY, os.W_OK)
                and shutil.disk_usage(SHARED_MEMORY).free > 1.25 * nbytes + 2**20):
            return SHARED_MEMORY
    except OSError:
        pass
    return tempfile.gettempdir()


_LOCAL_PROCESS_BACKENDS = frozenset({"LokyBackend", "MultiprocessingBackend"})


def _local_processes(backend):
    """Whether ``backend`` (or a class it derives from) is one of joblib's backends
    of local worker processes."""
    return any(cls.__name__ in _LOCAL_PROCESS_BACKENDS for cls in type(backend).__mro__)


#: Linux's boot id and this process's PID namespace, which :func:`process_space`
#: adds to the host name where they exist; tests point them elsewhere.
BOOT_ID = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE = "/proc/self/ns/pid"


@functools.lru_cache(maxsize=1)
def process_space():
    """8 hex digits naming this host (its name and, on Linux, its boot id) and PID
    namespace: a process id means a process only within them (containers sharing a
    temporary folder, or hosts sharing one over the network, see other processes'
    ids).

    Without ``/proc`` (macOS, Windows) the host name alone names the space: no
    containers share a PID namespace there, but two hosts of the same name sharing
    a folder over the network are not told apart. (Not the boot time: psutil's
    differs by a second between processes on Windows, psutil issue 1007, and moves
    when the clock is set; each process would be a space of its own.)
    """
    parts = [socket.gethostname()]
    for link, read in ((BOOT_ID, _read_text), (PID_NAMESPACE, os.readlink)):
        try:
            parts.append(read(link))
        except OSError:
            parts.append("")
    key = "|".join(parts).encode()
    return hashlib.sha256(key).hexdigest()[:8]


def _read_text(path):
    with open(path) as f:
        return f.read().strip()


def remove_stray_folders(parent):
    """Remove ``emgmm-<pid>-<space>-*`` folders left by processes of this host and
    PID namespace (:func:`process_space`) that no longer exist (a fit killed with
    SIGKILL cannot clean up after itself). Folders of other hosts or namespaces are
    left alone: their process ids mean nothing here. Folders of earlier versions
    (``emgmm-<pid>-<id>``, no space) are judged by their pid alone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        match = _STRAY.match(name)
        untagged = _STRAY_UNTAGGED.match(name)
        if ((match and match.group(2) == process_space()
             and not pid_alive(int(match.group(1))))
                or (untagged and not pid_alive(int(untagged.group(1))))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


_HOW_TO_MOVE = (
    "Choose another folder with the estimator's temp_folder parameter or the "
    "JOBLIB_TEMP_FOLDER environment variable, or use n_jobs=1."
)
# only where the folder would hold a copy of an in-memory X
_OR_FILE_BACKED = (" Or pass X as a file-backed source (.npy or HDF5): the workers "
                   "then read it in place.")


def make_temp_folder(parent, nbytes, what, advice=_HOW_TO_MOVE):
    """Create ``parent/emgmm-<pid>-<space>-<id>`` after checking ``parent`` has
    ``nbytes`` free.

    The name carries the creating process id and its host and PID namespace
    (:func:`process_space`), so :func:`remove_stray_folders` can recognise folders
    left by a process that was killed.

    Parameters
    ----------
    parent : str
    nbytes : int
        Bytes that will be written into the folder.
    what : str
        What the bytes are for (named in the error message).
    advice : str, optional
        How to avoid the folder (ends the error message).

    Returns
    -------
    str
        The new folder.

    Raises
    ------
    OSError
        If ``parent`` is unusable or lacks the space (names the folder and how to
        change it).
    """
    remove_stray_folders(parent)
    try:
        free = shutil.disk_usage(parent).free
    except OSError as exc:
        raise OSError(f"Temporary folder {parent} is not usable ({exc}). {advice}") \
            from None
    if free < nbytes + 2**20:
        raise OSError(
            f"Temporary folder {parent} has {free / 2**20:,.1f} MiB free; {what} "
            f"needs {nbytes / 2**20:,.1f} MiB and 1 MiB to spare. {advice}"
        )
    folder = os.path.join(
        parent, f"{TEMP_PREFIX}{os.getpid()}-{process_space()}-{uuid.uuid4().hex[:12]}")
    try:
        os.makedirs(folder)
    except OSError as exc:  # a file, not a folder; not writable
        raise OSError(f"Temporary folder {parent} is not usable ({exc.strerror}). "
                      f"{advice}") from None
    return folder


def dump_array(array, parent):
    """Write ``array`` once to ``parent/emgmm-<pid>-<space>-<id>/X.npy``.

    Returns
    -------
    folder : str
        The folder to remove when the fit ends.
    path : str
        The ``.npy`` file, for the worker processes to map.

    Raises
    ------
    OSError
        If ``parent`` lacks the space (names the folder and how to change it).
    """
    folder = make_temp_folder(parent, array.nbytes, "sharing X with the workers",
                              _HOW_TO_MOVE + _OR_FILE_BACKED)
    path = os.path.join(folder, "X.npy")
    try:
        np.save(path, np.ascontiguousarray(array), allow_pickle=False)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise OSError(f"Writing X to temporary folder {parent} failed ({exc}). "
                      f"{_HOW_TO_MOVE}{_OR_FILE_BACKED}") from None
    return folder, path


def core_budget(backend):
    """Cores the passes of this process may keep busy.

    At the top level, the cores joblib sees (``joblib.cpu_count()``: affinity and
    cgroup quotas). Inside a joblib worker (``backend.nesting_level > 0``, e.g. a
    ``GridSearchCV(n_jobs=2)`` fit), the BLAS threads joblib left to this worker
    (it sets them to ``cores // outer workers``), so nested parallelism does not
    oversubscribe the machine.
    """
    cores = cpu_count()
    if getattr(backend, "nesting_level", 0) > 0:
        return max(1, min(cores, blas_thread_count()))
    return max(1, cores)


def means_one_core(n_jobs):
    """Whether ``n_jobs`` (given, or ``None`` under
    ``joblib.parallel_config(n_jobs=1)``) asks for one core at the top level: then
    one BLAS thread too, as in
    scikit-learn's joblib-based estimators (not inside a joblib worker, whose BLAS
    threads joblib sets)."""
    backend, config_n_jobs = get_active_backend()
    if getattr(backend, "nesting_level", 0) > 0:
        return False
    if n_jobs is None and config_n_jobs is None:
        return False
    return max(1, effective_n_jobs(n_jobs)) == 1


class Executor:
    """Runs lists of tasks over a source, in process or with joblib workers.

    The backend is whatever ``joblib.parallel_config`` selects (loky processes by
    default, threads, or dask). With process workers an in-memory array is written
    once to the temporary folder (:func:`dump_array`); file-backed sources travel as
    their description. BLAS threads: each process worker limits itself to
    ``blas_threads`` while it runs a task. While the executor is open, this process
    is limited too, to ``blas_threads`` (one BLAS thread with row threads): thread
    workers share its limit (threadpoolctl limits are process-wide, so per-thread
    limits would race), and its own calls between passes must not leave spinning
    BLAS threads on the workers' cores.

    Parameters
    ----------
    source : emgmm._io.sources.Source
        The data; :meth:`~emgmm._io.sources.Source.copy_for_workers` gives what
        worker processes read.
    n_jobs : int or None
        joblib's meaning; ``None`` follows ``joblib.parallel_config``. Capped by
        :func:`core_budget` when this process is itself a joblib worker.
    temp_folder : str, os.PathLike or None, optional
        The estimator's ``temp_folder`` (see :func:`joblib_temp_folder`).

    Attributes
    ----------
    temp_folder : str
        Where the fit's temporary folders are created (:func:`joblib_temp_folder`).
    n_workers : int
    worker_source : Source
        What the tasks receive: never an in-memory array for process workers.
    blas_threads : int
        BLAS threads each worker may use, ``max(1, core_budget // n_workers)``; 1
        with :attr:`one_core`.
    one_core : bool
        ``n_jobs=1``, given or from ``joblib.parallel_config``, at the top level:
        the passes and this process's BLAS calls run on one thread while the
        executor is open (OpenBLAS's spare threads would otherwise contend for the
        one core; user guide, "Parallelism").
    row_threads : int
        With ``n_jobs=None`` resolving to one worker at the top level, the threads
        of this process that run the tasks of a pass (one BLAS thread each):
        ``min(core_budget, BLAS threads)`` when that is more than one, else 0 (tasks
        run one after the other, as with an explicit ``n_jobs=1``). A
        ``threadpoolctl`` limit of one BLAS thread thus keeps the pass serial.
    uses_threads : bool
        Whether the tasks run in threads of this process (set on entering).
    on_task : callable or None
        ``on_task(done, total)`` after each finished task of a :meth:`map`, in
        order (progress reporting).
    """

    def __init__(self, source, n_jobs, temp_folder=None):
        self.source = source
        self.n_jobs = n_jobs
        self.temp_folder = joblib_temp_folder(temp_folder)
        if temp_folder is not None and not os.path.isdir(self.temp_folder):
            # (checked also where no file will go there, so that a typo shows)
            reason = ("Not a directory" if os.path.exists(self.temp_folder)
                      else "No such file or directory")
            raise OSError(f"Temporary folder {self.temp_folder} is not usable "
                          f"({reason}). {_HOW_TO_MOVE}")
        # (the shared model goes to memory unless a folder was chosen)
        self._given_temp_folder = temp_folder
        backend, config_n_jobs = get_active_backend()
        budget = core_budget(backend)
        n_workers = max(1, effective_n_jobs(n_jobs))
        nested = getattr(backend, "nesting_level", 0) > 0
        if nested and n_workers > budget:
            n_workers = budget
            self.n_jobs = budget  # what each joblib call asks for
        self.n_workers = n_workers
        # n_jobs=None (here and in joblib.parallel_config) with one worker (this
        # process) at the top level: its cores run the tasks of a pass in threads,
        # one BLAS thread each, as many as BLAS may use, so that the element-wise
        # work is spread over the cores too, not only the products. An explicit
        # n_jobs=1 stays serial.
        self.row_threads = 0
        if (n_jobs is None and config_n_jobs is None and n_workers == 1
                and not nested):
            threads = min(budget, blas_thread_count())
            if threads > 1:
                self.row_threads = threads
        self.blas_threads = max(1, budget // self.n_workers)
        # n_jobs=1 (here or in joblib.parallel_config) means one core, as in
        # scikit-learn's joblib-based estimators: one BLAS thread too
        self.one_core = means_one_core(n_jobs)
        if self.one_core:
            self.blas_threads = 1
        self.uses_threads = False
        #: Whether the tasks can share arrays that they write: in this process, or
        #: as files mapped by local worker processes (not a cluster's).
        self.shares_arrays = (n_workers == 1 or self.row_threads > 0
                              or bool(getattr(backend, "uses_threads", False))
                              or _local_processes(backend))
        self.worker_source = source
        self._folder = None
        self._return_as = None
        self._holds_limit = False
        self._one_blas_thread = False
        self._shares_files = False
        self._shared = []
        self._extra_folders = []
        self.on_task = None

    def __enter__(self):
        # every fit sweeps what killed fits left where fits keep their folders
        # (a killed pairs fit's shared model may hold gigabytes of memory there)
        for parent in {self.temp_folder, SHARED_MEMORY}:
            remove_stray_folders(parent)
        self.uses_threads = self.row_threads > 0
        if self.n_workers > 1:
            backend, _ = get_active_backend()
            self.uses_threads = bool(getattr(backend, "uses_threads", False))
            if not (self.source.shareable or self.uses_threads):
                raise ValueError(
                    f"X ({self.source.description}) is an HDF5 dataset of a file open "
                    "for writing or held in memory: worker processes would reopen it "
                    "by name and could read stale data. Use n_jobs=1 or the threading "
                    "backend, or close the file and pass 'file.h5:/dataset'."
                )
            try:
                if not self.uses_threads:
                    # (a copy on disk for data in memory; None and the source
                    # itself for sources that worker processes reopen)
                    self._folder, self.worker_source = self.source.copy_for_workers(
                        self.temp_folder)
                # results stream back in order; backends that cannot stream
                # (multiprocessing) return the list
                streams = getattr(backend, "supports_return_generator", False)
                self._return_as = "generator" if streams else "list"
                self._shares_files = _local_processes(backend)
            except BaseException:
                self.__exit__(None, None, None)
                raise
        if (self.n_workers > 1 or self.row_threads or self._one_blas_thread
                or self.one_core):
            # Tasks run concurrently (or are tiny: then in this process too, with
            # one BLAS thread). In threads of this process the limit is theirs
            # (threadpoolctl limits are process-wide: per-thread limits would race).
            # Either way it also holds this process's own BLAS calls between passes
            # (the M step) to one task's share: OpenBLAS threads spin for a while
            # after each multi-threaded call and would take the cores that the
            # next pass's tasks run on. The loops over components between passes
            # (the M step, the factorisation, the screen) use the cores of the
            # idle row threads or workers (:func:`~emgmm._runtime.blas.over_ranges`).
            hold_process_limit(1 if self.row_threads else self.blas_threads,
                               loop_threads=self.component_threads)
            self._holds_limit = True
        return self

    @property
    def component_threads(self):
        """Threads for a loop of one LAPACK call per component in this process
        between passes (the factorisation of the M step): the pass's parallelism
        (row threads or workers, which are idle then; else the BLAS threads the
        process may use), one with ``n_jobs=1``."""
        if self.one_core or self._one_blas_thread:
            return 1
        if self.row_threads or self.n_workers > 1:
            return max(1, min(max(self.row_threads, self.n_workers),
                              os.cpu_count() or 1))
        # a lone process without row threads: as many as BLAS may use (a
        # threadpoolctl limit, or joblib's share inside an outer worker)
        return max(1, min(self.blas_threads, blas_thread_count()))

    def one_blas_thread(self):
        """Run every task with one BLAS thread, also in this process (for tiny
        tasks, :func:`emgmm._memory.tasks_are_tiny`); call before entering."""
        self.blas_threads = 1
        self._one_blas_thread = True

    def map(self, func, task_args):
        """``func(source, *args, blas_threads=...)`` for every args, results in order.

        Parameters
        ----------
        func : callable
        task_args : list of tuple

        Returns
        -------
        iterator
            Results in the order of ``task_args`` (a fixed reduction order).
        """
        if self.row_threads and len(task_args) > 1:
            results = self._threaded(func, task_args)
        elif self._return_as is None:
            run = per_thread(func)
            results = (run(self.worker_source, *args, blas_threads=None)
                       for args in task_args)
        else:
            blas_threads = None if self.uses_threads else self.blas_threads
            if self._shares_files:
                task_args = self._share_large_arguments(task_args)
            # (worker processes allocate afresh: a process's one thread keeps its
            # freed blocks in one arena, where the next block finds them). Worker
            # processes of this host end with this process, also when it is killed
            # (loky's would stay until their idle timeout, with their memory).
            if self.uses_threads:
                run = per_thread(func)
            elif self._shares_files:
                run = functools.partial(run_watched, func)
            else:
                run = func
            # One joblib call per map (the loky workers are reused between calls).
            # joblib's memmapping folders go into this fit's own (removed when it
            # ends): left to joblib, every call with a reused pool creates one in
            # /dev/shm that stays until the pool stops
            temp = {"temp_folder": self._joblib_folder()} if self._shares_files else {}
            results = Parallel(n_jobs=self.n_jobs, return_as=self._return_as, **temp)(
                delayed(run)(self.worker_source, *args, blas_threads=blas_threads)
                for args in task_args
            )
        return self._reported(results, len(task_args))

    def _joblib_folder(self):
        """The folder given to joblib as ``temp_folder``: ``joblib/`` in this fit's
        temporary folder (created on first use)."""
        if self._folder is None:
            self._folder = make_temp_folder(self.temp_folder, 0,
                                            "joblib's memmapping folder")
        return os.path.join(self._folder, "joblib")

    def _threaded(self, func, task_args):
        """The tasks in ``row_threads`` threads of this process, one BLAS thread each
        (the limit is set for the whole process while the executor is open), each
        with a workspace of its own for the call
        (:func:`~emgmm._workspace.per_thread`)."""
        run = per_thread(func)
        return Parallel(n_jobs=self.row_threads, backend="threading",
                        return_as="generator")(
            delayed(run)(self.worker_source, *args, blas_threads=None)
            for args in task_args
        )

    def _reported(self, results, total):
        """Yield ``results``, calling ``on_task(done, total)`` after each one."""
        for done, result in enumerate(results, 1):
            if self.on_task is not None:
                self.on_task(done, total)
            yield result

    def _share_large_arguments(self, task_args):
        """Write each large array of the arguments (also inside dataclasses such as
        the model, and tuples such as its prepared estimates) once to the temporary
        folder and pass a read-only memory map of it.

        joblib sends a memory map as its file name; left to itself it would hash and
        dump large arrays for every task, keeping the files until the pool stops.
        The files of the previous call are removed: at most one set is on disk.
        """
        for path in self._shared:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._shared = []
        cache = {}
        return [tuple(self._share(value, cache) for value in args)
                for args in task_args]

    def _share(self, value, cache):
        """``value`` with its large arrays replaced by read-only memory maps of
        files in the temporary folder (itself if none is); ``cache`` maps the id of
        each value already shared to ``(value, shared)``."""
        key = id(value)
        if key in cache:
            return cache[key][1]
        shared = value
        if (isinstance(value, np.ndarray) and not isinstance(value, np.memmap)
                and value.nbytes > SHARE_BYTES):
            shared = self._share_array(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            shared = self._share_dataclass(value, cache)
        elif type(value) is tuple:
            items = tuple(self._share(v, cache) for v in value)
            if any(a is not b for a, b in zip(items, value, strict=False)):
                shared = items
        cache[key] = (value, shared)  # keeps value alive: ids stay unique
        return shared

    def _share_array(self, value):
        """A read-only memory map of ``value``, written to a new file of the
        temporary folder (made on first use)."""
        if self._folder is None:
            self._folder = make_temp_folder(self.temp_folder, value.nbytes,
                                            "sharing the model with the workers")
        path = os.path.join(self._folder, f"arg-{uuid.uuid4().hex[:12]}.npy")
        self._shared.append(path)
        try:
            np.save(path, value, allow_pickle=False)
        except OSError as exc:
            raise OSError(f"Writing a task argument to {self._folder} failed "
                          f"({exc}). {_HOW_TO_MOVE}") from None
        return np.load(path, mmap_mode="r")

    def _share_dataclass(self, value, cache):
        """The dataclass instance ``value`` with its fields shared (itself if no
        field changed)."""
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        changed = {name: self._share(v, cache) for name, v in fields.items()}
        if any(changed[name] is not fields[name] for name in fields):
            return dataclasses.replace(value, **changed)
        return value

    @property
    def in_process(self):
        """Whether the tasks run in this process (threads, or one after the other):
        then they share its arrays (once entered)."""
        return self.uses_threads or self._return_as is None

    def shared_folder(self, nbytes, what):
        """A new folder for ``nbytes`` of files that worker processes map and write
        (removed when the executor exits), or ``None`` when the tasks run in this
        process (:attr:`in_process`).

        The folder is in :func:`shared_memory_folder`.

        Raises
        ------
        OSError
            If that folder lacks the space (names it and how to change it).
        """
        if self.in_process:
            return None
        folder = make_temp_folder(
            shared_memory_folder(nbytes, self._given_temp_folder), nbytes, what)
        self._extra_folders.append(folder)
        return folder

    def file_folder(self, nbytes, what):
        """A new folder for ``nbytes`` of files in the fit's temporary folder
        (:func:`joblib_temp_folder`, on disk: for per-row state that should not
        take memory), also when the tasks run in this process; removed when the
        executor exits.

        Raises
        ------
        OSError
            If that folder lacks the space (names it and how to change it).
        """
        folder = make_temp_folder(self.temp_folder, nbytes, what)
        self._extra_folders.append(folder)
        return folder

    def remove_folder(self, folder):
        """Remove a folder of :meth:`shared_folder` or :meth:`file_folder` before
        the executor exits."""
        self._extra_folders.remove(folder)
        shutil.rmtree(folder, ignore_errors=True)

    def __exit__(self, *exc):
        self._return_as = None
        self._shared = []
        for folder in self._extra_folders:
            shutil.rmtree(folder, ignore_errors=True)
        self._extra_folders = []
        if self._holds_limit:
            release_process_limit()
            self._holds_limit = False
        if self.worker_source is not self.source:
            self.worker_source.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
