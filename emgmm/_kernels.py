"""Pure numerical kernels of blocked EM for Gaussian mixtures.

Every function here works on one block of rows and on the model parameters it is given;
none keeps state, reads files or starts workers. The orchestration lives in
:mod:`emgmm._em`.

Notation (Bishop, *Pattern Recognition and Machine Learning*, 2006, section 9.2):
``X`` is a block of ``n`` rows and ``d`` features, ``K`` the number of components,
``w_k`` the weights, ``mu_k`` the means, ``Lambda_k`` the precision matrices and
``U_k`` their upper-triangular Cholesky factors with ``U_k @ U_k.T == Lambda_k``
(scikit-learn's ``precisions_cholesky_`` convention). ``r_ik`` are the
responsibilities (eq. 9.23) and ``c_k`` the centres the sufficient statistics are
accumulated around (the means of the previous iteration).
"""

from dataclasses import dataclass

import numpy as np
from scipy import linalg, sparse

from ._blas import single_blas_thread

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")

_LOG_2PI = np.log(2.0 * np.pi)
# log(1 / smallest subnormal float64): exp() of anything lower is exactly zero
_LOG_RANGE = 745.2
#: Margin (nats) of the scoring passes: the pairs left estimated change a row's
#: log-likelihood by less than exp(-50) ~ 2e-22 relative, and never hold its argmax.
SCORE_MARGIN = 50.0


def _ill_defined_message(component, dtype):
    """Error text for a covariance that is not positive definite (sklearn's wording)."""
    where = "" if component is None else f" (component {component})"
    msg = (
        "Fitting the mixture model failed because some components have "
        f"ill-defined empirical covariance{where} (for instance caused by singleton "
        "or collapsed samples). Try to decrease the number of components, "
        "increase reg_covar, or scale the input data."
    )
    if np.dtype(dtype) == np.float32:
        msg += (
            " The numerical accuracy can also be improved by passing float64"
            " data instead of float32."
        )
    return msg


# --------------------------------------------------------------------------------------
# Parameterisation: covariances <-> precision Cholesky factors


def factorize(covariances, covariance_type, dtype=np.float64):
    """Precision Cholesky factors and the components whose covariance is not PD.

    A component also counts as not positive definite when its factor is so large that
    its precision matrix would overflow ``dtype`` (a covariance within rounding of
    singular, possible with ``reg_covar=0``).

    Parameters
    ----------
    covariances : ndarray
        sklearn's shapes, float64.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    dtype : numpy dtype, default=float64
        The dtype the fitted precisions are stored in.

    Returns
    -------
    precisions_cholesky : ndarray
        Rows of bad components are left as NaN.
    bad : list of int
        For 'tied', ``[0]`` means the shared covariance failed.
    """
    d = covariances.shape[-1] if covariance_type in ("full", "tied", "diag") else 1
    # |U_ij| below this keeps every entry of U U^T (a sum of d products) finite
    limit = np.sqrt(np.finfo(dtype).max / d)
    if covariance_type in ("full", "tied"):
        stack = covariances if covariance_type == "full" else covariances[np.newaxis]
        out = np.full_like(stack, np.nan)
        eye = np.eye(stack.shape[-1])
        bad = []
        for k, cov in enumerate(stack):
            try:
                chol = linalg.cholesky(cov, lower=True, check_finite=True)
            except (linalg.LinAlgError, ValueError):
                bad.append(k)
                continue
            u = linalg.solve_triangular(chol, eye, lower=True).T
            if not np.all(np.abs(u) < limit):
                bad.append(k)
                continue
            out[k] = u
        return (out if covariance_type == "full" else out[0]), bad
    with np.errstate(divide="ignore", invalid="ignore"):
        u = 1.0 / np.sqrt(covariances)
    ok = (covariances > 0.0) & (u < limit)
    if covariance_type == "diag":
        ok = ok.all(axis=1)
    out = np.full_like(covariances, np.nan)
    out[ok] = u[ok]
    return out, [int(k) for k in np.flatnonzero(~ok)]


def precisions_cholesky_from_covariances(covariances, covariance_type):
    """Upper Cholesky factors of the precisions, from the covariances.

    For a covariance ``Sigma = L L^T`` (``L`` lower triangular) the precision factor is
    ``U = L^{-T}``, upper triangular, with ``U U^T = Sigma^{-1}`` (scikit-learn's
    ``_compute_precision_cholesky``).

    Parameters
    ----------
    covariances : ndarray
        ``(K, d, d)`` for 'full', ``(d, d)`` for 'tied', ``(K, d)`` for 'diag',
        ``(K,)`` for 'spherical'; float32 or float64.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    precisions_cholesky : ndarray
        Same shape and dtype as ``covariances``.

    Raises
    ------
    ValueError
        If a covariance is not positive definite (see :func:`factorize`); the message
        names the component.
    """
    covariances = np.asarray(covariances)
    u, bad = factorize(covariances, covariance_type, covariances.dtype)
    if bad:
        raise ValueError(_ill_defined_message(
            None if covariance_type == "tied" else bad[0], covariances.dtype))
    return u


def precisions_cholesky_from_precisions(precisions, covariance_type):
    """Upper Cholesky factors ``U`` with ``U U^T = precision``.

    The upper factor of ``Lambda`` is ``J chol(J Lambda J) J`` with ``J`` the exchange
    matrix (scikit-learn issue #26415).

    Parameters
    ----------
    precisions : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    precisions_cholesky : ndarray
        Same shape and dtype as ``precisions``.

    Raises
    ------
    ValueError
        If a precision matrix is not positive definite; names the component.
    """
    precisions = np.asarray(precisions)
    if covariance_type in ("full", "tied"):
        stack = precisions if covariance_type == "full" else precisions[np.newaxis]
        out = np.empty_like(stack)
        for k, prec in enumerate(stack):
            try:
                lower = linalg.cholesky(prec[::-1, ::-1], lower=True)
            except linalg.LinAlgError:
                raise ValueError(
                    f"'{covariance_type} precision' of component {k} is not "
                    "positive definite"
                ) from None
            out[k] = lower[::-1, ::-1]
        return out if covariance_type == "full" else out[0]
    return np.sqrt(precisions)


def precisions_from_cholesky(precisions_cholesky, covariance_type):
    """Precisions ``U U^T`` from their upper Cholesky factors.

    Parameters
    ----------
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    precisions : ndarray
        Same shape and dtype.
    """
    u = np.asarray(precisions_cholesky)
    if covariance_type == "full":
        return np.matmul(u, np.swapaxes(u, 1, 2))
    if covariance_type == "tied":
        return u @ u.T
    return u**2


def covariances_from_cholesky(precisions_cholesky, covariance_type):
    """Covariances ``(U U^T)^{-1} = U^{-T} U^{-1}`` from the precision factors.

    Parameters
    ----------
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    covariances : ndarray
        Same shape and dtype.
    """
    u = np.asarray(precisions_cholesky)
    if covariance_type in ("full", "tied"):
        stack = u if covariance_type == "full" else u[np.newaxis]
        eye = np.eye(stack.shape[-1], dtype=u.dtype)
        out = np.empty_like(stack)
        for k, uk in enumerate(stack):
            u_inv = linalg.solve_triangular(uk, eye, lower=False)
            out[k] = u_inv.T @ u_inv
        return out if covariance_type == "full" else out[0]
    return 1.0 / u**2


def log_det_cholesky(precisions_cholesky, covariance_type, n_features):
    """``log det U_k = 1/2 log det Lambda_k`` for each component.

    Parameters
    ----------
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    n_features : int

    Returns
    -------
    log_det : ndarray of shape (K,) for 'full', 'diag', 'spherical', or a float64
        scalar for 'tied'.
    """
    u = np.asarray(precisions_cholesky, dtype=np.float64)
    if covariance_type == "full":
        return np.log(np.diagonal(u, axis1=1, axis2=2)).sum(axis=1)
    if covariance_type == "tied":
        return np.log(np.diag(u)).sum()
    if covariance_type == "diag":
        return np.log(u).sum(axis=1)
    return n_features * np.log(u)


# --------------------------------------------------------------------------------------
# E step


def _shift(means, weights):
    """A common centre for the expanded distance formulas: the mixture mean."""
    weights = np.asarray(weights, dtype=np.float64)
    total = weights.sum()
    if not total > 0.0:
        weights, total = np.ones(len(weights)), float(len(weights))
    return (weights / total) @ np.asarray(means, dtype=np.float64)


def _gamma(m, dtype):
    """Higham's ``gamma_m = m u / (1 - m u)`` for the unit roundoff ``u`` of ``dtype``."""
    unit = np.finfo(dtype).eps / 2
    return m * unit / (1.0 - m * unit)


