"""Gathering chosen rows of a block into reused float64 work buffers."""

from contextlib import contextmanager, nullcontext

import numpy as np

from .workspace import borrow


class GatherBuffers:
    """Work buffers for gathering up to ``size`` rows of ``X`` at a time, centred in
    float64 (the rows are copied as they are, then centred into a float64 buffer)."""

    def __init__(self, X, buf, raw):
        self.X = X
        self.buf = buf
        self.raw = raw

    @classmethod
    @contextmanager
    def borrowed(cls, X, size):
        """The buffers for up to ``size`` rows of ``X``, borrowed from the thread's
        workspace (:func:`~emgmm._runtime.workspace.borrow`) for the ``with`` block."""
        shape = (size, X.shape[1])
        with borrow("gather", shape) as buf, \
                (nullcontext(buf) if X.dtype == np.float64
                 else borrow("gather_raw", shape, X.dtype)) as raw:
            yield cls(X, buf, raw)

    def split(self, parts):
        """``parts`` buffers over equal slices of these ones' rows (one for each of
        as many threads)."""
        size = len(self.buf) // parts
        return [GatherBuffers(self.X, self.buf[i * size:(i + 1) * size],
                              self.raw[i * size:(i + 1) * size])
                for i in range(parts)]

    def centred(self, rows, center):
        """``X[rows] - center`` (float64), a view of the buffer valid until the next
        call."""
        m = rows.size
        # (mode='raise', the default, gathers through a temporary copy; the rows are
        # valid indices)
        np.take(self.X, rows, axis=0, out=self.raw[:m], mode="clip")
        return np.subtract(self.raw[:m], center, out=self.buf[:m])
