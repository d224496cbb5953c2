"""Whether a process lives, on every platform (the stray-folder and lock checks, and
the workers' watch of their parent)."""

import os

#: Whether ``os.kill(pid, 0)`` probes a process without signalling it (POSIX). On
#: Windows signal 0 is ``CTRL_C_EVENT``: it would interrupt the process group
#: ``pid``.
_PROBE_BY_SIGNAL = os.name == "posix"


def pid_alive(pid):
    """Whether a process of id ``pid`` runs in this host's PID namespace.

    On POSIX systems, by ``os.kill(pid, 0)``; elsewhere (Windows) by
    ``psutil.pid_exists`` (psutil is a dependency there), and ``True`` without
    psutil: an unknown process counts as alive, so nothing of it is removed.

    Parameters
    ----------
    pid : int

    Returns
    -------
    bool
    """
    if not _PROBE_BY_SIGNAL:
        try:
            import psutil
        except ImportError:
            return True
        return psutil.pid_exists(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
