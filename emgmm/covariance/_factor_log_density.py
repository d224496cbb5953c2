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
# Rows of the statistics' chunks at least (the inner dimension of the GEMMs that
# update the (d, K q) sums: fewer rows make them memory bound).
_MIN_PRODUCT_ROWS = 256


@dataclass
class Projections:
    """Products of a block kept from the E step for its statistics, formed when first
    read (a screened E step never reads them).

    Attributes
    ----------
    X : ndarray of shape (n, d)
        The block (as read; never modified).
    means : ndarray of shape (K, d)
        The E step's means.
    precision : FactorPrecision
        The factorisation they are computed with.
    shift : ndarray of shape (d,), float64
        ``g``: the rows enter every product as ``y = x - g``, formed by chunks.
    dtype : numpy dtype
        Of the projection GEMM.
    P : ndarray of shape (n, K, q), float64
        ``p_k(x_i) = (x_i - mu_k)^T G_k`` (computed on first access).
    y_norm : ndarray of shape (n,), float64
        ``||x_i - g||`` (computed with ``P``).
    diag : ndarray of shape (n, K), float64, or None
        ``sum_j (x_ij - mu_kj)^2 / psi_kj`` (computed with ``P``, from the same pass
        over the rows, for float64 projections); ``None``: computed by
        :func:`densities`.
    """

    X: np.ndarray
    means: np.ndarray
    precision: FactorPrecision
    shift: np.ndarray
    dtype: object = np.float64
    _products: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def computed(self):
        """Whether :attr:`P` has been formed."""
        return self._products is not None

    def _formed(self):
        if self._products is None:
            if np.dtype(self.dtype) == np.float64:
                self._products = _projections_and_distances(
                    self.X, self.means, self.precision, self.shift)
            else:
                self._products = _projections(self.X, self.means, self.precision,
                                              self.shift, self.dtype) + (None,)
        return self._products

    @property
    def P(self):
        return self._formed()[0]

    @property
    def y_norm(self):
        return self._formed()[1]

    @property
    def diag(self):
        return self._formed()[2]


