"""Variational Bayes for Gaussian mixtures from blocked sufficient statistics.

The updates of scikit-learn's ``BayesianGaussianMixture`` (Bishop 2006, section 10.2,
eq. 10.58-10.63 for the Dirichlet distribution prior; Blei and Jordan 2006, section 5,
for the truncated stick-breaking Dirichlet process), written as pure functions of the
statistics emgmm's passes accumulate (``N_k``, ``s_k``, ``S_k``, the log-likelihood):
the means ``x_k`` and covariances ``S_k`` (with ``reg_covar``) that
:func:`emgmm._m_step.m_step` forms from them, and ``sum_ik r_ik log r_ik``, derived
from the same statistics. None reads data, keeps state or imports scikit-learn.

scikit-learn's conventions are kept: ``covariances_`` are the Wishart scale matrices'
inverses divided by the degrees of freedom (``W_k^{-1} / nu_k``), so that
``precisions_cholesky_`` ``U_k`` satisfies ``U_k U_k^T = nu_k W_k``, the expected
precision (Bishop eq. 10.65 without the ``d / beta_k`` term). The lower bound is
scikit-learn's ``_compute_lower_bound``: the ELBO up to terms that do not depend on the
variational parameters.
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import betaln, digamma, gammaln

from ..covariance import get_covariance_type
from ..covariance._cholesky import ill_defined_message
from ..covariance._m_step import m_step, needs_recentring
from .model import Model

PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
_EPS10 = 10 * np.finfo(np.float64).eps


@dataclass
class DataMoments:
    """Count, mean and scatter of rows, mergeable across blocks (Chan, Golub and
    LeVeque 1983, pairwise update), for the priors' defaults.

    Attributes
    ----------
    n_samples : int
    mean : ndarray of shape (d,), float64
    scatter : ndarray of shape (d, d) or (d,), float64
        ``sum_i (x_i - mean)(x_i - mean)^T``, or only its diagonal.
    """

    n_samples: int
    mean: np.ndarray
    scatter: np.ndarray

    def __add__(self, other):
        n = self.n_samples + other.n_samples
        if self.n_samples == 0 or other.n_samples == 0:
            return self if other.n_samples == 0 else other
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n_samples / n)
        factor = self.n_samples * other.n_samples / n
        cross = (np.outer(delta, delta) if self.scatter.ndim == 2 else delta**2)
        return DataMoments(n, mean, self.scatter + other.scatter + factor * cross)


def block_moments(X, full=True):
    """:class:`DataMoments` of one block, centred on its own mean in float64.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    full : bool, default=True
        The whole scatter matrix ('full', 'tied'), or its diagonal only.

    Returns
    -------
    DataMoments
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    if n == 0:
        return DataMoments(0, np.zeros(d), np.zeros((d, d) if full else d))
    mean = X.mean(axis=0)
    Y = X - mean
    scatter = Y.T @ Y if full else np.einsum("ij,ij->j", Y, Y)
    return DataMoments(n, mean, scatter)


def moments_task(source, start, stop, block_size, full, *, blas_threads):
    """:class:`~emgmm._engine.variational.DataMoments` of rows ``start:stop``, read in
    float64 block by block (a task of the priors' pass)."""
    total = None
    for b0 in range(start, stop, block_size):
        part = block_moments(source.read(b0, min(b0 + block_size, stop), np.float64),
                             full)
        total = part if total is None else total + part
    return total


@dataclass(frozen=True)
class Priors:
    """The resolved priors (scikit-learn's ``*_prior_`` attributes).

    Attributes
    ----------
    weight_concentration_prior_type : {'dirichlet_process', 'dirichlet_distribution'}
    weight_concentration_prior : float
        ``gamma_0`` (process) or ``alpha_0`` (distribution).
    mean_precision_prior : float
        ``beta_0``.
    mean_prior : ndarray of shape (d,)
        ``m_0``.
    degrees_of_freedom_prior : float
        ``nu_0``.
    covariance_prior : ndarray or float
        ``W_0^{-1}``: (d, d) for 'full' and 'tied', (d,) for 'diag', a float for
        'spherical'.
    """

    weight_concentration_prior_type: str
    weight_concentration_prior: float
    mean_precision_prior: float
    mean_prior: np.ndarray
    degrees_of_freedom_prior: float
    covariance_prior: object


