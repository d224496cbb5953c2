"""The E step of a block: weighted log-densities, each row's log-likelihood and the
responsibilities (Bishop 2006, eq. 9.23 and 9.28).

Pure functions of one block of rows and the model parameters they are given: none
keeps state, reads files or starts workers (the orchestration lives in
:mod:`emgmm._engine`). Notation as in :mod:`emgmm.covariance._log_density`.
"""

import numpy as np

from ..covariance._log_density import chunk_rows, log_prob
from ..covariance._packed_estimate import BeyondRange, prepare_log_prob

#: Margin (nats) of the scoring passes: the pairs left estimated change a row's
#: log-likelihood by less than exp(-50) ~ 2e-22 relative, and never hold its argmax.
SCORE_MARGIN = 50.0


def weighted_log_prob(X, weights, means, precisions_cholesky, covariance_type,
                      margin=None, prepared=None, products=None, out=None):
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
        :meth:`~emgmm.covariance._packed_estimate.RefinedEstimate.weighted_refined`),
        or, for
        'full' beyond the packed products' ``d``, are ``-inf`` where a certified
        bound puts them more than ``margin`` below the row's best
        (:class:`~emgmm.covariance._screen.ProjectionScreen`).
    prepared : object or None, default=None
        :func:`prepare_log_prob` of the same parameters and ``X.dtype``, to share
        its work between the blocks of a pass.
    products : CentredProducts or None, default=None
        'diag' and 'spherical': :func:`centred_products` of ``X`` around
        ``weights`` and ``means``, to reuse in the M step (built here if ``None``).
    out : ndarray of shape (n, K), float64, column-major, or None, default=None
        A work array for the result ('full' writes it there; the others return a
        new array): use the returned array.

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
                weighted = estimate.weighted_refined(X, margin, out)
                if weighted is not None:
                    return weighted
            if prepared and X.dtype != np.float64:
                # Too many pairs for every estimate: the plain path in float64. Its
                # float32 products lose digits where a broad component far from the
                # others moves the shift g (3e-5 to 9e-5 relative in the
                # log-likelihood were seen).
                X = X.astype(np.float64)
        except BeyondRange:
            far = estimate.beyond_range(X)
            if far.any() and not far.all():
                # only the far rows take the plain path (in float32, its check
                # refuses an overflow): with them, the whole block's float32
                # products were 9e-4 nats off
                weighted = np.empty((n, K), order="F") if out is None else out
                args = (weights, means, precisions_cholesky, covariance_type, margin)
                weighted[far] = weighted_log_prob(X[far], *args, prepared=())
                weighted[~far] = weighted_log_prob(X[~far], *args, prepared=prepared)
                return weighted
    return log_prob(X, means, precisions_cholesky, covariance_type, weights, True,
                     products, margin, out)


def estimate_log_prob_resp(X, weights, means, precisions_cholesky, covariance_type,
                           margin=None, prepared=None, out=None):
    """Per-row log-likelihood and log-responsibilities (Bishop eq. 9.23, 9.28).

    Parameters
    ----------
    X, weights, means, precisions_cholesky, covariance_type, margin, prepared, out
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
                                 covariance_type, margin, prepared, out=out)
    log_prob_norm = logsumexp_rows(weighted)
    with np.errstate(under="ignore", invalid="ignore"):
        weighted -= log_prob_norm[:, np.newaxis]
    return log_prob_norm, weighted


def estimate_resp(X, weights, means, precisions_cholesky, covariance_type, margin=None,
                  prepared=None, products=None, out=None):
    """Per-row log-likelihood and responsibilities (Bishop eq. 9.23), one exp per pair.

    ``r_ik = exp(a_ik - t_i) / sum_j exp(a_ij - t_i)`` with ``a`` the weighted
    log-densities and ``t_i`` their row maximum: the same as ``exp(log_resp)`` of
    :func:`estimate_log_prob_resp` to rounding, without the second exponential, except
    that responsibilities below ``exp(EXP_FLOOR)`` (~1e-304) are 0
    (:func:`exp_flushed`).

    Parameters
    ----------
    X, weights, means, precisions_cholesky, covariance_type, margin, prepared
        As in :func:`weighted_log_prob`.
    products, out
        As in :func:`weighted_log_prob`.

    Returns
    -------
    log_prob_norm : ndarray of shape (n,), float64
    resp : ndarray of shape (n, K), float64
    """
    resp = weighted_log_prob(X, weights, means, precisions_cholesky, covariance_type,
                             margin, prepared, products, out)
    return normalize_rows(resp), resp


def normalize_rows(weighted):
    """Responsibilities from the weighted log-densities ``weighted`` (n, K), in
    place (one exp per pair, as :func:`estimate_resp`); return ``log p(x_i)`` (n,).
    """
    log_prob_norm = np.empty(weighted.shape[0])
    for r0, r1, w, axis in _row_chunks(weighted):
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
    return log_prob_norm


#: ``exp`` of anything below this (nats) is taken as exactly 0: ``exp(-700) ~ 1e-304``.
#: numpy's vectorised ``exp`` is several times slower on arguments whose result
#: underflows to 0, and more again on those with a subnormal result (below ~-708),
#: where most pairs of a mixture of separated clusters lie (benchmarks/README.md,
#: "How the 'full' kernels get there").
EXP_FLOOR = -700.0


def exp_flushed(a):
    """``exp(a)`` in place, every result below ``exp(EXP_FLOOR)`` (~1e-304) set to 0.

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
    rows = chunk_rows(K, 8, n)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        if by_columns:
            yield r0, r1, a.T[:, r0:r1], 0
        else:
            yield r0, r1, a[r0:r1], 1


def logsumexp_rows(a):
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