def _square_chunks(X, shift, min_rows=16):
    """Yield ``(r0, r1, Z)`` with ``Z = [y^2, y, 1]`` (float64) of rows ``r0:r1``,
    ``y = x - shift``, in chunks of about ``_CHUNK_BYTES`` but at least ``min_rows``
    rows (one buffer, overwritten by the next chunk): no ``(n, d)`` float64 copy of
    the block is held."""
    n, d = X.shape
    rows = int(max(1, min(n, max(min_rows, _CHUNK_BYTES // (8 * (2 * d + 1))))))
    buf = np.empty((min(rows, n), 2 * d + 1))
    buf[:, 2 * d] = 1.0
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        Z = buf[:r1 - r0]
        np.subtract(X[r0:r1], shift, out=Z[:, d:2 * d], dtype=np.float64,
                    casting="unsafe")
        np.multiply(Z[:, d:2 * d], Z[:, d:2 * d], out=Z[:, :d])
        yield r0, r1, Z


def _diag_distances(X, means, inv_noise, shift):
    """``sum_j (x_ij - mu_kj)^2 / psi_kj``: ``(n, K)``, from the shifted rows'
    ``y^2`` and ``y`` (by row chunks): ``S_ik + B_ik + C_k`` with ``S = y^2 @
    (1 / psi)``, ``B = y @ (-2 m / psi)`` and ``C_k = sum_j m_kj^2 / psi_kj``
    (``m = mu - shift``), then :func:`_refine_distances`."""
    diag = _DiagonalSums(means, inv_noise, shift, X.shape[0])
    for r0, r1, Z in _square_chunks(X, shift):
        diag.add(r0, r1, Z)
    return diag.finish(X, means)


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


def _projections_and_distances(X, means, precision, shift):
    """float64 ``P``, ``||y||`` and the diagonal distances of :class:`Projections`
    from one pass of row chunks of ``[y^2, y, 1]`` (:func:`_square_chunks`, at least
    ``_MIN_PRODUCT_ROWS`` rows): the projection GEMM of each chunk's ``y`` against
    the stacked ``G_k`` and the two of :class:`_DiagonalSums`, then ``P -= (mu_k -
    shift)^T G_k``."""
    n, d = X.shape
    K, _, q = precision.projection.shape
    G = precision.stacked(np.float64)
    P = np.empty((n, K * q))
    y_norm = np.empty(n)
    diag = _DiagonalSums(means, precision.inv_noise, shift, n)
    for r0, r1, Z in _square_chunks(X, shift, _MIN_PRODUCT_ROWS):
        np.matmul(Z[:, d:2 * d], G, out=P[r0:r1])
        y_norm[r0:r1] = np.sqrt(Z[:, :d].sum(axis=1))
        diag.add(r0, r1, Z)
    m = np.asarray(means, dtype=np.float64) - shift
    P = P.reshape(n, K, q)
    P -= np.einsum("kd,kdq->kq", m, precision.projection)[None]
    return P, y_norm, diag.finish(X, means)


def _projections(X, means, precision, shift, dtype):
    """``P`` and ``||y||`` of :class:`Projections`: GEMMs of the shifted rows (by
    chunks, in ``dtype``) against every component's ``G_k`` stacked as ``(d, K q)``,
    minus ``(mu_k - shift)^T G_k``."""
    n, d = X.shape
    K, _, q = precision.projection.shape
    g = shift.astype(dtype)  # the shift as the chunks have it, also in m below
    G = precision.stacked(dtype)
    P = np.empty((n, K * q))
    y_norm = np.empty(n)
    rows = int(max(1, min(n, max(_MIN_PRODUCT_ROWS, _CHUNK_BYTES // (8 * d)))))
    buf = np.empty((min(rows, n), d), dtype=dtype)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        Y = buf[:r1 - r0]
        np.subtract(X[r0:r1], g, out=Y, dtype=dtype, casting="unsafe")
        y_norm[r0:r1] = np.sqrt(np.einsum("ij,ij->i", Y, Y, dtype=np.float64))
        P[r0:r1] = Y @ G
    m = np.asarray(means, dtype=np.float64) - g.astype(np.float64)
    P = P.reshape(n, K, q)
    P -= np.einsum("kd,kdq->kq", m, precision.projection)[None]
    return P, y_norm


def estimate_log_prob(X, means, precision, weights=None, dtype=np.float64,
                      margin=None):
    """Log-densities of every row under every component, and the products kept for
    :func:`block_statistics`.

    ``log N(x | mu_k, Sigma_k) = -d/2 log(2 pi) - 1/2 log det Sigma_k
    - 1/2 (sum_j (x_j - mu_kj)^2 / psi_kj - ||p_k(x)||^2)`` (see the module's
    docstring): ``O(d q)`` per pair after :func:`factorize`; the work is one GEMM
    ``(n, d) x (d, K q)`` and one ``(n, 2 d + 1) x (2 d + 1, K)``.

    With a float32 projection GEMM the two terms cancel where the factors explain
    most of the variance (``||p||^2`` ~ 6e4 at d=2500, q=16: 0.02 nats off). Given a
    ``margin``, the pairs that may lie within it of their row's best weighted
    log-density (by the rounding bound of :func:`_float32_bound`) get their
    projections recomputed in float64: those are exact, the others are within the
    bound and have responsibilities below ``exp(-margin)``.

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
    from the block's projections ``proj`` (see :func:`estimate_log_prob`; its
    ``margin`` refinement, for float32 projections, ranks the pairs by these values:
    ``offset`` should hold ``log w_k``)."""
    diag = proj.diag
    if diag is None:
        diag = _diag_distances(X, means, precision.inv_noise, proj.shift)
    maha = diag - np.einsum("nkq,nkq->nk", proj.P, proj.P)
    d = X.shape[1]
    if margin is not None and X.dtype != np.float64 and maha.size:
        bound = _float32_bound(proj, precision, d)
        est = offset - 0.5 * maha
        floor = (est - 0.5 * bound).max(axis=1, keepdims=True) - margin
        redo = (est + 0.5 * bound >= floor).T
        _exact_projections(proj, means, precision, redo)
        maha = diag - np.einsum("nkq,nkq->nk", proj.P, proj.P)
    np.maximum(maha, 0.0, out=maha)
    maha *= -0.5
    maha += offset
    return maha


def _float32_bound(proj, precision, d):
    """Bound on the error of ``||p||^2`` from a float32 projection GEMM, ``(n, K)``:
    ``2 ||p|| e + e^2`` with ``||dp|| <= e = gamma_{d+2} ||y|| ||G_k||_F`` (Higham
    2002, eq. 3.5, with the float32 rounding of ``y`` and of ``G``; Cauchy-Schwarz
    for ``|y|^T |G|``)."""
    unit = np.finfo(np.float32).eps / 2
    gamma = (d + 2) * unit / (1.0 - (d + 2) * unit)
    err = gamma * np.outer(proj.y_norm,
                           np.linalg.norm(precision.projection, axis=(1, 2)))
    p_norm = np.sqrt(np.einsum("nkq,nkq->nk", proj.P, proj.P))  # no (n, K, q) copy
    return 2.0 * p_norm * err + err * err


def _exact_projections(proj, means, precision, redo):
    """Recompute ``proj.P`` in float64 on the pairs of ``redo`` (``(K, n)`` bool):
    per component, its rows gathered, one GEMM."""
    for k in np.flatnonzero(redo.any(axis=1)):
        rows = np.flatnonzero(redo[k])
        diff = np.subtract(proj.X[rows], means[k], dtype=np.float64)
        proj.P[rows, k] = diff @ precision.projection[k]


def projections(X, means, precision, weights=None, dtype=np.float64, shift=None):
    """:class:`Projections` of the block ``X`` (n, d) under components of ``means``
    (K, d) and ``precision``, around ``shift`` (default: the mixture mean of
    ``means`` and ``weights``); the projection GEMM in ``dtype``."""
    if shift is None:
        shift = _shift(means, weights)
    return Projections(np.asarray(X), means, precision, shift, dtype)


def log_gaussian_prob(X, means, precision, weights=None):
    """``(n, K)`` float64 log-densities of :func:`estimate_log_prob` alone."""
    return estimate_log_prob(X, means, precision, weights)[0]