def check_degrees_of_freedom_prior(degrees_of_freedom_prior, n_features):
    """Raise scikit-learn's ``ValueError`` unless ``degrees_of_freedom_prior`` is
    ``None`` or greater than ``n_features - 1`` (a proper Wishart prior)."""
    if degrees_of_freedom_prior is not None and not (
            degrees_of_freedom_prior > n_features - 1.0):
        raise ValueError(
            "The parameter 'degrees_of_freedom_prior' should be greater than "
            f"{n_features - 1}, but got {degrees_of_freedom_prior:.3f}.")


def resolve_priors(moments, n_components, covariance_type,
                   weight_concentration_prior_type,
                   weight_concentration_prior=None, mean_precision_prior=None,
                   mean_prior=None, degrees_of_freedom_prior=None,
                   covariance_prior=None):
    """The priors, with scikit-learn's defaults for those given as ``None``.

    Defaults (``BayesianGaussianMixture._check_parameters``): ``1 / n_components``,
    ``1.0``, the mean of ``X``, ``n_features``, and ``np.cov(X.T)`` ('full', 'tied'),
    ``np.var(X, axis=0, ddof=1)`` ('diag') or its mean ('spherical'), from
    ``moments`` of all rows (:func:`block_moments`, summed over the blocks).

    Parameters
    ----------
    moments : DataMoments
        Of all rows; its scatter must be full where the covariance type's prior is
        a matrix ('full', 'tied') when ``covariance_prior`` is None.
    n_components : int
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    weight_concentration_prior_type : {'dirichlet_process', 'dirichlet_distribution'}
    weight_concentration_prior, mean_precision_prior, mean_prior,
    degrees_of_freedom_prior, covariance_prior : as the estimator's, already validated
        for shape and sign.

    Returns
    -------
    Priors

    Raises
    ------
    ValueError
        ``degrees_of_freedom_prior <= n_features - 1`` (scikit-learn's message).
    """
    d = moments.mean.shape[0]
    check_degrees_of_freedom_prior(degrees_of_freedom_prior, d)
    if degrees_of_freedom_prior is None:
        degrees_of_freedom_prior = d
    if covariance_prior is None:
        kind = get_covariance_type(covariance_type)
        covariance_prior = kind.default_covariance_prior(
            moments.scatter / (moments.n_samples - 1))
    return Priors(
        weight_concentration_prior_type,
        1.0 / n_components if weight_concentration_prior is None
        else float(weight_concentration_prior),
        1.0 if mean_precision_prior is None else float(mean_precision_prior),
        moments.mean if mean_prior is None else np.asarray(mean_prior, np.float64),
        degrees_of_freedom_prior,
        covariance_prior,
    )


@dataclass
class VariationalModel(Model):
    """The variational posterior: a :class:`Model` (``weights`` the posterior mean
    weights, ``weights_``; ``means`` ``m_k``; ``covariances`` ``W_k^{-1} / nu_k``;
    ``precisions_cholesky`` their upper factors) with the rest of it, in
    scikit-learn's attribute shapes.

    Attributes
    ----------
    weight_concentration : ndarray of shape (K,), or tuple of two of them
        Dirichlet parameters (distribution), or the Beta parameters of the sticks
        (process).
    mean_precision : ndarray of shape (K,)
        ``beta_k``.
    degrees_of_freedom : ndarray of shape (K,), or float for 'tied'
        ``nu_k``.
    resp_log_resp : float
        ``sum r log r`` of the E step whose statistics gave this posterior (0 for
        an initial one).
    """

    weight_concentration: object = None
    mean_precision: np.ndarray | None = None
    degrees_of_freedom: object = None
    resp_log_resp: float = 0.0


