"""'full': each component has its own covariance matrix, ``(K, d, d)``."""

import numpy as np

from .base import CovarianceType, check_shape
from .cholesky import (
    check_precision_matrix,
    cholesky_factors,
    covariances_of_factors,
    entry_below_diagonal,
    upper_factors_of_precisions,
)
from .log_density import full_mahalanobis
from .m_step import full_covariances
from .packed_estimate import prepare_full_log_prob
from .statistics import full_block_statistics


class FullCovariance(CovarianceType):
    """Covariances ``(K, d, d)``; factors ``U_k`` upper triangular (K, d, d)."""

    name = "full"
    triangular = True

    def covariance_shape(self, n_components, n_features):
        return (n_components, n_features, n_features)

    def n_parameters(self, n_components, n_features):
        return n_components * n_features * (n_features + 1) / 2.0

    def statistics_values(self, n_components, n_features):
        return n_components * n_features * (n_features + 1) // 2

    def work_per_row(self, n_features):
        return n_features * n_features

    def factorize(self, covariances, dtype=np.float64, threads=1):
        return cholesky_factors(covariances, self.factor_limit(covariances.shape[-1],
                                                               dtype), threads)

    def precisions_cholesky_from_precisions(self, precisions):
        return upper_factors_of_precisions(precisions, self.name)

    def precisions_from_cholesky(self, precisions_cholesky):
        u = precisions_cholesky
        return np.matmul(u, np.swapaxes(u, 1, 2))

    def covariances_from_cholesky(self, precisions_cholesky):
        return covariances_of_factors(precisions_cholesky)

    def log_det_cholesky(self, precisions_cholesky, n_features):
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        return np.log(np.diagonal(u, axis1=1, axis2=2)).sum(axis=1)

    def feature_variances(self, a):
        return np.diagonal(a, axis1=1, axis2=2)

    def prepare_log_prob(self, weights, means, precisions_cholesky, dtype):
        return prepare_full_log_prob(weights, means, precisions_cholesky, dtype)

    def log_prob(self, X, means, precisions_cholesky, g, offset, margin=None,
                 products=None, out=None):
        out = full_mahalanobis(X, means, precisions_cholesky, g, out)
        out *= -0.5
        out += offset
        return out

    def block_statistics(self, X, resp, centers, resp_threshold=0.0, products=None,
                         out=None):
        return full_block_statistics(X, resp, centers, resp_threshold, out)

    def m_step_covariances(self, stats, nk, shift, reg_covar, overwrite=False):
        return full_covariances(stats, nk, shift, reg_covar, overwrite)

    def factor_diagonals(self, stack):
        return np.diagonal(stack, axis1=-2, axis2=-1)

    def first_below_diagonal(self, stack):
        return entry_below_diagonal(stack)

    def check_precisions(self, precisions, n_components, n_features):
        check_shape(precisions, self.covariance_shape(n_components, n_features),
                    f"{self.name} precision")
        for precision in precisions:
            check_precision_matrix(precision, self.name)

    def sample(self, rng, means, covariances, counts):
        return [rng.multivariate_normal(m, c, int(s))
                for m, c, s in zip(means, covariances, counts)]
