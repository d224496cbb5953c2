"""Sample weights read in the row blocks of ``X``: arrays, memory maps, .npy, HDF5.

A weight source knows its length and reads ranges of rows as float64, each range
checked: finite and non-negative, else a ``ValueError`` naming the row (and the file).
File-backed weights hold only a description of their file and open it lazily,
read-only, in the process that reads, so that worker processes receive them by
reference and read only their own blocks, as the data sources (:mod:`.sources`).
An in-memory array is written once to a ``.npy`` file for process workers
(:func:`dump_weights`).
"""

import abc
import hashlib
import mmap
import os
from dataclasses import dataclass
from numbers import Real
from pathlib import Path

import numpy as np

from .sources import (
    _REOPENABLE_DRIVERS,
    OPEN_LOCK,
    MissingDatasetError,
    _check_descriptor_unchanged,
    _check_file_unchanged,
    _file_state,
    _open_file_path,
    hdf5_error,
    is_hdf5_dataset,
    is_npy,
    npy_error,
    read_exactly,
    split_hdf5_spec,
)

#: Rows per block of :func:`check_weights`' pass (64 KiB of float64).
_CHECK_ROWS = 8192


def check_weight_block(block, start, description):
    """Raise ``ValueError`` naming the first row of ``block`` that is NaN, infinite
    or negative.

    Parameters
    ----------
    block : ndarray of shape (m,), float64
    start : int
        Row of ``block[0]`` in the data set.
    description : str
        How the message names the weights.
    """
    if np.isfinite(block.sum()) and (block.min(initial=0.0) >= 0.0):
        return
    bad = np.flatnonzero(~np.isfinite(block) | (block < 0.0))[0]
    value = block[bad]
    row = start + int(bad)
    if np.isnan(value):
        problem = "NaN"
    elif np.isinf(value):
        problem = f"infinity ({value})"
    else:
        problem = f"a negative value ({float(value)!r})"
    raise ValueError(f"{description} has {problem} at row {row}: weights must be "
                     "finite and >= 0 (a weight of 0 leaves the row out).")


def _check_dtype(dtype, description):
    if np.dtype(dtype).kind not in "fiub":
        raise ValueError(f"{description} has dtype {np.dtype(dtype)}; weights must be "
                         "real numbers.")


def _check_length(shape, n_samples, description):
    if len(shape) != 1:
        raise ValueError(f"{description} must be 1-D (one weight per row of X); got "
                         f"shape {tuple(shape)}.")
    if shape[0] != n_samples:
        raise ValueError(f"{description} has {shape[0]} values, but X has "
                         f"{n_samples} rows.")


class WeightSource(abc.ABC):
    """Weights of the rows of a data set, read by ranges of rows.

    Attributes
    ----------
    n_samples : int
    description : str
        How messages name the weights ("sample_weight" and the file).
    shareable : bool
        Whether worker processes can read them by reference.
    """

    shareable = True
    checked = False  # whether every value was checked already (then reads are not)
    #: The power of two every weight is multiplied by as it is read (exactly,
    #: :func:`numpy.ldexp`): :func:`unit_exponent`, which ``fit`` sets.
    exponent = 0

    @abc.abstractmethod
    def _read(self, start, stop):
        """The stored weights of rows ``start:stop`` (unchecked)."""

    def read(self, start, stop):
        """Weights of rows ``start:stop`` as float64, checked.

        Returns
        -------
        ndarray of shape (stop - start,), float64
            Never a writable view of the user's data.

        Raises
        ------
        ValueError
            A NaN, infinite or negative weight (names the row and file).
        """
        block = np.asarray(self._read(start, stop))
        if block.dtype != np.float64:
            block = block.astype(np.float64)
        elif block.flags.writeable:
            block = block.view()
            block.flags.writeable = False
        if not self.checked:
            check_weight_block(block, start, self.description)
        if self.exponent:
            block = np.ldexp(block, self.exponent)
        return block

    def take(self, indices, block_size):
        """Weights at sorted ``indices``, read block by block in increasing order
        (those of a subsample of rows, :meth:`.sources.Source.take`).

        Returns
        -------
        ndarray of shape (len(indices),), float64
        """
        out = np.empty(len(indices), dtype=np.float64)
        pos = 0
        for start in range(0, self.n_samples, block_size):
            stop = min(start + block_size, self.n_samples)
            hi = int(np.searchsorted(indices, stop))
            if hi > pos:
                out[pos:hi] = self.read(start, stop)[indices[pos:hi] - start]
                pos = hi
            if pos == len(indices):
                break
        return out

    def close(self):  # noqa: B027 (a no-op for sources without file handles)
        """Release open file handles (reopened on the next read)."""


