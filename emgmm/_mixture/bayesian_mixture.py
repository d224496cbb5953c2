"""Variational Bayesian Gaussian mixture fitted from blocked, out-of-core passes."""

from __future__ import annotations

import os
from collections.abc import Callable
from numbers import Real
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from .._engine.variational import (
    PRIOR_TYPES,
    Priors,
    VariationalBayes,
    VariationalModel,
    block_moments,
    check_degrees_of_freedom_prior,
    moments_task,
    resolve_priors,
    update_posterior,
)
from ..covariance import REGISTRY
from .base import BaseMixture, DataLike
from .initialization import (
    initial_responsibilities,
    parameters_from_responsibilities,
)
from .parameter_docs import fill_parameter_docs
from .validation import Interval, StrOptions

if TYPE_CHECKING:
    from typing_extensions import Self

_POSITIVE = Interval(Real, 0.0, None, closed="neither")


@fill_parameter_docs(
    headings={"schedule": "schedule : {'auto', 'rows', 'components'}, default='auto'"},
    schedule="'pairs' is maximum likelihood's (:class:`emgmm.GaussianMixture`): it\n"
             "does not apply to the variational fit.",
    checkpoint="The checkpoint holds the posterior; the priors are recomputed from\n"
               "the data, which it fingerprints.")
