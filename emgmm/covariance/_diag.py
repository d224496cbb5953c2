"""'diag': each component has its own diagonal covariance, ``(K, d)``."""

import numpy as np

from ._base import CovarianceType, check_shape
from ._cholesky import check_precision_positivity
from ._log_density import (
    centred_products,
    centred_products_around,
    expanded_log_prob,
)
from ._m_step import diagonal_variances
from ._statistics import expanded_block_statistics


class DiagCovariance(CovarianceType):
    """Variances ``(K, d)``; factors the square roots of the precisions (K, d)."""

    name = "diag"
    streams_blocks = True

    def covariance_shape(self, n_components, n_features):
        return (n_components, n_features)

    def n_parameters(self, n_components, n_features):
        return n_components * n_features

    def statistics_values(self, n_components, n_features):
        return n_components * n_features

    def work_per_row(self, n_features):
        return n_features

    def factorize(self, covariances, dtype=np.float64, threads=1):
        limit = self.factor_limit(covariances.shape[-1], dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            u = 1.0 / np.sqrt(covariances)
        ok = (covariances > 0.0) & (u < limit)
        if ok.ndim == 2:
            ok = ok.all(axis=1)
        out = np.full_like(covariances, np.nan)
        out[ok] = u[ok]
        return out, [int(k) for k in np.flatnonzero(~ok)]

    def precisions_cholesky_from_precisions(self, precisions):
        return np.sqrt(precisions)

    def precisions_from_cholesky(self, precisions_cholesky):
        return precisions_cholesky**2

    def covariances_from_cholesky(self, precisions_cholesky):
        return 1.0 / precisions_cholesky**2

    def log_det_cholesky(self, precisions_cholesky, n_features):
        return np.log(np.asarray(precisions_cholesky, dtype=np.float64)).sum(axis=1)

    def feature_variances(self, a):
        return a

    def diagonal_precisions(self, precisions_cholesky, n_features):
        """The diagonals of the precisions, (K, d) float64."""
        return np.asarray(precisions_cholesky, dtype=np.float64) ** 2

    def block_products(self, X, model, g=None):
        """The centred products of the block around ``g`` (default: the mixture
        mean), which its log-densities and its statistics share."""
        if g is not None:
            return centred_products_around(X, g)
        return centred_products(X, model.means, model.weights)

    def log_prob(self, X, means, precisions_cholesky, g, offset, margin=None,
                 products=None, out=None):
        prec = self.diagonal_precisions(precisions_cholesky, X.shape[1])
        return expanded_log_prob(X, means, prec, g, offset, margin, products)

    def block_statistics(self, X, resp, centers, resp_threshold=0.0, products=None,
                         out=None):
        return expanded_block_statistics(X, resp, centers, resp_threshold, products,
                                         out)

    def m_step_covariances(self, stats, nk, shift, reg_covar, overwrite=False):
        return diagonal_variances(stats, nk, shift, reg_covar)

    def covariance_prior_shape(self, n_features):
        return (n_features,)

    def default_covariance_prior(self, data_covariance):
        cov = np.asarray(data_covariance)
        return np.diagonal(cov) if cov.ndim == 2 else cov

    def check_covariance_prior(self, covariance_prior):
        if np.any(covariance_prior <= 0.0):
            raise ValueError(f"covariance_prior (covariance_type={self.name!r}) "
                             "should be positive.")

    def posterior_covariances(self, nk, xk, sk, priors, mean_precision,
                              degrees_of_freedom):
        diff = xk - priors.mean_prior
        cov = priors.covariance_prior + nk[:, np.newaxis] * (
            sk + (priors.mean_precision_prior / mean_precision)[:, np.newaxis]
            * np.square(diff))
        return cov / degrees_of_freedom[:, np.newaxis]

    def weighted_mahalanobis(self, stats, delta, precisions_cholesky):
        prec = self.diagonal_precisions(precisions_cholesky, delta.shape[1])
        return np.sum(prec * (stats.sum_xx - 2.0 * delta * stats.sum_x
                              + stats.nk[:, np.newaxis] * delta**2), axis=1)

    def check_precisions(self, precisions, n_components, n_features):
        check_shape(precisions, self.covariance_shape(n_components, n_features),
                    f"{self.name} precision")
        check_precision_positivity(precisions, self.name)

    def sample(self, rng, means, covariances, counts):
        d = means.shape[1]
        return [m + rng.standard_normal(size=(s, d)) * np.sqrt(c)
                for m, c, s in zip(means, covariances, counts, strict=False)]

    has_online_statistics = True

    def second_moments_shape(self, n_components, n_features):
        return (n_components, n_features)

    def shift_second_moments(self, sum_xx, nk, sum_x, delta):
        return sum_xx - 2.0 * delta * sum_x + nk[:, None] * delta**2

    def implied_second_moments(self, weights, covariances, reg_covar, n_features):
        return weights[:, None] * (covariances - reg_covar)
