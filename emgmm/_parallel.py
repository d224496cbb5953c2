"""Running passes over the data with joblib, sharing the data by file reference.

Workers never receive the data by value: file-backed sources travel as their
description (path, dataset name) and reopen the file read-only; an in-memory array is
written once per fit to a ``.npy`` file in joblib's temporary folder and travels as
that file's path. The folder is removed when the fit ends, also when it raises.
BLAS threads per worker are limited so that workers x threads <= cores.
"""

import os
import re
import shutil
import tempfile
import uuid
from contextlib import nullcontext

import numpy as np
from joblib import Parallel, delayed, effective_n_jobs
from joblib.parallel import get_active_backend
from threadpoolctl import threadpool_limits

from ._sources import ArraySource, MemmapSource

TEMP_PREFIX = "emgmm-"
_STRAY = re.compile(rf"^{TEMP_PREFIX}(\d+)-[0-9a-f]+$")


def joblib_temp_folder():
    """The folder joblib would memory-map into: parallel_config(temp_folder=...),
    else ``JOBLIB_TEMP_FOLDER``, else the system temporary folder (on disk, so the
    copy of an in-memory array does not take memory)."""
    from joblib import parallel as _jp

    config = getattr(_jp._backend, "config", {})
    folder = config.get("temp_folder")
    if isinstance(folder, str):
        return folder
    return os.environ.get("JOBLIB_TEMP_FOLDER") or tempfile.gettempdir()


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stray_folders(parent):
    """Remove ``emgmm-<pid>-*`` folders left by processes that no longer exist
    (a fit killed with SIGKILL cannot clean up after itself)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        match = _STRAY.match(name)
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def dump_array(array, parent):
    """Write ``array`` once to ``parent/emgmm-<pid>-<id>/X.npy``.

    Returns
    -------
    folder : str
        The folder to remove when the fit ends.
    source : MemmapSource

    Raises
    ------
    OSError
        If ``parent`` lacks the space (names the folder and how to change it).
    """
    remove_stray_folders(parent)
    how = (
        "Point joblib elsewhere with the JOBLIB_TEMP_FOLDER environment variable or "
        "joblib.parallel_config(temp_folder=...), or use n_jobs=1 or a file-backed "
        "source (.npy or HDF5)."
    )
    try:
        free = shutil.disk_usage(parent).free
    except OSError as exc:
        raise OSError(f"Temporary folder {parent} is not usable ({exc}). {how}") from None
    if free < array.nbytes + 2**20:
        raise OSError(
            f"Temporary folder {parent} has {free / 2**20:,.0f} MiB free; sharing X "
            f"with the workers needs {array.nbytes / 2**20:,.0f} MiB. {how}"
        )
    folder = os.path.join(parent, f"{TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.makedirs(folder)
    path = os.path.join(folder, "X.npy")
    try:
        np.save(path, np.ascontiguousarray(array), allow_pickle=False)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise OSError(f"Writing X to temporary folder {parent} failed ({exc}). {how}") from None
    return folder, MemmapSource.from_npy(path)


class Executor:
    """Runs lists of tasks over a source, in process or with joblib workers.

    Parameters
    ----------
    source : Source
    n_jobs : int or None
        joblib's meaning; ``None`` follows ``joblib.parallel_config``.

    Attributes
    ----------
    n_workers : int
    worker_source : Source
        What the tasks receive: never an in-memory array for process workers.
    blas_threads : int
        BLAS threads each worker may use.
    """

    def __init__(self, source, n_jobs):
        self.source = source
        self.n_jobs = n_jobs
        self.n_workers = max(1, effective_n_jobs(n_jobs))
        self.blas_threads = max(1, (os.cpu_count() or 1) // self.n_workers)
        self.worker_source = source
        self._folder = None
        self._parallel = None

    def __enter__(self):
        if self.n_workers > 1:
            backend, _ = get_active_backend()
            threads = getattr(backend, "uses_threads", False)
            try:
                if isinstance(self.source, ArraySource) and not threads:
                    self._folder, self.worker_source = dump_array(
                        self.source.array, joblib_temp_folder()
                    )
                self._parallel = Parallel(n_jobs=self.n_jobs, return_as="generator")
                self._parallel.__enter__()
            except BaseException:
                self.__exit__(None, None, None)
                raise
        return self

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
        if self._parallel is None:
            return (func(self.worker_source, *args, blas_threads=None) for args in task_args)
        return self._parallel(
            delayed(func)(self.worker_source, *args, blas_threads=self.blas_threads)
            for args in task_args
        )

    def __exit__(self, *exc):
        if self._parallel is not None:
            self._parallel.__exit__(None, None, None)
            self._parallel = None
        if self.worker_source is not self.source:
            self.worker_source.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def limit_blas(blas_threads):
    """Context that limits BLAS threads in a worker (a no-op in process)."""
    if blas_threads is None:
        return nullcontext()
    return threadpool_limits(limits=blas_threads, user_api="blas")

