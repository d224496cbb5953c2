"""The death of a worker process, explained as the memory error it most often is."""

import math
from concurrent.futures import BrokenExecutor
from contextlib import contextmanager

from . import memory

_MIB = 2**20
# Errors of a worker pool whose worker process died: loky's TerminatedWorkerError and
# BrokenProcessPool derive from BrokenExecutor; dask reports KilledWorker.
_WORKER_DEATH_NAMES = ("KilledWorker",)


@contextmanager
def explain_worker_loss(model_nbytes, block_nbytes, n_workers, source=None):
    """Turn the death of a worker process into a ``MemoryError`` with the estimate,
    unless the data file changed under the workers.

    A worker that disappears (loky's ``TerminatedWorkerError``, any
    ``BrokenExecutor``, dask's ``KilledWorker``) was most often killed by the
    out-of-memory killer. The estimator enters this context outside its executor, so
    the pool and the temporary files are gone when the error is raised.

    Parameters
    ----------
    model_nbytes : int
        Bytes of the model over the parent and the workers (the memory model's
        estimate for the chosen schedule).
    block_nbytes : int
        Working memory of one block in one worker.
    n_workers : int
    source : Source or None, default=None
        The data: a file truncated or rewritten during the pass kills the worker
        that reads it (SIGBUS), which is then no memory problem.

    Raises
    ------
    OSError, FileNotFoundError
        If the data file was deleted, truncated or modified (checked first, by its
        size and modification time), chained to the pool's error.
    MemoryError
        Chained to the pool's error; names the likely cause and the estimate.
    """
    try:
        yield
    except Exception as exc:
        names = {cls.__name__ for cls in type(exc).__mro__}
        if not (isinstance(exc, BrokenExecutor) or names & set(_WORKER_DEATH_NAMES)):
            raise
        if source is not None:
            try:
                source.check_unchanged()
            except OSError as changed:
                raise changed from exc
        total = model_nbytes + n_workers * block_nbytes
        available = memory.available_memory()
        # (the dead workers' memory is free again: what is available now is an upper
        # bound of what was when they died)
        if not math.isfinite(available):  # the system does not tell it
            cause = ("The memory available is unknown here (install psutil): the "
                     "operating system's out-of-memory killer, a signal (e.g. kill) "
                     "or a crash in a native library may be the cause.")
            now = ""
        else:
            cause = ("The likely cause is the operating system's out-of-memory killer."
                     if 4 * total > available else
                     "The fit's estimate is far below the memory available now: a "
                     "signal (e.g. kill), a crash in a native library, or other "
                     "processes' memory use are likelier causes than this fit's.")
            now = f"; {available / _MIB:,.0f} MiB are available now"
        raise MemoryError(
            f"A worker process died during the fit ({type(exc).__name__}). {cause} "
            f"The fit needs about {total / _MIB:,.1f} MiB: "
            f"{model_nbytes / _MIB:,.1f} MiB for the model (parent and {n_workers} "
            f"worker(s)) and {block_nbytes / _MIB:,.1f} MiB of block working memory "
            f"per worker{now}. If memory ran out, lower n_jobs, working_memory or "
            "block_size, use a cheaper covariance_type, or set memory_limit to what "
            "this machine can spare."
        ) from exc
