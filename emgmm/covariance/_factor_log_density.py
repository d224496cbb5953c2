"""'factor': the E step of a block, every pair by one GEMM of the rows against the
stacked ``G_k`` and the diagonal distances.

Pure functions of one block of rows and the parameters they are given. Notation as
in :mod:`emgmm.covariance._factor_parameters`.
"""

from dataclasses import dataclass, field

import numpy as np

from ._factor_parameters import FactorPrecision
from ._log_density import _shift

_LOG_2PI = np.log(2.0 * np.pi)
# A component whose expanded diagonal distances (around the common shift) may be off
# by more than this relative to the scale of its log-densities is recomputed directly.
_REFINE_RTOL = 1e-10
# Bytes of the row chunks of [y^2, y, 1] (their products with the coefficients).
_CHUNK_BYTES = 8 * 2**20
# Rows of the E step's and the statistics' chunks at least (the inner dimension of
# the GEMMs that update the (d, K q) sums: fewer rows make them memory bound).
_MIN_PRODUCT_ROWS = 256


@dataclass
class Projections:
    """What the E step of a block and its statistics share: the parameters and the
    shift. No per-row product is kept: the E step forms the
    projections chunk by chunk of rows (:func:`densities`), and the statistics form
    the posterior means again from their own chunks of shifted rows
    (:func:`~emgmm.covariance._factor_statistics.block_statistics`).

    Attributes
    ----------
    means : ndarray of shape (K, d)
        The E step's means.
    precision : FactorPrecision
        The factorisation they are computed with.
    shift : ndarray of shape (d,), float64
        ``g``: the rows enter every product as ``y = x - g``, formed by chunks.
    dtype : numpy dtype
        Of the projection GEMM.
    computed : bool
        Whether the E step computed every pair (:func:`densities`); a screened E
        step computes only some, and its statistics are summed over the pairs of
        nonzero responsibility.
    """

    means: np.ndarray
    precision: FactorPrecision
    shift: np.ndarray
    dtype: object = np.float64
    computed: bool = field(default=False, compare=False)


