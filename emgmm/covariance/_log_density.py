"""Log-densities of a block of rows under every component: the heavy products of the
E step.

Pure functions of one block of rows and the model parameters they are given: none keeps
state, reads files or starts workers (the orchestration lives in :mod:`emgmm._engine`).

Notation (Bishop, *Pattern Recognition and Machine Learning*, 2006, section 9.2):
``X`` is a block of ``n`` rows and ``d`` features, ``K`` the number of components,
``w_k`` the weights, ``mu_k`` the means, ``Lambda_k`` the precision matrices and
``U_k`` their upper-triangular Cholesky factors with ``U_k @ U_k.T == Lambda_k``
(scikit-learn's ``precisions_cholesky_`` convention). ``r_ik`` are the
responsibilities (eq. 9.23) and ``c_k`` the centres the sufficient statistics are
accumulated around (the means of the previous iteration).

Tuning constants: ``TRIANGLE_BLOCK`` (columns of one block of a triangular factor),
``CHUNK_BYTES`` and ``PACKED_CHUNK_BYTES`` (bytes of one row chunk's product buffer,
dense and packed products) size the pieces of the 'full' kernels' work, not what they
compute. They are read at every call, so that tests can lower them to cross chunk
and block boundaries on small data.
"""

from dataclasses import dataclass

import numpy as np

from .._runtime.workspace import borrow
from ._base import get_covariance_type

_LOG_2PI = np.log(2.0 * np.pi)
# log(1 / smallest subnormal float64): exp() of anything lower is exactly zero
_LOG_RANGE = 745.2


def _shift(means, weights):
    """A common centre for the expanded distance formulas: the mixture mean, with
    equal weights when ``weights`` is ``None`` or does not sum to a positive
    number."""
    if weights is None:
        weights = np.ones(len(means))
    weights = np.asarray(weights, dtype=np.float64)
    total = weights.sum()
    if not total > 0.0:
        weights, total = np.ones(len(weights)), float(len(weights))
    return (weights / total) @ np.asarray(means, dtype=np.float64)


def _gamma(m, dtype):
    """Higham's ``gamma_m = m u / (1 - m u)`` for the unit roundoff ``u`` of
    ``dtype``."""
    unit = np.finfo(dtype).eps / 2
    return m * unit / (1.0 - m * unit)


# Every product of the passes is numpy's ``matmul``, which releases the GIL; scipy's
# BLAS wrappers (``trmm``, ``syrk``) hold it while they run, so that row threads
# calling them take turns. numpy sends ``W.T @ W`` to ``syrk`` itself; the triangular
# factor products of ``refine`` take twice the flops of ``trmm``, which the threads
# running at once repay (benchmarks/README.md, "How the 'full' kernels get there").
# The same products everywhere also keep results bitwise equal across schedules and
# ``n_jobs`` (with one BLAS thread per task).

# Sizes of the work buffers of the 'full' kernels. Row chunks are cut so that the
# buffer a chunk's matrix product writes stays within a few MiB (cache-sized), and
# products are batched over components so that every GEMM is wide enough to run near
# the BLAS peak rate.
_GEMM_COLUMNS = 1024      # columns of one batched product (components x features)
# Width of the column blocks of the triangular factor in _full_maha_dense: narrower
# blocks skip more of the zero triangle but make thinner GEMMs; 64 balances the two
# at d = 400-900 (benchmarks/README.md, "Measurements behind the tuning constants").
TRIANGLE_BLOCK = 64
CHUNK_BYTES = 4 * 2**20  # bytes of one row chunk's product buffer
# The packed formulation (below) is used while its packed model fits in this many bytes
# and CHUNK_BYTES of float64 packed products still hold _PACKED_MIN_ROWS rows (the
# cut-off at d ~ 90, beyond which the dense products run nearer the GEMM rate).
_PACKED_MODEL_BYTES = 64 * 2**20
_PACKED_MIN_ROWS = 128
# Bytes of one row chunk of float64 packed products (float32 chunks have as many rows).
# Larger than CHUNK_BYTES: the thin side of their GEMM is the K components, and more
# rows per call amortise the packing of the (T, K) weights that each call repeats
# (benchmarks/README.md, "How the 'full' kernels get there"). Each thread holds one
# such buffer
# (16 MiB at d=64, beside its block's (n, K) arrays: not counted in working_memory).
PACKED_CHUNK_BYTES = 16 * 2**20