class ArrayWeights(WeightSource):
    """Weights in memory, checked once here."""

    checked = True

    def __init__(self, array, description="sample_weight"):
        self.array = array
        self.n_samples = array.shape[0]
        self.description = description
        for start in range(0, self.n_samples, _CHECK_ROWS):
            block = np.asarray(array[start:start + _CHECK_ROWS], dtype=np.float64)
            check_weight_block(block, start, description)

    def _read(self, start, stop):
        return self.array[start:stop]


class MemmapWeights(WeightSource):
    """A 1-D raw memory map or ``.npy`` file of weights, reopened read-only.

    Each range is read (:func:`~.sources.read_exactly`, the file opened for the
    read), not taken from a memory map: a map's pages fault with SIGBUS when the
    file is truncated under them, a read reports it as an ``OSError`` that names
    the file.
    """

    def __init__(self, filename, dtype, n_samples, offset, description):
        self.filename = os.path.abspath(filename)
        self._state = _file_state(self.filename)
        self.dtype = np.dtype(dtype)
        self.n_samples = int(n_samples)
        self.offset = int(offset)
        self.description = description

    @classmethod
    def from_npy(cls, path, description):
        try:
            mm = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise npy_error(description, exc) from None
        if not isinstance(mm, np.memmap) or not mm.flags.c_contiguous:
            raise ValueError(f"{description} is not a plain 1-D .npy array file.")
        _check_dtype(mm.dtype, description)
        expected = mm.offset + mm.nbytes
        if os.path.getsize(path) < expected:
            raise ValueError(f"{description} is truncated: expected {expected} bytes.")
        return mm.shape, cls(path, mm.dtype, mm.shape[0] if mm.ndim else 0, mm.offset,
                             description)

    def _read(self, start, stop):
        _check_file_unchanged(self.filename, self._state, self.description)
        block = np.empty(stop - start, dtype=self.dtype)
        with open(self.filename, "rb", buffering=0) as fh:
            read_exactly(fh, block, self.offset + start * self.dtype.itemsize,
                         self.filename, self.description)
            # the bytes read may mix the old and the new contents
            _check_descriptor_unchanged(fh.fileno(), self._state, self.filename,
                                        self.description)
        return block


class HDF5Weights(WeightSource):
    """A 1-D HDF5 dataset of weights, opened read-only and lazily in each process."""

    def __init__(self, filename, dataset, description):
        import h5py

        self.filename = os.path.abspath(filename)
        self.dataset = dataset
        self.description = description
        self._file = None
        if not os.path.exists(self.filename):
            raise FileNotFoundError(f"No such HDF5 file: {os.fspath(filename)} "
                                    f"({description})")
        self._state = _file_state(self.filename)
        ds = self._dataset()
        if not isinstance(ds, h5py.Dataset):
            self.close()
            raise ValueError(f"{description} is not an HDF5 dataset.")
        self.shape = tuple(ds.shape)
        _check_dtype(ds.dtype, description)
        self.n_samples = self.shape[0] if self.shape else 0

    def _dataset(self):
        import h5py

        with OPEN_LOCK:  # threads of one process share the source
            if self._file is None:
                try:
                    self._file = h5py.File(self.filename, "r")
                except OSError as exc:
                    raise hdf5_error(self.filename, exc) from None
                _check_file_unchanged(self.filename, self._state, self.description)
        try:
            return self._file[self.dataset]
        except KeyError:
            self.close()
            raise MissingDatasetError(
                f"HDF5 file {self.filename} has no dataset {self.dataset!r} "
                f"({self.description}).") from None

    def _read(self, start, stop):
        block = self._dataset()[start:stop]
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


