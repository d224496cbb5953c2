"""'full': one component's sufficient statistics, M step and precision factor, in
place in the arrays of the component that owns them.

Pure functions of one component's rows and arrays: the heavy products are BLAS
and LAPACK calls that release the GIL (:mod:`emgmm._runtime.lapack`), so threads
that own other components run at the same time. Notation as in
:mod:`emgmm.covariance._log_density`; the second moments and covariances are C-ordered
``(d, d)`` arrays, whose upper triangle is the lower triangle of their column-major
transpose that BLAS writes.
"""

import numpy as np

from .._runtime.lapack import potrf_lower, syrk_lower_add, trtri_lower
from ._cholesky import mirror_upper, strictly_lower

_EPS = np.finfo(np.float64).eps


def add_moments(y, weights, sum_xx, sum_x):
    """Add ``sum_i w_i y_i`` into ``sum_x`` (d,) and ``sum_i w_i y_i y_i^T`` into
    the upper triangle of ``sum_xx`` (d, d); return ``sum_i w_i``.

    Parameters
    ----------
    y : ndarray of shape (m, d), float64, C-ordered
        Rows centred on the component's centre; overwritten (scaled by
        ``sqrt(w_i)``).
    weights : ndarray of shape (m,)
        ``w_i r_ik`` of the rows.
    sum_xx : ndarray of shape (d, d), C-ordered
    sum_x : ndarray of shape (d,)

    Returns
    -------
    float
    """
    if y.shape[0] == 0:
        return 0.0
    sum_x += weights @ y
    y *= np.sqrt(weights)[:, None]
    syrk_lower_add(sum_xx.T, y.T)
    return float(weights.sum())


def m_step_in_place(sum_xx, sum_x, nk, reg_covar):
    """Turn the second moments ``sum_xx`` (upper triangle) into the covariance
    ``S_k / N_k - delta delta^T + reg_covar I`` in place (symmetric), with
    ``N_k = nk + 10 eps`` as scikit-learn regularises it and ``delta = s_k / N_k``
    (Bishop 2006, eq. 9.25, around the centre); return ``delta``, the shift of the
    mean from the centre."""
    d = sum_x.shape[0]
    count = nk + 10 * _EPS
    delta = sum_x / count
    np.divide(sum_xx, count, out=sum_xx)
    syrk_lower_add(sum_xx.T, np.asfortranarray(delta[:, None]), alpha=-1.0)
    mirror_upper(sum_xx)
    sum_xx.flat[::d + 1] += reg_covar
    return delta


def factor_in_place(covariance, factor, limit):
    """The upper precision Cholesky factor ``U = L^{-T}`` of ``covariance = L L^T``
    into ``factor`` (both (d, d), C-ordered): the covariance copied there, factored
    and inverted in place (LAPACK ``potrf`` and ``trtri``, ``2 d^3 / 3`` flops).

    Returns
    -------
    bool
        Whether the covariance is positive definite and every entry of ``U`` is below
        ``limit`` in magnitude (else ``factor`` is NaN).
    """
    d = covariance.shape[0]
    a = factor.T  # column-major: its lower triangle is the factor's upper one
    np.copyto(factor, covariance)
    ok = potrf_lower(a) == 0 and trtri_lower(a) == 0
    if ok:
        np.copyto(factor, 0.0, where=strictly_lower(d))
        ok = bool(factor.max() < limit and -factor.min() < limit)
    if not ok:
        factor[...] = np.nan
    return ok
