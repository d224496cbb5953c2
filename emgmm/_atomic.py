"""Outputs written atomically: a temporary name in the same folder, then a rename."""

import os
import tempfile
from contextlib import contextmanager, suppress


def check_writable(path, what="output"):
    """Refuse, before any work, an output path that :func:`atomic_output` could not
    write: its folder missing, not writable (permissions, a read-only file system),
    or the path itself a folder.

    Parameters
    ----------
    path : str or os.PathLike
    what : str, default="output"
        How messages name the path.

    Raises
    ------
    FileNotFoundError
        If the folder of ``path`` does not exist.
    PermissionError
        If that folder is not writable.
    IsADirectoryError
        If ``path`` is a folder.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{what} directory does not exist: {directory}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} path is a directory: {path}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} directory is not writable: {directory} "
                              f"(permissions or a read-only file system; {what} "
                              f"{path})")


@contextmanager
def atomic_output(path):
    """Yield a temporary path next to ``path``; rename it to ``path`` on success.

    The temporary file is created in the directory of ``path`` (so the final
    ``os.replace`` is atomic) and removed if the body raises, so a failed
    run never leaves a partial or stray file behind. The result gets the
    permissions of a newly created file (``0666`` less the umask).

    Parameters
    ----------
    path : str or os.PathLike
        Final output path. Its directory must exist.

    Yields
    ------
    tmp_path : str
        Path of an empty temporary file to write to.

    Raises
    ------
    FileNotFoundError
        If the directory of ``path`` does not exist.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp_path = tempfile.mkstemp(
            dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp"
        )
    except OSError as exc:  # name the user's path, not the temporary one
        raise type(exc)(exc.errno, f"Cannot write {path} ({exc.strerror} in its "
                        f"folder {directory})") from None
    os.close(fd)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:  # on disk before the rename
            os.fsync(fh.fileno())
        # mkstemp creates the file 0600; give it the mode a new file would get
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp_path)
        raise