class OpenDatasetWeights(WeightSource):
    """An ``h5py.Dataset`` that other processes cannot reopen by name (see
    :class:`.sources.OpenDatasetSource`): read through the user's handle."""

    shareable = False

    def __init__(self, dataset, description):
        self._handle = dataset
        self.shape = tuple(dataset.shape)
        _check_dtype(dataset.dtype, description)
        self.n_samples = self.shape[0] if self.shape else 0
        self.description = description

    def _read(self, start, stop):
        return self._handle[start:stop]

    def __getstate__(self):
        raise TypeError(f"{self.description} is open for writing or held in memory; "
                        "worker processes cannot read it. Use n_jobs=1, or close the "
                        "file and pass 'file.h5:/dataset'.")


def _from_path(path):
    text = os.fspath(path)
    description = f"sample_weight {text}"
    if is_npy(text):
        return MemmapWeights.from_npy(text, description)
    spec = split_hdf5_spec(text)
    if spec is not None:
        source = HDF5Weights(*spec, description=f"sample_weight {spec[0]}:{spec[1]}")
        return source.shape, source
    if not Path(text).exists():
        raise FileNotFoundError(f"No such file: {text} (sample_weight)")
    if not Path(text).is_dir() and not Path(text).is_file():
        raise ValueError(f"{description}: not a regular file (a pipe, socket or "
                         "device): the weights are read once per iteration; save "
                         "them to a .npy file first (numpy.save).")
    raise ValueError(f"{description}: not a .npy file or 'file.h5:/dataset'; emgmm "
                     "reads weights from arrays, .npy files and HDF5 datasets.")


def _from_memmap(mm):
    """``(shape, source)`` reading a 1-D memmap by its file name, or ``None`` for one
    that is not a whole contiguous map of its file (a view, copy-on-write): then
    read as an in-memory array."""
    if (mm.ndim != 1 or not mm.flags.c_contiguous or mm.filename is None
            or mm.mode == "c" or not isinstance(mm.base, mmap.mmap)):
        return None
    source = MemmapWeights(mm.filename, mm.dtype, mm.shape[0], mm.offset,
                           f"sample_weight (memmap {mm.filename})")
    return mm.shape, source


