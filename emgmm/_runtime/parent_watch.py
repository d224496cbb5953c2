"""Worker processes that end with the process that started them.

loky's workers wait for their next task on a pipe whose both ends they hold, so they
do not notice the death of the process that started them: after a SIGKILL of a fit
they stay, orphaned, until loky's idle timeout (5 minutes, more when a worker waits
to report its exit), holding their memory, and loky's resource trackers stay with
them (each ends when the last process holding its pipe has gone, then cleans up and
warns about what the dead fit left, into the terminal of whatever runs then).

The executor runs every task of a worker process through :func:`run_watched`, which
starts, once in each worker process, a daemon thread that ends the process within
``POLL_SECONDS`` of its parent's death. (Not ``prctl(PR_SET_PDEATHSIG)``: Linux
only, and it fires when the *thread* that started the child ends, and loky starts
its workers from a thread of its own.)
"""

import os
import threading
import time

from .processes import pid_alive

#: Seconds between a worker's checks that its parent lives.
POLL_SECONDS = 1.0
#: Exit status of a worker whose parent has gone.
ORPHAN_STATUS = 1

_LOCK = threading.Lock()
# the process id in which the watch runs: a process forked from a worker inherits
# the value but not the thread
_WATCHING = {"pid": None}


def _parent_gone(parent):
    """Whether the process ``parent`` (this process's parent when the watch began)
    has ended.

    On POSIX systems an orphan is adopted by another process (init or a subreaper),
    so its parent id changes: no confusion with a new process that reuses the id.
    Elsewhere (Windows) the parent id does not change; the process is probed.
    """
    if os.name == "posix":
        return os.getppid() != parent
    return not pid_alive(parent)


def _watch(parent):
    while not _parent_gone(parent):
        time.sleep(POLL_SECONDS)
    # a task may be running: nobody is left to take its result, and a clean exit
    # could wait for loky's threads
    os._exit(ORPHAN_STATUS)


def watch_parent():
    """Start, once in this process, a daemon thread that ends the process when its
    parent (the process that started it) has ended."""
    with _LOCK:
        if _WATCHING["pid"] == os.getpid():
            return
        _WATCHING["pid"] = os.getpid()
    threading.Thread(target=_watch, args=(os.getppid(),), daemon=True,
                     name="emgmm-parent-watch").start()


def run_watched(func, *args, **kwargs):
    """``func(*args, **kwargs)`` in a worker process that ends with its parent
    (:func:`watch_parent`).

    Parameters
    ----------
    func : callable
        A task; picklable, as this function is, for joblib to send both.
    *args, **kwargs
        Its arguments.

    Returns
    -------
    object
        What ``func`` returns.
    """
    watch_parent()
    return func(*args, **kwargs)