def estimate_weight_concentration(nk, priors):
    """Posterior of the weights (scikit-learn's ``_estimate_weights``).

    Process: ``(1 + N_k, gamma_0 + sum_{j > k} N_j)`` (Blei and Jordan 2006, eq. 19);
    distribution: ``alpha_0 + N_k`` (Bishop eq. 10.58).

    Parameters
    ----------
    nk : ndarray of shape (K,)
        With scikit-learn's ``10 eps`` added.
    priors : Priors

    Returns
    -------
    ndarray of shape (K,), or tuple of two
    """
    gamma = priors.weight_concentration_prior
    if priors.weight_concentration_prior_type == "dirichlet_process":
        return (1.0 + nk, gamma + np.hstack((np.cumsum(nk[::-1])[-2::-1], 0)))
    return gamma + nk


def update_posterior(nk, xk, sk, priors, covariance_type, factorize=True):
    """Variational M step (scikit-learn's ``_estimate_weights``, ``_estimate_means``,
    ``_estimate_precisions``; Bishop eq. 10.58, 10.60-10.63 with ``nu_k = nu_0 + N_k``).

    ``beta_k = beta_0 + N_k``, ``m_k = (beta_0 m_0 + N_k x_k) / beta_k``, and the
    covariance type's ``nu_k`` and ``W_k^{-1} / nu_k``
    (:meth:`~emgmm.covariance.CovarianceType.posterior_covariances`).

    Parameters
    ----------
    nk : ndarray of shape (K,)
        ``sum_i r_ik + 10 eps`` (scikit-learn's ``_estimate_gaussian_parameters``).
    xk : ndarray of shape (K, d)
        ``sum_i r_ik x_i / nk``.
    sk : ndarray
        The maximum-likelihood covariances from the same statistics, with
        ``reg_covar`` (scikit-learn's shapes).
    priors : Priors
    covariance_type : str
    factorize : bool, default=True
        Also the factors (else ``precisions_cholesky`` is ``None``: the engine's EM
        step factorises).

    Returns
    -------
    VariationalModel

    Raises
    ------
    ValueError
        A covariance that is not positive definite (scikit-learn's message); with a
        positive definite ``covariance_prior`` only through rounding.
    """
    kind = get_covariance_type(covariance_type)
    nk = np.asarray(nk, dtype=np.float64)
    beta = priors.mean_precision_prior + nk
    means = (priors.mean_precision_prior * priors.mean_prior
             + nk[:, np.newaxis] * xk) / beta[:, np.newaxis]
    nu = kind.posterior_degrees_of_freedom(priors.degrees_of_freedom_prior, nk)
    cov = kind.posterior_covariances(nk, xk, sk, priors, beta, nu)
    u = None
    if factorize:
        u, bad = kind.factorize(cov)
        if bad:
            raise ValueError(ill_defined_message(kind.first_failure(bad), np.float64,
                                                 cov))
    concentration = estimate_weight_concentration(nk, priors)
    weights = mixture_weights(concentration, priors.weight_concentration_prior_type)
    return VariationalModel(weights, means, cov, u, covariance_type,
                            weight_concentration=concentration, mean_precision=beta,
                            degrees_of_freedom=nu)


def expected_log_weights(weight_concentration, prior_type):
    """``E[log pi_k]`` (scikit-learn's ``_estimate_log_weights``).

    Distribution: ``psi(alpha_k) - psi(sum alpha)`` (Bishop eq. 10.66). Process:
    ``E[log v_k] + sum_{j < k} E[log(1 - v_j)]`` over the Beta sticks.

    Returns
    -------
    ndarray of shape (K,)
    """
    if prior_type == "dirichlet_process":
        a, b = weight_concentration
        digamma_sum = digamma(a + b)
        return (digamma(a) - digamma_sum
                + np.hstack((0, np.cumsum(digamma(b) - digamma_sum)[:-1])))
    return digamma(weight_concentration) - digamma(np.sum(weight_concentration))


def _log_lambda(nu, n_features):
    """``d log 2 + sum_{i<d} psi((nu_k - i) / 2)``: ``E[log det Lambda_k]`` without
    ``log det W_k`` (Bishop eq. 10.65)."""
    return n_features * math.log(2.0) + np.sum(
        digamma(0.5 * (nu - np.arange(n_features)[:, np.newaxis])), 0)