def as_weight_source(sample_weight, n_samples):
    """Wrap ``sample_weight`` for the rows of a data set of ``n_samples`` rows.

    Parameters
    ----------
    sample_weight : None, float, array-like, np.memmap, h5py.Dataset, str or PathLike
        ``None``: unweighted. A number: the same weight for every row. A path is a
        ``.npy`` file or ``"file.h5:/path/to/dataset"`` (told apart by content).
    n_samples : int

    Returns
    -------
    WeightSource or None

    Raises
    ------
    ValueError
        Not 1-D, not of length ``n_samples``, not real numbers; for arrays (checked
        whole here), a NaN, infinite or negative weight naming the row.
    FileNotFoundError, KeyError, OSError
        A missing file or dataset, an HDF5 file that cannot be opened.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, (str, os.PathLike)):
        shape, source = _from_path(sample_weight)
    elif is_hdf5_dataset(sample_weight):
        ds = sample_weight
        description = f"sample_weight {ds.file.filename}:{ds.name}"
        if ds.file.mode == "r" and ds.file.driver in _REOPENABLE_DRIVERS:
            source = HDF5Weights(_open_file_path(ds.file), ds.name, description)
        else:
            source = OpenDatasetWeights(ds, description)
        shape = source.shape
    elif isinstance(sample_weight, np.memmap) and (
            mapped := _from_memmap(sample_weight)) is not None:
        _check_dtype(sample_weight.dtype, "sample_weight")
        shape, source = mapped
    elif isinstance(sample_weight, Real) and not isinstance(sample_weight, bool):
        value = np.full(1, float(sample_weight))
        check_weight_block(value, 0, "sample_weight")
        return ArrayWeights(np.broadcast_to(value, (n_samples,)))
    else:
        array = np.asarray(sample_weight)
        _check_dtype(array.dtype, "sample_weight")
        _check_length(array.shape, n_samples, "sample_weight")
        return ArrayWeights(array)
    try:
        _check_length(shape, n_samples, source.description)
    except ValueError:
        source.close()
        raise
    return source


@dataclass(frozen=True)
class WeightTotals:
    """What one pass over the weights finds."""

    total: float
    n_positive: int


def check_weights(weights, n_components=None):
    """Read every weight once: their sum and the rows of positive weight.

    Parameters
    ----------
    weights : WeightSource
    n_components : int or None
        When given, at least this many rows must have a positive weight (as
        ``n_samples >= n_components`` for unweighted data).

    Returns
    -------
    WeightTotals

    Raises
    ------
    ValueError
        A bad weight (names the row), every weight zero, or fewer rows of positive
        weight than ``n_components``.
    """
    total, positive = 0.0, 0
    for start in range(0, weights.n_samples, _CHECK_ROWS):
        block = weights.read(start, min(start + _CHECK_ROWS, weights.n_samples))
        total += float(block.sum())
        positive += int(np.count_nonzero(block))
    if positive == 0:
        raise ValueError(f"{weights.description} sums to zero (every weight is "
                         "zero): there is nothing to fit.")
    if not np.isfinite(total):
        raise ValueError(f"{weights.description} sums to {total}: beyond float64.")
    if n_components is not None and positive < n_components:
        raise ValueError(f"{weights.description} has {positive} rows of positive "
                         f"weight, fewer than n_components={n_components}.")
    return WeightTotals(total, positive)


def unit_exponent(total, n_samples):
    """The exponent ``e`` of the power of two ``2^e`` that brings the mean of
    weights summing to ``total`` over ``n_samples`` rows to within a factor of
    ``sqrt(2)`` of one: scaling by it (:func:`numpy.ldexp`, also beyond the range of
    ``2.0 ** e`` for subnormal weights) is exact, and the sums of ``fit`` are then
    those of weights of about one (``N_k`` gets ``10 eps`` added, which would swamp
    weights of 1e-20).

    Returns
    -------
    int
    """
    return int(-np.round(np.log2(total / n_samples)))


def dump_weights(weights, folder):
    """The weights as a ``.npy`` file in ``folder`` (for process workers), written
    once; file-backed weights are returned as they are.

    Returns
    -------
    WeightSource
    """
    if not isinstance(weights, ArrayWeights):
        return weights
    path = os.path.join(folder, "sample_weight.npy")
    np.save(path, np.ascontiguousarray(weights.array, dtype=np.float64),
            allow_pickle=False)
    _, source = MemmapWeights.from_npy(path, weights.description)
    source.checked = True
    source.exponent = weights.exponent
    return source


def weights_fingerprint(weights):
    """SHA-256 of every weight as float64 (``None`` for no weights): what tells a
    checkpoint of a weighted fit apart from one of other weights.

    Returns
    -------
    str or None
    """
    if weights is None:
        return None
    digest = hashlib.sha256()
    for start in range(0, weights.n_samples, _CHECK_ROWS):
        digest.update(weights.read(start, min(start + _CHECK_ROWS, weights.n_samples))
                      .tobytes())
    return digest.hexdigest()
