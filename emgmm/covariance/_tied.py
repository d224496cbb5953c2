"""'tied': one covariance matrix shared by all components, ``(d, d)``."""

import numpy as np

from ._base import CovarianceType, check_shape, widest_axis_of_matrix
from ._cholesky import (
    check_precision_matrix,
    check_symmetric_positive_definite,
    cholesky_factors,
    covariances_of_factors,
    entry_below_diagonal,
    upper_factors_of_precisions,
)
from ._log_density import tied_log_prob
from ._m_step import tied_covariance
from ._statistics import tied_block_statistics

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
        return n_features * (n_features + 1) // 2

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

    def widest_axis(self, covariance, n_features):
        return widest_axis_of_matrix(covariance)

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

    def weighted_block_statistics(self, X, resp, centers, sample_weight,
                                  resp_threshold=0.0, products=None, out=None):
        # the kernel reads responsibilities that sum to one per row: the weights
        # go in apart (resp is not modified)
        return tied_block_statistics(X, resp, centers, out, sample_weight)

    def m_step_covariances(self, stats, nk, shift, reg_covar, overwrite=False):
        return tied_covariance(stats, nk, shift, reg_covar)

    def covariances_from_responsibilities(self, X, resp, means, nk, reg_covar,
                                          sample_weight=None):
        """scikit-learn's pooled initial covariance, formed without cancellation.

        scikit-learn forms ``(X^T X - sum_k N_k mu_k mu_k^T) / sum_k N_k``
        (``_estimate_gaussian_covariances_tied``), whose terms cancel catastrophically
        when the clusters lie far apart relative to their spread (two clusters at
        ``+-1e8`` with unit spread: nothing of the spread is left, and the fit fails as
        if a component had collapsed). The same value is
        ``sum_k sum_i r_ik (x_i - mu_k)(x_i - mu_k)^T / sum_k N_k`` over rows whose
        responsibilities sum to one (k-means, random; up to rounding), formed here
        centred on each component's mean (the 'tied' second moments of
        :func:`~emgmm.covariance._statistics.tied_block_statistics`: no large terms
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
        sample_weight : ndarray of shape (m,) or None, default=None
            Multiplies every row's terms.

        Returns
        -------
        ndarray of shape (d, d)
        """
        owned = resp.sum(axis=1) > 0
        d = X.shape[1]
        w = np.ones(X.shape[0]) if sample_weight is None else sample_weight
        scatter = np.zeros((d, d))
        # by chunks of rows: the centred products hold a few copies of their rows
        for start in range(0, X.shape[0], _CHUNK_ROWS):
            x, r, own, wc = (a[start:start + _CHUNK_ROWS]
                             for a in (X, resp, owned, w))
            if own.any():
                scatter += tied_block_statistics(
                    x[own], np.asarray(r[own], dtype=np.float64),
                    np.asarray(means, dtype=np.float64),
                    sample_weight=None if sample_weight is None else wc[own]).sum_xx
            rest = x[~own]
            scatter += (rest * wc[~own, None]).T @ rest
        cov = scatter / nk.sum()
        cov = 0.5 * (cov + cov.T)
        cov[np.diag_indices_from(cov)] += reg_covar
        return cov

    def covariance_prior_shape(self, n_features):
        return (n_features, n_features)

    def default_covariance_prior(self, data_covariance):
        return np.atleast_2d(data_covariance)

    def check_covariance_prior(self, covariance_prior):
        check_symmetric_positive_definite(covariance_prior, self.name)

    def posterior_degrees_of_freedom(self, degrees_of_freedom_prior, nk):
        # one Wishart for all components, with the mean count (scikit-learn's)
        return degrees_of_freedom_prior + nk.sum() / len(nk)

    def posterior_covariances(self, nk, xk, sk, priors, mean_precision,
                              degrees_of_freedom):
        K = len(nk)
        diff = xk - priors.mean_prior
        cov = (priors.covariance_prior + sk * nk.sum() / K
               + priors.mean_precision_prior / K
               * np.dot((nk / mean_precision) * diff.T, diff))
        return cov / degrees_of_freedom

    def weighted_mahalanobis(self, stats, delta, precisions_cholesky):
        u, nk = precisions_cholesky, stats.nk
        dU, sU = delta @ u, stats.sum_x @ u
        return (np.sum((stats.sum_xx @ u) * u) - 2.0 * np.sum(dU * sU)
                + np.sum(nk * np.einsum("kj,kj->k", dU, dU)))

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
                for m, s in zip(means, counts, strict=False)]

    has_online_statistics = True

    def second_moments_shape(self, n_components, n_features):
        return (n_features, n_features)

    def shift_second_moments(self, sum_xx, nk, sum_x, delta):
        cross = sum_x.T @ delta  # (the terms summed over the components)
        return sum_xx - cross - cross.T + (delta.T * nk) @ delta

    def implied_second_moments(self, weights, covariances, reg_covar, n_features):
        return weights.sum() * (covariances - reg_covar * np.eye(n_features))
