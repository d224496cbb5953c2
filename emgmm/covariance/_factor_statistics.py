"""'factor': the sufficient statistics of a block, ``O(d q)`` per component.

Pure functions of one block of rows and the parameters they are given. Notation as
in :mod:`emgmm.covariance._factor_parameters`.
"""

from dataclasses import dataclass

import numpy as np

from .._runtime.lapack import gemm_add
from ._factor_log_density import _CHUNK_BYTES, _MIN_PRODUCT_ROWS, projections

# Expanded sums more than this many times larger than their centred value (a tight
# component far from the shift) are recomputed centred (about 1e-10 relative left).
_MAX_CANCELLATION = 1e6
# A block whose pairs of nonzero responsibility are at most 1 / _PAIR_FRACTION of
# its pairs has its statistics summed over those pairs (each component's rows
# gathered) instead of by dense chunks that form every pair's posterior mean
# (dense_pays).
_PAIR_FRACTION = 8


@dataclass
class FactorStatistics:
    """Sufficient statistics of the mixture of factor analysers, summed over rows and
    centred on fixed centres ``c_k`` (the means of the E step), float64.

    With ``u = x - c_k`` and ``e = E[z | x, k]`` under the E step's parameters:

    Attributes
    ----------
    nk : ndarray of shape (K,)
        ``sum_i r_ik``.
    sum_x : ndarray of shape (K, d)
        ``sum_i r_ik u_i``.
    sum_xx : ndarray of shape (K, d)
        ``sum_i r_ik u_i^2`` (the diagonal of the second moments).
    sum_xz : ndarray of shape (K, d, q)
        ``sum_i r_ik u_i e_i^T``.
    sum_z : ndarray of shape (K, q)
        ``sum_i r_ik e_i``.
    sum_zz : ndarray of shape (K, q, q)
        ``sum_i r_ik E[z z^T | x_i, k] = sum_i r_ik (e_i e_i^T + M_k^{-1})``.
    log_likelihood : float
    n_samples : int
    sum_abs_x : ndarray of shape (K, d) or None
        The sum of the absolute terms that ``sum_x`` was summed from, or an upper
        bound of it (Higham 2002, section 4.2: the scale of a sum's rounding):
        ``sum_i r_ik |x_i - mu_k| + N_k |c_k - mu_k|`` over gathered pairs; for a
        dense block, summed around a shift, ``sqrt(N_k sum_i r_ik y_i^2) + N_k |c_k -
        shift|`` (Cauchy-Schwarz), or ``sqrt(N_k sum_i r_ik u_i^2)`` for a
        component summed again centred. It decides whether the M step needs the sums
        again around the new means
        (:meth:`~emgmm.covariance._factor.FactorCovariance.recentring_terms`).
        ``None`` for statistics from elsewhere (running or implied ones).
    """

    nk: np.ndarray
    sum_x: np.ndarray
    sum_xx: np.ndarray
    sum_xz: np.ndarray
    sum_z: np.ndarray
    sum_zz: np.ndarray
    log_likelihood: float
    n_samples: int
    sum_abs_x: np.ndarray | None = None

    _ARRAYS = ("nk", "sum_x", "sum_xx", "sum_xz", "sum_z", "sum_zz")

    def __add__(self, other):
        return FactorStatistics(
            *(getattr(self, a) + getattr(other, a) for a in self._ARRAYS),
            self.log_likelihood + other.log_likelihood,
            self.n_samples + other.n_samples,
            _joined_scale([self.sum_abs_x, other.sum_abs_x], sum))

    def __iadd__(self, other):
        for a in self._ARRAYS:
            getattr(self, a).__iadd__(getattr(other, a))
        self.log_likelihood += other.log_likelihood
        self.n_samples += other.n_samples
        if self.sum_abs_x is not None and other.sum_abs_x is not None:
            self.sum_abs_x += other.sum_abs_x
        else:
            self.sum_abs_x = None
        return self


def _joined_scale(scales, join):
    """``join(scales)`` of the ``sum_abs_x`` of several statistics, ``None`` when
    one lacks it."""
    return None if any(s is None for s in scales) else join(scales)


def concatenate_statistics(parts):
    """:class:`FactorStatistics` of consecutive component slices joined along the
    components (the log-likelihood and rows of the first part)."""
    first = parts[0]
    arrays = (np.concatenate([getattr(p, a) for p in parts])
              for a in FactorStatistics._ARRAYS)
    return FactorStatistics(*arrays, first.log_likelihood, first.n_samples,
                            _joined_scale([p.sum_abs_x for p in parts],
                                          np.concatenate))


def zero_statistics(n_components, n_features, n_factors):
    """:class:`FactorStatistics` of no rows."""
    K, d, q = n_components, n_features, n_factors
    return FactorStatistics(np.zeros(K), np.zeros((K, d)), np.zeros((K, d)),
                            np.zeros((K, d, q)), np.zeros((K, q)), np.zeros((K, q, q)),
                            0.0, 0, np.zeros((K, d)))


