"""Named arrays that every worker of a pass reads and writes in place.

With worker threads (or none), the arrays are ordinary arrays of this process. With
worker processes, the arrays lie at page-aligned offsets of one file in a folder of
the fit's temporary folder, mapped by every process that uses them: a
:class:`SharedArrays` pickles as the file's path and layout, and each task maps the
file once, when it first reads an array (one ``mmap``, whatever the number of
arrays; the map goes with the task's copy, so a worker keeps no map of a state
after its tasks and the pages of a removed folder are freed). Workers write only
their own parts (a range of components, say).
"""

import mmap
import os

import numpy as np

#: The name of the file of the arrays in their folder.
FILE_NAME = "arrays.bin"


def _layout(shapes):
    """``{name: (offset, shape, dtype)}`` at page-aligned offsets, and the size."""
    layout, offset = {}, 0
    for name, (shape, dtype) in shapes.items():
        layout[name] = (offset, tuple(shape), np.dtype(dtype).str)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        offset += -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    return layout, max(offset, mmap.PAGESIZE)


def _views(path, layout, size):
    """The arrays of ``layout`` as views of one read-write map of ``path``
    (``np.memmap`` views: what is written lands in the file)."""
    whole = np.memmap(path, mode="r+", dtype=np.uint8, shape=(size,))
    out = {}
    for name, (offset, shape, dtype) in layout.items():
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = whole[offset:offset + count * np.dtype(dtype).itemsize].view(
            dtype).reshape(shape)
    return out


class SharedArrays:
    """Arrays by name: in memory (``folder=None``), or in one file in ``folder``.

    Parameters
    ----------
    arrays : dict of str to ndarray
    folder : str or None
        Where the file is (:meth:`allocate` made it).
    layout : tuple or None
        ``(offsets, size)`` of the file (:func:`_layout`), with ``folder``.
    """

    def __init__(self, arrays, folder=None, layout=None):
        self._arrays = arrays
        self.folder = folder
        self._layout = layout

    @classmethod
    def allocate(cls, shapes, folder=None, adopt=None):
        """New arrays of ``shapes`` (``{name: (shape, dtype)}``), values undefined:
        in memory, or in one file in ``folder`` (created, with the parents it
        lacks).

        ``adopt`` (``{name: ndarray}``), in memory only: arrays used as they are
        instead of new ones when they already have the shape and dtype and are
        C-contiguous and writable (a starting model the caller lets go).
        """
        if folder is None:
            adopt = adopt or {}
            return cls({name: adopt[name] if _adoptable(adopt.get(name), shape, dtype)
                        else np.empty(shape, dtype=dtype)
                        for name, (shape, dtype) in shapes.items()})
        os.makedirs(folder, exist_ok=True)
        layout = _layout(shapes)
        path = os.path.join(folder, FILE_NAME)
        with open(path, "wb") as fh:
            fh.truncate(layout[1])
        return cls(_views(path, *layout), folder, layout)

    def __getitem__(self, name):
        if self._arrays is None:
            self._arrays = _views(os.path.join(self.folder, FILE_NAME),
                                  *self._layout)
        return self._arrays[name]

    def __getstate__(self):
        if self.folder is None:
            return self.__dict__
        return {"_arrays": None, "folder": self.folder, "_layout": self._layout}

    def close(self):
        """Let the map go (its file stays until the folder is removed)."""
        if self.folder is not None:
            self._arrays = None


def _adoptable(array, shape, dtype):
    return (isinstance(array, np.ndarray) and not isinstance(array, np.memmap)
            and array.shape == tuple(shape) and array.dtype == np.dtype(dtype)
            and array.flags.c_contiguous and array.flags.writeable)
