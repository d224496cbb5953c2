"""The M step from summed sufficient statistics (Bishop 2006, eq. 9.24-9.26), and the
test for the cancellation it can suffer.
"""

import numpy as np

from ._base import get_covariance_type

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
    ``2 |delta_j| e_j`` from the rounding ``e_j ~ u a_j`` of the shift itself, where
    ``a_j`` is the scale of the terms ``s_k`` was summed from (the type's
    ``recentring_terms``: by default ``|mu_kj|``, the size of the rows). Summing
    again around the new means removes ``moved_j = delta_j^2 + 2 |delta_j| a_j`` of
    that and keeps the rounding of the type's ``left_j`` (for 'factor' the model's
    ``diag(W W^T) + psi``; 0 for the others, whose ``Sigma_jj`` is the variance
    below). A
    component is flagged where ``moved_j + left_j`` exceeds ``_RECENTRE_RATIO``
    times its variance (the value the model uses, with ``reg_covar``; or that is
    not positive), so that more than 6 of its digits may be lost, and where the
    pass cuts the loss at least tenfold (``moved_j > 9 left_j``; a pass that gains
    less than a digit is not taken): a tight component whose mean moved far (Chan,
    Golub and LeVeque 1983 on updating variances). Components without weight are
    never flagged.

    Parameters
    ----------
    stats : SufficientStatistics or FactorStatistics
    means, covariances : ndarray
        :func:`m_step`'s result for ``stats`` (the type's shapes).
    covariance_type : str or CovarianceType

    Returns
    -------
    ndarray of shape (K,), bool
    """
    kind = get_covariance_type(covariance_type)
    nk = stats.nk
    shift = np.abs(stats.sum_x / (nk + 10 * np.finfo(np.float64).eps)[:, None])
    scale, left = kind.recentring_terms(stats, means, covariances)
    moved = shift * (shift + 2.0 * scale)
    limit = _RECENTRE_RATIO * np.maximum(kind.feature_variances(covariances), 0.0)
    lost = (moved + left > limit) & (moved > 9.0 * left) & (moved > 0.0)
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
    covariance_type : str or CovarianceType
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
    return get_covariance_type(covariance_type).m_step(stats, centers, reg_covar,
                                                       overwrite)


def full_covariances(stats, nk, shift, reg_covar, overwrite=False):
    """'full': ``S_k / N_k - delta_k delta_k^T + reg_covar I`` from the upper
    triangles of ``stats.sum_xx``, with cache-sized temporaries (the model may be
    gigabytes: K d^2 float64 per array); in the memory of ``stats.sum_xx`` if
    ``overwrite``."""
    d = shift.shape[1]
    cov = np.divide(stats.sum_xx, nk[:, None, None],
                    out=stats.sum_xx if overwrite else None)
    lower = np.tril(np.ones((d, d), dtype=bool), -1)
    step = max(1, 2**16 // (d * d))
    for k0 in range(0, len(cov), step):
        c, delta = cov[k0:k0 + step], shift[k0:k0 + step]
        c -= delta[:, :, None] * delta[:, None, :]
        np.copyto(c, np.swapaxes(c, 1, 2), where=lower)
    cov[:, np.arange(d), np.arange(d)] += reg_covar
    return cov


def tied_covariance(stats, nk, shift, reg_covar):
    """'tied': ``sum_k (S_k - s_k s_k^T / N_k) / sum_k N_k + reg_covar I``,
    symmetrised."""
    d = shift.shape[1]
    cov = stats.sum_xx - (shift.T * nk) @ shift
    cov /= nk.sum()
    cov = 0.5 * (cov + cov.T)
    cov[np.arange(d), np.arange(d)] += reg_covar
    return cov


def diagonal_variances(stats, nk, shift, reg_covar):
    """'diag': ``S_kj / N_k - delta_kj^2 + reg_covar`` per feature.

    A variance around the new mean is >= 0: the rounding below it is clipped.
    (scikit-learn's E[x^2] - mu^2 with the regularised N_k exceeds this by
    ~mu^2 * 10 eps / N_k, which grows with the distance from the origin: not
    copied, so the variances do not change when the data are shifted.)
    """
    cov = np.maximum(stats.sum_xx / nk[:, None] - shift**2, 0.0)
    cov += reg_covar
    return cov
