"""Work buffers that a thread reuses from block to block within a pass.

Each block of a pass needs the same large work arrays (the ``(n, K)``
responsibilities, the packed products of a row chunk). Allocated afresh for every
block, they come from glibc's ``malloc``: the first ones from mappings of their own,
but freeing such a chunk raises the allocator's mmap threshold to its size (up to
32 MiB), and the next blocks' arrays then come from the heap arenas, one per thread,
where freed memory stays resident and fragments (resident memory well above what
tracemalloc traces). Allocating every block's arrays on mappings of their own
instead costs a page fault per page touched, every block (the measurements:
benchmarks/README.md, "Memory").

A :class:`Workspace` keeps one buffer per name on an anonymous mapping of its own,
lent to one user at a time and kept for the next block; the executor gives each
thread of a pass (the fitting thread, row threads, joblib's threading backend) one
workspace (:func:`per_thread`), made active for the tasks it runs, and drops it
with the pass. Kernels borrow through :func:`borrow`, which without an active
workspace (worker processes, direct calls) lends a fresh array.
A borrowed array must not outlive its ``with`` block.

References
----------
mallopt(3), M_MMAP_THRESHOLD, Linux man-pages.
"""

import math
import mmap
import threading
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

_ACTIVE = ContextVar("emgmm_workspace", default=None)
#: Test switches, read at every call. ``FILL``: None (lent values undefined), or a
#: value every array a :class:`Workspace` lends is filled with first (NaN: a kernel
#: that reads a buffer before writing it changes the fit; True for bool arrays).
#: ``REUSE``: False makes :func:`per_thread` activate no workspace (fresh arrays).
FILL = None
REUSE = True


class Workspace:
    """Named buffers, each on an anonymous mapping, lent to one user at a time."""

    def __init__(self):
        self._free = {}

    @contextmanager
    def borrow(self, name, shape, dtype=np.float64, order="C"):
        """Lend an array of ``shape`` and ``dtype`` over the buffer ``name`` (grown to
        fit; a second borrower of a name that is lent out gets a buffer of its own).
        Its values are undefined.

        Yields
        ------
        ndarray
            Contiguous in ``order`` ('C' or 'F'), writable.
        """
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        nbytes = max(1, count * dtype.itemsize)
        buf = self._free.pop(name, None)
        if buf is None or len(buf) < nbytes:
            del buf  # unmapped before the larger one is mapped
            buf = mmap.mmap(-1, nbytes)
        try:
            array = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape,
                                                                         order=order)
            if FILL is not None:
                array[...] = True if dtype.kind == "b" else FILL
            yield array
        finally:
            self._free[name] = buf


@contextmanager
def borrow(name, shape, dtype=np.float64, order="C"):
    """:meth:`Workspace.borrow` of the active workspace, or a fresh ``numpy.empty``.

    Parameters
    ----------
    name : str
        Distinct for arrays that are lent at the same time.
    shape : tuple of int
    dtype : numpy dtype, default=float64
    order : {'C', 'F'}, default='C'

    Yields
    ------
    ndarray
        Values undefined; valid inside the ``with`` block only.
    """
    workspace = _ACTIVE.get()
    if workspace is None:
        yield np.empty(shape, dtype=dtype, order=order)
    else:
        with workspace.borrow(name, shape, dtype, order) as array:
            yield array


def per_thread(func):
    """``func`` run with a workspace of its thread's own active (one workspace per
    thread that calls the returned function; all are dropped with it), or ``func``
    itself when ``REUSE`` is false."""
    if not REUSE:
        return func
    local = threading.local()

    def run(*args, **kwargs):
        workspace = getattr(local, "workspace", None)
        if workspace is None:
            workspace = local.workspace = Workspace()
        token = _ACTIVE.set(workspace)
        try:
            return func(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    return run