# Every product of the passes is numpy's ``matmul``, which releases the GIL; scipy's
# BLAS wrappers (``trmm``, ``syrk``) hold it while they run, so that row threads
# calling them take turns (two threads doing ``trmm`` on [2000, 400] blocks took as
# long as one doing both). numpy sends ``W.T @ W`` to ``syrk`` itself; the triangular
# factor products of ``refine`` take twice the flops of ``trmm``. Alternating
# 5-iteration fits (two pairs each, with two row threads; not in the results files):
# float32 iterations of [100k, 64], K=200 'full' ~9% faster, the patch data ~13%,
# float64 the same. The same products everywhere also keep results bitwise equal
# across schedules and ``n_jobs`` (with one BLAS thread per task).

# Sizes of the work buffers of the 'full' kernels. Row chunks are cut so that the
# buffer a chunk's matrix product writes stays within a few MiB (cache-sized), and
# products are batched over components so that every GEMM is wide enough to run near
# the BLAS peak rate (measured on OpenBLAS 0.3, 2 cores).
_GEMM_COLUMNS = 1024      # columns of one batched product (components x features)
# Width of the column blocks of the triangular factor in _full_maha_dense: narrower
# blocks skip more of the zero triangle but make thinner GEMMs (d = 400 and 900 on one
# thread: 32 and 64 fastest, 1.6-1.7x over dense products; 128: 1.4-1.7x).
_TRIANGLE_BLOCK = 64
_CHUNK_BYTES = 4 * 2**20  # bytes of one row chunk's product buffer
# The packed formulation (below) is used while its packed model fits in this many bytes
# and _CHUNK_BYTES of float64 packed products still hold _PACKED_MIN_ROWS rows (the
# cut-off at d ~ 90, beyond which the dense products run nearer the GEMM rate).
_PACKED_MODEL_BYTES = 64 * 2**20
_PACKED_MIN_ROWS = 128
# ... and only for components whose |m_k|^T |Lambda_k| |m_k| (m_k = mu_k - shift) is
# at most this: its float64 rounding error then stays below ~1e-10 in log N.
_PACKED_MAX_AMPLIFICATION = 1e5
# Bytes of one row chunk of float64 packed products (float32 chunks have as many rows).
# Larger than _CHUNK_BYTES: the thin side of their GEMM is the K components, and more
# rows per call amortise the packing of the (T, K) weights that each call repeats
# (d=64, K=200: 244 -> 977 rows took a block's estimate from 300 to 260 ms on one
# thread and 5-iteration fits from 1.62 to 1.38 s per iteration in float64; float32
# gained ~3% on one thread, nothing in a fit). Each thread holds one such buffer
# (16 MiB at d=64, beside its block's (n, K) arrays: not counted in working_memory).
_PACKED_CHUNK_BYTES = 16 * 2**20


def _chunk_rows(n_columns, itemsize, n_rows, nbytes=None):
    """Rows per chunk so that a ``(rows, n_columns)`` buffer holds ``nbytes`` (default
    ``_CHUNK_BYTES``)."""
    rows = (_CHUNK_BYTES if nbytes is None else nbytes) // max(1, n_columns * itemsize)
    return int(min(max(rows, 16), max(n_rows, 1)))


def _use_packed(d, K):
    """Whether the packed products suit ``d`` features and ``K`` components."""
    T = d * (d + 1) // 2 + d + 1
    return T * K * 8 <= _PACKED_MODEL_BYTES and _CHUNK_BYTES // (T * 8) >= _PACKED_MIN_ROWS


def _packed_index(d):
    """Row-major upper-triangle indices of a ``(d, d)`` matrix (pairs ``j <= l``)."""
    return np.triu_indices(d)


