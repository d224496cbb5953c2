"""'tied': one covariance matrix shared by all components, ``(d, d)``."""

import numpy as np

from .base import CovarianceType, check_shape
from .cholesky import (
    check_precision_matrix,
    cholesky_factors,
    covariances_of_factors,
    entry_below_diagonal,
    upper_factors_of_precisions,
)
from .log_density import tied_log_prob
from .m_step import tied_covariance
from .statistics import tied_block_statistics

# rows of the sample per chunk of the initial covariance (see
# covariances_from_responsibilities)
_CHUNK_ROWS = 8192


class TiedCovariance(CovarianceType):
    """One covariance ``(d, d)``; its factor ``U`` upper triangular (d, d)."""

    name = "tied"
    shared = True
    triangular = True

    def covariance_shape(self, n_components, n_features):
        return (n_features, n_features)

    def n_parameters(self, n_components, n_features):
        return n_features * (n_features + 1) / 2.0

    def statistics_values(self, n_components, n_features):
        return n_features * (n_features + 1) // 2

    def work_per_row(self, n_features):
        return n_features * n_features

    def factorize(self, covariances, dtype=np.float64, threads=1):
        limit = self.factor_limit(covariances.shape[-1], dtype)
        out, bad = cholesky_factors(covariances[np.newaxis], limit)
        return out[0], bad

    def precisions_cholesky_from_precisions(self, precisions):
        return upper_factors_of_precisions(precisions[np.newaxis], self.name)[0]

    def precisions_from_cholesky(self, precisions_cholesky):
        return precisions_cholesky @ precisions_cholesky.T

    def covariances_from_cholesky(self, precisions_cholesky):
        return covariances_of_factors(precisions_cholesky[np.newaxis])[0]

    def log_det_cholesky(self, precisions_cholesky, n_features):
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        return np.log(np.diag(u)).sum()

    def feature_variances(self, a):
        return np.diagonal(a)[None, :]

    def per_component(self, a):
        return np.asarray(a)[np.newaxis]

    def slice_factors(self, precisions_cholesky, k0, k1):
        return precisions_cholesky

    def pooled_covariance(self, weights, covariances, healthy):
        return None

    def first_failure(self, bad):
        return None

    def log_prob(self, X, means, precisions_cholesky, g, offset, margin=None,
                 products=None, out=None):
        return tied_log_prob(X, means, precisions_cholesky, g, offset, margin)

    def block_statistics(self, X, resp, centers, resp_threshold=0.0, products=None,
                         out=None):
        return tied_block_statistics(X, resp, centers, out)

    def m_step_covariances(self, stats, nk, shift, reg_covar, overwrite=False):
        return tied_covariance(stats, nk, shift, reg_covar)

    def covariances_from_responsibilities(self, X, resp, means, nk, reg_covar):
        """scikit-learn's pooled initial covariance, formed without cancellation.

        scikit-learn forms ``(X^T X - sum_k N_k mu_k mu_k^T) / sum_k N_k``
        (``_estimate_gaussian_covariances_tied``), whose terms cancel catastrophically
        when the clusters lie far apart relative to their spread (two clusters at
        ``+-1e8`` with unit spread: nothing of the spread is left, and the fit fails as
        if a component had collapsed). The same value is
        ``sum_k sum_i r_ik (x_i - mu_k)(x_i - mu_k)^T / sum_k N_k`` over rows whose
        responsibilities sum to one (k-means, random; up to rounding), formed here
        centred on each component's mean (the 'tied' second moments of
        :func:`~emgmm.covariance.statistics.tied_block_statistics`: no large terms
        cancel), plus ``x_i x_i^T`` for rows without responsibility (all but ``K``
        rows for k-means++ and random_from_data), which scikit-learn's formula
        counts uncentred.

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
                scatter += tied_block_statistics(
                    x[own], np.asarray(r[own], dtype=np.float64),
                    np.asarray(means, dtype=np.float64)).sum_xx
            rest = x[~own]
            scatter += rest.T @ rest
        cov = scatter / nk.sum()
        cov = 0.5 * (cov + cov.T)
        cov[np.diag_indices_from(cov)] += reg_covar
        return cov

    def factor_name(self, index):
        return "precisions_cholesky (tied)"

    def factor_diagonals(self, stack):
        return np.diagonal(stack, axis1=-2, axis2=-1)

    def first_below_diagonal(self, stack):
        return entry_below_diagonal(stack)

    def check_precisions(self, precisions, n_components, n_features):
        check_shape(precisions, self.covariance_shape(n_components, n_features),
                    f"{self.name} precision")
        check_precision_matrix(precisions, self.name)

    def sample(self, rng, means, covariances, counts):
        return [rng.multivariate_normal(m, covariances, int(s))
                for m, s in zip(means, counts)]
