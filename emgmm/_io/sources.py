"""Data sources: one interface over in-memory arrays, memory maps, .npy and HDF5 files.

A :class:`Source` knows the shape and dtype of a 2-D data set and reads row ranges
from it. File-backed sources hold only a description of the file (path, dataset name,
offset; its size and modification time, to tell it replaced); they open the file
lazily, read-only, in the process that reads, so they can be sent to worker processes
by reference. Every block that is read is checked: a non-numeric dtype, NaN or
infinity raises a ``ValueError`` that names the first offending row and the file.
"""

from __future__ import annotations

import abc
import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from .._runtime.executor import dump_array

if TYPE_CHECKING:
    import h5py
    from typing_extensions import Self

#: What the methods taking ``X`` accept: array-likes, ``np.memmap``, a ``.npy``
#: path, an ``h5py.Dataset``, ``"file.h5:/path/to/dataset"`` or a :class:`Source`.
DataLike = Union[ArrayLike, str, "os.PathLike[str]", "h5py.Dataset", "Source"]
#: What ``sample_weight`` accepts: the same kinds of source, 1-D, or one number.
WeightLike = Union[DataLike, float]  # noqa: UP007 (DataLike holds strings)

#: Serialises the lazy opening of file handles: two threads opening at once would
#: each store a handle, and the one dropped closes while its thread reads from it.
OPEN_LOCK = threading.Lock()

HDF5_SEPARATOR = ":"
_HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


def _check_numeric_dtype(dtype, where):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        raise ValueError(f"Complex data not supported: {where} has dtype {dtype}.")
    if dtype.kind not in "fiub":
        raise ValueError(
            f"{where} has dtype {dtype}; emgmm needs real numbers "
            "(float, integer or boolean data)."
        )


def _check_shape(shape, where):
    if len(shape) > 2:
        raise ValueError(
            f"Found array with dim {len(shape)}, while dim <= 2 is required by "
            f"GaussianMixture: {where} has shape {tuple(shape)}."
        )
    if len(shape) != 2:
        raise ValueError(
            f"Expected 2D array, got {len(shape)}D array instead: {where} has shape "
            f"{tuple(shape)}. Reshape your data either using array.reshape(-1, 1) if "
            "your data has a single feature or array.reshape(1, -1) if it contains a "
            "single sample."
        )


def check_block_finite(block, start, where):
    """Raise ``ValueError`` naming the first row of ``block`` with NaN or infinity.

    Parameters
    ----------
    block : ndarray of shape (n, d)
    start : int
        Index of the block's first row in the data set.
    where : str
        How to name the data set in the message.
    """
    if block.dtype.kind != "f":
        return
    # the sum screens the block cheaply: +inf and -inf, or finite values that
    # overflow, make it NaN or infinite (silently), and the exact check decides
    with np.errstate(over="ignore", invalid="ignore"):
        total = block.sum(dtype=np.float64)
    if np.isfinite(total) or np.isfinite(block).all():
        return
    bad = ~np.isfinite(block)
    row, col = np.argwhere(bad)[0]
    kind = "NaN" if np.isnan(block[row, col]) else (
        f"infinity or a value too large for {block.dtype!r}"
    )
    raise ValueError(
        f"Input X contains {kind}: {where}, row {start + row}, column {col}."
    )


def npy_error(description, exc):
    """The ``ValueError`` for a file ``np.load`` could not read as a ``.npy``
    array: one shorter than its header says is named truncated."""
    reason = str(exc)
    if "mmap length is greater than file size" in reason:
        reason = "the file is shorter than its header says (truncated?)"
    return ValueError(f"Cannot read {description} as a .npy array: {reason}")


class MissingDatasetError(KeyError):
    """An HDF5 file without the named dataset: a ``KeyError`` (as h5py raises) that
    prints as its message, not as the quoted repr a ``KeyError`` prints."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


def _file_state(path):
    """Size and modification time of the file at ``path``: what shows it replaced or
    rewritten since (not the inode: a worker on another host may see another inode
    number for the same file, e.g. through a FUSE mount)."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _of(path, description):
    """`` (of <description>)`` when the user named the data otherwise than ``path``."""
    return "" if description == path else f" (of {description})"


#: Bytes of the stored rows read at a time when a block is cast (float64 data read for
#: float32 compute): the cast copy is filled chunk by chunk.
CAST_CHUNK_BYTES = 8 * 2**20
#: Bytes of one ``os.pread`` call in :func:`read_exactly`: it returns a new bytes
#: object, copied into the block, so a bounded size bounds the extra memory.
_PREAD_BYTES = 2**24

#: Serialises :func:`read_exactly`'s seek and read where neither ``os.preadv`` nor
#: ``os.pread`` exists (Windows): the threads of a pass share a source's file
#: object, whose position one thread's seek would move under another's read. One
#: lock for all files: the reads of one file serialise anyway, and a fit reads one
#: data file (and at most one file of weights).
_SEEK_LOCK = threading.Lock()