class BayesianGaussianMixture(BaseMixture):
    """Variational Bayesian Gaussian mixture, fitted by blocked, out-of-core passes.

    A drop-in for :class:`sklearn.mixture.BayesianGaussianMixture` (scikit-learn
    1.9.1's parameters, defaults, attributes and lower bound; Bishop 2006, section
    10.2; Blei and Jordan 2006 for the Dirichlet process) that reads ``np.memmap``,
    ``.npy`` and HDF5 data in row blocks and runs the blocks on joblib workers, as
    :class:`emgmm.GaussianMixture`. Each iteration reads ``X`` once: the E step adds
    per-component offsets (expected log-weights and log-determinants, ``-d / (2
    beta_k)``) to emgmm's Gaussian kernels, and everything else, ``sum r log r`` of
    the lower bound included, comes from the blocks' sufficient statistics. The
    priors' defaults (mean and covariance of ``X``) take one more pass per fit.

    Parameters
    ----------
    n_components : int, default=1
        Number of components; the prior may leave some of them with almost no
        weight.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}, default='full'
        As scikit-learn's.
    tol : float, default=1e-3
        EM stops when the lower bound changes by less (the bound is not divided by
        ``n_samples``, as in scikit-learn).
    reg_covar : float, default=1e-6
        Non-negative value added to the diagonal of every covariance.
    max_iter : int, default=100
        EM iterations per initialisation.
    n_init : int, default=1
        Initialisations; the run with the highest final lower bound is kept.
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data'}, \
default='kmeans'
        As scikit-learn's, on at most ``init_max_samples`` rows, whose ``N_k`` are
        scaled to ``n_samples``.
    weight_concentration_prior_type : {'dirichlet_process', 'dirichlet_distribution'}, \
default='dirichlet_process'
        Stick-breaking (Dirichlet process) or Dirichlet-distribution prior on the
        weights.
    weight_concentration_prior : float or None, default=None
        ``gamma_0`` or ``alpha_0`` (> 0); ``None``: ``1 / n_components``.
    mean_precision_prior : float or None, default=None
        ``beta_0`` (> 0); ``None``: 1.
    mean_prior : array-like of shape (n_features,) or None, default=None
        ``m_0``; ``None``: the mean of ``X``.
    degrees_of_freedom_prior : float or None, default=None
        ``nu_0`` (> ``n_features - 1``); ``None``: ``n_features``.
    covariance_prior : float, array-like or None, default=None
        ``W_0^{-1}``: (d, d) symmetric positive definite ('full', 'tied'), (d,)
        positive ('diag'), a positive float ('spherical'); ``None``: the covariance
        of ``X`` (``ddof=1``), its diagonal, or the mean of that.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation, the subsample and :meth:`sample`.
    warm_start : bool, default=False
        Start the next ``fit`` from the fitted posterior (``n_init`` is then 1); its
        first change is measured against the fitted ``lower_bound_``, as
        scikit-learn's is.
    verbose : int, default=0
        1 prints each initialisation and iteration; 2 also times and lower bounds.
    verbose_interval : int, default=10
        Iterations between two messages.
    %(n_jobs)s
    %(temp_folder)s
    %(working_memory)s
    %(block_size)s
    %(memory_limit)s
    %(schedule)s
    %(init_max_samples)s
    %(compute_dtype)s
    %(resp_threshold)s
    %(callback)s
    %(checkpoint)s
    %(checkpoint_interval)s

    Attributes
    ----------
    weights_, means_, covariances_, precisions_, precisions_cholesky_
        scikit-learn's: float64, also for float32 data.
    weight_concentration_prior_, weight_concentration_, mean_precision_prior_,
    mean_precision_, mean_prior_, degrees_of_freedom_prior_, degrees_of_freedom_,
    covariance_prior_
        The priors used and the posterior's parameters, as scikit-learn's.
    converged_, n_iter_, lower_bound_, lower_bounds_
        As scikit-learn's: ``lower_bounds_[i]`` is the bound after the M step of
        iteration ``i + 1``.
    history_ : list of dict
        One record per iteration of the kept run (see ``callback``).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (``n_features_in_``,)
        Only when ``X`` has string feature names.

    Notes
    -----
    ``on_degenerate`` of :class:`emgmm.GaussianMixture` is no parameter here: a
    component without data falls back to the prior, whose covariance is positive
    definite, so none degenerates.

    Examples
    --------
    >>> import numpy as np
    >>> from emgmm import BayesianGaussianMixture
    >>> X = np.array([[1, 2], [1, 4], [1, 0], [4, 2], [12, 4], [10, 7]], dtype=float)
    >>> bgm = BayesianGaussianMixture(n_components=2, random_state=42).fit(X)
    >>> bgm.means_.round(2)
    array([[2.5 , 2.29],
           [8.46, 4.52]])
    >>> bgm.predict([[0, 0], [9, 3]])
    array([0, 1])
    """

    #: scikit-learn's BayesianGaussianMixture returns float64 for float32 data.
    _keeps_float32 = False
    _parameter_constraints: dict = {  # noqa: RUF012 (scikit-learn's convention)
        **BaseMixture._parameter_constraints,
        "covariance_type": [StrOptions({name for name, kind in REGISTRY.items()
                                        if kind.variational})],
        "weight_concentration_prior_type": [StrOptions(set(PRIOR_TYPES))],
        "weight_concentration_prior": [None, _POSITIVE],
        "mean_precision_prior": [None, _POSITIVE],
        "mean_prior": [None, "array-like"],
        "degrees_of_freedom_prior": [None, _POSITIVE],
        "covariance_prior": [None, "array-like", _POSITIVE],
    }
    # BaseMixture's parameter without a meaning here: no component degenerates
    # (starved ones fall back to the prior, kept as scikit-learn keeps them)
    on_degenerate = "raise"

    def __init__(
        self,
        *,
        n_components: int = 1,
        covariance_type: str = "full",
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        n_init: int = 1,
        init_params: Literal["kmeans", "k-means++", "random",
                             "random_from_data"] = "kmeans",
        weight_concentration_prior_type: Literal[
            "dirichlet_process", "dirichlet_distribution"] = "dirichlet_process",
        weight_concentration_prior: float | None = None,
        mean_precision_prior: float | None = None,
        mean_prior: ArrayLike | None = None,
        degrees_of_freedom_prior: float | None = None,
        covariance_prior: float | ArrayLike | None = None,
        random_state: int | np.random.RandomState | None = None,
        warm_start: bool = False,
        verbose: int = 0,
        verbose_interval: int = 10,
        n_jobs: int | None = None,
        temp_folder: str | os.PathLike[str] | None = None,
        working_memory: float | None = None,
        block_size: int | None = None,
        memory_limit: float | None = None,
        schedule: Literal["auto", "rows", "components"] = "auto",
        init_max_samples: int = 100_000,
        compute_dtype: Literal["float32", "float64"] | None = None,
        resp_threshold: float = 1e-20,
        callback: Callable[[dict[str, Any]], Any] | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        checkpoint_interval: float = 0.0,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weight_concentration_prior_type = weight_concentration_prior_type
        self.weight_concentration_prior = weight_concentration_prior
        self.mean_precision_prior = mean_precision_prior
        self.mean_prior = mean_prior
        self.degrees_of_freedom_prior = degrees_of_freedom_prior
        self.covariance_prior = covariance_prior
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.n_jobs = n_jobs
        self.temp_folder = temp_folder
        self.working_memory = working_memory
        self.block_size = block_size
        self.memory_limit = memory_limit
        self.schedule = schedule
        self.init_max_samples = init_max_samples
        self.compute_dtype = compute_dtype
        self.resp_threshold = resp_threshold
        self.callback = callback
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval

    # the variational fit takes no sample_weight yet (as scikit-learn's): these
    # signatures say so to scikit-learn's checks and to users (narrower than the
    # base class's, hence the ignored override checks)
    def fit(self, X: DataLike, y: None = None) -> Self:  # type: ignore[override]
        """Estimate the variational posterior: the best of ``n_init`` runs.

        As :meth:`emgmm.GaussianMixture.fit`, without ``sample_weight``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            Training data, from any source :meth:`emgmm.GaussianMixture.fit` accepts.
        y : None
            Ignored.

        Returns
        -------
        BayesianGaussianMixture
            The fitted estimator (``self``).
        """
        return super().fit(X)

    def fit_predict(self, X: DataLike,  # type: ignore[override]
                    y: None = None) -> np.ndarray:
        """Fit, then return the labels of ``X`` from a final E step.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            Training data, as :meth:`fit` takes it.
        y : None
            Ignored.

        Returns
        -------
        ndarray of shape (n_samples,), int64
            The most responsible component of each sample.
        """
        return super().fit_predict(X)

    def score(self, X: DataLike, y: None = None) -> float:  # type: ignore[override]
        """Mean per-sample log-likelihood of ``X`` under the expected parameters.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        y : None
            Ignored.

        Returns
        -------
        float
            The mean log-likelihood per sample, in nats.
        """
        return super().score(X)

    def _check_priors(self, n_features):
        """Validated ``(mean_prior, covariance_prior)`` as float64 (``None`` kept);
        raises ``ValueError`` naming the parameter (before any pass)."""
        check_degrees_of_freedom_prior(self.degrees_of_freedom_prior, n_features)
        mean = _checked_array(self.mean_prior, (n_features,), "mean_prior")
        kind = self._kind()
        cov = _checked_array(self.covariance_prior,
                             kind.covariance_prior_shape(n_features),
                             f"covariance_prior (covariance_type={kind.name!r})")
        if cov is not None:
            kind.check_covariance_prior(cov)
            if cov.ndim == 0:
                cov = float(cov)
        return mean, cov

    # ------------------------------------------------------------------ hooks

    def _check_initial_parameters(self, n_features):
        return self._check_priors(n_features)

    def _priors(self):
        """The priors of the fit (the ``*_prior_`` attributes)."""
        return Priors(self.weight_concentration_prior_type,
                      self.weight_concentration_prior_, self.mean_precision_prior_,
                      self.mean_prior_, self.degrees_of_freedom_prior_,
                      self.covariance_prior_)

    def _set_priors(self, plan):
        """Resolve the priors, their defaults from one pass over the data (mean and
        covariance), and store them as the ``*_prior_`` attributes."""
        mean, cov = plan.inits
        if mean is None or cov is None:
            full = len(self._kind().covariance_prior_shape(plan.n_features)) == 2
            args = [(s, e, plan.block_size, full) for s, e in plan.tasks]
            moments = None
            for part in plan.executor.map(moments_task, args):
                moments = part if moments is None else moments + part
        else:
            moments = block_moments(np.zeros((0, plan.n_features)), False)
        priors = resolve_priors(
            moments, self.n_components, self.covariance_type,
            self.weight_concentration_prior_type, self.weight_concentration_prior,
            self.mean_precision_prior, mean, self.degrees_of_freedom_prior, cov)
        self.weight_concentration_prior_ = priors.weight_concentration_prior
        self.mean_precision_prior_ = priors.mean_precision_prior
        self.mean_prior_ = priors.mean_prior
        self.degrees_of_freedom_prior_ = priors.degrees_of_freedom_prior
        self.covariance_prior_ = priors.covariance_prior

    def _update_rule(self):
        priors = self._priors() if hasattr(self, "covariance_prior_") else None
        return VariationalBayes(priors, self.weight_concentration_prior_type,
                                self.covariance_type)

    def _initial_model(self, source, random_state, inits, block_size):
        """scikit-learn's ``_initialize``: the variational M step from the initial
        responsibilities' ``N_k``, means and covariances, on the subsample of at most
        ``init_max_samples`` rows (``N_k`` scaled by ``n_samples / m``)."""
        sample, _ = self._init_sample(source, random_state, block_size)
        resp = initial_responsibilities(sample, self.n_components, self.init_params,
                                        random_state)
        weights, means, covariances = parameters_from_responsibilities(
            sample, resp, self.reg_covar, self.covariance_type)
        return update_posterior(weights * source.n_samples, means, covariances,
                                self._priors(), self.covariance_type)

    def _before_runs(self, plan):
        self._set_priors(plan)

    def _run_score(self, plan, init, run, want_labels):
        """The run's final lower bound (scikit-learn's choice; no extra pass)."""
        bound = run.lower_bounds[-1] if run.lower_bounds else (
            -np.inf if plan.do_init else self.lower_bound_)
        return bound, None

    def _labels_model(self, plan, model):
        return self._update_rule().e_step_model(model)

    def _warm_start_bound(self):
        """The fitted lower bound: the last iteration's (scikit-learn's)."""
        return self.lower_bound_

    def _current_model(self, continued_by="warm_start=True"):
        if isinstance(self.weight_concentration_, tuple) != (
                self.weight_concentration_prior_type == "dirichlet_process"):
            raise ValueError(
                "warm_start=True continues the fitted model, whose weight "
                "concentration prior is not weight_concentration_prior_type="
                f"{self.weight_concentration_prior_type!r}. Set warm_start=False to "
                "fit a new model.")
        return super()._current_model(continued_by)

    def _fitted_model(self):
        """The fitted posterior as a float64 :class:`VariationalModel`."""
        return VariationalModel(
            *(np.asarray(a, dtype=np.float64) for a in (
                self.weights_, self.means_, self.covariances_,
                self.precisions_cholesky_)),
            self.covariance_type, weight_concentration=self.weight_concentration_,
            mean_precision=self.mean_precision_,
            degrees_of_freedom=self.degrees_of_freedom_)

    def _set_model(self, model, dtype, precisions):
        self.weights_ = model.weights.astype(dtype)
        self.means_ = model.means.astype(dtype)
        self.covariances_ = np.asarray(model.covariances).astype(dtype)
        self.precisions_cholesky_ = np.asarray(model.precisions_cholesky).astype(dtype)
        self.precisions_ = precisions
        self.weight_concentration_ = model.weight_concentration
        self.mean_precision_ = model.mean_precision
        self.degrees_of_freedom_ = model.degrees_of_freedom


def _checked_array(value, shape, name):
    """``value`` as a finite float64 array of ``shape`` (``None`` kept)."""
    if value is None:
        return None
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric; got {value!r}.") from exc
    if array.shape != shape:
        raise ValueError(f"The parameter '{name}' should have the shape of {shape}, "
                         f"but got {array.shape}.")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} must be finite.")
    return array