def block_statistics(X, resp, centers, precision, proj=None, resp_threshold=0.0,
                     means=None):
    """:class:`FactorStatistics` of one block (``log_likelihood = 0``), summed over
    every pair (see :func:`dense_pays`).

    By row chunks (:func:`_statistics_chunks`: no array of the block's size is
    formed): each chunk's shifted rows ``y = x -
    shift``, their projections ``p_k = y^T G_k - (mu_k - shift)^T G_k`` formed again
    (one GEMM ``(rows, d) x (d, K q)``: the E step keeps none) and ``e_i^T = p_k(x_i)
    L_k^{-1}``; then the GEMMs ``R^T y``, ``R^T y^2`` and ``Y^T [r_1 e_1, ..., r_K
    e_K]`` (``(d, n) x (n, K q)``, accumulated in place), re-centred on ``c_k`` by
    ``sum r (y - m)^2 = sum r y^2 - 2 m sum r y + N m^2`` and ``sum r (y - m) e^T =
    Y^T (r e) - m (sum r e)^T`` (``m = c_k - shift``). A component whose expanded
    second moments exceed ``_MAX_CANCELLATION`` times their centred value in some
    feature is recomputed from ``x - c_k``.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block; not modified.
    resp : ndarray of shape (n, K), float64
        Responsibilities.
    centers : ndarray of shape (K, d)
        The centres ``c_k`` of the sums: the E step's means, or others (the M step
        holds for any centres, as long as ``e`` is that of the E step).
    precision : FactorPrecision
        Of the E step.
    proj : Projections or None, default=None
        :func:`estimate_log_prob`'s for this block (its means and shift); ``None``:
        from ``means`` around their mixture mean.
    resp_threshold : float, default=0.0
        Pairs with ``r_ik <= resp_threshold`` are left out of every sum.
    means : ndarray of shape (K, d) or None, default=None
        The E step's means when ``proj`` is ``None`` (default: ``centers``).

    Returns
    -------
    FactorStatistics
    """
    X = np.asarray(X)
    n, d = X.shape
    resp = np.asarray(resp, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    if proj is None:
        proj = projections(X, centers if means is None else means, precision,
                           resp.sum(axis=0))
    K, q = len(centers), precision.n_factors
    if resp_threshold > 0.0:
        resp = np.where(resp > resp_threshold, resp, 0.0)
    chol_inv = precision.cholesky_inv
    sum_y, sum_yy = np.zeros((K, d)), np.zeros((K, d))
    sum_z, sum_zz = np.zeros((K, q)), np.zeros((K, q, q))
    flat = np.zeros((d, K * q))                       # sum_i y_i (r_i e_i)^T
    for r0, r1, Y, rE in _statistics_chunks(X, proj, resp, sum_z, sum_zz):
        sum_y += resp[r0:r1].T @ Y
        # flat^T += (r e)^T y: Fortran views of the C-ordered arrays, no copies
        gemm_add(flat.T, rE.reshape(r1 - r0, K * q).T, Y.T, trans_b=True)
        Y *= Y
        sum_yy += resp[r0:r1].T @ Y
    nk = resp.sum(axis=0)
    sum_zz += nk[:, None, None] * np.matmul(np.swapaxes(chol_inv, 1, 2), chol_inv)
    sum_xz = np.swapaxes(flat.reshape(d, K, q), 0, 1)  # (K, d, q), a view
    m = centers - proj.shift
    sum_x = sum_y - nk[:, None] * m
    sum_xx = sum_yy - 2.0 * m * sum_y + nk[:, None] * m**2
    for k in range(K):  # (no (K, d, q) temporary)
        sum_xz[k] -= np.outer(m[k], sum_z[k])
    scale = sum_yy + nk[:, None] * m**2
    # sum r |y| <= sqrt(N sum r y^2) (Cauchy-Schwarz), and the term N m
    sum_abs_x = np.sqrt(nk[:, None] * sum_yy) + nk[:, None] * np.abs(m)
    for k in np.flatnonzero((scale / _MAX_CANCELLATION > sum_xx).any(axis=1)):
        sum_x[k], sum_xx[k], sum_xz[k] = _centred_sums(
            X, resp[:, k], centers[k], proj.means[k], precision.projection[k],
            chol_inv[k])
        sum_abs_x[k] = np.sqrt(nk[k] * sum_xx[k])
    np.maximum(sum_xx, 0.0, out=sum_xx)
    return FactorStatistics(nk, sum_x, sum_xx, sum_xz, sum_z, sum_zz, 0.0, n,
                            sum_abs_x)


def dense_pays(resp, resp_threshold=0.0):
    """Whether :func:`block_statistics` (every pair's posterior mean, by one GEMM
    per chunk) is the way to sum ``resp``: more than ``1 / _PAIR_FRACTION`` of the
    pairs above ``resp_threshold``. Else the sums over each component's rows of
    nonzero responsibility
    (:func:`~emgmm.covariance._factor_pairs.pair_statistics`, ``O(d q)`` per such
    pair) take less: on well separated components the others' responsibilities
    underflow to 0 also with ``resp_threshold=0``."""
    n, K = np.shape(resp)
    return _PAIR_FRACTION * np.count_nonzero(resp > resp_threshold) > n * K


def _statistics_rows(n, d, K, q):
    """Rows of a chunk of :func:`block_statistics`: its shifted rows, their
    projections and weighted posterior means within ``_CHUNK_BYTES``, but at least
    ``_MIN_PRODUCT_ROWS`` (the inner dimension of the products that update the
    ``(d, K q)`` sums)."""
    rows = _CHUNK_BYTES // (8 * (d + 2 * K * q) + 1)
    return int(max(1, min(n, max(rows, _MIN_PRODUCT_ROWS))))


def _statistics_chunks(X, proj, resp, sum_z, sum_zz):
    """Yield ``(r0, r1, Y, rE)`` over row chunks of the block: ``Y = x - shift``
    (float64, C-ordered) and ``rE = r e`` (``(r1 - r0, K, q)``) from the chunk's
    projections (float64, whatever the E step's GEMM), each chunk's ``sum r e`` and
    ``sum r e e^T`` added to ``sum_z`` and ``sum_zz`` (three buffers, overwritten by
    the next chunk: no ``(n, K, q)`` array)."""
    n, d = X.shape
    precision = proj.precision
    K, _, q = precision.projection.shape
    G = precision.stacked(np.float64)
    m = np.asarray(proj.means, dtype=np.float64) - proj.shift
    offset = np.einsum("kd,kdq->kq", m, precision.projection)
    rows = _statistics_rows(n, d, K, q)
    y_buf = np.empty((min(rows, n), d))
    p_buf = np.empty((min(rows, n), K * q))
    e_buf = np.empty((min(rows, n), K, q))
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        Y, P, E = y_buf[:r1 - r0], p_buf[:r1 - r0], e_buf[:r1 - r0]
        np.subtract(X[r0:r1], proj.shift, out=Y, dtype=np.float64, casting="unsafe")
        np.matmul(Y, G, out=P)
        P = P.reshape(r1 - r0, K, q)
        P -= offset[None]
        _weighted_means(P, resp[r0:r1], precision.cholesky_inv, E, sum_z, sum_zz)
        yield r0, r1, Y, E


def _weighted_means(P, resp, cholesky_inv, out, sum_z, sum_zz):
    """``out = r e`` (``(n, K, q)``) from projections ``P`` (``e = p L^{-1}`` per
    component), with ``sum r e`` added to ``sum_z`` and ``sum r e e^T`` to ``sum_zz``
    (``s = sqrt(r) e``: ``s^T s``, then ``r e = sqrt(r) s``)."""
    np.matmul(np.swapaxes(P, 0, 1), cholesky_inv, out=np.swapaxes(out, 0, 1))
    root = np.sqrt(resp)[:, :, None]
    out *= root
    sum_zz += np.matmul(np.transpose(out, (1, 2, 0)), np.swapaxes(out, 0, 1))
    out *= root
    sum_z += out.sum(axis=0)
    return out


def _centred_sums(X, r, center, mean, projection, cholesky_inv):
    """``sum r u``, ``sum r u^2`` and ``sum r u e^T`` (``u = x - c``, ``e = p
    L^{-1}``, ``p = (x - mu)^T G``) of one component from ``x - c`` and ``x - mu``
    directly, over its rows with ``r > 0`` by chunks of ``_CHUNK_BYTES`` (where the
    expansion around the shift cancels)."""
    d, q = X.shape[1], cholesky_inv.shape[0]
    sum_x, sum_xx, sum_xz = np.zeros(d), np.zeros(d), np.zeros((d, q))
    rows = np.flatnonzero(r > 0.0)
    step = int(max(16, _CHUNK_BYTES // (8 * max(d, 1))))
    for c0 in range(0, len(rows), step):
        chunk = rows[c0:c0 + step]
        diff = np.subtract(X[chunk], mean, dtype=np.float64)
        rE = ((diff @ projection) @ cholesky_inv) * r[chunk, None]
        if np.any(center != mean):
            np.subtract(X[chunk], center, out=diff, dtype=np.float64)
        sum_x += r[chunk] @ diff
        sum_xz += diff.T @ rE
        diff *= diff
        sum_xx += r[chunk] @ diff
    return sum_x, sum_xx, sum_xz


def statistics_nbytes(n_components, n_features, n_factors):
    """Bytes of one set of :class:`FactorStatistics` (float64)."""
    K, d, q = n_components, n_features, n_factors
    return 8 * (K + 3 * K * d + K * d * q + K * q + K * q * q)
