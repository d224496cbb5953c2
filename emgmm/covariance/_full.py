"""'full': each component has its own covariance matrix, ``(K, d, d)``."""

import numpy as np

from ._base import CovarianceType, check_shape, widest_axis_of_matrix
from ._cholesky import (
    check_precision_matrix,
    check_symmetric_positive_definite,
    cholesky_factors,
    covariances_of_factors,
    each_component,
    entry_below_diagonal,
    upper_factors_of_precisions,
)
from ._log_density import full_mahalanobis
from ._m_step import full_covariances
from ._packed_estimate import prepare_full_log_prob
from ._statistics import full_block_statistics


class FullCovariance(CovarianceType):
    """Covariances ``(K, d, d)``; factors ``U_k`` upper triangular (K, d, d)."""

    name = "full"
    triangular = True
    #: Its components own their statistics, M step and factor under the pairs
    #: schedule (:mod:`emgmm.covariance._full_component`).
    owns_statistics = True

    def covariance_shape(self, n_components, n_features):
        return (n_components, n_features, n_features)

    def n_parameters(self, n_components, n_features):
        return n_components * n_features * (n_features + 1) // 2

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

    def widest_axis(self, covariance, n_features):
        return widest_axis_of_matrix(covariance)

    def feature_variances(self, a):
        return np.diagonal(a, axis1=1, axis2=2)

    def prepare_log_prob(self, weights, means, precisions_cholesky, dtype,
                         screen=None):
        return prepare_full_log_prob(weights, means, precisions_cholesky, dtype,
                                     screen)

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

    def covariance_prior_shape(self, n_features):
        return (n_features, n_features)

    def default_covariance_prior(self, data_covariance):
        return np.atleast_2d(data_covariance)

    def check_covariance_prior(self, covariance_prior):
        check_symmetric_positive_definite(covariance_prior, self.name)

    def posterior_covariances(self, nk, xk, sk, priors, mean_precision,
                              degrees_of_freedom):
        diff = xk - priors.mean_prior
        coef = nk * priors.mean_precision_prior / mean_precision
        cov = np.empty_like(sk)
        for k in range(len(nk)):  # (one d x d temporary at a time)
            cov[k] = priors.covariance_prior + nk[k] * sk[k]
            cov[k] += coef[k] * np.outer(diff[k], diff[k])
        cov /= degrees_of_freedom[:, np.newaxis, np.newaxis]
        return cov

    def weighted_mahalanobis(self, stats, delta, precisions_cholesky):
        u, s, nk = precisions_cholesky, stats.sum_x, stats.nk
        out = np.empty(len(nk))
        for k in range(len(nk)):  # (the upper triangle of S_k is meaningful)
            upper = np.triu(stats.sum_xx[k])
            dU, sU = delta[k] @ u[k], s[k] @ u[k]
            out[k] = (np.sum(((upper + np.triu(upper, 1).T) @ u[k]) * u[k])
                      - 2.0 * dU @ sU + nk[k] * dU @ dU)
        return out

    def factor_diagonals(self, stack):
        return np.diagonal(stack, axis1=-2, axis2=-1)

    def first_below_diagonal(self, stack):
        return entry_below_diagonal(stack)

    def check_precisions(self, precisions, n_components, n_features):
        check_shape(precisions, self.covariance_shape(n_components, n_features),
                    f"{self.name} precision")
        each_component(lambda k: check_precision_matrix(precisions[k], self.name),
                       n_components, n_features)

    def sample(self, rng, means, covariances, counts):
        return [rng.multivariate_normal(m, c, int(s))
                for m, c, s in zip(means, covariances, counts, strict=False)]

    has_online_statistics = True

    def second_moments_shape(self, n_components, n_features):
        return (n_components, n_features, n_features)

    def shift_second_moments(self, sum_xx, nk, sum_x, delta):
        cross = sum_x[:, :, None] * delta[:, None, :]
        return (sum_xx - cross - np.swapaxes(cross, 1, 2)
                + nk[:, None, None] * delta[:, :, None] * delta[:, None, :])

    def implied_second_moments(self, weights, covariances, reg_covar, n_features):
        return weights[:, None, None] * (covariances - reg_covar * np.eye(n_features))

    def symmetrised_second_moments(self, sum_xx):
        d = sum_xx.shape[1]
        lower = np.tril(np.ones((d, d), dtype=bool), -1)
        np.copyto(sum_xx, np.swapaxes(sum_xx, 1, 2), where=lower)
        return sum_xx
