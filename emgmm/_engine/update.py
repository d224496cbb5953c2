"""The update rule of an EM run: the parameters the E step uses, the parameters
from the summed sufficient statistics, and the lower bound.

:class:`MaximumLikelihood` is :class:`~emgmm.GaussianMixture`'s. Another estimator
(a variational posterior) gives its own rule: an E-step model whose weights carry
its per-component log offsets, a "parameters from statistics" that is not the ML M
step, and its own lower bound; its :class:`~emgmm._engine.model.Model` may be a
subclass carrying the extra parameters.
"""

from ..covariance._m_step import m_step, needs_recentring
from .model import Model


class MaximumLikelihood:
    """The maximum-likelihood update (Bishop 2006, eq. 9.24-9.27)."""

    def e_step_model(self, model):
        """The parameters of the E step of ``model`` (the model itself)."""
        return model

    def parameters_from_statistics(self, data_pass, model, stats, reg_covar):
        """The M step from ``stats`` (centred on ``model.means``), summed again
        around the new means when the subtraction cancelled too much (a tight
        component that moved far from its centre: one more pass, rarely needed).

        The covariances replace the second moments of ``stats`` (only ``N_k`` and
        ``s_k`` are read on).

        Returns
        -------
        stats : SufficientStatistics
            The statistics the parameters come from.
        model : Model
            The new parameters, without factors (``precisions_cholesky=None``).
        """
        ct = model.covariance_type
        weights, means, covariances = m_step(stats, model.means, reg_covar, ct,
                                             overwrite=True)
        if needs_recentring(stats, means, covariances, ct).any():
            stats, _ = data_pass(model, 0, centers=means)
            weights, means, covariances = m_step(stats, means, reg_covar, ct,
                                                 overwrite=True)
        return stats, Model(weights, means, covariances, None, ct)

    def lower_bound(self, log_likelihood, n_samples, model):
        """The mean log-likelihood of the E step (``model``: the new parameters)."""
        return log_likelihood / n_samples
