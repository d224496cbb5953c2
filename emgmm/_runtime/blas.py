"""BLAS threads: a task's limit, holds on the whole process, and one thread for the
kernels' loops of small products.

threadpoolctl limits are process-wide: tasks that run in threads of one process share
one limit, which the holds below count (the smallest requested limit holds until the
last release, which restores the limits found by the first). The limits of tasks and
of the kernels' loops use the BLAS libraries found at the first call in this process
(finding them costs ~1 ms: ``dl_iterate_phdr`` over every shared object), when numpy
and scipy are loaded; an executor's hold looks them up afresh.
"""

import os
import threading
from contextlib import contextmanager, nullcontext

from threadpoolctl import ThreadpoolController

# (pid, ThreadpoolController) of this process
_CONTROLLER = None


def _controller():
    global _CONTROLLER
    if _CONTROLLER is None or _CONTROLLER[0] != os.getpid():
        _CONTROLLER = (os.getpid(), ThreadpoolController())
    return _CONTROLLER[1]


def limit_blas(blas_threads):
    """Context that limits BLAS threads in a worker (a no-op in process: ``None``)."""
    if blas_threads is None:
        return nullcontext()
    return _controller().limit(limits=blas_threads, user_api="blas")


_LIMIT_LOCK = threading.Lock()
_LIMIT = {"holders": 0, "threads": None, "original": None}


def _reset_after_fork():
    """A forked child (multiprocessing workers) starts with no holds of its own."""
    global _LIMIT_LOCK
    _LIMIT_LOCK = threading.Lock()
    _LIMIT.update(holders=0, threads=None, original=None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def hold_process_limit(threads, cached=False):
    """Limit this process's BLAS to at most ``threads`` until released.

    ``cached``: through the controller found at the first call (~10 us) instead of
    looking the libraries up again (~1 ms; finds those loaded since).
    """
    with _LIMIT_LOCK:
        controller = _controller() if cached else ThreadpoolController()
        if _LIMIT["holders"] == 0:
            _LIMIT["original"] = controller.limit(limits=threads, user_api="blas")
            _LIMIT["threads"] = threads
        elif threads < _LIMIT["threads"]:
            controller.limit(limits=threads, user_api="blas")
            _LIMIT["threads"] = threads
        _LIMIT["holders"] += 1


def held_threads():
    """The BLAS threads this process is held to (:func:`hold_process_limit`), or
    ``os.cpu_count()`` without a hold: how many threads a loop of one-thread LAPACK
    calls may run (``n_jobs=1`` holds one)."""
    return _LIMIT["threads"] or os.cpu_count() or 1


def release_process_limit():
    """Release one hold; the last restores the limits found by the first."""
    with _LIMIT_LOCK:
        _LIMIT["holders"] -= 1
        if _LIMIT["holders"] == 0:
            _LIMIT["original"].restore_original_limits()
            _LIMIT["original"] = _LIMIT["threads"] = None


@contextmanager
def single_blas_thread():
    """Context for a loop of small BLAS calls (one per component): one BLAS thread.

    OpenBLAS splits every product beyond a small size over its threads, which then
    synchronise on each call: the per-component products of the refined E step (a few
    hundred rows each, d=64; triangular products then) took 7x as long on two threads
    as on one, and an explicit ``n_jobs=1`` fit of [100k, 64], K=200 'full' ~25%
    longer per iteration. A hold on the process (:func:`hold_process_limit`, cached:
    ~10 us with its release), taken in the main thread only: OpenBLAS (0.3.31)
    ignores a limit set from another thread once the main thread has set one, so a
    hold released last by another thread could not restore the limit. Thread workers
    (row threads) run under their pass's hold of one thread anyway.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hold_process_limit(1, cached=True)
    try:
        yield
    finally:
        release_process_limit()