def log_prob_offsets(params, prior_type, covariance_type, n_features):
    """Per-component additive terms of the variational E step.

    scikit-learn's ``_estimate_weighted_log_prob`` of a ``BayesianGaussianMixture``
    equals ``log N(x | m_k, U_k U_k^T) + offset_k`` for every row, where the first term
    is the ordinary Gaussian log-density under ``means`` and ``precisions_cholesky``
    (emgmm's kernels; the ``nu_k`` scaling of the Mahalanobis term is already in
    ``U_k``) and ``offset_k = E[log pi_k] - d/2 log nu_k + 1/2 (d log 2 + sum_i
    psi((nu_k - i)/2) - d / beta_k)`` (Bishop eq. 10.64-10.67).

    Parameters
    ----------
    params : VariationalModel
    prior_type : {'dirichlet_process', 'dirichlet_distribution'}
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    n_features : int

    Returns
    -------
    offsets : ndarray of shape (K,), float64
    """
    d = n_features
    nu = np.asarray(params.degrees_of_freedom, dtype=np.float64)
    log_lambda = _log_lambda(np.atleast_1d(nu), d)
    per_component = (-0.5 * d * np.log(nu)
                     + 0.5 * (log_lambda - d / params.mean_precision))
    return expected_log_weights(params.weight_concentration, prior_type) + per_component


def resp_log_resp(stats, centers, log_weights, means, precisions_cholesky,
                  covariance_type):
    """``sum_ik r_ik log r_ik`` of the E step that gave ``stats``, from the
    statistics alone: no pass over ``(n, K)`` responsibilities.

    With ``a_ik = log_weights_k + log N(x_i | mu_k, U_k U_k^T)`` and ``sum_k r_ik =
    1``, ``sum_ik r_ik log r_ik = sum_k sum_i r_ik a_ik - sum_i log sum_k exp(a_ik)``;
    the first sum is ``N_k (log_weights_k - d/2 log(2 pi) + log det U_k) - 1/2 sum_i
    r_ik ||(x_i - mu_k) U_k||^2`` (the covariance type's
    :meth:`~emgmm.covariance.CovarianceType.weighted_mahalanobis`), the second the
    statistics' ``log_likelihood``. Pairs the pass left out (``r_ik <=
    resp_threshold``) change it by at most ``r_ik |a_ik|`` each.

    Parameters
    ----------
    stats : SufficientStatistics
        Summed over all rows around ``centers``, with ``log_likelihood``.
    centers : ndarray of shape (K, d)
    log_weights : ndarray of shape (K,)
        The log-weights the E step added (``log`` of the weights it was given).
    means, precisions_cholesky : ndarray
        The E step's parameters.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    float
    """
    kind = get_covariance_type(covariance_type)
    d = means.shape[1]
    log_det = kind.log_det_cholesky(precisions_cholesky, d)
    linear = np.sum(stats.nk * (log_weights - 0.5 * d * math.log(2 * math.pi)
                                + log_det))
    maha = kind.weighted_mahalanobis(stats, means - np.asarray(centers, np.float64),
                                     precisions_cholesky)
    return float(linear - 0.5 * np.sum(maha) - stats.log_likelihood)


def _log_wishart_norm(nu, log_det_chol, n_features):
    """``log B(W, nu)`` up to the ``log pi`` term (Bishop eq. B.79), from
    ``log det W^{1/2}``, as scikit-learn's ``_log_wishart_norm``."""
    return -(nu * log_det_chol + nu * n_features * 0.5 * math.log(2.0)
             + np.sum(gammaln(0.5 * (nu - np.arange(n_features)[:, np.newaxis])), 0))


