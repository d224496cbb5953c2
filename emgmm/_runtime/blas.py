"""BLAS threads: a task's limit, holds on the whole process, and one thread for the
kernels' loops of small products.

threadpoolctl limits are process-wide: tasks that run in threads of one process share
one limit, which the holds below count (the smallest requested limit holds until the
last release, which restores the limits found by the first). The limits of tasks and
of the kernels' loops use the BLAS libraries found at the first call in this process
(finding them walks every shared object with ``dl_iterate_phdr``), when numpy
and scipy are loaded; an executor's hold looks them up afresh.
"""

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_info

# (pid, ThreadpoolController) of this process
_CONTROLLER = None


def _controller():
    global _CONTROLLER
    if _CONTROLLER is None or _CONTROLLER[0] != os.getpid():
        _CONTROLLER = (os.getpid(), ThreadpoolController())
    return _CONTROLLER[1]


def limit_blas(blas_threads):
    """Context that limits BLAS threads in a worker (a no-op in process: ``None``);
    the loops over components there (:func:`over_ranges`) take as many threads."""
    if blas_threads is None:
        return nullcontext()
    return _controller().limit(limits=blas_threads, user_api="blas")


def blas_thread_count():
    """The BLAS threads this process may use now (1 when no BLAS is loaded): the
    limits of threadpoolctl, of joblib in its workers, or of a hold."""
    counts = [info["num_threads"] for info in threadpool_info()
              if info.get("user_api") == "blas"]
    return max(counts, default=1)


_LIMIT_LOCK = threading.Lock()
_LIMIT = {"holders": 0, "threads": None, "loop_threads": None, "original": None}


def _reset_after_fork():
    """A forked child (multiprocessing workers) starts with no holds of its own."""
    global _LIMIT_LOCK
    _LIMIT_LOCK = threading.Lock()
    _LIMIT.update(holders=0, threads=None, loop_threads=None, original=None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def hold_process_limit(threads, cached=False, loop_threads=None):
    """Limit this process's BLAS to at most ``threads`` until released.

    ``cached``: through the controller found at the first call (~10 us) instead of
    looking the libraries up again (which finds those loaded since, at a cost).
    ``loop_threads``: the threads a loop of one-thread BLAS calls may run meanwhile
    (:func:`held_threads`; at least ``threads``): an executor whose row threads each
    hold one BLAS thread leaves all of them to the loops between its passes. The
    first hold sets it (``threads`` when not given); a later hold that names it can
    lower it until the last release; one that does not (:func:`single_blas_thread`)
    leaves it.
    """
    with _LIMIT_LOCK:
        controller = _controller() if cached else ThreadpoolController()
        if _LIMIT["holders"] == 0:
            _LIMIT["original"] = controller.limit(limits=threads, user_api="blas")
            _LIMIT["threads"] = threads
            _LIMIT["loop_threads"] = max(threads, loop_threads or threads)
        else:
            if threads < _LIMIT["threads"]:
                controller.limit(limits=threads, user_api="blas")
                _LIMIT["threads"] = threads
            if loop_threads is not None:
                _LIMIT["loop_threads"] = min(_LIMIT["loop_threads"],
                                             max(threads, loop_threads))
        _LIMIT["holders"] += 1


def held_threads():
    """The threads a loop of one-thread BLAS or LAPACK calls may run in this
    process: the holds' ``loop_threads`` (:func:`hold_process_limit`; one under
    ``n_jobs=1``), else as many as BLAS may use now (:func:`blas_thread_count`:
    a threadpoolctl limit, or joblib's share in a worker, bounds the loops too).
    One in a thread other than the main one, where :func:`over_ranges` runs the
    loop in that thread (without looking the libraries up)."""
    if threading.current_thread() is not threading.main_thread():
        return 1
    return _LIMIT["loop_threads"] or blas_thread_count()


def release_process_limit():
    """Release one hold; the last restores the limits found by the first."""
    with _LIMIT_LOCK:
        _LIMIT["holders"] -= 1
        if _LIMIT["holders"] == 0:
            _LIMIT["original"].restore_original_limits()
            _LIMIT["original"] = _LIMIT["threads"] = _LIMIT["loop_threads"] = None


@contextmanager
def single_blas_thread():
    """Context for a loop of small BLAS calls (one per component): one BLAS thread.

    OpenBLAS splits every product beyond a small size over its threads, which then
    synchronise on each call: loops of small products run several times slower on
    two threads than on one (benchmarks/README.md, "How the 'full' kernels get
    there"). A hold on the process (:func:`hold_process_limit`, cached), taken
    in the main thread only: OpenBLAS (0.3.31)
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


def over_ranges(func, n_items, threads, work=None):
    """``func(start, stop)`` over ``threads`` contiguous ranges of ``range(n_items)``
    (at most ``n_items``; of about equal ``work``, an ``(n_items,)`` array of each
    item's, when given; some may be empty), in threads of this process, or in this
    thread for one range or when called from a thread other than the main one; their
    results in range order. From the main thread every call runs on one BLAS thread
    (:func:`single_blas_thread`); from another, on the BLAS threads of its pass
    (one for row threads).

    For loops of one kernel call per component whose products release the GIL:
    each component's arithmetic is the same whatever ``threads`` is (at one BLAS
    thread), so the results are too.
    """
    if threading.current_thread() is not threading.main_thread():
        threads = 1  # (a row thread: its siblings hold the other cores)
    threads = max(1, min(int(threads), n_items))
    if work is None or threads == 1:
        edges = np.linspace(0, n_items, threads + 1).astype(int)
    else:
        done = np.cumsum(work, dtype=np.float64)
        cuts = np.searchsorted(done, done[-1] * np.arange(1, threads) / threads)
        edges = np.concatenate([[0], np.minimum(cuts + 1, n_items), [n_items]])
    ranges = list(itertools.pairwise(edges))
    with single_blas_thread():
        if threads == 1:
            return [func(*r) for r in ranges]
        # (the first range in this thread, the others in the pool's)
        futures = [_pool(threads - 1).submit(func, *r) for r in ranges[1:]]
        try:
            first = func(*ranges[0])
        finally:
            wait(futures)  # (no range still writes when this returns or raises)
        return [first] + [f.result() for f in futures]


# (pid, threads, ThreadPoolExecutor): the threads that run over_ranges's ranges,
# kept for the next loop (a pool started per loop cost as much as the kernels of a
# block: benchmarks/README.md); made afresh in a forked child
_POOL = None


def _pool(threads):
    """A pool of at least ``threads`` threads of this process."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < threads:
        if _POOL is not None and _POOL[0] == os.getpid():
            _POOL[2].shutdown(wait=False)
        _POOL = (os.getpid(), threads, ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="emgmm-components"))
    return _POOL[2]


#: Flops of a loop over components beyond which :func:`loop_threads` gives it
#: threads: below, starting them costs more than they save.
THREADED_WORK = 2**25


def threads_for_loop(work, threads=None):
    """Threads for a loop over components of ``work`` flops in all: ``threads``
    (else :func:`held_threads`), or 1 for a small loop."""
    if work < THREADED_WORK:
        return 1
    return held_threads() if threads is None else threads
