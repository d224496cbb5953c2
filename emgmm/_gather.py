"""Gathering chosen rows of a block into reused float64 work buffers."""

import numpy as np


class GatherBuffers:
    """Work buffers for gathering up to ``size`` rows of ``X`` at a time, centred in
    float64 (the rows are copied as they are, then centred into a float64 buffer)."""

    def __init__(self, X, size):
        self.X = X
        self.buf = np.empty((size, X.shape[1]))
        self.raw = (self.buf if X.dtype == np.float64
                    else np.empty((size, X.shape[1]), dtype=X.dtype))

    def centred(self, rows, center):
        """``X[rows] - center`` (float64), a view of the buffer valid until the next
        call."""
        m = rows.size
        np.take(self.X, rows, axis=0, out=self.raw[:m])
        return np.subtract(self.raw[:m], center, out=self.buf[:m])
