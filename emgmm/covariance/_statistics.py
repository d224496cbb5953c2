"""Sufficient statistics of a block for the M step: ``N_k``, ``s_k`` and ``S_k``
summed around fixed centres, skipping the negligible responsibilities.

Pure functions of one block of rows and the model parameters they are given: none
keeps state, reads files or starts workers (the orchestration lives in
:mod:`emgmm._engine`). Notation as in :mod:`emgmm.covariance._log_density`.

Tuning constant: ``MOMENT_CHUNK_BYTES`` (bytes of the work arrays that turn packed
sums into second moments), read at every call like those of
:mod:`~emgmm.covariance._log_density`.
"""

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from .._runtime.blas import single_blas_thread
from .._runtime.gather import GatherBuffers
from .._runtime.workspace import borrow
from ._base import get_covariance_type
from ._log_density import (
    _packed_chunks,
    _packed_index,
    _shift,
    _use_packed,
    centred_products,
    packed_chunk_rows,
)


def _pack_upper(S):
    """Rows of the upper triangles of ``S`` (K, d, d), one after another:
    (K, d(d+1)/2)."""
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
# the product it saves. Their sparse product is taken while the kept share is below
# _sparse_share, which follows the crossovers measured at 24 to 64 features
# (benchmarks/README.md, "Measurements behind the tuning constants").
SPARSE_MIN_FEATURES = 24


def _sparse_share(n_columns):
    """Kept share of the pairs below which :func:`_kept_products` takes the sparse
    product for ``Z`` of ``n_columns`` columns."""
    return min(0.04, n_columns / 2500)


