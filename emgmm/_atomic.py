"""Outputs written atomically: a temporary name in the same folder, then a rename."""

import os
import tempfile
from contextlib import contextmanager, suppress


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
    fd, tmp_path = tempfile.mkstemp(
        dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp"
    )
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