def _square_chunks(X, shift, min_rows, row_bytes=0):
    """Yield ``(r0, r1, Z)`` with ``Z = [y^2, y, 1]`` (float64) of rows ``r0:r1``,
    ``y = x - shift``, in chunks of about ``_CHUNK_BYTES`` (with the caller's
    ``row_bytes`` of other buffers per row) but at least ``min_rows`` rows (one
    buffer, overwritten by the next chunk): no ``(n, d)`` float64 copy of the block
    is held."""
    n, d = X.shape
    per_row = 8 * (2 * d + 1) + row_bytes
    rows = int(max(1, min(n, max(min_rows, _CHUNK_BYTES // per_row))))
    buf = np.empty((min(rows, n), 2 * d + 1))
    buf[:, 2 * d] = 1.0
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        Z = buf[:r1 - r0]
        np.subtract(X[r0:r1], shift, out=Z[:, d:2 * d], dtype=np.float64,
                    casting="unsafe")
        np.multiply(Z[:, d:2 * d], Z[:, d:2 * d], out=Z[:, :d])
        yield r0, r1, Z


class _DiagonalSums:
    """The expanded diagonal distances of a block, accumulated by row chunks of
    ``[y^2, y, 1]`` (:func:`_square_chunks`): two GEMMs per chunk."""

    def __init__(self, means, inv_noise, shift, n):
        self.inv_noise = np.asarray(inv_noise, dtype=np.float64)
        m = np.asarray(means, dtype=np.float64) - shift
        self.linear = -2.0 * (m * self.inv_noise).T              # (d, K)
        self.const = (m * m * self.inv_noise).sum(axis=1)
        self.out = np.empty((n, len(m)))
        self.squares = np.empty((n, len(m)))

    def add(self, r0, r1, Z):
        d = self.linear.shape[0]
        np.matmul(Z[:, :d], self.inv_noise.T, out=self.squares[r0:r1])
        np.matmul(Z[:, d:2 * d], self.linear, out=self.out[r0:r1])

    def finish(self, X, means):
        """The distances, the pairs whose expansion may cancel recomputed."""
        out, squares = self.out, self.squares
        out += squares
        out += self.const
        _refine_distances(X, means, self.inv_noise, out, squares, self.const)
        self.squares = None
        return out


def _refine_distances(X, means, inv_noise, out, squares, const):
    """Recompute from ``x - mu_k`` (:func:`_direct_distances`) the pairs of the
    expanded distances ``out`` whose rounding may exceed ``_REFINE_RTOL`` times the
    scale of their log-density (their distance, or ``d`` if larger).

    The rounding of a pair is at most ``gamma_{2d+8}`` times the sum of the
    magnitudes of its expanded terms, ``S + |B| + C <= (sqrt(S) + sqrt(C))^2``
    (Higham 2002, eq. 3.5; Cauchy-Schwarz for ``|B|``): large for a row of a tight
    component far from the shift, whose expansion cancels. ``squares`` (``S``) is
    overwritten with the bounds.
    """
    d = X.shape[1]
    unit = np.finfo(np.float64).eps / 2
    gamma = (2 * d + 8) * unit / (1.0 - (2 * d + 8) * unit)
    np.sqrt(squares, out=squares)
    squares += np.sqrt(const)
    squares *= squares
    squares *= gamma * (1.0 + gamma)                       # the bound of each pair
    redo = ~(squares <= _REFINE_RTOL * np.maximum(out, d))
    if redo.any():
        _direct_distances(X, means, inv_noise, redo, out)


def _direct_distances(X, means, inv_noise, redo, out):
    """``out[i, k] = sum_j (x_ij - mu_kj)^2 / psi_kj`` from ``x - mu_k`` on the pairs
    of ``redo`` (``(n, K)`` bool), per component by row chunks of ``_CHUNK_BYTES``."""
    d = X.shape[1]
    step = int(max(16, _CHUNK_BYTES // (8 * max(d, 1))))
    for k in np.flatnonzero(redo.any(axis=0)):
        rows = np.flatnonzero(redo[:, k])
        for c0 in range(0, len(rows), step):
            chunk = rows[c0:c0 + step]
            diff = np.subtract(X[chunk], means[k], dtype=np.float64)
            diff *= diff
            out[chunk, k] = diff @ inv_noise[k]


def _distance_terms(X, means, precision, shift, dtype):
    """The two terms of every pair's distance from one pass of row chunks of ``[y^2,
    y, 1]`` (:func:`_square_chunks`: with the chunk's projections within
    ``_CHUNK_BYTES``, but at least ``_MIN_PRODUCT_ROWS`` rows): the
    diagonal distances (:class:`_DiagonalSums`), ``||p_k(x_i)||^2`` with ``p_k(x) =
    y^T G_k - (mu_k - g)^T G_k`` from each chunk's projection GEMM into a chunk
    buffer (in ``dtype``; float32 rows as ``fl(x - fl(g))``) and, for float32,
    ``||y||``. No ``(n, K q)`` array is formed.

    Returns
    -------
    diag, squared : ndarray of shape (n, K), float64
        The diagonal distances and ``||p||^2``.
    y_norm : ndarray of shape (n,), float64, or None
        ``||y||`` of the rows the float32 GEMM took (``None`` for float64).
    """
    n, d = X.shape
    K, _, q = precision.projection.shape
    single = np.dtype(dtype) != np.float64
    g = shift.astype(dtype)  # the shift as the GEMM's rows have it, also in m below
    G = precision.stacked(dtype)
    m = np.asarray(means, dtype=np.float64) - g.astype(np.float64)
    offset = np.einsum("kd,kdq->kq", m, precision.projection)
    squared = np.empty((n, K))
    y_norm = np.empty(n) if single else None
    diag = _DiagonalSums(means, precision.inv_noise, shift, n)
    buf = cast = None
    row_bytes = 8 * K * q + (d * np.dtype(dtype).itemsize if single else 0)
    for r0, r1, Z in _square_chunks(X, shift, _MIN_PRODUCT_ROWS, row_bytes):
        if buf is None:
            buf = np.empty((len(Z), K * q))
            cast = np.empty((len(Z), d), dtype=dtype) if single else None
        P = buf[:r1 - r0]
        if single:
            Y = cast[:r1 - r0]
            np.subtract(X[r0:r1], g, out=Y, dtype=dtype, casting="unsafe")
            y_norm[r0:r1] = np.sqrt(np.einsum("ij,ij->i", Y, Y, dtype=np.float64))
            P[...] = Y @ G
        else:
            np.matmul(Z[:, d:2 * d], G, out=P)
        P = P.reshape(r1 - r0, K, q)
        P -= offset[None]
        np.einsum("nkq,nkq->nk", P, P, out=squared[r0:r1])
        diag.add(r0, r1, Z)
    return diag.finish(X, means), squared, y_norm


def estimate_log_prob(X, means, precision, weights=None, dtype=np.float64,
                      margin=None):
    """Log-densities of every row under every component, and the block's
    :class:`Projections` for its statistics.

    ``log N(x | mu_k, Sigma_k) = -d/2 log(2 pi) - 1/2 log det Sigma_k
    - 1/2 (sum_j (x_j - mu_kj)^2 / psi_kj - ||p_k(x)||^2)`` (see the module's
    docstring): ``O(d q)`` per pair after :func:`factorize`; the work is one GEMM
    ``(n, d) x (d, K q)`` and one ``(n, 2 d + 1) x (2 d + 1, K)``.

    With a float32 projection GEMM the two terms cancel where the factors explain
    most of the variance (``||p||^2`` ~ 6e4 at d=2500, q=16: 0.02 nats off). Given a
    ``margin``, the pairs that may lie within it of their row's best weighted
    log-density (by the rounding bound of :func:`_float32_bound`) get ``||p||^2``
    recomputed in float64: those are exact, the others are within the bound and
    have responsibilities below ``exp(-margin)``.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block; not modified.
    means : ndarray of shape (K, d)
    precision : FactorPrecision
    weights : ndarray of shape (K,), optional
        The shift (the mixture mean) and, with a ``margin``, the pairs that matter;
        uniform when omitted.
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64
        Of the projection GEMM (the diagonal distances are float64).
    margin : float or None, default=None
        Nats (see above); ``None``: every pair in ``dtype``.

    Returns
    -------
    log_prob : ndarray of shape (n, K), float64
    projections : Projections
    """
    X = np.asarray(X)
    d = X.shape[1]
    proj = projections(X, means, precision, weights, dtype)
    log_w = np.log(np.full(len(means), 1.0 / len(means)) if weights is None
                   else np.asarray(weights, dtype=np.float64))
    offset = log_w - 0.5 * (precision.log_det + d * _LOG_2PI)
    out = densities(X, means, precision, proj, offset, margin)
    out -= log_w
    return out, proj


def densities(X, means, precision, proj, offset, margin=None):
    """``offset_k - 1/2 (x - mu_k)^T Sigma_k^{-1} (x - mu_k)``: ``(n, K)`` float64
    of every pair of the block, from its projections formed by row chunks
    (:func:`_distance_terms`; see :func:`estimate_log_prob`; its ``margin``
    refinement, for float32 projections, ranks the pairs by these values:
    ``offset`` should hold ``log w_k``). Marks ``proj`` computed."""
    diag, squared, y_norm = _distance_terms(X, means, precision, proj.shift,
                                            proj.dtype)
    proj.computed = True
    d = X.shape[1]
    if margin is not None and y_norm is not None and diag.size:
        bound = _float32_bound(squared, y_norm, precision, d)
        est = diag - squared
        est *= -0.5
        est += offset
        floor = (est - 0.5 * bound).max(axis=1, keepdims=True) - margin
        redo = (est + 0.5 * bound >= floor).T
        del est, bound
        _exact_squares(X, means, precision, redo, squared)
    maha = diag
    maha -= squared
    np.maximum(maha, 0.0, out=maha)
    maha *= -0.5
    maha += offset
    return maha


def _float32_bound(squared, y_norm, precision, d):
    """Bound on the error of ``||p||^2`` from a float32 projection GEMM, ``(n, K)``:
    ``2 ||p|| e + e^2`` with ``||dp|| <= e = gamma_{d+2} ||y|| ||G_k||_F`` (Higham
    2002, eq. 3.5, with the float32 rounding of ``y`` and of ``G``; Cauchy-Schwarz
    for ``|y|^T |G|``), from ``squared = ||p||^2`` and ``y_norm = ||y||``."""
    unit = np.finfo(np.float32).eps / 2
    gamma = (d + 2) * unit / (1.0 - (d + 2) * unit)
    err = gamma * np.outer(y_norm, np.linalg.norm(precision.projection, axis=(1, 2)))
    bound = np.sqrt(squared)
    bound *= 2.0 * err
    err *= err
    bound += err
    return bound


def _exact_squares(X, means, precision, redo, squared):
    """Recompute ``squared = ||p||^2`` in float64 on the pairs of ``redo`` (``(K,
    n)`` bool): per component, its rows gathered (by chunks of ``_CHUNK_BYTES``),
    ``p = (x - mu_k)^T G_k``."""
    d = X.shape[1]
    step = int(max(16, _CHUNK_BYTES // (8 * max(d, 1))))
    for k in np.flatnonzero(redo.any(axis=1)):
        rows = np.flatnonzero(redo[k])
        for c0 in range(0, len(rows), step):
            chunk = rows[c0:c0 + step]
            diff = np.subtract(X[chunk], means[k], dtype=np.float64)
            p = diff @ precision.projection[k]
            squared[chunk, k] = np.einsum("ij,ij->i", p, p)


def projections(X, means, precision, weights=None, dtype=np.float64, shift=None):
    """:class:`Projections` of the block ``X`` (n, d) under components of ``means``
    (K, d) and ``precision``, around ``shift`` (default: the mixture mean of
    ``means`` and ``weights``); the projection GEMM in ``dtype``."""
    if shift is None:
        shift = _shift(means, weights)
    return Projections(means, precision, shift, dtype)


def log_gaussian_prob(X, means, precision, weights=None):
    """``(n, K)`` float64 log-densities of :func:`estimate_log_prob` alone."""
    return estimate_log_prob(X, means, precision, weights)[0]