def _kept_products(resp, Z, resp_threshold):
    """``G_k = sum_i r_ik Z_i`` over the pairs with ``r_ik > resp_threshold`` (with
    ``0``: the pairs whose responsibility is not exactly zero).

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
    kept = R > max(resp_threshold, 0.0)
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
# recomputation would gain nothing). Others are recomputed centred. (On data whose
# first S_k are numerically singular, the amplification test alone sends nearly every
# component to a recomputation that gains nothing; the excess test keeps most of them
# packed: benchmarks/README.md.)
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
    prod = np.empty((d, d))
    size = int(counts[components].max(initial=0))
    with single_blas_thread(), GatherBuffers.borrowed(X, size) as gather:
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


def _packed_sums(X, resp, g, kept=None, out=None):
    """``R^T [y_j y_l (j <= l), y, 1]`` summed over the rows (``y = x - g``), one GEMM
    per row chunk, float64 accumulation; only the pairs of ``kept`` (``(K, n)``
    bool, masked per chunk; ``None``: every pair).

    Returns
    -------
    acc : ndarray of shape (K, d(d+1)/2 + d + 1), float64
        Per component ``sum_i r_ik y_j y_l`` (``j <= l``, row-major upper triangle),
        then ``sum_i r_ik y`` and ``N_k``; ``out`` (overwritten) if given.
    """
    K = resp.shape[1]
    d = X.shape[1]
    T = d * (d + 1) // 2
    acc = np.empty((K, T + d + 1)) if out is None else out
    acc[...] = 0.0
    with borrow("packed_part", acc.shape) as part, \
            borrow("kept_resp", (packed_chunk_rows(*X.shape), K)) as kept_resp:
        for r0, r1, _, P in _packed_chunks(X, g):
            r = resp[r0:r1]
            if kept is not None:
                # (responsibilities are finite: r * 0 is 0)
                r = np.multiply(r, kept[:, r0:r1].T, out=kept_resp[:r1 - r0])
            np.matmul(r.T, P, out=part)
            acc += part
    return acc


#: Bytes of the (components, d, d) work arrays that turn packed sums into centred
#: second moments (:func:`_add_packed_moments`): a few per thread, never (K, d, d).
MOMENT_CHUNK_BYTES = 2**20


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
    Components are taken a chunk of ``MOMENT_CHUNK_BYTES`` at a time.

    Returns
    -------
    redo : ndarray of int
        The components left out, to recompute centred.
    """
    K, d = centers.shape
    iu = _packed_index(d)
    T = iu[0].size
    step = max(1, MOMENT_CHUNK_BYTES // (8 * d * d))
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
    with borrow("kept", resp.shape, bool, "F") as kept:
        kept = np.greater(resp, resp_threshold, out=kept).T
        counts = np.count_nonzero(kept, axis=1)
        if not (counts.sum() >= _GATHER_DENSITY * n * K and _use_packed(d, K)):
            _gathered_moments(X, resp, centers, kept, counts, range(K), nk, sum_x,
                              sum_xx)
            return
        # the mixture mean by responsibility mass: a broad component that keeps a
        # pair on every row would pull a shift weighted by kept pairs far from the data
        g = _shift(centers, resp.sum(axis=0))
        with borrow("packed_sums", (K, d * (d + 1) // 2 + d + 1)) as acc:
            # (always through the mask, so that one set of kept pairs gives the same
            # bits whatever the threshold that chose it: weighted statistics zero
            # their dropped pairs and keep the others by r > 0)
            _packed_sums(X, resp, g, kept, acc)
            redo = _add_packed_moments(acc, centers, g, nk, sum_x, sum_xx)
        if redo.size:
            _gathered_moments(X, resp, centers, kept, counts, redo, nk, sum_x, sum_xx)


def _tied_moments(X, resp, centers, sample_weight=None):
    """``s_k = sum_i r_ik (x_i - c_k)`` and ``sum_k sum_i r_ik (x_i - c_k)(x_i -
    c_k)^T`` for 'tied', with no cancellation.

    With ``m_i = sum_k r_ik c_k``, ``a_i = argmax_k r_ik`` and ``sum_k r_ik = 1``:
    ``s_k = sum_i r_ik (x_i - c_{a_i}) + sum_j W_jk (c_j - c_k)`` and the second
    moments ``sum_i (x_i - m_i)(x_i - m_i)^T + sum_{j,k} W_jk (c_k - c_j)(c_k -
    c_j)^T - sum_i e_i e_i^T``, where ``W_jk = sum_{i: a_i = j} r_ik`` and
    ``e_i = m_i - c_{a_i}``. Every term is small when the responsibilities are nearly
    one-hot, and each is formed from differences (``x_i - c_{a_i}``, ``c_k - c_j``),
    so nothing large cancels (exact copies give exactly zero; the plain ``R^T X -
    N_k c_k`` and ``m_i = R c`` lost 8 ulps of the means and 2e-8 of the covariance on
    clusters at 1e10). Three products over the rows (one of them per label) plus
    ``nnz(W) d^2`` work on the centres.

    Parameters
    ----------
    X : ndarray of shape (n, d), float64
    resp : ndarray of shape (n, K), float64
    centers : ndarray of shape (K, d), float64
    sample_weight : ndarray of shape (n,) or None, default=None
        Row weights ``w_i``: every term of row ``i`` is multiplied by ``w_i``
        (``resp`` stays the unweighted responsibilities, whose rows sum to one;
        ``W_jk`` sums ``w_i r_ik``).

    Returns
    -------
    sum_x : ndarray of shape (K, d)
    sum_xx : ndarray of shape (d, d), symmetric
    """
    n, d = X.shape
    K = centers.shape[0]
    labels = resp.argmax(axis=1)
    ref = centers[labels]
    # e_i = sum_k r_ik (c_k - c_{a_i}), one product per label on the differences of
    # the centres (resp @ centers - ref rounds relative to |c_k|: 2e-9 of the second
    # moments on clusters at 1e10)
    e = np.empty((n, d))
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], np.arange(K + 1))
    for j in np.flatnonzero(np.diff(starts)):
        rows = order[starts[j]:starts[j + 1]]
        e[rows] = resp[rows] @ (centers - centers[j])
    diff = X - ref
    wresp = resp if sample_weight is None else resp * sample_weight[:, None]
    sum_x = wresp.T @ diff
    diff -= e
    if sample_weight is None:
        out = diff.T @ diff
        out -= e.T @ e
    else:
        out = (diff * sample_weight[:, None]).T @ diff
        out -= (e * sample_weight[:, None]).T @ e
    one_hot = sparse.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(K, n))
    W = np.asarray(one_hot @ wresp)
    for j in np.flatnonzero(W.any(axis=1)):
        others = np.flatnonzero(W[j])
        others = others[others != j]
        if others.size:
            dc = centers[others] - centers[j]
            sum_x[others] -= W[j, others, None] * dc
            out += (dc.T * W[j, others]) @ dc
    return sum_x, out


