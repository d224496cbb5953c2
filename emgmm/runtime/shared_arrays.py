"""Named arrays that every worker of a pass reads and writes in place.

With worker threads (or none), the arrays are ordinary arrays of this process. With
worker processes, each array is a ``.npy`` file in a folder of the fit's temporary
folder, mapped by every process that uses it: a :class:`SharedArrays` pickles as the
folder and the arrays' names, and each task maps the files when it first reads
an array (the maps go with the task's copy: a worker keeps no map of a folder after
its tasks, so the pages of a removed folder are freed). Workers write only their
own parts (a range of components, say).
"""

import os

import numpy as np


class SharedArrays:
    """Arrays by name: in memory (``folder=None``), or files in ``folder``.

    Parameters
    ----------
    arrays : dict of str to ndarray
    folder : str or None
        Where the files are (:meth:`allocate` made them).
    """

    def __init__(self, arrays, folder=None):
        self._arrays = arrays
        self.folder = folder
        self._names = tuple(arrays)

    @classmethod
    def allocate(cls, shapes, folder=None, adopt=None):
        """New arrays of ``shapes`` (``{name: (shape, dtype)}``), values undefined:
        in memory, or as files in ``folder`` (created, with the parents it lacks).

        ``adopt`` (``{name: ndarray}``), in memory only: arrays used as they are
        instead of new ones when they already have the shape and dtype and are
        C-contiguous and writable (a starting model the caller lets go).
        """
        adopt = adopt or {}
        arrays = {}
        if folder is not None:
            os.makedirs(folder, exist_ok=True)
        for name, (shape, dtype) in shapes.items():
            given = adopt.get(name)
            if folder is None and _adoptable(given, shape, dtype):
                arrays[name] = given
            elif folder is None:
                arrays[name] = np.empty(shape, dtype=dtype)
            else:
                path = os.path.join(folder, name + ".npy")
                arrays[name] = np.lib.format.open_memmap(path, mode="w+",
                                                         dtype=dtype, shape=shape)
        return cls(arrays, folder)

    def __getitem__(self, name):
        if self._arrays is None:
            self._arrays = {n: np.load(os.path.join(self.folder, n + ".npy"),
                                       mmap_mode="r+") for n in self._names}
        return self._arrays[name]

    def __getstate__(self):
        if self.folder is None:
            return self.__dict__
        return {"_arrays": None, "folder": self.folder, "_names": self._names}

    def close(self):
        """Let the maps go (their files stay until the folder is removed)."""
        if self.folder is not None:
            self._arrays = None


def _adoptable(array, shape, dtype):
    return (isinstance(array, np.ndarray) and not isinstance(array, np.memmap)
            and array.shape == tuple(shape) and array.dtype == np.dtype(dtype)
            and array.flags.c_contiguous and array.flags.writeable)
