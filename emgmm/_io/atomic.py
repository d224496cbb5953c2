"""Outputs written atomically: a temporary name in the same folder, then a rename."""

import os
import tempfile
from contextlib import contextmanager, suppress

from .._runtime.disk import reserve


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
    ValueError
        If ``path`` is empty, or names something other than a regular file (a
        device such as ``/dev/null``, a pipe or a socket), which the output would
        replace.
    """
    path = os.fspath(path)
    if path == "":
        raise ValueError(f"{what} path is empty")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{what} directory does not exist: {directory}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} path is a directory: {path}")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{what} path {path} is not a regular file (a device, pipe "
                         "or socket): give the path of a file")
    if not (os.access(directory, os.W_OK | os.X_OK) and _can_create_in(directory)):
        raise PermissionError(f"{what} directory is not writable: {directory} "
                              f"(permissions or a read-only file system; {what} "
                              f"{path})")


def _can_create_in(directory):
    """Whether a file can be created in ``directory``: tried, as ``os.access``
    answers by permission bits alone (yes to root on sysfs or procfs)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".emgmm-probe-"):
            return True
    except OSError:
        return False


@contextmanager
def atomic_output(path):
    """Yield a temporary path next to ``path``; rename it to ``path`` on success.

    :func:`atomic_outputs` for one path.

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
    OSError
        If the temporary file cannot be created (the message names ``path``).
    """
    with atomic_outputs([path]) as (tmp_path,):
        yield tmp_path


@contextmanager
def atomic_outputs(paths):
    """Yield temporary paths next to ``paths``; rename each to its path on success.

    Each temporary file is created in the directory of its path (so the final
    ``os.replace`` is atomic). All of them are written to disk (``fsync``) before the
    first rename, and all are removed if the body raises or a write to disk fails: a
    failed run leaves no partial or stray file, and none of the outputs is replaced
    unless all were written. (A rename that fails, e.g. over an immutable file, stops
    the renames: the outputs before it are replaced, the others left as they were.)
    Each result gets the permissions of a newly created file (``0666`` less the
    umask).

    Parameters
    ----------
    paths : sequence of str or os.PathLike
        Final output paths. Their directories must exist.

    Yields
    ------
    tmp_paths : list of str
        Paths of empty temporary files to write to, in the order of ``paths``.

    Raises
    ------
    OSError
        If a temporary file cannot be created (the message names the user's path,
        not the temporary one).
    """
    paths = [os.fspath(path) for path in paths]
    tmp_paths = []
    try:
        for path in paths:
            directory = os.path.dirname(os.path.abspath(path))
            try:
                fd, tmp_path = tempfile.mkstemp(
                    dir=directory, prefix="." + os.path.basename(path) + ".",
                    suffix=".tmp")
            except OSError as exc:  # name the user's path, not the temporary one
                raise type(exc)(exc.errno, f"Cannot write {path} ({exc.strerror} in "
                                f"its folder {directory})") from None
            os.close(fd)
            tmp_paths.append(tmp_path)
        yield list(tmp_paths)
        for tmp_path in tmp_paths:
            with open(tmp_path, "rb+") as fh:  # on disk before any rename
                os.fsync(fh.fileno())
        # mkstemp creates the file 0600; give it the mode a new file would get
        umask = os.umask(0)
        os.umask(umask)
        for tmp_path in tmp_paths:
            os.chmod(tmp_path, 0o666 & ~umask)
        for tmp_path, path in zip(list(tmp_paths), paths, strict=False):
            try:
                os.replace(tmp_path, path)
            except OSError as exc:  # name the user's path, not the temporary one
                raise type(exc)(exc.errno, f"Cannot replace {path} ({exc.strerror})"
                                ) from None
            tmp_paths.remove(tmp_path)
    except BaseException:
        for tmp_path in tmp_paths:  # those not renamed
            with suppress(FileNotFoundError):
                os.unlink(tmp_path)
        raise


@contextmanager
def reserved_file(tmp_path, nbytes, path):
    """``tmp_path`` open for writing (binary) from its start, its first ``nbytes``
    reserved (:func:`~emgmm._runtime.disk.reserve`; errors name ``path``); on
    leaving, the file is cut at the position written to, so the unused part of the
    reserve does not stay."""
    with open(tmp_path, "r+b") as fh:
        reserve(fh.fileno(), nbytes, path)
        yield fh
        fh.truncate()