def chunk_rows(n_columns, itemsize, n_rows, nbytes=None):
    """Rows per chunk so that a ``(rows, n_columns)`` buffer holds ``nbytes`` (default
    ``CHUNK_BYTES``)."""
    rows = (CHUNK_BYTES if nbytes is None else nbytes) // max(1, n_columns * itemsize)
    return int(min(max(rows, 16), max(n_rows, 1)))


def _use_packed(d, K):
    """Whether the packed products suit ``d`` features and ``K`` components."""
    T = d * (d + 1) // 2 + d + 1
    return (T * K * 8 <= _PACKED_MODEL_BYTES
            and CHUNK_BYTES // (T * 8) >= _PACKED_MIN_ROWS)


def _packed_index(d):
    """Row-major upper-triangle indices of a ``(d, d)`` matrix (pairs ``j <= l``)."""
    return np.triu_indices(d)


def _packed_products(Y, out):
    """``out[:, :T] = y_j y_l`` for ``j <= l`` (row-major upper triangle), then
    ``y``, 1.

    ``out`` has shape ``(n, T + d + 1)`` with ``T = d (d + 1) / 2``. It is the row-wise
    Khatri-Rao square of ``Y``, augmented so that one matrix product with it gives
    quadratic forms, linear terms and counts together.
    """
    n, d = Y.shape
    off = 0
    for j in range(d):
        np.multiply(Y[:, j:], Y[:, j:j + 1], out=out[:, off:off + d - j])
        off += d - j
    out[:, off:off + d] = Y
    out[:, off + d] = 1.0
    return out


def _packed_weights(precisions, means_shifted):
    """The ``(T + d + 1, K)`` matrix of :func:`_full_maha_packed` for these components.

    With ``y = x - g`` and ``m_k = mu_k - g``:
    ``(y - m_k)^T Lambda_k (y - m_k) = sum_{j<=l} c_jl Lambda_k[j, l] y_j y_l
    - 2 y^T Lambda_k m_k + m_k^T Lambda_k m_k`` with ``c_jj = 1``, ``c_jl = 2``.
    """
    K, d = means_shifted.shape
    iu = _packed_index(d)
    T = iu[0].size
    W = np.empty((T + d + 1, K))
    W[:T] = precisions[:, iu[0], iu[1]].T
    W[:T][iu[0] != iu[1]] *= 2.0
    lam_m = np.einsum("kij,kj->ki", precisions, means_shifted)
    W[T:T + d] = -2.0 * lam_m.T
    W[T + d] = np.einsum("ki,ki->k", lam_m, means_shifted)
    return W


def _representable(W, dtype):
    """Whether float64 values ``W`` (the packed weights, or a triangular estimate's
    factors and the bounds of its shifts) keep the error bound of their estimate
    (:mod:`emgmm.covariance._packed_estimate`) in ``dtype``: finite, and every nonzero
    entry a
    normal number of ``dtype`` (below that, rounding is absolute, not relative) and
    at most ``max * eps`` (so that a product underflowing to zero, off by at most
    ``tiny * u``, moves a term by less than 1e-13). A model beyond float32's range
    then has no float32 estimate; the plain path meets, and names, the data that put
    it there."""
    info = np.finfo(dtype)
    W = np.abs(W)
    nonzero = W[W != 0]
    return bool(np.isfinite(W).all() and (nonzero.size == 0 or (
        nonzero.min() >= info.tiny and nonzero.max() <= info.max * info.eps)))


def packed_chunk_rows(n, d):
    """Rows per chunk of :func:`_packed_chunks` for ``n`` rows of ``d`` features."""
    return chunk_rows(d * (d + 1) // 2 + d + 1, 8, n, PACKED_CHUNK_BYTES)


def _packed_chunks(X, g, dtype=np.float64):
    """Yield ``(r0, r1, y, P)`` over row chunks of ``X`` (``PACKED_CHUNK_BYTES``):
    ``y = x - g`` and its packed products ``P = [y_j y_l (j <= l), y, 1]`` (work
    buffers of ``dtype``, reused, borrowed from the thread's workspace: valid until
    the next chunk). The buffers are column-major, so that every product
    is formed over a contiguous column (row-major, each row's run is only ``d - j``
    long)."""
    n, d = X.shape
    cols = d * (d + 1) // 2 + d + 1
    rows = packed_chunk_rows(n, d)
    g = np.asarray(g, dtype=dtype)
    with borrow("packed", (rows, cols), dtype, "F") as P, \
            borrow("packed_y", (rows, d), dtype, "F") as Y:
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            m = r1 - r0
            np.subtract(X[r0:r1], g, out=Y[:m], casting="same_kind")
            yield r0, r1, Y[:m], _packed_products(Y[:m], P[:m])


def _full_maha_packed(X, g, W, out, y_norm=None):
    """Squared Mahalanobis distances by one GEMM per row chunk, in the dtype of ``W``.

    The packed products of a chunk (:func:`_packed_chunks`) times ``W``
    (:func:`_packed_weights`): ``n K d^2`` flops, half of a dense ``(x - mu) U`` per
    component. ``out`` is float64, best column-major (the GEMM then writes into it
    directly); a float32 ``W`` runs float32 GEMMs into a chunk buffer. ``y_norm``, if
    given, receives ``||x - g||`` per row (float64).
    """
    out_t = out.T
    direct = W.dtype == out.dtype and out_t.strides[1] == out.itemsize
    chunk = None
    for r0, r1, y, P in _packed_chunks(X, g, W.dtype):
        # (K, rows) = W^T P^T: with P column-major, as fast as P W
        if direct:
            np.matmul(W.T, P.T, out=out_t[:, r0:r1])
        else:
            if chunk is None:
                chunk = np.empty((W.shape[1], P.shape[0]), dtype=W.dtype)
            out_t[:, r0:r1] = np.matmul(W.T, P.T, out=chunk[:, :r1 - r0])
        if y_norm is not None:
            np.sqrt(np.einsum("ij,ij->i", y, y, dtype=np.float64), out=y_norm[r0:r1])
    np.maximum(out, 0.0, out=out)
    return out


def _full_maha_dense(X, g, means_shifted, precisions_cholesky, components, out):
    """Squared Mahalanobis distances ``||(x - mu_k) U_k||^2`` for ``components``.

    ``U_k`` is upper triangular, so column block ``j`` (columns ``c0:c1``, width
    ``TRIANGLE_BLOCK``) of ``(x - mu_k) U_k`` involves only the first ``c1``
    features: it is ``y[:, :c1] U_k[:c1, c0:c1] - m_k U_k[:, c0:c1]`` with
    ``y = x - g`` and ``m_k = mu_k - g``. One GEMM per column block, batched over
    components, the constant subtracted after it (so that each sum starts from the
    data's terms, not from ``m_k U_k``), then squares and row sums, added up over the
    blocks: ``n K d^2 (1 + h/d)`` flops for blocks of width ``h``, against
    ``2 n K d^2`` for dense products that ignore the triangle, and every product
    is numpy's (scipy's ``trmm`` holds the GIL, so row threads would take turns on
    it). The GEMMs run in the dtype of ``X``
    (float32 mode runs float32 GEMMs; the rounding is relative to ``|x - g|`` and
    ``|m_k|``, linear in them; each block's row sums are float32 there, and are added
    up over the blocks in float64).
    """
    n, d = X.shape
    dtype = X.dtype
    h = min(d, TRIANGLE_BLOCK)
    kb = max(1, min(len(components), _GEMM_COLUMNS // h))
    rows = chunk_rows(kb * h, dtype.itemsize, n)
    Y = np.subtract(X, g, dtype=dtype, casting="same_kind")
    Z = np.empty(rows * kb * h, dtype=dtype)
    part = np.empty((rows, kb), dtype=dtype)
    acc = np.empty((n, kb))
    for b0 in range(0, len(components), kb):
        batch = components[b0:b0 + kb]
        nb = len(batch)
        total = acc[:, :nb]
        for c0 in range(0, d, h):
            c1 = min(c0 + h, d)
            w = c1 - c0
            # at most d x _GEMM_COLUMNS values; the factors are read in place (a copy
            # of the batch's factors would be nb d^2 values)
            W = np.empty((c1, nb, w))
            shift = np.empty((nb, w))
            for i, k in enumerate(batch):
                u = precisions_cholesky[k, :c1, c0:c1]
                np.matmul(means_shifted[k, :c1], u, out=shift[i])
                W[:, i] = u
            W = W.reshape(c1, nb * w).astype(dtype, copy=False)
            shift = shift.reshape(nb * w).astype(dtype, copy=False)
            for r0 in range(0, n, rows):
                r1 = min(r0 + rows, n)
                m = r1 - r0
                z = Z[:m * nb * w].reshape(m, nb * w)
                np.matmul(Y[r0:r1, :c1], W, out=z)
                z -= shift
                np.multiply(z, z, out=z)
                if c0 == 0:
                    np.add.reduce(z.reshape(m, nb, w), axis=2, out=total[r0:r1])
                else:
                    total[r0:r1] += np.add.reduce(z.reshape(m, nb, w), axis=2,
                                                  out=part[:m, :nb])
        out[:, batch] = total
    return out


def full_mahalanobis(X, means, precisions_cholesky, g, out=None):
    """Squared Mahalanobis distances of every row to every 'full' component, (n, K),
    float64: in ``out`` if given (best column-major), around the shift ``g`` (d,).

    The triangular products of :func:`_full_maha_dense` for every component: their
    rounding is linear in ``|x - g|`` and ``|mu_k - g|``. The packed products are
    cheaper but cancel within each quadratic form; they are used only where a
    rounding bound per pair vouches for them
    (:mod:`emgmm.covariance._packed_estimate`): on a covariance of condition number
    1e12 they were 2e-4 nats off.
    """
    K = means.shape[0]
    # The rows are shifted by g in the compute dtype: shift the means by the very
    # same (rounded) g, or float32 data far from the origin sees every component
    # displaced by the rounding of g (up to half an ulp of |g|).
    g = np.asarray(g).astype(X.dtype).astype(np.float64)
    means_shifted = np.asarray(means, dtype=np.float64) - g
    u64 = np.asarray(precisions_cholesky, dtype=np.float64)
    maha = np.empty((X.shape[0], K)) if out is None else out
    return _full_maha_dense(X, g.astype(X.dtype), means_shifted, u64, np.arange(K),
                            maha)


def log_gaussian_prob(X, means, precisions_cholesky, covariance_type, weights=None):
    """Log-density of every row under every component.

    ``log N(x | mu_k, Lambda_k) = -d/2 log(2 pi) + sum_j log U_k[j, j]
    - 1/2 ||(x - mu_k) U_k||^2`` (Bishop eq. 2.43 with ``Lambda_k = U_k U_k^T``).

    For 'full' the squared distances are ``||(y - m_k) U_k||^2`` with ``y = x - g``
    and ``m_k = mu_k - g`` around the mixture mean ``g``, by column blocks of the
    triangular ``U_k``, batched over several components at once
    (:func:`_full_maha_dense`): their rounding is linear in ``|y|`` and ``|m_k|``.
    (The cheaper packed products, whose rounding can cancel within each quadratic
    form, serve only the refined E step of
    :mod:`emgmm.covariance._packed_estimate`, which bounds their error per pair.)
    For 'tied', 'diag' and 'spherical' the squared distances are expanded around the
    same shift so that the work is a few matrix products, in float64; a component
    whose expansion may lose more than ``_REFINE_TOL`` (far from the shift relative
    to its spread, by a rounding bound per component) is recomputed directly.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block. It is not modified. Its dtype is the compute dtype.
    means : ndarray of shape (K, d)
    precisions_cholesky : ndarray
        Shapes as in :func:`~emgmm.covariance._cholesky.factorize`.
    covariance_type : str or CovarianceType
    weights : ndarray of shape (K,), optional
        Only used to choose the shift (mixture mean); uniform when omitted. Does not
        change the result beyond rounding.

    Returns
    -------
    log_prob : ndarray of shape (n, K), float64
    """
    return log_prob(X, means, precisions_cholesky, covariance_type, weights, False)


@dataclass
class CentredProducts:
    """``Z = [(x - g)^2, x - g, 1]`` of a block (float64, shape ``(n, 2d + 1)``) around
    the shift ``g`` (shape ``(d,)``): the operand of the 'diag'/'spherical' E step,
    kept for the M step of the same block (:func:`block_statistics`)."""

    Z: np.ndarray
    shift: np.ndarray


def centred_products(X, means, weights):
    """:class:`CentredProducts` of ``X`` (n, d) around the mixture mean
    ``g = sum_k w_k mu_k / sum_k w_k`` of ``means`` (K, d) and ``weights`` (K,)."""
    return centred_products_around(X, _shift(means, weights))


def centred_products_around(X, g):
    """:class:`CentredProducts` of ``X`` (n, d) around the shift ``g`` (d,)."""
    n, d = X.shape
    Z = np.empty((n, 2 * d + 1))
    Y = Z[:, d:2 * d]
    np.subtract(X, g, out=Y, dtype=np.float64)
    np.multiply(Y, Y, out=Z[:, :d])
    Z[:, 2 * d] = 1.0
    return CentredProducts(Z, g)


def log_prob(X, means, precisions_cholesky, covariance_type, weights, add_log_weights,
             products=None, margin=None, out=None):
    """:func:`log_gaussian_prob`, plus ``log w_k`` if ``add_log_weights``; 'diag' and
    'spherical' use ``products`` (:func:`centred_products` of ``X``) if given, and
    with a ``margin`` recompute only the pairs that may lie within it of their row's
    best (see :func:`~emgmm._engine.estep.weighted_log_prob`). 'full' writes into
    ``out`` if given. The shift of the expanded distances is the mixture mean of
    ``weights`` (uniform when ``None``), or the shift of ``products``."""
    kind = get_covariance_type(covariance_type)
    X = np.asarray(X)
    d = X.shape[1]
    K = means.shape[0]
    offset = kind.log_det_cholesky(precisions_cholesky, d) - 0.5 * d * _LOG_2PI
    if add_log_weights:
        with np.errstate(divide="ignore"):
            offset = offset + np.log(np.asarray(weights, dtype=np.float64))
    if products is not None:
        g = products.shift
    else:
        g = _shift(means, np.ones(K) if weights is None else weights)
    return kind.log_prob(X, means, precisions_cholesky, g, offset, margin, products,
                         out)


def expanded_log_prob(X, means, precisions, g, offset, margin=None, products=None):
    """'diag' and 'spherical': one product of ``[y^2, y, 1]`` (``y = x - g``, the
    ``products`` if given) with the coefficients of ``offset_k - 1/2 (y - m_k)^T
    Lambda_k (y - m_k)``, in float64 (the expansion cancels, so it must not run in
    float32); ``precisions`` (K, d) are the diagonals of ``Lambda_k``. A component
    whose expansion may lose more than ``_REFINE_TOL`` is recomputed directly."""
    n, d = X.shape
    if products is None:
        products = centred_products_around(X, g)
    M = np.asarray(means, dtype=np.float64) - products.shift
    prec = precisions
    A = np.concatenate([-0.5 * prec.T, (M * prec).T,
                        (offset - 0.5 * (M**2 * prec).sum(axis=1))[None, :]])
    # (K, n) C-ordered, returned as its (n, K) transpose: the row-wise softmax then
    # reduces over contiguous columns (see estimate_resp)
    out = (A.T @ products.Z.T).T
    # The expansion cancels for a tight component far from the shift; the rounding
    # of the product is at most gamma_m times the sum of the magnitudes of its terms,
    # b_k = 1/2 max_j Lambda_kj (max_i ||y_i|| + ||m_k||)^2 + |c_k| (Higham 2002,
    # eq. 3.5; m = 2d + 4). Where b_k may exceed _REFINE_TOL, the pairs of component
    # k are recomputed directly: all of them, or with a margin those that may lie
    # within it of their row's best. (||y_i||^2 as a product with ones: faster than
    # a strided reduction.)
    if n:
        gamma = _gamma(2 * d + 4, np.float64)
        y_max = np.sqrt((products.Z[:, :d] @ np.ones(d)).max())
        # (a zero weight's constant, -inf, is exact)
        constant = np.where(np.isfinite(A[-1]), np.abs(A[-1]), 0.0)
        reach = y_max + np.linalg.norm(M, axis=1)
        bound = gamma * (0.5 * prec.max(axis=1) * reach ** 2 + constant)

        def exact(k, rows):
            diff = np.subtract(X[rows], means[k], dtype=np.float64)
            diff *= diff
            return offset[k] - 0.5 * (diff @ prec[k])

        _recompute_inexact(out, bound, margin, exact)
    return out


def tied_log_prob(X, means, precisions_cholesky, g, offset, margin=None):
    """'tied': ``offset_k - 1/2 ||(x - mu_k) U||^2`` expanded around the shift ``g``,
    ``||y U||^2 - 2 (y U) . (m_k U) + ||m_k U||^2`` with ``y = x - g`` and ``m_k = mu_k
    - g`` (two products for every pair), and recomputed directly where that may lose
    digits (components far from ``g`` relative to their spread).

    The products ``a = y U`` and ``b = m_k U`` are off by at most ``gamma_{d+1}
    sqrt(rho) (||y|| + ||m_k||)`` in norm (``rho = max_j (|U| |U|^T 1)_j``, at least
    the squared spectral norm of ``|U|``), and the expansion adds at most
    ``gamma_{d+3} (||a|| + ||b||)^2`` (Higham 2002, eq. 3.5), so the squared
    distance is within ``3.01 gamma_{d+3} rho (||y|| + ||m_k||)^2``; half of it
    (with ``gamma |offset_k|`` for the final sum, and ``max_i ||y_i||`` over the
    block) is each component's bound in ``log N``.
    """
    n, d = X.shape
    K = means.shape[0]
    offset = np.broadcast_to(offset, (K,))  # a scalar without the log-weights
    M = np.asarray(means, dtype=np.float64) - g
    u = np.asarray(precisions_cholesky, dtype=np.float64)
    Y = np.subtract(X, g, dtype=np.float64)
    y_max = np.sqrt(np.einsum("ij,ij->i", Y, Y).max(initial=0.0))
    Yu = Y @ u
    del Y
    Mu = M @ u
    out = (np.einsum("ij,ij->i", Yu, Yu)[:, None]
           - 2.0 * (Yu @ Mu.T)
           + np.einsum("ij,ij->i", Mu, Mu)[None, :])
    del Yu
    np.maximum(out, 0.0, out=out)
    out *= -0.5
    out += offset
    if n:
        gamma = _gamma(d + 3, np.float64)
        abs_u = np.abs(u)
        rho = (abs_u @ abs_u.sum(axis=0)).max(initial=0.0)
        constant = np.where(np.isfinite(offset), np.abs(offset), 0.0)
        bound = gamma * (1.51 * rho * (y_max + np.linalg.norm(M, axis=1)) ** 2
                         + constant)

        def exact(k, rows):
            z = np.subtract(X[rows], means[k], dtype=np.float64) @ u
            return offset[k] - 0.5 * np.einsum("ij,ij->i", z, z)

        _recompute_inexact(out, bound, margin, exact)
    return out


def _recompute_inexact(out, bound, margin, exact):
    """Recompute in place the pairs of every component whose bound (nats, one per
    component) may exceed ``_REFINE_TOL``: all its rows, or with a ``margin`` the
    rows where it may lie within the margin of the row's best (by the bounds).
    ``exact(k, rows)`` gives their values."""
    inexact = np.flatnonzero(~(bound <= _REFINE_TOL))
    if inexact.size and margin is not None:
        floor = (out.T - bound[:, None]).max(axis=0) - margin
    for k in inexact:
        rows = (slice(None) if margin is None
                else np.flatnonzero(out[:, k] + bound[k] >= floor))
        out[rows, k] = exact(k, rows)


def relevance_margin(resp_threshold):
    """Nats below a row's best component beyond which a pair cannot reach the threshold.

    A pair whose weighted log-density lies more than ``log(1 / resp_threshold)`` below
    its row's largest has ``r_ik < resp_threshold``; two nats are added for safety.

    Parameters
    ----------
    resp_threshold : float
        In ``[0, 1)``.

    Returns
    -------
    float or None
        ``None`` for ``resp_threshold == 0`` (every pair must be exact).
    """
    if resp_threshold <= 0.0:
        return None
    return float(min(np.log(1.0 / resp_threshold), _LOG_RANGE) + 2.0)


# Pairs whose error bound in log N is at most this keep the packed estimate
# (the bound is worst-case; typical rounding is ~100x smaller).
_REFINE_TOL = 1e-9
