"""'factor' kernels on chosen pairs: each component's rows gathered, centred on its
mean in float64 and projected by one product (``O(d q)`` per pair).

The screened E step computes only the pairs that may matter
(:mod:`emgmm.covariance._factor_screen`), and its responsibilities are then mostly
exact zeros: the statistics of such a block are summed over each component's rows of
nonzero responsibility instead of over every pair (:func:`pair_statistics`).
Notation as in :mod:`emgmm.covariance._factor_parameters`.
"""

import queue

import numpy as np

from .._runtime.blas import over_ranges, threads_for_loop
from .._runtime.gather import GatherBuffers
from .._runtime.lapack import gemm_add
from ._factor_statistics import zero_statistics
from ._log_density import _gamma

_U64 = np.finfo(np.float64).eps / 2
#: Bytes of the gathered rows taken at a time (float64) by a call's threads together:
#: its gather buffers hold at most this much, not a component's rows of the block.
GATHER_CHUNK_BYTES = 16 * 2**20


def _row_chunks(start, stop, step):
    """``(c0, c1)`` spans of ``start:stop`` of at most ``step`` rows each."""
    return [(c0, min(c0 + step, stop)) for c0 in range(start, stop, step)]


def pair_values(X, means, precision, offset, comps, rows, g_norm=None):
    """``offset_k - 1/2 m_ik`` of the pairs ``(rows[j], comps[j])`` (sorted by
    component), with ``m_ik = sum_j (x_ij - mu_kj)^2 / psi_kj - ||p_k(x_i)||^2``
    (clipped at 0, as the dense kernel does) from the rows centred in float64.

    With ``g_norm``, also a bound of each value's rounding (Higham 2002, eq. 3.5):
    the diagonal sum of positive terms is within ``gamma_{d+3}`` relative; ``p =
    fl(fl(x - mu) G_k)`` is within ``e = gamma_{d+1} ||x - mu|| ||G_k||_F`` of the
    exact projection, so ``fl(||p||^2)`` is within ``2 ||p|| e + e^2 + gamma_q
    ||p||^2``; the subtraction adds ``u`` of both terms, the offset ``2u`` of the
    value. The values are exact for the parameters as ``precision`` holds them.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    means : ndarray of shape (K, d), float64
    precision : FactorPrecision
    offset : ndarray of shape (K,)
    comps, rows : ndarray of int, shape (m,)
    g_norm : ndarray of shape (K,) or None, default=None
        Upper bounds of ``||G_k||_F``: then the rounding bounds are returned too.

    Returns
    -------
    values : ndarray of shape (m,), float64
    errors : ndarray of shape (m,), float64
        Only with ``g_norm``.
    """
    K, d = means.shape
    bounds = np.searchsorted(comps, np.arange(K + 1))
    counts = np.diff(bounds)
    values = np.empty(comps.size)
    errors = g_norm is not None
    err = np.empty(comps.size) if errors else None

    def component_range(k0, k1, gb, step):
        for k in k0 + np.flatnonzero(counts[k0:k1]):
            for b0, b1 in _row_chunks(bounds[k], bounds[k + 1], step):
                u = gb.centred(rows[b0:b1], means[k])
                p = u @ precision.projection[k]
                pp = np.einsum("ij,ij->i", p, p)
                np.square(u, out=u)
                diag = u @ precision.inv_noise[k]
                out = values[b0:b1]
                np.subtract(diag, pp, out=out)
                np.maximum(out, 0.0, out=out)
                out *= -0.5
                out += offset[k]
                if errors:
                    err[b0:b1] = _value_errors(diag, pp, np.sqrt(u.sum(axis=1)),
                                               g_norm[k], out, d, p.shape[1])

    _over_components(component_range, X, counts, d * (precision.n_factors + 2))
    return (values, err) if errors else values