def _read_at(fh, view, offset):
    """Read bytes of the raw file ``fh`` from ``offset`` into the start of ``view``.

    ``os.preadv`` (Linux, the BSDs; macOS where Python provides it) reads into
    ``view`` and keeps no file position, so threads share the file; ``os.pread``
    (Unix) likewise, through a copy of at most ``_PREAD_BYTES``; elsewhere (Windows)
    a seek and ``readinto`` under ``_SEEK_LOCK``. The functions are looked up at
    every call, so that tests can take them away.

    Parameters
    ----------
    fh : io.FileIO
        Open for reading, unbuffered.
    view : memoryview
        Of bytes; its start is overwritten.
    offset : int
        Bytes from the start of the file.

    Returns
    -------
    int
        The bytes read: 0 at the end of the file, else at least 1.
    """
    preadv = getattr(os, "preadv", None)
    if preadv is not None:
        return preadv(fh.fileno(), [view], offset)
    pread = getattr(os, "pread", None)
    if pread is not None:
        data = pread(fh.fileno(), min(len(view), _PREAD_BYTES), offset)
        view[:len(data)] = data
        return len(data)
    with _SEEK_LOCK:
        fh.seek(offset)
        return fh.readinto(view)


def read_exactly(fh, out, offset, path, description):
    """Fill ``out`` with the bytes of the raw file ``fh`` from ``offset``.

    Threads can share ``fh`` (:func:`_read_at` says how, on each platform).

    Parameters
    ----------
    fh : io.FileIO
        Open for reading, unbuffered (``open(path, "rb", buffering=0)``).
    out : ndarray
        C-contiguous; overwritten.
    offset : int
        Bytes from the start of the file.
    path, description : str
        The file and the user's name for it, for the message.

    Raises
    ------
    OSError
        If the file ends first (truncated while it was read; names ``path``).
    """
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        got = _read_at(fh, view[done:], offset + done)
        if got == 0:
            size = os.fstat(fh.fileno()).st_size
            raise OSError(
                f"The file {path}{_of(path, description)} was truncated while "
                f"emgmm was reading it: it holds {size} bytes, fewer than the "
                f"{offset + len(view)} this read needs. Keep the file unchanged "
                "while emgmm reads it (fit, predict, score)."
            )
        done += got


def _check_descriptor_unchanged(fd, state, path, description):
    """Raise ``OSError`` if the file open at ``fd`` no longer has the size and
    modification time of ``state`` (cheap: ``os.fstat``)."""
    st = os.fstat(fd)
    if (st.st_size, st.st_mtime_ns) != tuple(state):
        what = "truncated" if st.st_size < state[0] else "modified"
        raise OSError(
            f"The data file {path}{_of(path, description)} was {what} while emgmm "
            f"was reading it (it held {state[0]} bytes when it was opened, "
            f"{st.st_size} now): the rest would be read from other data. Keep the "
            "file unchanged while emgmm reads it (fit, predict, score)."
        )


def _check_file_unchanged(path, state, description):
    """Raise if the file at ``path`` is gone, or is no longer the file of ``state``.

    File-backed sources are reopened by name (in every worker process, and after
    :meth:`Source.close`); this makes a file deleted, moved or replaced during the
    fit an error that says so, not a bare "No such file" or a read of other data.

    Parameters
    ----------
    path : str
        The absolute path the source reopens.
    state : tuple
        :func:`_file_state` when the source was made.
    description : str
        How messages name the data set (the path or spec the user gave).

    Raises
    ------
    FileNotFoundError
        If ``path`` no longer exists.
    OSError
        If its size or modification time changed.
    """
    of = _of(path, description)
    try:
        now = _file_state(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"The data file {path}{of} was deleted or moved while emgmm was reading "
            "it: it cannot be read again by its name. Keep the file in place while "
            "emgmm reads it (fit, predict, score)."
        ) from None
    if now != state:
        what = "truncated" if now[0] < state[0] else "replaced or modified"
        raise OSError(
            f"The data file {path}{of} was {what} while emgmm was "
            "reading it (its size or modification time changed since it was opened): "
            "the rest would be read from other data. Keep the file unchanged while "
            "emgmm reads it (fit, predict, score)."
        )


