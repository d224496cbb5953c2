"""Initial parameters from a bounded random subsample, as scikit-learn computes them.

scikit-learn initialises from responsibilities over the whole of ``X``
(``sklearn.mixture._base.BaseMixture._initialize_parameters``). emgmm does the same on
a subsample of at most ``init_max_samples`` rows, drawn with the estimator's random
state and read in increasing row order (one sequential pass at most). When ``X`` has
no more rows than that, the subsample is ``X`` itself and no random numbers are drawn
for it, so every ``init_params`` gives exactly scikit-learn's initialisation.
"""

import numpy as np
from sklearn.cluster import KMeans, kmeans_plusplus

from ..covariance.m_step import m_step
from ..covariance.statistics import block_statistics

#: Rows per chunk of the pooled 'tied' scatter (see _tied_covariance).
_CHUNK_ROWS = 8192


def subsample_indices(n_samples, max_samples, random_state):
    """Sorted row indices of the initialisation subsample, or ``None`` for all rows.

    Parameters
    ----------
    n_samples, max_samples : int
    random_state : numpy.random.RandomState

    Returns
    -------
    ndarray of int or None
    """
    if n_samples <= max_samples:
        return None
    return np.sort(random_state.choice(n_samples, size=max_samples, replace=False))


def initial_responsibilities(X, n_components, init_params, random_state):
    """Responsibilities the initialisation starts from (scikit-learn's four methods).

    Parameters
    ----------
    X : ndarray of shape (m, d)
        The subsample.
    n_components : int
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data'}
    random_state : numpy.random.RandomState
        Consumed exactly as scikit-learn consumes it.

    Returns
    -------
    resp : ndarray of shape (m, n_components), float64
    """
    m = X.shape[0]
    resp = np.zeros((m, n_components), dtype=np.float64)
    if init_params == "kmeans":
        labels = (
            KMeans(n_clusters=n_components, n_init=1, random_state=random_state)
            .fit(X)
            .labels_
        )
        resp[np.arange(m), labels] = 1
    elif init_params == "random":
        resp = random_state.uniform(size=(m, n_components))
        resp /= resp.sum(axis=1)[:, np.newaxis]
    elif init_params == "random_from_data":
        indices = random_state.choice(m, size=n_components, replace=False)
        resp[indices, np.arange(n_components)] = 1
    else:  # "k-means++"
        _, indices = kmeans_plusplus(X, n_components, random_state=random_state)
        resp[indices, np.arange(n_components)] = 1
    return resp


def _tied_covariance(X, resp, means, nk, reg_covar):
    """scikit-learn's pooled initial covariance, formed without cancellation.

    scikit-learn forms ``(X^T X - sum_k N_k mu_k mu_k^T) / sum_k N_k``
    (``_estimate_gaussian_covariances_tied``), whose terms cancel catastrophically
    when the clusters lie far apart relative to their spread (two clusters at
    ``+-1e8`` with unit spread: nothing of the spread is left, and the fit fails as
    if a component had collapsed). The same value is
    ``sum_k sum_i r_ik (x_i - mu_k)(x_i - mu_k)^T / sum_k N_k`` over rows whose
    responsibilities sum to one (k-means, random; up to rounding), formed here
    centred on each component's mean (:func:`~emgmm.covariance.statistics.block_statistics`'
    'tied' second moments: no large terms cancel), plus ``x_i x_i^T`` for rows
    without responsibility (all but ``K`` rows for k-means++ and random_from_data),
    which scikit-learn's formula counts uncentred.

    Parameters
    ----------
    X : ndarray of shape (m, d), float64
    resp : ndarray of shape (m, K)
        Rows summing to one, or to zero.
    means : ndarray of shape (K, d)
        ``sum_i r_ik x_i / N_k``.
    nk : ndarray of shape (K,)
        ``N_k``, with scikit-learn's ``10 eps``.
    reg_covar : float

    Returns
    -------
    ndarray of shape (d, d)
    """
    owned = resp.sum(axis=1) > 0
    d = X.shape[1]
    scatter = np.zeros((d, d))
    # by chunks of rows: the centred products hold a few copies of their rows
    for start in range(0, X.shape[0], _CHUNK_ROWS):
        x, r, own = (a[start:start + _CHUNK_ROWS] for a in (X, resp, owned))
        if own.any():
            scatter += block_statistics(x[own], r[own], means, "tied").sum_xx
        rest = x[~own]
        scatter += rest.T @ rest
    cov = scatter / nk.sum()
    cov = 0.5 * (cov + cov.T)
    cov[np.diag_indices_from(cov)] += reg_covar
    return cov


def parameters_from_responsibilities(X, resp, reg_covar, covariance_type):
    """Weights, means and covariances from responsibilities on an in-memory sample.

    Follows ``sklearn.mixture._gaussian_mixture._estimate_gaussian_parameters``:
    ``N_k = sum_i r_ik + 10 eps``, ``w_k = N_k / m`` (not renormalised, as in
    scikit-learn's initialisation), means ``sum_i r_ik x_i / N_k``. Statistics are
    centred on those means; for 'tied', see :func:`_tied_covariance` (scikit-learn's
    value, also where rows of ``resp`` do not sum to one).

    Parameters
    ----------
    X : ndarray of shape (m, d)
    resp : ndarray of shape (m, K)
    reg_covar : float
    covariance_type : str

    Returns
    -------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    covariances : ndarray
    """
    X64 = np.asarray(X, dtype=np.float64)
    m = X64.shape[0]
    nk = resp.sum(axis=0) + 10 * np.finfo(np.float64).eps
    means = (resp.T @ X64) / nk[:, np.newaxis]
    if covariance_type == "tied":
        covariances = _tied_covariance(X64, resp, means, nk, reg_covar)
    else:
        stats = block_statistics(X64, resp, means, covariance_type)
        _, _, covariances = m_step(stats, means, reg_covar, covariance_type)
    return nk / m, means, covariances