def _over_components(func, X, counts, work_per_row):
    """``func(k0, k1, gather_buffers, step)`` over ranges of the components of about
    equal gathered rows ``counts`` (K,) (:func:`~emgmm._runtime.blas.over_ranges`),
    in threads when their ``counts.sum() * work_per_row`` flops are worth it. The
    threads share one borrowed pair of gather buffers of ``GATHER_CHUNK_BYTES``,
    a slice each (``step`` rows of ``X`` at a time), whatever their number."""
    threads = threads_for_loop(float(counts.sum()) * work_per_row)
    step = max(1, GATHER_CHUNK_BYTES // (8 * max(X.shape[1], 1) * threads))
    with GatherBuffers.borrowed(X, int(min(counts.max(initial=0), step)) * threads) \
            as gb:
        free = queue.SimpleQueue()
        for part in gb.split(threads):
            free.put(part)

        def run(k0, k1):
            part = free.get()
            try:
                func(k0, k1, part, step)
            finally:
                free.put(part)

        over_ranges(run, counts.size, threads, work=counts)


def _value_errors(diag, pp, u_norm, g_norm, values, d, q):
    """The rounding bound of :func:`pair_values` of one component's pairs."""
    e = _gamma(d + 1, np.float64) * u_norm * g_norm * (1.0 + _gamma(d + 4, np.float64))
    p_norm = np.sqrt(pp / (1.0 - _gamma(q, np.float64)))
    m_err = (_gamma(d + 3, np.float64) * diag + 2.0 * p_norm * e + e * e
             + _gamma(q, np.float64) * p_norm**2 + _U64 * (diag + pp))
    return (0.5 * m_err + 2.0 * _U64 * np.abs(values)) * (1.0 + 1e-6)


def pair_statistics(X, resp, centers, means, precision, resp_threshold=0.0,
                    out=None):
    """:class:`~emgmm.covariance._factor_statistics.FactorStatistics` of a block summed
    over each component's rows of responsibility above ``resp_threshold`` only.

    The same sums as :func:`~emgmm.covariance._factor_statistics.block_statistics`
    (``u = x - c_k``, ``e = p_k(x) L_k^{-1}`` with ``p_k`` around the E step's mean
    ``mu_k``), from the gathered rows: ``O(d q)`` per pair with a nonzero
    responsibility, against ``O(d K q)`` per row for the dense sums.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    resp : ndarray of shape (n, K), float64
    centers : ndarray of shape (K, d)
        The centres of the sums.
    means : ndarray of shape (K, d)
        The E step's means.
    precision : FactorPrecision
        The E step's factorisation.
    resp_threshold : float, default=0.0
    out : FactorStatistics or None, default=None
        Running sums to add this block's to (in place; no ``(K, d, q)`` array of the
        block is formed).

    Returns
    -------
    FactorStatistics
        ``out`` with this block's sums and ``n`` rows added, or this block's alone
        (``log_likelihood = 0``).
    """
    n, d = X.shape
    K, q = resp.shape[1], precision.n_factors
    stats = zero_statistics(K, d, q) if out is None else out
    stats.n_samples += n
    cov_z = np.matmul(np.swapaxes(precision.cholesky_inv, 1, 2), precision.cholesky_inv)
    keep = resp > resp_threshold
    counts = keep.sum(axis=0)

    def component_range(k0, k1, gb, step):
        for k in k0 + np.flatnonzero(counts[k0:k1]):
            rows = np.flatnonzero(keep[:, k])
            delta = (np.asarray(centers[k], dtype=np.float64)
                     - np.asarray(means[k], dtype=np.float64))
            for c0, c1 in _row_chunks(0, rows.size, step):
                chunk = rows[c0:c1]
                _component_sums(stats, k, gb.centred(chunk, means[k]),
                                resp[chunk, k], delta, precision, cov_z[k])

    _over_components(component_range, X, counts, 4 * d * q)
    return stats


def _component_sums(stats, k, u, r, delta, precision, cov_z):
    """Add component ``k``'s sums over its gathered rows ``u = x - mu_k`` (m, d;
    overwritten) with responsibilities ``r`` (m,), re-centred on ``c_k = mu_k +
    delta``."""
    e = (u @ precision.projection[k]) @ precision.cholesky_inv[k]
    re = e * r[:, None]
    nk = r.sum()
    if stats.sum_abs_x is not None:  # (the terms of sum_x: fl(x - mu) - delta)
        stats.sum_abs_x[k] += r @ np.abs(u) + nk * np.abs(delta)
    if np.any(delta):
        u -= delta
    stats.nk[k] += nk
    stats.sum_z[k] += re.sum(axis=0)
    stats.sum_zz[k] += e.T @ re + nk * cov_z
    gemm_add(stats.sum_xz[k].T, re.T, u.T, trans_b=True)  # sum_xz += u^T re
    stats.sum_x[k] += r @ u
    np.square(u, out=u)
    stats.sum_xx[k] += r @ u