class Source(abc.ABC):
    """A 2-D data set read in row blocks.

    Attributes
    ----------
    shape : tuple of int
        ``(n_samples, n_features)``.
    dtype : numpy.dtype
        The stored dtype.
    description : str
        How messages name the data set.
    chunk_rows : int or None
        Rows per storage chunk (HDF5), for aligned block reads.
    known_finite : bool
        Whether the whole data set was checked for NaN and infinity already (then
        :meth:`read` does not check each block).
    """

    shape: tuple[int, int]
    dtype: np.dtype
    description: str
    chunk_rows: int | None = None
    known_finite: bool = False
    #: Whether worker processes can read the source by reference (reopening files).
    shareable: bool = True

    def copy_for_workers(self, parent: str) -> tuple[str | None, Source]:
        """What worker processes read in place of this source: the source itself
        (they reopen its file by name); sources of data in memory override it.

        Parameters
        ----------
        parent : str
            The folder under which a copy would be written (joblib's temporary
            folder).

        Returns
        -------
        folder : str or None
            A folder to remove when the fit ends (``None``: nothing was written).
        source : Source
        """
        return None, self

    @property
    def n_samples(self) -> int:
        return self.shape[0]

    @property
    def n_features(self) -> int:
        return self.shape[1]

    @property
    def compute_dtype(self) -> type[np.floating[Any]]:
        """float32 for float32 data, float64 for everything else."""
        return np.float32 if self.dtype == np.float32 else np.float64

    @abc.abstractmethod
    def _read(self, start: int, stop: int) -> np.ndarray:
        """The stored rows ``start:stop`` as an array of their own (unchecked)."""

    def read(self, start: int, stop: int, dtype: DTypeLike | None = None) -> np.ndarray:
        """Rows ``start:stop`` as a float array, checked for NaN and infinity.

        Parameters
        ----------
        start, stop : int
        dtype : numpy dtype or None, default=None
            float32 or float64 to cast to (``None``: :attr:`compute_dtype`).

        Returns
        -------
        block : ndarray of shape (stop - start, n_features)
            Of ``dtype``; integer and boolean data are cast. Never a writable view of
            the user's data.

        Raises
        ------
        ValueError
            If the block holds NaN or infinity, also one that the cast made (a value
            beyond float32's range); names the row and column. A source that is
            :attr:`known_finite` is checked only after a cast.
        """
        dtype = self.compute_dtype if dtype is None else dtype
        cast = np.dtype(self.dtype) != np.dtype(dtype)
        if cast:
            block = self._read_cast(start, stop, dtype)
        else:
            block = np.asarray(self._read(start, stop))
            if block.dtype != dtype:  # (a source whose reads are of another dtype)
                cast = True
                with np.errstate(over="ignore"):
                    block = block.astype(dtype)
        if cast or not self.known_finite:
            check_block_finite(block, start, self.description)
        return block

    def _read_cast(self, start: int, stop: int, dtype: Any) -> np.ndarray:
        """Rows ``start:stop`` cast to ``dtype``, read by row chunks of about
        ``CAST_CHUNK_BYTES`` into the result (the stored block and its cast copy are
        never both held: a float64 block read for float32 compute)."""
        itemsize = max(np.dtype(self.dtype).itemsize, 1)
        step = max(1, CAST_CHUNK_BYTES // (itemsize * max(self.n_features, 1)))
        out = np.empty((stop - start, self.n_features), dtype=dtype)
        with np.errstate(over="ignore"):  # found by the caller, by row and column
            for r0 in range(start, stop, step):
                r1 = min(r0 + step, stop)
                out[r0 - start:r1 - start] = np.asarray(self._read(r0, r1))
        return out

    def take(self, indices: np.ndarray, block_size: int) -> np.ndarray:
        """Rows at sorted ``indices``, read block by block in increasing order.

        Parameters
        ----------
        indices : ndarray of int, sorted increasing
        block_size : int

        Returns
        -------
        rows : ndarray of shape (len(indices), n_features)
        """
        out = np.empty((len(indices), self.n_features), dtype=self.compute_dtype)
        pos = 0
        for start in range(0, self.n_samples, block_size):
            stop = min(start + block_size, self.n_samples)
            hi = int(np.searchsorted(indices, stop))
            if hi > pos:
                block = self.read(start, stop)
                out[pos:hi] = block[indices[pos:hi] - start]
                pos = hi
            if pos == len(indices):
                break
        return out

    def take_rows(self, rows: Sequence[int] | np.ndarray,
                  dtype: DTypeLike | None = None) -> np.ndarray:
        """The rows at sorted, distinct ``rows`` (a gather), checked for NaN and
        infinity as :meth:`read` checks a block (the message names the row).

        One read per run of consecutive rows (:meth:`_read_rows`).

        Parameters
        ----------
        rows : ndarray of int, sorted increasing, distinct
        dtype : numpy dtype or None, default=None
            As in :meth:`read`.

        Returns
        -------
        ndarray of shape (len(rows), n_features)
        """
        dtype = self.compute_dtype if dtype is None else dtype
        rows = np.asarray(rows, dtype=np.int64)
        block = np.asarray(self._read_rows(rows))
        cast = block.dtype != dtype
        if cast:
            with np.errstate(over="ignore"):
                block = block.astype(dtype)
        if (cast or not self.known_finite) and block.size:
            try:
                check_block_finite(block, 0, self.description)
            except ValueError:
                bad = int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
                check_block_finite(block[bad:bad + 1], int(rows[bad]),
                                   self.description)
        return block

    def _read_rows(self, rows):
        """The stored rows at sorted ``rows``: :meth:`_read` of each run of
        consecutive rows."""
        out = np.empty((rows.size, self.n_features), dtype=self.dtype)
        for a, b in _runs(rows):
            out[a:b] = self._read(int(rows[a]), int(rows[b - 1]) + 1)
        return out

    def blocks(self, block_size: int, dtype: DTypeLike | None = None
               ) -> Iterator[tuple[int, int, np.ndarray]]:
        """Yield ``(start, stop, block)`` over all rows.

        Parameters
        ----------
        block_size : int
            Rows per block (the last may be shorter).
        dtype : numpy dtype or None, default=None
            As in :meth:`read`.
        """
        for start in range(0, self.n_samples, block_size):
            stop = min(start + block_size, self.n_samples)
            yield start, stop, self.read(start, stop, dtype)

    def check_unchanged(self) -> None:
        """Raise if the file behind the source was deleted, replaced, truncated or
        modified since the source was made (a no-op for in-memory data).

        For telling a worker's death apart from a file cut under it: a worker
        that faulted on a file which shrank is no memory problem.

        Raises
        ------
        FileNotFoundError, OSError
            Naming the file and what changed.
        """
        state = getattr(self, "_state", None)
        if state is not None:
            # (only file-backed sources, which define filename, have a state)
            _check_file_unchanged(self.filename,  # type: ignore[attr-defined]
                                  state, self.description)

    def close(self) -> None:  # noqa: B027 (a no-op without file handles)
        """Release open file handles (reopened on the next read)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _runs(rows):
    """``(a, b)`` index ranges of ``rows`` (sorted) whose values are consecutive."""
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    edges = np.concatenate([[0], breaks, [rows.size]]) if rows.size else [0]
    return list(zip(edges[:-1], edges[1:], strict=False))


class ArraySource(Source):
    """An in-memory array (already validated by scikit-learn), checked for NaN and
    infinity once here rather than block by block on every pass.

    Raises
    ------
    ValueError
        If ``array`` holds NaN or infinity (names the row and column).
    """

    known_finite = True

    def __init__(self, array, description="X"):
        check_block_finite(array, 0, description)
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.description = description

    def _read(self, start, stop):
        block = self.array[start:stop]
        mapped = _backing_memmap(self.array)
        if mapped is not None:
            # the pages of a file map fault (SIGBUS) once the file is cut: the
            # block is copied out of the map after the file is checked to hold it
            _check_map_intact(mapped, self.description)
            return np.array(block)
        block = block.view()
        block.flags.writeable = False
        return block

    def _read_rows(self, rows):
        mapped = _backing_memmap(self.array)
        if mapped is not None:
            _check_map_intact(mapped, self.description)
        return np.take(self.array, rows, axis=0)

    def copy_for_workers(self, parent):
        """The array written once to a ``.npy`` file under ``parent``
        (:func:`~emgmm._runtime.executor.dump_array`) and mapped by the workers: a
        :class:`MemmapSource` named ``description`` in messages (the user's name
        for the data, not the temporary file) and :attr:`known_finite` like this
        checked array (its blocks are not checked again on every pass).

        Raises
        ------
        OSError
            If ``parent`` lacks the space (names the folder and how to change it).
        """
        folder, path = dump_array(self.array, parent)
        source = MemmapSource.from_npy(path)
        source.description = self.description
        source.known_finite = True
        return folder, source


def _backing_memmap(array):
    """The ``np.memmap`` whose mapped file holds ``array``'s data (through its chain
    of bases), or ``None`` for data in memory."""
    base = array
    while base is not None:
        if isinstance(base, np.memmap) and base.filename is not None:
            return base
        base = getattr(base, "base", None)
    return None


def _check_map_intact(mm, description):
    """Raise ``OSError`` if the file of memmap ``mm`` is now shorter than the bytes
    it maps (reading them would fault with SIGBUS)."""
    needed = mm.offset + mm.nbytes
    try:
        size = os.stat(mm.filename).st_size
    except FileNotFoundError:
        return  # deleted: its pages stay readable until the map is closed
    if size < needed:
        raise OSError(
            f"The data file {mm.filename} (of {description}, a memory map) was "
            f"truncated while emgmm was reading it: it holds {size} bytes, fewer "
            f"than the {needed} it maps. Keep the file unchanged while emgmm reads "
            "it (fit, predict, score)."
        )


class MemmapSource(Source):
    """A raw memory-mapped file (``np.memmap`` or ``.npy``), reopened read-only.

    Blocks are read (:func:`read_exactly`) into arrays of their own, not as views of a
    memory map: a map's pages fault with SIGBUS (the process dies, no message) when
    the file is truncated under them, while a read of a shorter file returns fewer
    bytes, reported here as an ``OSError`` that names the file.

    Raises
    ------
    FileNotFoundError
        If ``filename`` does not exist (any more).
    """

    def __init__(self, filename, dtype, shape, offset, order, description):
        self.filename = os.fspath(filename)
        self._state = _file_state(self.filename)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.offset = offset
        self.order = order
        self.description = description
        self._file = None

    @classmethod
    def from_memmap(cls, mm):
        order = "F" if (mm.flags.f_contiguous and not mm.flags.c_contiguous) else "C"
        if not (mm.flags.c_contiguous or mm.flags.f_contiguous) or mm.filename is None:
            return None
        if mm.mode == "c":
            return None  # copy-on-write: its changes are in this process only
        base = mm
        while isinstance(base.base, np.memmap):
            base = base.base
        if not isinstance(base.base, mmap.mmap):
            # the chain of memmaps ends at a plain array, not at the file's map: a
            # view through another array, treated as an in-memory array
            return None
        # a contiguous view (a reshape, a range of rows) reads its own bytes of the
        # file: its offset there is the map's plus its distance from the map's start
        # (a view's .offset is its map's)
        offset = mm.offset + (mm.ctypes.data - base.ctypes.data)
        if not (base.offset <= offset
                and offset + mm.nbytes <= base.offset + base.nbytes):
            return None  # not within the mapped bytes: treat as an in-memory array
        description = (f"memmap {mm.filename}" if base is mm
                       else f"X (a view of memmap {mm.filename})")
        _check_mapped_file(mm, description)
        try:
            source = cls(mm.filename, mm.dtype, mm.shape, offset, order, description)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"The file {mm.filename} of this memmap was deleted or moved after "
                "the memmap was opened: emgmm reads a memmap again by its file name. "
                "Pass np.asarray(X) to fit it as an array, or keep the file in place."
            ) from None
        size, needed = source._state[0], offset + mm.nbytes
        if size < needed:
            raise ValueError(
                f"The file {mm.filename} of this memmap holds {size} bytes, fewer than "
                f"the {needed} the memmap maps: it was truncated or replaced after the "
                "memmap was opened."
            )
        return source

    @classmethod
    def from_npy(cls, path):
        path = os.fspath(path)
        try:
            mm = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"No such .npy file: {path}") from None
        except ValueError as exc:
            raise npy_error(path, exc) from None
        if not isinstance(mm, np.memmap):
            raise ValueError(f"{path} is not a plain .npy array file.")
        _check_numeric_dtype(mm.dtype, path)
        _check_shape(mm.shape, path)
        expected = mm.offset + mm.dtype.itemsize * int(np.prod(mm.shape))
        if os.path.getsize(path) < expected:
            raise ValueError(f"{path} is truncated: expected {expected} bytes.")
        order = "F" if (mm.flags.f_contiguous and not mm.flags.c_contiguous) else "C"
        # absolute: workers (and later reads) may run in another working directory
        return cls(os.path.abspath(path), mm.dtype, mm.shape, mm.offset, order, path)

    def _open(self):
        with OPEN_LOCK:  # threads of one process share the source
            if self._file is None:  # (a file object: closed when collected)
                self._file = open(self.filename, "rb", buffering=0)
            return self._file

    def _read(self, start, stop):
        # every read, not only before opening: a file replaced under its name, or
        # rewritten in place (the same inode), would give other data
        _check_file_unchanged(self.filename, self._state, self.description)
        fh = self._open()
        n_rows, n_cols = stop - start, self.shape[1]
        itemsize = self.dtype.itemsize
        if self.order == "C":
            block = np.empty((n_rows, n_cols), dtype=self.dtype)
            read_exactly(fh, block, self.offset + start * n_cols * itemsize,
                         self.filename, self.description)
        else:  # one read per column (contiguous in the file)
            columns = np.empty((n_cols, n_rows), dtype=self.dtype)
            for j in range(n_cols):
                where = self.offset + (j * self.shape[0] + start) * itemsize
                read_exactly(fh, columns[j], where, self.filename,
                             self.description)
            block = np.ascontiguousarray(columns.T)
        # and after it: the bytes read may mix the old and the new contents
        _check_descriptor_unchanged(fh.fileno(), self._state, self.filename,
                                    self.description)
        return block

    def _read_rows(self, rows):
        if self.order != "C":
            return super()._read_rows(rows)
        _check_file_unchanged(self.filename, self._state, self.description)
        fh = self._open()
        n_cols, itemsize = self.shape[1], self.dtype.itemsize
        out = np.empty((rows.size, n_cols), dtype=self.dtype)
        for a, b in _runs(rows):
            read_exactly(fh, out[a:b], self.offset + int(rows[a]) * n_cols * itemsize,
                         self.filename, self.description)
        _check_descriptor_unchanged(fh.fileno(), self._state, self.filename,
                                    self.description)
        return out

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"] = None
        return state


def hdf5_error(filename, exc):
    """The ``OSError`` to raise for h5py's failure ``exc`` to open ``filename``,
    classified by what can be checked, not by the words of HDF5's message: a
    permission error, a file without the HDF5 signature, a file that opens with
    file locking off (then a lock is the cause), or else a damaged file."""
    text = str(exc)
    if isinstance(exc, PermissionError):
        return OSError(exc.errno, f"Cannot open HDF5 file {filename} read-only: "
                                  f"permission denied ({text})")
    if not _is_hdf5(filename):
        return OSError(f"Cannot open {filename}: it is not an HDF5 file (no HDF5 "
                       f"signature; h5py: {text})")
    if opens_without_locking(filename):
        return OSError(
            f"Cannot open HDF5 file {filename} read-only because it is locked "
            f"({text}). Another process may have it open for writing; if the file "
            "system does not support locking, set HDF5_USE_FILE_LOCKING=FALSE in the "
            "environment of this process and its workers."
        )
    size = os.path.getsize(filename)
    return OSError(
        f"Cannot open HDF5 file {filename} ({size} bytes): it has the HDF5 signature "
        "but HDF5 cannot read it, also with file locking off, so it is damaged or "
        f"truncated (h5py: {text})"
    )


def opens_without_locking(filename):
    """Whether h5py opens ``filename`` read-only with HDF5 file locking off (only to
    tell a lock from damage: the handle is closed at once)."""
    import h5py

    try:
        h5py.File(filename, "r", locking=False).close()
    except (OSError, TypeError, ValueError):  # (TypeError: h5py before 3.5)
        return False
    return True


class HDF5Source(Source):
    """A 2-D dataset in an HDF5 file, opened read-only and lazily in each process."""

    def __init__(self, filename, dataset):
        import h5py

        self.description = f"{os.fspath(filename)}:{dataset}"
        # absolute: workers (and later reads) may run in another working directory
        self.filename = os.path.abspath(filename)
        self.dataset = dataset
        self._file = None
        if not os.path.exists(self.filename):
            raise FileNotFoundError(f"No such HDF5 file: {os.fspath(filename)}")
        if is_npy(self.filename):
            raise ValueError(
                f"{os.fspath(filename)} is a .npy file, not HDF5 (whatever its "
                f"suffix): pass '{os.fspath(filename)}' without a dataset path."
            )
        self._state = _file_state(self.filename)
        ds = self._dataset()
        if not isinstance(ds, h5py.Dataset):
            self.close()
            raise ValueError(f"{self.description} is not an HDF5 dataset.")
        _check_numeric_dtype(ds.dtype, self.description)
        _check_shape(ds.shape, self.description)
        self.shape = tuple(ds.shape)
        self.dtype = ds.dtype
        if ds.chunks is not None:
            self.chunk_rows = int(ds.chunks[0])

    def _dataset(self):
        import h5py

        with OPEN_LOCK:  # threads of one process share the source
            if self._file is None:
                self._open_file(h5py)
        try:
            return self._file[self.dataset]
        except KeyError:
            self.close()
            raise MissingDatasetError(
                f"HDF5 file {self.filename} has no dataset {self.dataset!r}."
            ) from None

    def _open_file(self, h5py):
        try:
            self._file = h5py.File(self.filename, "r")
        except OSError as exc:
            # a file deleted, cut or rewritten since the source was made: say so, as
            # a read through the handle this process already holds does (a worker
            # process opens the file by name when the pass starts: one fault, one
            # message); but when a writer holds the lock, which has also changed
            # the modification time, the lock is what to report
            if (not os.path.exists(self.filename)
                    or not opens_without_locking(self.filename)):
                _check_file_unchanged(self.filename, self._state, self.description)
            raise hdf5_error(self.filename, exc) from None
        try:
            _check_file_unchanged(self.filename, self._state, self.description)
        except OSError:
            self.close()
            raise

    def _read(self, start, stop):
        dataset = self._dataset()  # (its errors on opening are its own)
        try:
            block = dataset[start:stop]
        except OSError as exc:
            # a file cut or rewritten under the open handle: say so (by its size
            # and modification time), not HDF5's "can't read data"
            _check_file_unchanged(self.filename, self._state, self.description)
            raise OSError(f"Cannot read rows {start}:{stop} of {self.description}: "
                          f"{exc}") from None
        # every read, not only on opening: a file rewritten during the fit (by a
        # writer that does not lock it) changes what an open handle reads
        _check_file_unchanged(self.filename, self._state, self.description)
        return block

    def _read_rows(self, rows):
        dataset = self._dataset()
        try:
            block = _hdf5_rows(dataset, rows)
        except OSError as exc:
            _check_file_unchanged(self.filename, self._state, self.description)
            raise OSError(f"Cannot read {rows.size} rows of {self.description}: "
                          f"{exc}") from None
        _check_file_unchanged(self.filename, self._state, self.description)
        return block

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"] = None
        return state


class OpenDatasetSource(Source):
    """An ``h5py.Dataset`` whose file is open for writing, lives in memory or in a
    Python file object, spans several files (drivers 'family', 'split'), or was
    opened with driver 'stdio' (no descriptor to find its path by).

    Read through the user's own handle, in this process only: another process that
    reopened the file by name could see stale contents (unflushed writes) or no file
    at all, or another file of the same relative name (drivers other than 'sec2').
    The handle is never closed or written.
    """

    shareable = False

    def __init__(self, dataset):
        _check_numeric_dtype(dataset.dtype, dataset.name)
        _check_shape(dataset.shape, dataset.name)
        self._handle = dataset
        self.shape = tuple(dataset.shape)
        self.dtype = dataset.dtype
        self.description = f"{dataset.file.filename}:{dataset.name}"
        if dataset.chunks is not None:
            self.chunk_rows = int(dataset.chunks[0])

    def _read(self, start, stop):
        return self._handle[start:stop]

    def _read_rows(self, rows):
        return _hdf5_rows(self._handle, rows)

    def __getstate__(self):
        raise TypeError(
            f"{self.description} is open for writing or held in memory; worker "
            "processes cannot read it. Use n_jobs=1, or close the file and pass "
            "'file.h5:/dataset'."
        )


#: Rows of one selection of :func:`_hdf5_rows`.
_HDF5_GATHER_ROWS = 4096


def _hdf5_rows(dataset, rows):
    """``dataset[rows]`` for sorted distinct ``rows``: one selection of many rows per
    call (h5py's fancy indexing), ``_HDF5_GATHER_ROWS`` at a time."""
    out = np.empty((rows.size,) + tuple(dataset.shape[1:]), dtype=dataset.dtype)
    for a in range(0, rows.size, _HDF5_GATHER_ROWS):
        b = min(a + _HDF5_GATHER_ROWS, rows.size)
        out[a:b] = dataset[rows[a:b]]
    return out


def split_hdf5_spec(spec):
    """Split ``"file.h5:/group/dataset"`` into its file name and dataset path.

    Returns ``None`` when ``spec`` does not name an existing or HDF5-suffixed file
    followed by a dataset path. A dataset path without its leading ``/``
    (``"file.h5:group/dataset"``) is taken from the root, as h5py does, after a file
    that is HDF5 by its suffix or by its content.
    """
    text = os.fspath(spec)
    idx = text.rfind(HDF5_SEPARATOR + "/")
    if idx > 0:
        filename, dataset = text[:idx], text[idx + 1:]
        if os.path.isfile(filename) or filename.lower().endswith(_HDF5_SUFFIXES):
            return filename, dataset
    idx = text.rfind(HDF5_SEPARATOR)
    if idx > 0 and idx + 1 < len(text) and (
            text[:idx].lower().endswith(_HDF5_SUFFIXES) or _is_hdf5(text[:idx])):
        return text[:idx], "/" + text[idx + 1:]
    return None


def as_source(X: DataLike) -> Source:
    """Wrap any supported input in a :class:`Source`.

    Parameters
    ----------
    X : ndarray, np.memmap, h5py.Dataset, str or os.PathLike
        A path is a ``.npy`` file (memory-mapped read-only) or
        ``"file.h5:/path/to/dataset"``; files are told apart by their content (the
        .npy magic string, the HDF5 signature), not by their suffix. Other
        array-likes are not handled here: the estimator validates them with
        scikit-learn first and passes the result.

    Returns
    -------
    Source
        The data set, read in row blocks by ``read(start, stop)`` or ``blocks``,
        with its ``shape`` and ``dtype``; files are opened read-only.

    Raises
    ------
    FileNotFoundError
        A path that does not exist.
    KeyError
        An HDF5 file without the named dataset.
    ValueError
        A data set that is not 2-D or not numeric, or a truncated .npy file.
    OSError
        An HDF5 file that cannot be opened (e.g. locked by a writer).
    """
    if isinstance(X, Source):
        return X
    if isinstance(X, (str, os.PathLike)):
        return _path_source(X)
    if is_hdf5_dataset(X):
        if X.file.mode != "r" or X.file.driver not in _REOPENABLE_DRIVERS:
            return OpenDatasetSource(X)
        # the user's handle is not used: reopened read-only by name in each process
        return HDF5Source(_open_file_path(X.file), X.name)
    if isinstance(X, np.memmap):
        src = MemmapSource.from_memmap(X)
        if src is not None:
            _check_numeric_dtype(src.dtype, src.description)
            _check_shape(src.shape, src.description)
            return src
    raise TypeError(f"as_source cannot wrap {type(X).__name__}")


def _path_source(X):
    """The :class:`Source` of the path ``X``: a .npy file or an HDF5 dataset
    (``"file.h5:/dataset"``); raise as :func:`as_source` says for any other."""
    text = os.fspath(X)
    if is_npy(text):  # by its content, whatever its suffix ('.h5' too)
        return MemmapSource.from_npy(text)
    spec = split_hdf5_spec(X)
    if spec is not None:
        return HDF5Source(*spec)
    hdf5_file = text[:-1] if text.endswith(HDF5_SEPARATOR) else text
    # by its content ('.npy' too); a file that does not exist, by its suffix
    if _is_hdf5(hdf5_file) or (not os.path.exists(hdf5_file) and Path(
            hdf5_file).suffix.lower() in _HDF5_SUFFIXES):
        raise ValueError(f"{hdf5_file} is an HDF5 file: name the dataset too, as "
                         f"'{hdf5_file}:/dataset'.")
    if not text:
        raise ValueError("X is an empty path: name a .npy file or "
                         "'file.h5:/dataset'.")
    _raise_not_data_file(Path(X))


def _raise_not_data_file(path):
    """Raise the error for a ``path`` that is neither a .npy file nor an HDF5
    file: missing, a directory, not a regular file, or of another format."""
    if not path.exists():
        raise FileNotFoundError(f"No such file: {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory: name a .npy file in it, or "
                         "'file.h5:/dataset'.")
    if not path.is_file():
        raise ValueError(f"{path} is not a regular file (a pipe, socket or "
                         "device): EM reads the data once per iteration; save it "
                         "to a .npy file first (numpy.save).")
    raise ValueError(
        f"{path} is not a .npy file: emgmm reads .npy files, HDF5 datasets "
        "('file.h5:/dataset') and arrays; load other formats first (e.g. "
        "np.loadtxt for text, then np.save for data larger than memory)."
    )


#: h5py drivers whose files another process can reopen by name: 'sec2', whose
#: descriptor gives the file's path whatever the working directory; the others
#: ('stdio', 'core', 'fileobj', 'family', ...) are read through the handle.
_REOPENABLE_DRIVERS = ("sec2",)


#: This process's folder of /proc (Linux): its memory maps and the links of its
#: descriptors. Elsewhere it does not exist, and the checks that read it are weaker
#: (:func:`_mapped_file`, :func:`_descriptor_path`); tests point it elsewhere.
PROC_SELF = "/proc/self"

#: What Linux appends to the target of a /proc/self/fd link whose file was deleted.
_DELETED = " (deleted)"


def _mapped_file(address):
    """``os.stat`` of the file mapped at ``address`` in this process (through
    ``PROC_SELF/maps`` and ``map_files``, Linux), or ``None`` where that cannot be
    read (other systems: no portable call names the file behind a memory map)."""
    try:
        with open(f"{PROC_SELF}/maps") as fh:
            for line in fh:
                span = line.split(" ", 1)[0]
                start, end = (int(a, 16) for a in span.split("-"))
                if start <= address < end:
                    return os.stat(f"{PROC_SELF}/map_files/{span}")
    except (OSError, ValueError):
        pass
    return None


def _check_mapped_file(mm, description):
    """Raise if the path of memmap ``mm`` now leads to another file than the one it
    maps (replaced after the memmap was opened: emgmm would read the new file).
    Where the mapped file cannot be known (:func:`_mapped_file`), a replacement
    goes unseen: the checks of size (here and in every read) remain."""
    if mm.nbytes == 0:
        return
    mapped = _mapped_file(mm.ctypes.data)
    try:
        now = os.stat(mm.filename)
    except FileNotFoundError:
        return  # said by the caller
    if mapped is not None and ((mapped.st_dev, mapped.st_ino)
                               != (now.st_dev, now.st_ino)):
        raise OSError(
            f"The file {mm.filename} of {description} was replaced after the memmap "
            "was opened: emgmm reads a memmap again by its file name, which now leads "
            "to other data. Pass np.asarray(X) to fit the memmap's values as an "
            "array, or open the memmap again."
        )


def _descriptor_path(fd):
    """The path of the file open at descriptor ``fd``, from its ``PROC_SELF/fd``
    link (Linux; ends with ``_DELETED`` when the file was deleted), or ``None``
    where there is no such link."""
    try:
        return os.readlink(f"{PROC_SELF}/fd/{fd}")
    except OSError:
        return None


def _open_file_path(h5file):
    """The absolute path of the file behind an open ``h5py.File``: for driver
    'sec2', that of its descriptor (:func:`_descriptor_path`), which holds even
    when the working directory changed since it was opened by a relative name; else,
    and where the descriptor names no path (macOS, Windows), its name made absolute.
    Either path must lead to the descriptor's file (same device and inode).

    Raises
    ------
    FileNotFoundError
        If the descriptor's file was deleted or replaced since it was opened (no
        path leads to it any more), naming the path it was opened by; without
        descriptor links, also when it was opened by a relative name before the
        working directory changed (the message says so).
    """
    absolute = os.path.abspath(h5file.filename)
    if h5file.driver != "sec2":
        return absolute
    try:
        fd = int(h5file.id.get_vfd_handle())
        opened = os.fstat(fd)
    except (OSError, RuntimeError, TypeError, ValueError):
        return absolute
    linked = _descriptor_path(fd)
    path = absolute if linked is None else linked
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            return path
    except FileNotFoundError:
        pass
    name = path[:-len(_DELETED)] if path.endswith(_DELETED) else path
    what = "replaced by another file" if os.path.exists(name) else "deleted"
    if linked is None and not os.path.isabs(h5file.filename):
        what += (f" (or, opened by the relative name {h5file.filename}, the working "
                 "directory changed since)")
    raise FileNotFoundError(
        f"HDF5 file {name} was {what} while it was open: emgmm reads the "
        "file again by its name (in every worker process), which no longer "
        "leads to the data of this dataset. Pass np.asarray(dataset) to fit "
        "it in memory, or keep the file in place while fitting."
    )


def is_npy(path):
    """Whether ``path`` is a file that starts with the .npy format's magic string
    (any suffix)."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(6) == b"\x93NUMPY"


def _is_hdf5(path):
    """Whether ``path`` is a file with the HDF5 signature (at its start or after a
    user block; ``h5py.is_hdf5``), whatever its suffix."""
    if not os.path.isfile(path):
        return False
    import h5py

    return bool(h5py.is_hdf5(path))


def is_hdf5_dataset(X: object) -> TypeGuard[h5py.Dataset]:
    """True for an ``h5py.Dataset`` (without importing h5py when it isn't one)."""
    return type(X).__module__.startswith("h5py") and hasattr(X, "file")


def is_file_backed(X):
    """True when ``X`` is read through a file-backed :class:`Source`, or is a
    :class:`Source` already (read as it is, e.g. a subclass of one's own)."""
    if isinstance(X, (Source, str, os.PathLike)) or is_hdf5_dataset(X):
        return True
    return isinstance(X, np.memmap) and MemmapSource.from_memmap(X) is not None