def lower_bound(params, sum_resp_log_resp, prior_type, covariance_type, n_features):
    """The variational lower bound as scikit-learn's ``_compute_lower_bound``.

    ``-sum r log r - sum_k log B(W_k, nu_k) - log C(weights) - d/2 sum_k log beta_k``,
    the constant terms removed; ``log C`` is ``-sum betaln(a_k, b_k)`` (process) or
    the Dirichlet normaliser (distribution). ``sum_resp_log_resp`` comes from the E
    step that preceded the update to ``params``.

    Parameters
    ----------
    params : VariationalModel
        After the M step.
    sum_resp_log_resp : float
        :func:`resp_log_resp` over all rows.
    prior_type, covariance_type : str
    n_features : int

    Returns
    -------
    float
    """
    kind = get_covariance_type(covariance_type)
    d = n_features
    nu = params.degrees_of_freedom
    log_det = (kind.log_det_cholesky(params.precisions_cholesky, d)
               - 0.5 * d * np.log(nu))
    log_wishart = np.sum(_log_wishart_norm(nu, log_det, d))
    if kind.shared:  # one Wishart, counted for every component (scikit-learn's)
        log_wishart *= len(params.mean_precision)
    if prior_type == "dirichlet_process":
        log_norm_weight = -np.sum(betaln(*params.weight_concentration))
    else:
        alpha = params.weight_concentration
        log_norm_weight = gammaln(np.sum(alpha)) - np.sum(gammaln(alpha))
    return float(-sum_resp_log_resp - log_wishart - log_norm_weight
                 - 0.5 * d * np.sum(np.log(params.mean_precision)))


def mixture_weights(weight_concentration, prior_type):
    """``weights_``: the posterior mean weights, normalised (scikit-learn's
    ``_set_parameters``; for the process, the sticks' means multiplied out)."""
    if prior_type == "dirichlet_process":
        a, b = weight_concentration
        total = a + b
        weights = a / total * np.hstack((1, np.cumprod((b / total)[:-1])))
        return weights / np.sum(weights)
    return weight_concentration / np.sum(weight_concentration)


#: Offsets below this (nats) are raised to it before ``exp``: the E step's weights
#: stay positive (``log`` finite) and such a component's responsibilities stay below
#: ``exp(-700)`` ~ 1e-304, as scikit-learn's.
_LOG_WEIGHT_FLOOR = -700.0


class VariationalBayes:
    """The update rule of a variational EM run (scikit-learn's
    ``BayesianGaussianMixture``) for the engine's :func:`~emgmm._engine.em.em_step`.

    Parameters
    ----------
    priors : Priors or None
        ``None`` for the E step only (scoring a fitted posterior).
    weight_concentration_prior_type : str
    covariance_type : str
    """

    def __init__(self, priors, weight_concentration_prior_type, covariance_type):
        self.priors = priors
        self.prior_type = weight_concentration_prior_type
        self.covariance_type = covariance_type

    def e_step_model(self, model):
        """The :class:`Model` whose weighted log-densities are the variational E
        step's: weights ``exp(offsets)`` (:func:`log_prob_offsets`, O(1) nats), the
        posterior means and factors (which already hold ``nu_k``)."""
        d = model.means.shape[1]
        offsets = log_prob_offsets(model, self.prior_type, self.covariance_type, d)
        weights = np.exp(np.maximum(offsets, _LOG_WEIGHT_FLOOR))
        return Model(weights, model.means, model.covariances, model.precisions_cholesky,
                     self.covariance_type)

    def parameters_from_statistics(self, data_pass, model, stats, reg_covar):
        """The posterior from the statistics of the E step of ``model`` (its
        :meth:`e_step_model`), summed again around the new means when the
        subtraction cancelled too much; ``sum r log r`` of that E step is kept on
        it for :meth:`lower_bound`.

        Returns
        -------
        stats : SufficientStatistics
        posterior : VariationalModel
            Without factors.
        """
        kind = self.covariance_type
        entropy = resp_log_resp(stats, model.means, np.log(model.weights), model.means,
                                model.precisions_cholesky, kind)
        _, xk, sk = m_step(stats, model.means, reg_covar, kind)
        if needs_recentring(stats, xk, sk, kind).any():
            stats, _ = data_pass(model, 0, centers=xk)
            _, xk, sk = m_step(stats, xk, reg_covar, kind)
        posterior = update_posterior(stats.nk + _EPS10, xk, sk, self.priors, kind,
                                     factorize=False)
        posterior.resp_log_resp = entropy
        return stats, posterior

    def lower_bound(self, log_likelihood, n_samples, model):
        """scikit-learn's lower bound of the posterior ``model`` (factorised)."""
        return lower_bound(model, model.resp_log_resp, self.prior_type,
                           self.covariance_type, model.means.shape[1])
