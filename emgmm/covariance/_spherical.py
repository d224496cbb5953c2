"""'spherical': each component has its own single variance, ``(K,)``."""

import numpy as np

from ._diag import DiagCovariance


class SphericalCovariance(DiagCovariance):
    """Variances ``(K,)``; factors the square roots of the precisions (K,). The
    kernels and statistics are those of 'diag' with every feature's precision
    equal; the M step averages the diagonal over the features."""

    name = "spherical"

    def covariance_shape(self, n_components, n_features):
        return (n_components,)

    def n_parameters(self, n_components, n_features):
        return n_components

    def factor_terms(self, n_features):
        return 1

    def log_det_cholesky(self, precisions_cholesky, n_features):
        return n_features * np.log(np.asarray(precisions_cholesky, dtype=np.float64))

    def feature_variances(self, a):
        return a[:, None]

    def diagonal_precisions(self, precisions_cholesky, n_features):
        prec = np.asarray(precisions_cholesky, dtype=np.float64) ** 2
        return np.repeat(prec[:, None], n_features, axis=1)

    def implied_second_moments(self, weights, covariances, reg_covar, n_features):
        # the statistics keep the diagonal (K, d): the variance in every feature
        return np.repeat((weights * (covariances - reg_covar))[:, None], n_features,
                         axis=1)

    def m_step_covariances(self, stats, nk, shift, reg_covar, overwrite=False):
        return super().m_step_covariances(stats, nk, shift, reg_covar).mean(axis=1)

    def covariance_prior_shape(self, n_features):
        return ()

    def default_covariance_prior(self, data_covariance):
        return float(super().default_covariance_prior(data_covariance).mean())

    def posterior_covariances(self, nk, xk, sk, priors, mean_precision,
                              degrees_of_freedom):
        diff = xk - priors.mean_prior
        cov = priors.covariance_prior + nk * (
            sk + priors.mean_precision_prior / mean_precision
            * np.mean(np.square(diff), 1))
        return cov / degrees_of_freedom