def block_statistics(X, resp, centers, covariance_type, resp_threshold=0.0,
                     products=None, out=None, sample_weight=None):
    """Sufficient statistics of one block, centred on ``centers``.

    ``N_k = sum_i r_ik``, ``s_k = sum_i r_ik (x_i - c_k)`` and
    ``S_k = sum_i r_ik (x_i - c_k)(x_i - c_k)^T`` (Bishop eq. 9.24-9.27 rewritten
    around ``c_k``; centring keeps float32 data clear of the ``E[x^2] - mu^2``
    cancellation), by the covariance type's kernel: for 'full'
    :func:`full_block_statistics`, for 'tied' :func:`tied_block_statistics`, for
    'diag' and 'spherical' :func:`expanded_block_statistics`.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block (compute dtype). Not modified.
    resp : ndarray of shape (n, K), float64
        Responsibilities ``r_ik``.
    centers : ndarray of shape (K, d), float64
        Centres ``c_k``.
    covariance_type : str or CovarianceType
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
    sample_weight : ndarray of shape (n,) or None, default=None
        Row weights ``w_i``: the statistics of ``w_i r_ik``
        (:meth:`~emgmm.covariance.CovarianceType.weighted_block_statistics`; for
        all but 'tied', ``resp`` is multiplied by them in place).
        ``resp_threshold`` applies to ``r_ik``, whatever the weights' scale.

    Returns
    -------
    SufficientStatistics
        ``out``, or new statistics with ``log_likelihood = 0.0``; the caller adds the
        block's log-likelihood. For 'full' only the upper triangle of ``sum_xx`` is
        meaningful (see :class:`SufficientStatistics`).
    """
    X = np.asarray(X)
    resp = np.asarray(resp, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    kind = get_covariance_type(covariance_type)
    if sample_weight is not None:
        return kind.weighted_block_statistics(X, resp, centers, sample_weight,
                                              resp_threshold, products, out)
    return kind.block_statistics(X, resp, centers, resp_threshold, products, out)


def _added(stats, out):
    """``stats`` added into ``out`` (``stats`` itself when there is no ``out``)."""
    if out is None:
        return stats
    out += stats
    return out


def expanded_block_statistics(X, resp, centers, resp_threshold=0.0, products=None,
                              out=None):
    """'diag' and 'spherical' statistics (``sum_xx`` of shape (K, d): the diagonals)
    from one product of the responsibilities with ``[y^2, y, 1]``, ``y = x - g``:
    ``sum r (x - c)^2 = sum r y^2 - 2 (c - g) sum r y + N (c - g)^2``, in float64.
    Arguments as in :func:`block_statistics` (arrays already converted)."""
    n, d = X.shape
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
    # (scaled down, not sum_xx up: at data scales ~1e150 that would overflow)
    redo = np.flatnonzero((scale / _PACKED_MAX_CANCELLATION > sum_xx).any(axis=1))
    for k in redo:
        rows = np.flatnonzero(resp[:, k] > resp_threshold)
        diff = np.subtract(X[rows], centers[k], dtype=np.float64)
        r = resp[rows, k]
        sum_x[k] = r @ diff
        sum_xx[k] = r @ (diff * diff)
    np.maximum(sum_xx, 0.0, out=sum_xx)
    return _added(SufficientStatistics(nk, sum_x, sum_xx, 0.0, n), out)


def full_block_statistics(X, resp, centers, resp_threshold=0.0, out=None):
    """'full' statistics (see :func:`_full_statistics`), added into ``out`` in
    place (a new zero :class:`SufficientStatistics` when ``None``): no
    ``(K, d, d)`` array per block."""
    K, d = centers.shape
    if out is None:
        out = SufficientStatistics(np.zeros(K), np.zeros((K, d)),
                                   np.zeros((K, d, d)), 0.0, 0)
    _full_statistics(X, resp, centers, resp_threshold, out.nk, out.sum_x, out.sum_xx)
    out.n_samples += X.shape[0]
    return out


def tied_block_statistics(X, resp, centers, out=None, sample_weight=None):
    """'tied' statistics: ``sum_xx`` pooled over the components, (d, d)
    (:func:`_tied_moments`, with the rows' weights), every pair counted."""
    nk = resp.sum(axis=0) if sample_weight is None else sample_weight @ resp
    X64 = X.astype(np.float64, copy=False)
    sum_x, sum_xx = _tied_moments(X64, resp, centers, sample_weight)
    return _added(SufficientStatistics(nk, sum_x, sum_xx, 0.0, X.shape[0]), out)
