"""BLAS threads: a task's limit, holds on the whole process, and one thread for the
kernels' loops of small products.

threadpoolctl limits are process-wide: tasks that run in threads of one process share
one limit, which the holds below count (the smallest requested limit holds until the
last release, which restores the limits found by the first). The BLAS libraries are
looked up once per process (finding them costs ~1 ms: ``dl_iterate_phdr`` over every
shared object), at the first call, when numpy and scipy are loaded.
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


def hold_process_limit(threads):
    """Limit this process's BLAS to at most ``threads`` until released."""
    with _LIMIT_LOCK:
        if _LIMIT["holders"] == 0:
            _LIMIT["original"] = _controller().limit(limits=threads, user_api="blas")
            _LIMIT["threads"] = threads
        elif threads < _LIMIT["threads"]:
            _controller().limit(limits=threads, user_api="blas")
            _LIMIT["threads"] = threads
        _LIMIT["holders"] += 1


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
    longer per iteration.
    A hold on the process (:func:`hold_process_limit`: ~10 us with its release, a
    counter when a pass already holds one thread), safe when several threads use it
    at once: while any of them is inside, the limit stays at one. OpenBLAS (0.3.31)
    ignores a limit set from a thread other than the main one once the main thread
    has set one: in thread workers this then changes nothing (row threads run under
    their pass's hold of one thread anyway).
    """
    hold_process_limit(1)
    try:
        yield
    finally:
        release_process_limit()