def _packed_products(Y, out):
    """``out[:, :T] = y_j y_l`` for ``j <= l`` (row-major upper triangle), then ``y``, 1.

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


def _packed_amplification(means_shifted, precisions):
    """``|m_k|^T |Lambda_k| |m_k|`` per component (float64 rounding amplification)."""
    a = np.abs(means_shifted)
    return (np.matmul(np.abs(precisions), a[:, :, None])[:, :, 0] * a).sum(axis=1)


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
    """Whether the float64 packed weights ``W`` keep the error bound of
    :class:`PackedEstimate` in ``dtype``: finite, and every nonzero entry a normal
    number of ``dtype`` (below that, rounding is absolute, not relative) and at most
    ``max * eps`` (so that a product underflowing to zero, off by at most
    ``tiny * u``, moves a term by less than 1e-13). A model beyond float32's range
    then has no float32 estimate; the plain path meets, and names, the data that put
    it there."""
    info = np.finfo(dtype)
    W = np.abs(W)
    nonzero = W[W != 0]
    return bool(np.isfinite(W).all() and (nonzero.size == 0 or (
        nonzero.min() >= info.tiny and nonzero.max() <= info.max * info.eps)))


def _packed_chunks(X, g, dtype=np.float64):
    """Yield ``(r0, r1, y, P)`` over row chunks of ``X`` (``_PACKED_CHUNK_BYTES``):
    ``y = x - g`` and its packed products ``P = [y_j y_l (j <= l), y, 1]`` (work
    buffers of ``dtype``, reused). The buffers are column-major, so that every product
    is formed over a contiguous column (row-major, each row's run is only ``d - j``
    long: 2.5-3.5x slower at d = 64)."""
    n, d = X.shape
    cols = d * (d + 1) // 2 + d + 1
    rows = _chunk_rows(cols, 8, n, _PACKED_CHUNK_BYTES)
    P = np.empty((rows, cols), dtype=dtype, order="F")
    Y = np.empty((rows, d), dtype=dtype, order="F")
    g = np.asarray(g, dtype=dtype)
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
    ``_TRIANGLE_BLOCK``) of ``(x - mu_k) U_k`` involves only the first ``c1``
    features: it is ``y[:, :c1] U_k[:c1, c0:c1] - m_k U_k[:, c0:c1]`` with
    ``y = x - g`` and ``m_k = mu_k - g``. One GEMM per column block, batched over
    components, the constant subtracted after it (so that each sum starts from the
    data's terms, not from ``m_k U_k``), then squares and row sums, added up over the
    blocks: ``n K d^2 (1 + h/d)`` flops for blocks of width ``h``, against
    ``2 n K d^2`` for dense products that ignore the triangle (about 1.6x faster at
    d = 400-900), and every product is numpy's (scipy's ``trmm`` holds the GIL, so
    row threads would take turns on it). The GEMMs run in the dtype of ``X``
    (float32 mode runs float32 GEMMs; the rounding is relative to ``|x - g|`` and
    ``|m_k|``, linear in them; each block's row sums are float32 there, and are added
    up over the blocks in float64).
    """
    n, d = X.shape
    dtype = X.dtype
    h = min(d, _TRIANGLE_BLOCK)
    kb = max(1, min(len(components), _GEMM_COLUMNS // h))
    rows = _chunk_rows(kb * h, dtype.itemsize, n)
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


def _full_maha(X, means, precisions_cholesky, weights):
    """Squared Mahalanobis distances of every row to every 'full' component, (n, K)."""
    n, d = X.shape
    K = means.shape[0]
    g = _shift(means, weights if weights is not None else np.ones(K))
    # The rows are shifted by g in the compute dtype: shift the means by the very
    # same (rounded) g, or float32 data far from the origin sees every component
    # displaced by the rounding of g (up to half an ulp of |g|).
    g = g.astype(X.dtype).astype(np.float64)
    means_shifted = np.asarray(means, dtype=np.float64) - g
    u64 = np.asarray(precisions_cholesky, dtype=np.float64)
    maha = np.empty((n, K), dtype=np.float64)
    dense = np.arange(K)
    if X.dtype == np.float64 and _use_packed(d, K) and n * K > 0:
        precisions = np.matmul(u64, np.swapaxes(u64, 1, 2))
        ok = _packed_amplification(means_shifted, precisions) <= _PACKED_MAX_AMPLIFICATION
        if ok.all():
            return _full_maha_packed(X, g, _packed_weights(precisions, means_shifted),
                                     maha)
        if ok.sum() * 2 > K:
            packed = np.flatnonzero(ok)
            W = _packed_weights(precisions[packed], means_shifted[packed])
            maha[:, packed] = _full_maha_packed(X, g, W, np.empty((n, packed.size)))
            dense = np.flatnonzero(~ok)
    return _full_maha_dense(X, g.astype(X.dtype), means_shifted, u64, dense, maha)


def log_gaussian_prob(X, means, precisions_cholesky, covariance_type, weights=None):
    """Log-density of every row under every component.

    ``log N(x | mu_k, Lambda_k) = -d/2 log(2 pi) + sum_j log U_k[j, j]
    - 1/2 ||(x - mu_k) U_k||^2`` (Bishop eq. 2.43 with ``Lambda_k = U_k U_k^T``).

    For 'full' in float64 the squared distances are, per chunk of rows, one matrix
    product of the packed products ``[y_j y_l (j <= l), y, 1]`` of ``y = x - g`` (``g``
    the mixture mean) with the packed precisions: ``n K d^2`` flops at the GEMM rate.
    Components whose mean lies so far from ``g`` (in their own metric) that this
    expansion would lose more than ~1e-10 in ``log N``, and float32 data, use instead
    ``(x - mu_k) U_k`` by column blocks of the triangular ``U_k``, batched over several
    components at once (:func:`_full_maha_dense`), whose rounding is linear in
    ``|x - g|`` and ``|mu_k - g|``.
    For 'tied', 'diag' and 'spherical' the squared distances are expanded around the
    same shift so that the work is a few matrix products, in float64.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block. It is not modified. Its dtype is the compute dtype.
    means : ndarray of shape (K, d)
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    weights : ndarray of shape (K,), optional
        Only used to choose the shift (mixture mean); uniform when omitted. Does not
        change the result beyond rounding.

    Returns
    -------
    log_prob : ndarray of shape (n, K), float64
    """
    return _log_prob(X, means, precisions_cholesky, covariance_type, weights, False)


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
    n, d = X.shape
    g = _shift(means, weights)
    Z = np.empty((n, 2 * d + 1))
    Y = Z[:, d:2 * d]
    np.subtract(X, g, out=Y, dtype=np.float64)
    np.multiply(Y, Y, out=Z[:, :d])
    Z[:, 2 * d] = 1.0
    return CentredProducts(Z, g)


def _log_prob(X, means, precisions_cholesky, covariance_type, weights, add_log_weights,
              products=None, margin=None):
    """:func:`log_gaussian_prob`, plus ``log w_k`` if ``add_log_weights``; 'diag' and
    'spherical' use ``products`` (:func:`centred_products` of ``X``) if given, and
    with a ``margin`` recompute only the pairs that may lie within it of their row's
    best (see :func:`weighted_log_prob`)."""
    X = np.asarray(X)
    n, d = X.shape
    K = means.shape[0]
    offset = log_det_cholesky(precisions_cholesky, covariance_type, d) - 0.5 * d * _LOG_2PI
    if add_log_weights:
        with np.errstate(divide="ignore"):
            offset = offset + np.log(np.asarray(weights, dtype=np.float64))
    if covariance_type == "full":
        out = _full_maha(X, means, precisions_cholesky, weights)
        out *= -0.5
        out += offset
        return out
    # Few products around one shift, in float64: the expansion cancels, so it must
    # not run in float32.
    if covariance_type == "tied":
        g = _shift(means, np.full(K, 1.0 / K) if weights is None else weights)
        M = np.asarray(means, dtype=np.float64) - g
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        Yu = np.subtract(X, g, dtype=np.float64) @ u
        Mu = M @ u
        maha = (
            np.einsum("ij,ij->i", Yu, Yu)[:, None]
            - 2.0 * (Yu @ Mu.T)
            + np.einsum("ij,ij->i", Mu, Mu)[None, :]
        )
        np.maximum(maha, 0.0, out=maha)
        maha *= -0.5
        maha += offset
        return maha
    # 'diag' and 'spherical': one product of [y^2, y, 1] with the coefficients of
    # log w_k - 1/2 log|2 pi Sigma_k| - 1/2 (y - m_k)^T Lambda_k (y - m_k)
    if products is None:
        products = centred_products(X, means, np.full(K, 1.0 / K) if weights is None
                                    else weights)
    M = np.asarray(means, dtype=np.float64) - products.shift
    prec = np.asarray(precisions_cholesky, dtype=np.float64) ** 2
    if covariance_type == "spherical":
        prec = np.repeat(prec[:, None], d, axis=1)
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
        bound = gamma * (0.5 * prec.max(axis=1) * (y_max + np.linalg.norm(M, axis=1)) ** 2
                         + constant)
        inexact = np.flatnonzero(~(bound <= _REFINE_TOL))
        if inexact.size and margin is not None:
            floor = (out.T - bound[:, None]).max(axis=0) - margin
        for k in inexact:
            rows = (slice(None) if margin is None
                    else np.flatnonzero(out[:, k] + bound[k] >= floor))
            diff = np.subtract(X[rows], means[k], dtype=np.float64)
            diff *= diff
            out[rows, k] = offset[k] - 0.5 * (diff @ prec[k])
    return out


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
# The refined E step probes this many rows first; if more than _REFINE_MAX_DENSITY of
# their pairs, beyond one per row, would need the exact recomputation (broad
# components, ill-conditioned precisions), the block takes the plain path of
# log_gaussian_prob instead.
_REFINE_PROBE_ROWS = 512
_REFINE_MAX_DENSITY = 0.3
# PackedEstimate.to_refine: while every row's uniform bound (at least each of its
# pairs' bounds) is at most _UNIFORM_BOUND nats, as in float64, one comparison with the
# row's best estimate finds the candidates (d=64, K=200, one thread: 4 ms per block of
# 12500 rows); beyond, every bound is evaluated, in row chunks of _BOUND_CHUNK_BYTES
# per work array (11-13 ms; 12-20 ms with the 4 MiB chunks and more passes of before).
# The candidates are then taken a chunk of components at a time (_BOUND_CHUNK_BYTES
# per array of their indices and bounds): all at once, the first pass of A (broad
# components, nearly every pair a candidate) took 96 MB per block for them.
_UNIFORM_BOUND = 1.0
_BOUND_CHUNK_BYTES = 2**20


#: Power iterations behind :func:`_abs_spectral_bound` (4 gave within 0.4% of the
#: spectral radius on fitted 64-feature precisions, the worst of 200).
_SPECTRAL_ITERATIONS = 6


def _abs_spectral_bound(A):
    """Upper bounds of the spectral radii of nonnegative ``A`` (K, d, d), each with a
    positive diagonal (``|Lambda_k|``).

    Collatz-Wielandt: ``rho(A) <= max_j (A v)_j / v_j`` for every positive ``v``
    (Horn and Johnson, *Matrix Analysis*, 2nd ed., 2013, Cor. 8.1.29); ``v`` from a
    few power iterations started at ones stays positive (the diagonal is), and the
    bound then comes within a few percent of the radius (0.4% at most on 200 fitted
    64-feature precisions). Raised by ``gamma_{d+2}`` for its own float64 rounding.
    NaN where ``A`` overflows, or where ``v`` underflows (diagonal entries some 50
    decades apart): the caller then keeps its cruder bound (``np.fmin``).
    """
    K, d, _ = A.shape
    v = np.ones((K, d, 1))
    for _ in range(_SPECTRAL_ITERATIONS):
        Av = np.matmul(A, v)
        with np.errstate(invalid="ignore"):
            v = Av / Av.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = (np.matmul(A, v) / v)[:, :, 0].max(axis=1)
    return bound * (1.0 + _gamma(d + 2, np.float64))


@dataclass
class PackedEstimate:
    """Packed estimate of ``log w_k + log N(x | mu_k, Lambda_k)`` and its error bounds.

    The estimate is :func:`_full_maha_packed` around the mixture mean ``g``, in
    float64, or in float32 for float32 compute (``dtype``: float32 products and GEMM,
    about twice the rate; ``g`` is then rounded to float32 first so that ``x - g`` and
    ``mu_k - g`` use the same shift). Its
    rounding error is, to first order, at most ``e_k(x) = (gamma_m lambda_k +
    gamma64 (lambda_k + rho_k)) (||y|| + ||m_k||)^2`` with ``y = x - g``,
    ``m_k = mu_k - g``, ``gamma_m = m u / (1 - m u)`` for the unit roundoff ``u`` of
    ``dtype`` and ``m = T + 3`` (``T = d (d+1)/2 + d + 1`` products in the dot
    product, Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, eq. 3.5,
    plus the roundings of ``y`` and of the products; one more for float32, whose
    weights are rounded from float64), and ``gamma64 = gamma_{2d+2}`` in float64.
    The sum of the magnitudes of the dot product's terms is at most
    ``(|y| + |m_k|)^T |Lambda_k| (|y| + |m_k|) <= lambda_k (||y|| + ||m_k||)^2``
    with ``lambda_k`` an upper bound of the spectral radius of ``|Lambda_k|``
    (elementwise absolute values; :func:`_abs_spectral_bound`). The float64 work on
    the model adds ``gamma_d rho_k`` for ``Lambda_k = U_k U_k^T`` (its rounding is at
    most ``gamma_d |U_k| |U_k|^T``, whose spectral radius is at most
    ``rho_k = max_j (|U_k| |U_k|^T 1)_j``) and ``gamma_{2d+2} lambda_k`` for
    ``Lambda_k m_k``, ``m_k^T Lambda_k m_k`` and the rounding of ``m_k`` itself.
    Half of ``e_k`` bounds the error in ``log N``: ``error_coef[k] (||y|| +
    ||m_k||)^2``; the float64 rounding of ``log w_k + log N`` from it is within the
    bound's spare (``gamma64 rho_k`` counts ``Lambda_k`` twice). Products that fall
    below float32's normal range (``||y|| < ~1e-19``) round absolutely, beyond the
    bound, by at most ~1e-13 in ``log N`` (see :func:`_representable`). The pairs
    recomputed by :meth:`refine` are computed in float64 whatever ``dtype`` is.

    A dataclass of arrays, so that a pass can build it once and share it with its
    workers (:meth:`build`).
    """

    dtype: str
    means: np.ndarray
    u: np.ndarray
    g: np.ndarray
    W: np.ndarray
    error_coef: np.ndarray
    m_norm: np.ndarray
    offset: np.ndarray
    y_limit: float

    @classmethod
    def build(cls, weights, means, precisions_cholesky, dtype=np.float64):
        """The estimate's work on the model: ``K d^3`` flops for the precisions.
        ``dtype`` (float64 or float32) is that of the estimate's products; ``None``
        when it cannot hold the packed weights (:func:`_representable`)."""
        built = cls.build_all(weights, means, precisions_cholesky, (dtype,))
        return None if built is None else built[0]

    @classmethod
    def build_all(cls, weights, means, precisions_cholesky, dtypes):
        """:meth:`build` for each of ``dtypes``, sharing the work on the model (and
        the shift ``g``, rounded to the narrowest of them); ``None`` when the
        narrowest cannot hold the packed weights (the wider ones then serve no
        purpose to its data)."""
        dtypes = [np.dtype(t) for t in dtypes]
        means = np.asarray(means, dtype=np.float64)
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        K, d = means.shape
        narrowest = min(dtypes, key=lambda t: t.itemsize)
        g = _shift(means, weights).astype(narrowest).astype(np.float64)
        means_shifted = means - g
        precisions = np.matmul(u, np.swapaxes(u, 1, 2))
        W = _packed_weights(precisions, means_shifted)
        if not _representable(W, narrowest):
            return None
        abs_u = np.abs(u)
        rho = np.matmul(abs_u, abs_u.sum(axis=1)[:, :, None])[:, :, 0].max(axis=1)
        gamma64 = _gamma(2 * d + 2, np.float64)
        spectral = np.fmin(_abs_spectral_bound(np.abs(precisions, out=precisions)),
                           rho * (1.0 + gamma64))
        del precisions
        with np.errstate(divide="ignore"):
            offset = (np.log(np.asarray(weights, dtype=np.float64))
                      + log_det_cholesky(u, "full", d) - 0.5 * d * _LOG_2PI)
        m_norm = np.linalg.norm(means_shifted, axis=1)
        built = []
        for dtype in dtypes:
            gamma = _gamma(d * (d + 1) // 2 + d + 4 + (dtype != np.float64), dtype)
            error_coef = 0.5 * (gamma * spectral + gamma64 * (spectral + rho))
            # The products and every partial sum of the dot product are at most
            # max(rho_k, 1) (||y|| + ||m_k||)^2 in magnitude: rows with ||y|| below
            # y_limit cannot overflow ``dtype`` (with a factor 4 to spare).
            y_limit = float(np.sqrt(np.finfo(dtype).max / 4.0 / max(rho.max(), 1.0))
                            - m_norm.max())
            built.append(cls(dtype.str, means, u, g, W.astype(dtype), error_coef,
                             m_norm, offset, y_limit))
        return built

    def weighted(self, X, out, y_norm=None):
        """The estimate into ``out``, ``(n, K)`` float64; returns ``out``.
        ``y_norm``, if given, receives ``||x - g||`` per row (for the bounds)."""
        _full_maha_packed(X, self.g, self.W, out, y_norm)
        out *= -0.5
        out += self.offset
        return out

    def to_refine(self, weighted, y_norm, margin):
        """The pairs to recompute: within ``margin`` nats of the row's best (by the
        bounds) and with a bound above ``_REFINE_TOL``.

        With ``e_ik`` the bound of pair ``(i, k)``, these are the pairs with
        ``w_ik + e_ik >= max_l (w_il - e_il) - margin`` and ``e_ik > _REFINE_TOL``.
        Candidates are marked first, then the bounds evaluated on them only.
        ``E_i = 2 max_k c_k ||m_k||^2 + 2 max_k c_k ||y_i||^2 >= e_ik`` (from
        ``(a + b)^2 <= 2 a^2 + 2 b^2``); while every ``E_i`` is at most
        ``_UNIFORM_BOUND`` (float64), the candidates are the pairs within
        ``margin + 2 E_i`` of their row's largest estimate, which hold every pair
        sought and the pair attaining the maximum: one comparison. Else (float32:
        bounds of up to ~1e5 nats on tight components) the condition is evaluated
        on every pair, in row chunks that stay in cache. The candidates (nearly
        every pair while the components are broad) are then taken a chunk of
        components at a time (``_BOUND_CHUNK_BYTES`` per array of their indices and
        bounds), so that these take no more memory than the pairs kept.

        Returns
        -------
        comps, rows : ndarray of int
            The pairs, sorted by component, then row.
        """
        n, K = weighted.shape
        est = weighted.T  # (K, n): contiguous rows for the column-major estimates
        coef = self.error_coef
        spread = 2.0 * ((coef * self.m_norm**2).max(initial=0.0)
                        + coef.max(initial=0.0) * y_norm**2)
        floor = np.full(n, -np.inf)
        found = []
        with np.errstate(invalid="ignore"):
            if spread.max(initial=0.0) <= _UNIFORM_BOUND:
                best = est.max(axis=0)
                # (with room for the rounding of these sums)
                limit = (best - margin - 2.0 * spread
                         - 1e-9 * (np.abs(best) + margin + spread))
                candidate = np.greater_equal(est, limit)
            else:
                candidate = self._near_best(est, y_norm, margin)
            step = max(1, _BOUND_CHUNK_BYTES // (8 * max(n, 1)))
            for k0 in range(0, K, step):
                flat = np.flatnonzero(candidate[k0:k0 + step])
                comps = flat // max(n, 1)
                rows = flat - comps * n
                comps += k0
                w = est[comps, rows]
                e = self.m_norm[comps] + y_norm[rows]
                e *= e
                e *= coef[comps]
                np.maximum.at(floor, rows, w - e)
                inexact = e > _REFINE_TOL
                found.append((comps[inexact], rows[inexact], (w + e)[inexact]))
            floor -= margin
            comps, rows, upper = (np.concatenate(parts) for parts in zip(*found))
            keep = upper >= floor[rows]
        return comps[keep], rows[keep]

    def _near_best(self, est, y_norm, margin):
        """``(K, n)`` mask of the pairs in ``est`` (K, n) with ``w + e >= max(w - e)
        - margin`` over their row, every bound evaluated (row chunks of
        ``_BOUND_CHUNK_BYTES``)."""
        K, n = est.shape
        mask = np.empty((K, n), dtype=bool)
        rows = _chunk_rows(K, 8, n, _BOUND_CHUNK_BYTES)
        e_buf, t_buf = np.empty((K, rows)), np.empty((K, rows))
        m_norm, coef = self.m_norm[:, None], self.error_coef[:, None]
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            e, t, w = e_buf[:, :r1 - r0], t_buf[:, :r1 - r0], est[:, r0:r1]
            np.add(m_norm, y_norm[r0:r1], out=e)
            np.square(e, out=e)
            e *= coef
            floor = np.subtract(w, e, out=t).max(axis=0)
            floor -= margin
            np.greater_equal(np.add(w, e, out=t), floor, out=mask[:, r0:r1])
        return mask

    def weighted_refined(self, X, margin):
        """``log w_k + log N(x | mu_k, Lambda_k)``, exact where it matters.

        Every pair is estimated (``n K d^2`` flops at the GEMM rate); the pairs that
        may lie within ``margin`` nats of their row's best and whose error bound
        exceeds ``_REFINE_TOL`` are recomputed exactly; the others either have
        ``r_ik < exp(-margin)`` or are accurate to ``_REFINE_TOL``.

        Returns
        -------
        weighted : ndarray of shape (n, K), float64, or None
            ``None`` when a probe of the first rows finds that more than
            ``_REFINE_MAX_DENSITY`` of the pairs would need recomputing (beyond one
            per row: in float32 every row's best pair has a bound above
            ``_REFINE_TOL``).

        Raises
        ------
        BeyondRange
            When a row lies so far from ``g`` (``y_limit``) that the products could
            overflow: the block is for the plain path.
        """
        # column-major: the GEMM writes it directly, and the softmax of
        # estimate_resp reduces over contiguous memory
        weighted = np.empty((X.shape[0], self.means.shape[0]), order="F")
        y_norm = np.empty(X.shape[0])
        p = _REFINE_PROBE_ROWS
        with np.errstate(over="ignore", invalid="ignore"):  # checked by y_limit
            probe = self.weighted(X[:p], weighted[:p], y_norm[:p])
        if not y_norm[:p].max(initial=0.0) <= self.y_limit:
            raise BeyondRange
        comps, _ = self.to_refine(probe, y_norm[:p], margin)
        if comps.size - probe.shape[0] > _REFINE_MAX_DENSITY * probe.size:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            self.weighted(X[p:], weighted[p:], y_norm[p:])
        if not y_norm.max(initial=0.0) <= self.y_limit:
            raise BeyondRange
        return self.refine(X, weighted, *self.to_refine(weighted, y_norm, margin))

    def refine(self, X, weighted, comps, rows):
        """Recompute the pairs ``(rows[j], comps[j])`` (sorted by component) exactly,
        ``log w_k + log N`` with ``||(x - mu_k) U_k||^2`` over each component's
        gathered rows (float64, one numpy product per component: it releases the
        GIL, scipy's ``trmm`` does not); in place."""
        K = self.means.shape[0]
        bounds = np.searchsorted(comps, np.arange(K + 1))
        counts = np.diff(bounds)
        size = counts.max(initial=0)
        gather = _GatherBuffers(X, size)
        zbuf = np.empty((size, X.shape[1]))
        sq = np.empty(size)
        with single_blas_thread():
            for k in np.flatnonzero(counts):
                these = rows[bounds[k]:bounds[k + 1]]
                m = these.size
                z = np.matmul(gather.centred(these, self.means[k]), self.u[k],
                              out=zbuf[:m])
                q = np.einsum("ij,ij->i", z, z, out=sq[:m])
                q *= -0.5
                q += self.offset[k]
                weighted[these, k] = q
        return weighted


class BeyondRange(Exception):
    """A row of the block lies too far from the shift for a :class:`PackedEstimate`'s
    products (its ``y_limit``)."""


class _GatherBuffers:
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


def prepare_log_prob(weights, means, precisions_cholesky, covariance_type, dtype):
    """Work on the model that every block of a pass shares, or ``None``.

    For 'full' with packed products (small ``d``), the :class:`PackedEstimate`
    objects (``K d^3`` flops) that :func:`estimate_log_prob_resp` otherwise builds
    per call, in the order they are tried: for float32 data the float32 estimate,
    then the float64 one (on the same data), taken where the float32 bounds are too
    coarse for the model (on the image patches D, ill-conditioned precisions: 150 of
    200 pairs per row to recompute), then the plain path in float64; for float64
    the float64 one. ``None`` when there is none, or for float32 data when float32
    cannot hold the packed weights.
    Where float32's range falls short (those weights, or a row too far for the
    products: :class:`BeyondRange`), float32 compute takes the plain float32 path as
    it does for every ``d``, and its check refuses what overflows there.
    """
    K, d = np.shape(means)
    if covariance_type == "full" and _use_packed(d, K):
        dtypes = ((np.float32, np.float64) if np.dtype(dtype) == np.float32
                  else (np.float64,))
        with np.errstate(over="ignore", invalid="ignore"):
            built = PackedEstimate.build_all(weights, means, precisions_cholesky,
                                             dtypes)
        return None if built is None else tuple(built)
    return None


def weighted_log_prob(X, weights, means, precisions_cholesky, covariance_type,
                      margin=None, prepared=None, products=None):
    """``log w_k + log N(x | mu_k, Lambda_k)`` for every row and component.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    precisions_cholesky : ndarray
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    margin : float or None, default=None
        ``None``: every entry is exact. A number (see :func:`relevance_margin`): for
        'full' (float32 too: the estimate in float32, or in float64 where the
        float32 bounds are too coarse, the pairs that matter recomputed in float64),
        'diag' and 'spherical', only the pairs within ``margin`` nats of their row's
        best component are computed exactly; the others are estimated to within a
        (first-order) rounding-error bound and have ``r_ik < exp(-margin)`` (see
        :meth:`PackedEstimate.weighted_refined`).
    prepared : object or None, default=None
        :func:`prepare_log_prob` of the same parameters and ``X.dtype``, to share
        its work between the blocks of a pass.
    products : CentredProducts or None, default=None
        'diag' and 'spherical': :func:`centred_products` of ``X`` around
        ``weights`` and ``means``, to reuse in the M step (built here if ``None``).

    Returns
    -------
    weighted : ndarray of shape (n, K), float64
    """
    X = np.asarray(X)
    n, d = X.shape
    K = means.shape[0]
    if margin is not None and n * K > 0:
        if prepared is None:
            prepared = prepare_log_prob(weights, means, precisions_cholesky,
                                        covariance_type, X.dtype)
        try:
            for estimate in prepared or ():
                weighted = estimate.weighted_refined(X, margin)
                if weighted is not None:
                    return weighted
            if prepared and X.dtype != np.float64:
                # Too many pairs for every estimate: the plain path in float64. Its
                # float32 products lose digits where a broad component far from the
                # others moves the shift g (3e-5 to 9e-5 relative in the
                # log-likelihood were seen).
                X = X.astype(np.float64)
        except BeyondRange:
            pass  # the plain path (in float32, its check refuses an overflow)
    return _log_prob(X, means, precisions_cholesky, covariance_type, weights, True,
                     products, margin)


def estimate_log_prob_resp(X, weights, means, precisions_cholesky, covariance_type,
                           margin=None, prepared=None):
    """Per-row log-likelihood and log-responsibilities (Bishop eq. 9.23, 9.28).

    Parameters
    ----------
    X, weights, means, precisions_cholesky, covariance_type, margin, prepared
        As in :func:`weighted_log_prob`. With a ``margin``, ``log_prob_norm`` is
        exact up to ``exp(-margin)`` relative and the log-responsibilities below
        ``-margin`` are estimates.

    Returns
    -------
    log_prob_norm : ndarray of shape (n,), float64
        ``log sum_k w_k N(x | mu_k, Lambda_k)``.
    log_resp : ndarray of shape (n, K), float64
        ``log r_ik``; rows sum (in probability) to one.
    """
    weighted = weighted_log_prob(X, weights, means, precisions_cholesky,
                                 covariance_type, margin, prepared)
    log_prob_norm = _logsumexp_rows(weighted)
    with np.errstate(under="ignore", invalid="ignore"):
        weighted -= log_prob_norm[:, np.newaxis]
    return log_prob_norm, weighted


def estimate_resp(X, weights, means, precisions_cholesky, covariance_type, margin=None,
                  prepared=None, products=None):
    """Per-row log-likelihood and responsibilities (Bishop eq. 9.23), one exp per pair.

    ``r_ik = exp(a_ik - t_i) / sum_j exp(a_ij - t_i)`` with ``a`` the weighted
    log-densities and ``t_i`` their row maximum: the same as ``exp(log_resp)`` of
    :func:`estimate_log_prob_resp` to rounding, without the second exponential, except
    that responsibilities below ``exp(EXP_FLOOR)`` (~1e-304) are 0 (:func:`exp_flushed`).

    Parameters
    ----------
    X, weights, means, precisions_cholesky, covariance_type, margin, prepared, products
        As in :func:`weighted_log_prob`.

    Returns
    -------
    log_prob_norm : ndarray of shape (n,), float64
    resp : ndarray of shape (n, K), float64
    """
    resp = weighted_log_prob(X, weights, means, precisions_cholesky, covariance_type,
                             margin, prepared, products)
    log_prob_norm = np.empty(resp.shape[0])
    for r0, r1, w, axis in _row_chunks(resp):
        top = w.max(axis=axis, keepdims=True)
        top[~np.isfinite(top)] = 0.0
        w -= top
        exp_flushed(w)
        total = w.sum(axis=axis, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            w /= total
            np.log(total, out=total)
        total += top
        log_prob_norm[r0:r1] = total.ravel()
    return log_prob_norm, resp


#: ``exp`` of anything below this (nats) is taken as exactly 0: ``exp(-700) ~ 1e-304``.
#: numpy's vectorised ``exp`` runs ~3x slower on arguments whose result underflows to
#: 0 and ~17x slower on those with a subnormal result (below ~-708; measured with
#: AVX-512 on numpy 2.4), where most pairs of a mixture of separated clusters lie
#: (85% of a block of A four iterations into the fit).
EXP_FLOOR = -700.0


def exp_flushed(a):
    """``exp(a)`` in place, with every result below ``exp(EXP_FLOOR)`` (~1e-304) set to 0.

    For log-responsibilities and other log-weights shifted to at most 0: the
    responsibilities flushed lie 280 orders of magnitude below any useful
    ``resp_threshold`` and cannot change a sum that holds a term of 1 (the row's
    best). The arguments are raised to ``EXP_FLOOR`` before the ``exp`` and the flushed
    results zeroed after it, which keeps the ``exp`` on its fast path (about half the
    time of a plain ``np.exp`` on a fitted mixture's responsibilities).

    Parameters
    ----------
    a : ndarray of float64
        Overwritten. NaN stays NaN, ``-inf`` gives 0.

    Returns
    -------
    ndarray
        ``a``.
    """
    flushed = a < EXP_FLOOR
    np.maximum(a, EXP_FLOOR, out=a)
    np.exp(a, out=a)
    np.copyto(a, 0.0, where=flushed)
    return a


def _row_chunks(a):
    """Yield ``(r0, r1, chunk, axis)`` over cache-sized row chunks of ``a`` (n, K):
    ``chunk`` is a view of rows ``r0:r1`` with the components on ``axis``. For a
    C-ordered ``a`` that is ``(rows, K)``, axis 1; for an F-ordered one (the 'diag'
    E step's) its C-ordered transpose ``(K, rows)``, axis 0, so that reductions over
    the components run across contiguous memory (several times faster than strided).
    """
    n, K = a.shape
    by_columns = a.flags.f_contiguous and not a.flags.c_contiguous
    rows = _chunk_rows(K, 8, n)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        if by_columns:
            yield r0, r1, a.T[:, r0:r1], 0
        else:
            yield r0, r1, a[r0:r1], 1


def _logsumexp_rows(a):
    """``log sum_k exp(a_ik)`` per row, with one ``(rows, K)`` temporary per chunk.

    Same as ``scipy.special.logsumexp(a, axis=1)`` for finite rows and rows with some
    ``-inf`` entries (a row of all ``-inf`` gives ``-inf``), without its full-size
    temporaries.
    """
    out = np.empty(a.shape[0])
    for r0, r1, chunk, axis in _row_chunks(a):
        top = chunk.max(axis=axis, keepdims=True)
        top[~np.isfinite(top)] = 0.0
        w = exp_flushed(np.subtract(chunk, top))
        total = w.sum(axis=axis, keepdims=True)
        with np.errstate(divide="ignore"):
            np.log(total, out=total)
        total += top
        out[r0:r1] = total.ravel()
    return out


# --------------------------------------------------------------------------------------
# Sufficient statistics and M step


def _pack_upper(S):
    """Rows of the upper triangles of ``S`` (K, d, d), one after another: (K, d(d+1)/2)."""
    K, d, _ = S.shape
    out = np.empty((K, d * (d + 1) // 2), dtype=S.dtype)
    start = 0
    for i in range(d):  # d slice copies: faster than one fancy index
        out[:, start:start + d - i] = S[:, i, i:]
        start += d - i
    return out


def _unpack_upper(packed, d):
    """Inverse of :func:`_pack_upper`; the strict lower triangles are zero."""
    S = np.zeros((packed.shape[0], d, d), dtype=packed.dtype)
    start = 0
    for i in range(d):
        S[:, i, i:] = packed[:, start:start + d - i]
        start += d - i
    return S


@dataclass
class SufficientStatistics:
    """Sums over rows that the M step needs, centred on fixed centres ``c_k``.

    Attributes
    ----------
    nk : ndarray of shape (K,), float64
        ``sum_i r_ik``.
    sum_x : ndarray of shape (K, d), float64
        ``sum_i r_ik (x_i - c_k)``.
    sum_xx : ndarray, float64
        'full': ``(K, d, d)``, ``sum_i r_ik (x_i - c_k)(x_i - c_k)^T`` (only the upper
        triangle is meaningful: gathered rows fill only it, and :func:`m_step`
        symmetrises from it); 'tied': ``(d, d)``, the
        same summed over ``k``; 'diag' and 'spherical': ``(K, d)``, the diagonal.
    log_likelihood : float
        ``sum_i log p(x_i)`` under the parameters of the E step.
    n_samples : int
        Rows summed.
    """

    nk: np.ndarray
    sum_x: np.ndarray
    sum_xx: np.ndarray
    log_likelihood: float
    n_samples: int

    def __add__(self, other):
        return SufficientStatistics(
            self.nk + other.nk,
            self.sum_x + other.sum_x,
            self.sum_xx + other.sum_xx,
            self.log_likelihood + other.log_likelihood,
            self.n_samples + other.n_samples,
        )

    merge = __add__

    def __getstate__(self):
        """'full' second moments travel (pickled, e.g. from a worker process) as their
        upper triangles only: half the bytes; :meth:`__setstate__` unpacks them."""
        state = dict(self.__dict__)
        if self.sum_xx.ndim == 3:
            state["sum_xx"] = _pack_upper(self.sum_xx)
            state["n_features"] = self.sum_xx.shape[1]
        return state

    def __setstate__(self, state):
        d = state.pop("n_features", None)
        if d is not None:
            state["sum_xx"] = _unpack_upper(state["sum_xx"], d)
        self.__dict__.update(state)

    def __iadd__(self, other):
        self.nk += other.nk
        self.sum_x += other.sum_x
        self.sum_xx += other.sum_xx
        self.log_likelihood += other.log_likelihood
        self.n_samples += other.n_samples
        return self


# Below this fraction of (row, component) pairs with a responsibility above the
# threshold, the 'full' statistics gather each component's rows instead of running the
# dense packed product over all of them.
_GATHER_DENSITY = 0.25
# 'diag'/'spherical' statistics leave out the pairs at or below the threshold from
# SPARSE_MIN_FEATURES features on: below, the mask of the kept pairs costs more than
# the product it saves (one thread, K=64, 2% of the pairs kept: 1.7x the plain
# product at d=8, 1.1x at d=16, 0.8x at d=24, 0.4x at d=64). Their sparse product is
# taken while the kept share is below _sparse_share (the measured crossovers: about
# 2.5% at d=24, 3% at d=32, 4.5% at d=64).
SPARSE_MIN_FEATURES = 24


def _sparse_share(n_columns):
    """Kept share of the pairs below which :func:`_kept_products` takes the sparse
    product for ``Z`` of ``n_columns`` columns."""
    return min(0.04, n_columns / 2500)


def _kept_products(resp, Z, resp_threshold):
    """``G_k = sum_i r_ik Z_i`` over the pairs with ``r_ik > resp_threshold``.

    When the kept share is below :func:`_sparse_share`, the kept responsibilities
    form a CSR matrix (``scipy.sparse``) whose product with ``Z`` costs in proportion
    to the kept pairs; else one GEMM, with the other pairs set to zero (none when
    every pair is kept).

    Parameters
    ----------
    resp : ndarray of shape (n, K), float64
        Best F-ordered (the E step's layout): its transpose is then read row by row.
    Z : ndarray of shape (n, m), float64
    resp_threshold : float

    Returns
    -------
    G : ndarray of shape (K, m), float64
    """
    R = resp.T
    if resp_threshold <= 0.0:
        return R @ Z  # the pairs left out are zeros
    kept = R > resp_threshold
    nnz = np.count_nonzero(kept)
    if nnz == kept.size:
        return R @ Z
    if nnz >= _sparse_share(Z.shape[1]) * kept.size:
        return np.where(kept, R, 0.0) @ Z
    K, n = R.shape
    indptr = np.zeros(K + 1, dtype=np.int64)
    np.cumsum(np.count_nonzero(kept, axis=1), out=indptr[1:])
    # positions in row-major (K, n) order: sorted by component, then row
    indices = np.flatnonzero(kept) % max(n, 1)
    return sparse.csr_array((R[kept], indices, indptr), shape=(K, n)) @ Z


# The packed (expanded) second moments are kept for a component while the rounding of
# the expanded terms, amplified in S_k^{-1} (see _cancellation), is at most this times
# the float64 unit roundoff (~1e-10 relative), or while in every feature the expanded
# terms are at most _PACKED_MAX_EXCESS times the centred ones: their rounding is then
# at most that multiple of a centred sum's, however ill-conditioned S_k is (a centred
# recomputation would gain nothing). Others are recomputed centred. (The patch data D,
# first iteration: 191 of 200 components beyond 1e6, most with S_k numerically
# singular, 139 of them within 2x of the centred terms; the recomputations took 70% of
# the M step.)
_PACKED_MAX_CANCELLATION = 1e6
_PACKED_MAX_EXCESS = 2.0


def _gathered_moments(X, resp, centers, kept, counts, components, nk, sum_x, sum_xx):
    """Add ``N_k``, ``s_k = sum r_ik (x_i - c_k)`` and the upper triangle of
    ``S_k = sum r_ik (x_i - c_k)(x_i - c_k)^T`` over each component's kept rows into
    ``nk``, ``sum_x`` and ``sum_xx`` (rows ``components``), centred.

    Each component's kept rows (``counts[k]`` of them) are gathered into one buffer
    and centred on ``c_k`` in float64; ``s_k`` is one matrix-vector product with the
    responsibilities, and ``S_k``, after scaling the rows by ``sqrt(r_ik)``, one
    product ``W^T W`` (numpy's, which releases the GIL), so the work is
    level-3 BLAS on the gathered rows only. Only the upper triangle of ``sum_xx`` is
    meaningful afterwards.
    """
    d = X.shape[1]
    gather = _GatherBuffers(X, int(counts[components].max(initial=0)))
    prod = np.empty((d, d))
    with single_blas_thread():
        for k in components:
            rows = np.flatnonzero(kept[k])
            if rows.size == 0:
                continue
            work = gather.centred(rows, centers[k])
            r = resp[rows, k]
            nk[k] += r.sum()
            sum_x[k] += r @ work
            work *= np.sqrt(r)[:, None]
            sum_xx[k] += np.matmul(work.T, work, out=prod)


def _packed_sums(X, resp, g, kept=None):
    """``R^T [y_j y_l (j <= l), y, 1]`` summed over the rows (``y = x - g``), one GEMM
    per row chunk, float64 accumulation; only the pairs of ``kept`` (``(K, n)``
    bool, masked per chunk; ``None``: every pair).

    Returns
    -------
    acc : ndarray of shape (K, d(d+1)/2 + d + 1), float64
        Per component ``sum_i r_ik y_j y_l`` (``j <= l``, row-major upper triangle),
        then ``sum_i r_ik y`` and ``N_k``.
    """
    K = resp.shape[1]
    d = X.shape[1]
    T = d * (d + 1) // 2
    acc = np.zeros((K, T + d + 1))
    part = np.empty_like(acc)
    for r0, r1, _, P in _packed_chunks(X, g):
        r = resp[r0:r1]
        if kept is not None:
            r = np.where(kept[:, r0:r1].T, r, 0.0)
        np.matmul(r.T, P, out=part)
        acc += part
    return acc


#: Bytes of the (components, d, d) work arrays that turn packed sums into centred
#: second moments (:func:`_add_packed_moments`): a few per thread, never (K, d, d).
_MOMENT_CHUNK_BYTES = 2**20


def _add_packed_moments(acc, centers, g, nk, sum_x, sum_xx):
    """Add the centred statistics of the packed sums ``acc`` (:func:`_packed_sums`)
    into ``nk``, ``sum_x`` and ``sum_xx`` for the components whose expanded sums keep
    their accuracy; return the others.

    With ``m_k = c_k - g``: ``s_k - N_k m_k`` and ``S_k = sum r y y^T - s_k m_k^T -
    m_k s_k^T + N_k m_k m_k^T``. A component whose rounding is amplified more than
    ``_PACKED_MAX_CANCELLATION``-fold (:func:`_cancellation`) and whose expanded
    terms exceed ``_PACKED_MAX_EXCESS`` times the centred ones in some feature
    (``a_j = sum_i r_ik y_ij^2 + N_k m_kj^2``, which is ``(S_k)_jj + 2 N_k m_kj^2``
    when ``c_k`` is the component's mean, against ``(S_k)_jj``) is not added.
    Components are taken a chunk of ``_MOMENT_CHUNK_BYTES`` at a time.

    Returns
    -------
    redo : ndarray of int
        The components left out, to recompute centred.
    """
    K, d = centers.shape
    iu = _packed_index(d)
    T = iu[0].size
    step = max(1, _MOMENT_CHUNK_BYTES // (8 * d * d))
    S = np.empty((min(step, K), d, d))
    redo = []
    for k0 in range(0, K, step):
        k1 = min(k0 + step, K)
        a, S_c = acc[k0:k1], S[:k1 - k0]
        m_k = centers[k0:k1] - g
        s, N = a[:, T:T + d], a[:, T + d]
        S_c[:, iu[0], iu[1]] = a[:, :T]
        S_c[:, iu[1], iu[0]] = a[:, :T]
        # per-feature magnitude of the expanded terms, a_j = sum r y_j^2 + N m_j^2
        scale = np.diagonal(S_c, axis1=1, axis2=2) + N[:, None] * m_k**2
        # s m^T + m s^T - N m m^T = t m^T + m t^T with t = s - N m / 2
        cross = (s - 0.5 * N[:, None] * m_k)[:, :, None] * m_k[:, None, :]
        S_c -= cross
        S_c -= np.swapaxes(cross, 1, 2)
        own = np.diagonal(S_c, axis1=1, axis2=2)
        good = ((scale <= _PACKED_MAX_EXCESS * own).all(axis=1)
                | (_cancellation(S_c, scale, N) <= _PACKED_MAX_CANCELLATION))
        keep = k0 + np.flatnonzero(good)
        redo.append(k0 + np.flatnonzero(~good))
        nk[keep] += N[good]
        sum_x[keep] += s[good] - N[good, None] * m_k[good]
        sum_xx[keep] += S_c[good]
    return np.concatenate(redo)


def _cancellation(S, scale, N):
    """``sum_j a_j (S_k^{-1})_jj`` per component: how much the rounding of the expanded
    terms (``|E_jl| <~ u sqrt(a_j a_l)``) is amplified in ``S_k^{-1}`` (relative).

    Features with ``a_j = 0`` (exactly zero in every row and centre) are left out;
    ``inf`` when the rest of ``S_k`` is not positive definite, 0 when ``N_k = 0``.
    The components of ``S`` at once: one batched Cholesky and inverse of the factors
    (``(S^{-1})_jj = sum_i (L^{-1})_ij^2``); a failed batch falls back per component.
    """
    K, d, _ = S.shape
    live = (scale > 0.0) & (N[:, None] != 0.0)
    if live.all():
        M = S
    else:
        # dead features get an identity row and column and zero weight
        M = S * (live[:, :, None] & live[:, None, :])
        M[:, np.arange(d), np.arange(d)] += ~live
    try:
        chol = np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        chol = np.full_like(M, np.nan)
        for k in range(K):
            try:
                chol[k] = np.linalg.cholesky(M[k])
            except np.linalg.LinAlgError:
                pass
    with np.errstate(invalid="ignore"):
        inv = np.linalg.inv(chol)
        del chol
        inv_diag = np.square(inv, out=inv).sum(axis=1)
        out = (np.where(live, scale, 0.0) * inv_diag).sum(axis=1)
    out[~np.isfinite(out)] = np.inf
    out[~live.any(axis=1)] = 0.0
    return out


def _full_statistics(X, resp, centers, resp_threshold, nk, sum_x, sum_xx):
    """Add ``N_k``, ``s_k`` and ``S_k = sum_i r_ik (x_i - c_k)(x_i - c_k)^T`` for
    'full' over the pairs with ``r_ik > resp_threshold`` into ``nk`` (K,), ``sum_x``
    (K, d) and the upper triangle of ``sum_xx`` (K, d, d).

    Dense responsibilities: one GEMM per row chunk of the packed products
    (:func:`_packed_sums`, :func:`_add_packed_moments`; small ``d``), with components
    whose expanded sums would lose accuracy recomputed centred. Sparse ones (fewer
    than ``_GATHER_DENSITY`` of the pairs kept): each component's rows gathered,
    centred and reduced by one product (:func:`_gathered_moments`), straight into
    the sums.
    """
    n, d = X.shape
    K = centers.shape[0]
    if n == 0:
        return
    kept = (resp > resp_threshold).T
    counts = np.count_nonzero(kept, axis=1)
    if not (counts.sum() >= _GATHER_DENSITY * n * K and _use_packed(d, K)):
        _gathered_moments(X, resp, centers, kept, counts, range(K), nk, sum_x, sum_xx)
        return
    # the mixture mean by responsibility mass: a broad component that keeps a pair
    # on every row would pull a shift weighted by kept pairs far from the data
    g = _shift(centers, resp.sum(axis=0))
    acc = _packed_sums(X, resp, g, kept if resp_threshold > 0.0 else None)
    redo = _add_packed_moments(acc, centers, g, nk, sum_x, sum_xx)
    if redo.size:
        _gathered_moments(X, resp, centers, kept, counts, redo, nk, sum_x, sum_xx)


def _tied_second_moments(X, resp, centers):
    """``sum_k sum_i r_ik (x_i - c_k)(x_i - c_k)^T`` for 'tied', with no cancellation.

    With ``m_i = sum_k r_ik c_k``, ``a_i = argmax_k r_ik`` and ``sum_k r_ik = 1``:
    ``sum_i (x_i - m_i)(x_i - m_i)^T + sum_{j,k} W_jk (c_k - c_j)(c_k - c_j)^T
    - sum_i e_i e_i^T``, where ``W_jk = sum_{i: a_i = j} r_ik`` and
    ``e_i = m_i - c_{a_i}``. Every term is small when the responsibilities are nearly
    one-hot, so nothing large cancels (exact copies give exactly zero). One
    product over the rows plus ``nnz(W) d^2`` work on the centres.

    Parameters
    ----------
    X : ndarray of shape (n, d), float64
    resp : ndarray of shape (n, K), float64
    centers : ndarray of shape (K, d), float64

    Returns
    -------
    ndarray of shape (d, d), symmetric
    """
    n, d = X.shape
    K = centers.shape[0]
    labels = resp.argmax(axis=1)
    ref = centers[labels]
    e = resp @ centers
    e -= ref
    diff = X - ref
    diff -= e
    out = diff.T @ diff
    out -= e.T @ e
    one_hot = sparse.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(K, n))
    W = np.asarray(one_hot @ resp)
    for j in np.flatnonzero(W.any(axis=1)):
        others = np.flatnonzero(W[j])
        others = others[others != j]
        if others.size:
            dc = centers[others] - centers[j]
            out += (dc.T * W[j, others]) @ dc
    return out


def block_statistics(X, resp, centers, covariance_type, resp_threshold=0.0,
                     products=None, out=None):
    """Sufficient statistics of one block, centred on ``centers``.

    ``N_k = sum_i r_ik``, ``s_k = sum_i r_ik (x_i - c_k)`` and
    ``S_k = sum_i r_ik (x_i - c_k)(x_i - c_k)^T`` (Bishop eq. 9.24-9.27 rewritten
    around ``c_k``; centring keeps float32 data clear of the ``E[x^2] - mu^2``
    cancellation). For 'full', see :func:`_full_statistics`; for 'tied',
    :func:`_tied_second_moments`. 'diag' and 'spherical' use matrix products around
    a common shift, in float64.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block (compute dtype). Not modified.
    resp : ndarray of shape (n, K), float64
        Responsibilities ``r_ik``.
    centers : ndarray of shape (K, d), float64
        Centres ``c_k``.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    resp_threshold : float, default=0.0
        Rows with ``r_ik <= resp_threshold`` are left out of all three statistics of
        component ``k`` ('full'; 'diag' and 'spherical' from ``SPARSE_MIN_FEATURES``
        features on; 'tied' pools every pair). ``0.0`` only skips exact zeros
        (exact).
    products : CentredProducts or None, default=None
        'diag' and 'spherical': :func:`centred_products` of ``X`` (those of the E
        step). ``None``: built around the responsibility-weighted mean of the centres.
    out : SufficientStatistics or None, default=None
        Sums of earlier blocks with the same centres: this block's statistics are
        added into it (for 'full' without a ``(K, d, d)`` array per block).

    Returns
    -------
    SufficientStatistics
        ``out``, or new statistics with ``log_likelihood = 0.0``; the caller adds the
        block's log-likelihood. For 'full' only the upper triangle of ``sum_xx`` is
        meaningful (see :class:`SufficientStatistics`).
    """
    X = np.asarray(X)
    n = X.shape[0]
    resp = np.asarray(resp, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    if covariance_type in ("diag", "spherical"):
        # one product of the responsibilities with [y^2, y, 1], y = x - g:
        # sum r (x - c)^2 = sum r y^2 - 2 (c - g) sum r y + N (c - g)^2
        d = X.shape[1]
        if products is None:
            products = centred_products(X, centers, resp.sum(axis=0))
        if d < SPARSE_MIN_FEATURES:
            resp_threshold = 0.0  # every pair (see SPARSE_MIN_FEATURES)
        G = _kept_products(resp, products.Z, resp_threshold)
        nk = G[:, 2 * d]
        cg = centers - products.shift
        sum_x = G[:, d:2 * d] - nk[:, None] * cg
        sum_xx = G[:, :d] - 2.0 * cg * G[:, d:2 * d] + nk[:, None] * cg**2
        # components whose expanded terms are far larger than the result (a tight
        # component far from the shift) lose digits: recompute them centred
        scale = G[:, :d] + nk[:, None] * cg**2
        redo = np.flatnonzero((scale > _PACKED_MAX_CANCELLATION * sum_xx).any(axis=1))
        for k in redo:
            rows = np.flatnonzero(resp[:, k] > resp_threshold)
            diff = np.subtract(X[rows], centers[k], dtype=np.float64)
            r = resp[rows, k]
            sum_x[k] = r @ diff
            sum_xx[k] = r @ (diff * diff)
        np.maximum(sum_xx, 0.0, out=sum_xx)
        stats = SufficientStatistics(nk, sum_x, sum_xx, 0.0, n)
    elif covariance_type == "full":
        K, d = centers.shape
        if out is None:
            out = SufficientStatistics(np.zeros(K), np.zeros((K, d)),
                                       np.zeros((K, d, d)), 0.0, 0)
        _full_statistics(X, resp, centers, resp_threshold, out.nk, out.sum_x,
                         out.sum_xx)
        out.n_samples += n
        return out
    else:
        nk = resp.sum(axis=0)
        X64 = X.astype(np.float64, copy=False)
        sum_x = resp.T @ X64 - nk[:, None] * centers
        sum_xx = _tied_second_moments(X64, resp, centers)
        stats = SufficientStatistics(nk, sum_x, sum_xx, 0.0, n)
    if out is None:
        return stats
    out += stats
    return out


# A covariance left by subtracting the squared shift of the mean from second moments
# around the previous centre loses about log10(shift^2 / variance) digits; beyond
# this ratio (1e-10 relative left) the statistics are accumulated again around the
# new means (see needs_recentring).
_RECENTRE_RATIO = 1e6


def needs_recentring(stats, means, covariances, covariance_type):
    """Components whose M step cancelled too much: ``(K,)`` bool.

    :func:`m_step` forms ``Sigma_k = S_k / N_k - delta_k delta_k^T`` with the shift
    ``delta_k = s_k / N_k`` of the mean from the centre the statistics were summed
    around. Its rounding is about ``u (Sigma_jj + delta_j^2)`` per feature, plus
    ``2 |delta_j| e_j`` from the rounding ``e_j ~ u |mu_j|`` of the shift itself (its
    sum runs over uncentred rows). A component where ``delta_kj^2 + 2 |delta_kj|
    |mu_kj|`` exceeds ``_RECENTRE_RATIO`` times its variance (``Sigma_kjj`` with
    ``reg_covar``, the value the model uses; or that is not positive) may have lost
    more than 6 of its digits: a tight component whose mean moved far (Chan, Golub and
    LeVeque 1983 on updating variances). Components without weight are never flagged.

    Parameters
    ----------
    stats : SufficientStatistics
    means, covariances : ndarray
        :func:`m_step`'s result for ``stats`` (scikit-learn's shapes).
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    ndarray of shape (K,), bool
    """
    nk = stats.nk
    shift = np.abs(stats.sum_x / (nk + 10 * np.finfo(np.float64).eps)[:, None])
    moved = shift * (shift + 2.0 * np.abs(means))
    if covariance_type == "full":
        var = np.diagonal(covariances, axis1=1, axis2=2)
    elif covariance_type == "tied":
        var = np.diagonal(covariances)[None, :]
    elif covariance_type == "diag":
        var = covariances
    else:
        var = covariances[:, None]
    lost = (moved > _RECENTRE_RATIO * np.maximum(var, 0.0)) & (moved > 0.0)
    return lost.any(axis=1) & (nk > 0.0)


def m_step(stats, centers, reg_covar, covariance_type, overwrite=False):
    """Maximisation step from summed sufficient statistics (Bishop eq. 9.24-9.26).

    ``N_k`` gets ``10 * eps`` added as in scikit-learn, ``w_k = N_k / sum N``,
    ``mu_k = c_k + s_k / N_k`` and ``Sigma_k = S_k / N_k - (s_k / N_k)(s_k / N_k)^T +
    reg_covar I``. 'tied' pools ``sum_k (S_k - s_k s_k^T / N_k) / sum_k N_k``;
    'spherical' averages the diagonal over features.

    Parameters
    ----------
    stats : SufficientStatistics
        Summed over all rows.
    centers : ndarray of shape (K, d)
        The centres the statistics were accumulated around.
    reg_covar : float
        Added to the diagonal of every covariance.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    overwrite : bool, default=False
        For 'full', form the covariances in the memory of ``stats.sum_xx`` (which
        is then the returned array): one ``(K, d, d)`` array less at the M step, for
        callers that are done with the statistics' second moments.

    Returns
    -------
    weights : ndarray of shape (K,), float64
    means : ndarray of shape (K, d), float64
    covariances : ndarray, float64
        sklearn's ``covariances_`` shapes.
    """
    eps = np.finfo(np.float64).eps
    nk = stats.nk + 10 * eps
    weights = nk / nk.sum()
    shift = stats.sum_x / nk[:, None]
    means = np.asarray(centers, dtype=np.float64) + shift
    d = means.shape[1]
    if covariance_type == "full":
        # from the upper triangle of the statistics, with cache-sized temporaries
        # (the model may be gigabytes: K d^2 float64 per array)
        cov = np.divide(stats.sum_xx, nk[:, None, None],
                        out=stats.sum_xx if overwrite else None)
        lower = np.tril(np.ones((d, d), dtype=bool), -1)
        step = max(1, 2**16 // (d * d))
        for k0 in range(0, len(cov), step):
            c, delta = cov[k0:k0 + step], shift[k0:k0 + step]
            c -= delta[:, :, None] * delta[:, None, :]
            np.copyto(c, np.swapaxes(c, 1, 2), where=lower)
        cov[:, np.arange(d), np.arange(d)] += reg_covar
    elif covariance_type == "tied":
        cov = stats.sum_xx - (shift.T * nk) @ shift
        cov /= nk.sum()
        cov = 0.5 * (cov + cov.T)
        cov[np.arange(d), np.arange(d)] += reg_covar
    else:
        # A variance around the new mean is >= 0: clip the rounding below it.
        # scikit-learn computes E[x^2] - mu^2 with the regularised N_k, which
        # exceeds the centred variance by mu^2 * 10 eps / N_k; add that term too so
        # both agree when N_k is about one sample (one-hot initialisations).
        cov = np.maximum(stats.sum_xx / nk[:, None] - shift**2, 0.0)
        mean_sk = (stats.sum_x + stats.nk[:, None] * np.asarray(centers, np.float64)) / nk[:, None]
        cov += mean_sk**2 * ((nk - stats.nk) / nk)[:, None] + reg_covar
        if covariance_type == "spherical":
            cov = cov.mean(axis=1)
    return weights, means, cov

