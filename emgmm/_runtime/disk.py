"""Disk space allocated up front for files written through memory maps or in
place: a full file system then raises ``OSError`` naming the file, not ``SIGBUS``.

Used by the component schedule's shared buffer (engine), the model files and
checkpoints (io) and the command line's outputs.
"""

import errno
import os
import shutil


def reserve(fd, nbytes, path):
    """Allocate the first ``nbytes`` of the open file ``fd`` on disk (the file grows
    to at least that size), so that writing them through a memory map cannot meet a
    full file system: without it, a sparse file mapped on a full one kills the process
    with ``SIGBUS``. Where ``os.posix_fallocate`` is missing (not Linux) or refused
    by the file system (``EOPNOTSUPP``, ``ENOSYS``), the file is only extended.

    Parameters
    ----------
    fd : int
        A file descriptor open for writing.
    nbytes : int
    path : str or os.PathLike
        The file the user knows it by, for the message.

    Raises
    ------
    OSError
        If the space cannot be allocated (``ENOSPC``: the message names ``path``, the
        bytes needed and those free).
    """
    if nbytes <= 0:
        return
    try:
        if hasattr(os, "posix_fallocate"):  # (not on every platform)
            os.posix_fallocate(fd, 0, nbytes)
            return
    except OSError as exc:
        # EOPNOTSUPP, ENOSYS: a C library that does not emulate it on such a file
        # system (musl); the file is extended below
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            directory = os.path.dirname(os.path.abspath(os.fspath(path)))
            free = shutil.disk_usage(directory).free
            raise type(exc)(exc.errno, f"Cannot write {os.fspath(path)}: "
                            f"{exc.strerror} (it needs {nbytes / 2**20:.1f} MiB; "
                            f"{free / 2**20:.1f} MiB free in {directory})") from None
    if os.fstat(fd).st_size < nbytes:
        os.ftruncate(fd, nbytes)
