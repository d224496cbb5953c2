"""The concerns of a covariance type, one abstract base class ("protocol") each.

:class:`~emgmm.covariance.CovarianceType` composes them; a type implements all of
them, and a caller that needs one concern only names that one in its annotations:

- :class:`Sizes`: shapes, parameter and value counts, bytes and work per row, and
  the type as an estimator or a model configures it. Asked by the memory model
  (``emgmm/_runtime/memory.py``), the engine's passes and schedules, the estimators
  (``n_parameters`` for BIC and AIC) and the model files.
- :class:`Parameterisation`: covariances to precision Cholesky factors and back,
  ``log det``, the feature variances, the per-component view and slices of the
  factors. Asked by the engine (E and M steps, the variational update), the
  kernels of ``emgmm/covariance/`` and the estimators' fitted precisions.
- :class:`Reseeding`: what a degenerate, starved or re-seeded component gets.
  Asked by ``emgmm/_engine/degenerate.py``, ``emgmm/_engine/online.py`` and
  ``partial_fit`` (``emgmm/_mixture/online.py``).
- :class:`Kernels`: the log-densities, block statistics and M step of a block.
  Asked by the engine (``emgmm/_engine/``: passes, schedules, updates) and the
  estimators' initialisation.
- :class:`VariationalPrior`: the conjugate prior of ``BayesianGaussianMixture``.
  Asked by ``emgmm/_engine/variational.py``, the Bayesian estimator and the model
  files.
- :class:`ModelFileLayout`: how the fitted attributes, the estimators' arrays and
  the model files hold the covariances. Asked by the estimators' fitted attributes
  (``emgmm/_mixture/``) and the model files (``emgmm/_io/model_file.py``).
- :class:`Validation`: the checks of user-given precisions and feature counts.
  Asked by the estimators (``emgmm/_mixture/validation.py``).
- :class:`Sampling`: draws of the components. Asked by the estimators' ``sample``.
- :class:`OnlineStatistics`: the running statistics of stepwise online EM. Asked
  by ``emgmm/_engine/online.py`` (``partial_fit``).

A default body that reads another concern names it as a base: :class:`ModelFileLayout`
builds on :class:`Sizes` and :class:`Parameterisation`, :class:`OnlineStatistics` on
:class:`Kernels`. The class attributes the defaults read (``name``, ``shared``) are
declared here and set by ``CovarianceType``.

This module is below everything: it imports only numpy and the standard library.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

#: A float array (float64 unless a kernel says otherwise; shapes in the docstrings).
FloatArray = NDArray[np.floating[Any]]
#: An object of a higher layer, passed in and only read here (a ``Model`` of
#: ``emgmm._engine``, block statistics, priors, an estimator): typed loosely so that
#: this protocol imports nothing above it.
Opaque = Any

#: The type a configured copy of a covariance type has (that of the type itself).
_Kind = TypeVar("_Kind", bound="Sizes")


def not_upper_triangular_message(name: str, entry: tuple[int, int],
                                 value: float) -> str:
    """Error text for a factor ``name`` with ``value`` at ``entry`` (i, j) below its
    diagonal."""
    i, j = entry
    return (f"{name} is not upper triangular: entry [{i}, {j}] below the diagonal is "
            f"{value:.6g} (the factor is upper triangular U with U @ U.T == "
            "precisions_, as scikit-learn's precisions_cholesky_)")


class Sizes(ABC):
    """Shapes, counts and sizes of a covariance type.

    The shapes of its parameters, their free parameters, the float64 values of its
    arrays and statistics, the bytes and multiply-adds a row of a block costs, and
    the type as an estimator's parameters or a model's arrays configure it. The
    memory model (``emgmm/_runtime/memory.py``) needs nothing else: these methods
    and the class attributes declared here (set by ``CovarianceType``; ``name``
    for its messages, ``shared`` for one slice, ``streams_blocks`` and
    ``chunked_blocks`` for the block cap).
    """

    name: str
    shared: bool
    streams_blocks: bool
    chunked_blocks: bool

    @abstractmethod
    def covariance_shape(self, n_components: int, n_features: int) -> tuple[int, ...]:
        """Shape of the covariances, precisions and their factors (a tuple)."""

    @abstractmethod
    def n_parameters(self, n_components: int, n_features: int) -> int:
        """Free parameters of the covariances (an int)."""

    @abstractmethod
    def statistics_values(self, n_components: int, n_features: int) -> int:
        """float64 values of one task's second-moment statistics (an int)."""

    @abstractmethod
    def work_per_row(self, n_features: int) -> float:
        """Multiply-adds per row and component of one E step plus statistics."""

    def bytes_per_row(self, n_features: int, n_components: int, itemsize: int) -> int:
        """Bytes of working memory one row of a block needs during a pass: the block
        in the compute dtype, a centred copy, a float64 copy for the first-order
        statistics, and a few ``B x K`` float64 arrays; plus the rows' split when some
        are too far for the float32 estimate (a copy of the block in two parts, the
        result of each beside the block's, the row norms and masks:
        :func:`~emgmm._engine.estep.weighted_log_prob`)."""
        return (4 * n_features * itemsize + 2 * n_features * 8 + 6 * n_components * 8
                + 16)

    def covariance_values(self, n_components: int, n_features: int) -> int:
        """float64 values of one covariance array."""
        return int(np.prod(self.covariance_shape(n_components, n_features)))

    def component_values(self, n_features: int) -> int:
        """float64 values of one component's factor (the component schedule's
        slices are cut by these)."""
        return int(np.prod(self.covariance_shape(1, n_features)))

    def for_params(self: _Kind, params: Mapping[str, Any]) -> _Kind:
        """The type as an estimator with ``params`` (``get_params()``) uses it (a
        type with a size parameter, such as 'factor', reads it from there)."""
        return self

    def for_model(self: _Kind, model: Opaque) -> _Kind:
        """The type as it applies to ``model`` (a type with a size parameter, such
        as 'factor', reads it off the model's arrays)."""
        return self


class Parameterisation(ABC):
    """The precision Cholesky factors of a covariance type.

    Covariances to factors ``U`` (``U @ U.T == precision``) and back, the bound on
    the factors' entries, ``log det U``, the feature variances, and the factors
    per component or of a slice of the components (what the engine and the kernels
    read off the parameters).
    """

    def factor_terms(self, n_features: int) -> int:
        """Products of two factor entries summed in one precision entry."""
        return n_features

    def factor_limit(self, n_features: int, dtype: DTypeLike = np.float64) -> float:
        """The bound on ``|U_ij|`` below which every precision formed from the
        factors is finite in ``dtype``: ``sqrt(max / terms)`` (an entry of
        ``U U^T`` sums ``terms`` products of two entries of ``U``)."""
        return float(np.sqrt(np.finfo(dtype).max / self.factor_terms(n_features)))

    @abstractmethod
    def factorize(self, covariances: np.ndarray, dtype: DTypeLike = np.float64,
                  threads: int = 1) -> tuple[np.ndarray, list[int]]:
        """Precision Cholesky factors and the components whose covariance is not
        positive definite (see :func:`emgmm.covariance._cholesky.factorize`)."""

    @abstractmethod
    def precisions_cholesky_from_precisions(self, precisions: np.ndarray) -> np.ndarray:
        """Upper factors ``U`` with ``U U^T = precision``."""

    @abstractmethod
    def precisions_from_cholesky(self, precisions_cholesky: np.ndarray) -> np.ndarray:
        """Precisions ``U U^T``."""

    @abstractmethod
    def covariances_from_cholesky(self, precisions_cholesky: np.ndarray) -> np.ndarray:
        """Covariances ``(U U^T)^{-1}``."""

    @abstractmethod
    def log_det_cholesky(self, precisions_cholesky: np.ndarray,
                         n_features: int) -> np.ndarray | float:
        """``log det U_k`` per component ((K,), or a scalar when shared)."""

    @abstractmethod
    def feature_variances(self, a: np.ndarray) -> np.ndarray:
        """The diagonals of covariances or precisions ``a``, broadcastable to
        ``(K, d)``."""

    def per_component(self, a: ArrayLike) -> np.ndarray:
        """``a`` with one component per entry of its first axis (shared: one)."""
        return np.asarray(a)

    def slice_factors(self, precisions_cholesky: np.ndarray, k0: int,
                      k1: int) -> np.ndarray:
        """The factors of components ``k0:k1`` (shared: all of them)."""
        return precisions_cholesky[k0:k1]

    def first_failure(self, bad: Sequence[int]) -> int | None:
        """The component to name in an error for the failed components ``bad``
        (``None`` when shared)."""
        return bad[0]


class Reseeding(ABC):
    """What a degenerate, starved or new component of a covariance type gets.

    The pooled covariance of a re-seeded component and of a stream's first batch,
    the repair of a degenerate component that keeps the lower bound (types with
    ``holds_degenerate``), and the axis along which a component is split. The
    defaults read the type's ``name``.
    """

    name: str

    def pooled_covariance(self, weights: np.ndarray, covariances: np.ndarray,
                          healthy: np.ndarray) -> np.ndarray | None:
        """The covariance a re-seeded component gets: the weighted mean of the
        healthy components' (``None`` when shared: the shared one is kept)."""
        hw = weights[healthy] / weights[healthy].sum()
        return np.tensordot(hw, covariances[healthy], axes=1)

    def stream_start_covariance(self, weights: np.ndarray,
                                covariances: np.ndarray) -> np.ndarray | None:
        """The one covariance every component of a stream's first batch starts
        with (``partial_fit``): here :meth:`pooled_covariance` of all of them."""
        return self.pooled_covariance(weights, covariances,
                                      np.arange(len(weights)))

    def hold_degenerate(self, covariances: np.ndarray, previous_factors: np.ndarray,
                        components: list[int]) -> list[int]:
        """Repair the degenerate ``components`` of the M step's ``covariances`` in
        place from the E step's factors ``previous_factors``, keeping the lower
        bound (types with :attr:`holds_degenerate`); the components repaired."""
        raise NotImplementedError(f"covariance_type={self.name!r} re-seeds")

    def widest_axis(self, covariance: ArrayLike, n_features: int) -> np.ndarray:
        """One standard deviation along the widest axis of one component's
        ``covariance``, as a vector (d,) along that axis; here for covariances
        given by their diagonal or one variance (every axis is widest then: the
        first is taken). Types with dense covariances override it."""
        variances = np.broadcast_to(np.asarray(covariance, dtype=np.float64),
                                    (n_features,))
        j = int(np.argmax(variances))
        axis = np.zeros(n_features)
        axis[j] = np.sqrt(variances[j])
        return axis


class Kernels(ABC):
    """The block kernels of a covariance type: E step, statistics and M step.

    The log-densities of a block's rows (with the work a pass shares and the
    products a block's E step and statistics share), the block's sufficient
    statistics (weighted or not) and their joining over component slices, and
    the M step from summed statistics. The defaults read the type's ``shared``.
    """

    shared: bool

    def prepare_log_prob(self, weights: np.ndarray, means: np.ndarray,
                         precisions_cholesky: np.ndarray, dtype: DTypeLike,
                         screen: Mapping[str, np.ndarray] | None = None) -> Any:
        """Work on the parameters that every block of a pass shares, or ``None``;
        ``screen``: the arrays of a screen of these parameters that a run kept
        (:class:`~emgmm.covariance._screen.ProjectionScreen`), used instead of a
        new one by the types that screen."""
        return None

    @abstractmethod
    def log_prob(self, X: FloatArray, means: np.ndarray, precisions_cholesky: Any,
                 g: np.ndarray, offset: np.ndarray, margin: float | None = None,
                 products: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        """``offset_k - 1/2 (x - mu_k)^T Lambda_k (x - mu_k)`` of every row and
        component, (n, K) float64, with the distances expanded around the shift
        ``g`` (d,); ``offset`` (K,) holds ``log det U_k - d/2 log(2 pi)`` and, for
        the E step, ``log w_k``. See
        :func:`emgmm.covariance._log_density.log_gaussian_prob`."""

    def block_products(self, X: FloatArray, model: Opaque,
                       g: np.ndarray | None = None) -> Any:
        """What the E step of a block computes once for its log-densities and its
        statistics (``products`` of :meth:`log_prob` and :meth:`block_statistics`),
        or ``None`` (this default): types whose kernels share such products
        override it."""
        return None

    @abstractmethod
    def block_statistics(self, X: FloatArray, resp: np.ndarray, centers: np.ndarray,
                         resp_threshold: float = 0.0, products: Any = None,
                         out: Any = None) -> Opaque:
        """Sufficient statistics of one block centred on ``centers`` (see
        :func:`emgmm.covariance._statistics.block_statistics`)."""

    def weighted_block_statistics(self, X: FloatArray, resp: np.ndarray,
                                  centers: np.ndarray, sample_weight: np.ndarray,
                                  resp_threshold: float = 0.0, products: Any = None,
                                  out: Any = None) -> Opaque:
        """:meth:`block_statistics` of the weighted responsibilities ``w_i r_ik``:
        ``resp`` (the caller's work buffer) is multiplied by ``sample_weight`` (n,)
        in place. The pairs left out are those with ``r_ik <= resp_threshold``,
        whatever the weights' scale (set to zero before the weights multiply in).
        Types whose kernel needs rows that sum to one override this."""
        if resp_threshold > 0.0:
            resp[resp <= resp_threshold] = 0.0
        resp *= sample_weight[:, None]
        return self.block_statistics(X, resp, centers, 0.0, products, out)

    @abstractmethod
    def m_step_covariances(self, stats: Opaque, nk: np.ndarray, shift: np.ndarray,
                           reg_covar: float, overwrite: bool = False) -> np.ndarray:
        """Covariances of the M step from the summed statistics, the regularised
        counts ``nk`` (K,) and the shifts ``s_k / N_k`` (K, d) of the means."""

    def recentring_terms(self, stats: Opaque, means: np.ndarray,
                         covariances: np.ndarray) -> tuple[np.ndarray, Any]:
        """What :func:`~emgmm.covariance._m_step.needs_recentring` weighs, per
        component and feature.

        Returns
        -------
        scale : ndarray, broadcastable to (K, d)
            The scale of the terms that ``s_k`` was summed from, whose rounding
            moves the mean. This default: ``|mu_k|``, the size of the rows
            themselves.
        left : ndarray or float, broadcastable to (K, d)
            The scale of the rounding that the M step keeps when the sums are formed
            again around the new means, beyond the variance the test compares
            with. This default: 0 (that variance is ``Sigma_jj`` itself).
        """
        return np.abs(means), 0.0

    def concatenate_statistics(self, parts: Sequence[Opaque]) -> Opaque:
        """Statistics of consecutive component slices joined along the components
        (shared: the one part)."""
        if self.shared:
            return parts[0]
        # (the parts' own dataclass, SufficientStatistics, without importing its
        # module: _statistics.py dispatches through this one's registry)
        return dataclasses.replace(
            parts[0], nk=np.concatenate([p.nk for p in parts]),
            sum_x=np.concatenate([p.sum_x for p in parts]),
            sum_xx=np.concatenate([p.sum_xx for p in parts]),
            log_likelihood=0.0, n_samples=0)

    def m_step(self, stats: Opaque, centers: ArrayLike, reg_covar: float,
               overwrite: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weights, means and covariances from summed statistics (see
        :func:`emgmm.covariance._m_step.m_step`): ``mu_k = c_k + s_k / N_k`` and
        :meth:`m_step_covariances`."""
        eps = np.finfo(np.float64).eps
        nk = stats.nk + 10 * eps
        weights = nk / nk.sum()
        shift = stats.sum_x / nk[:, None]
        means = np.asarray(centers, dtype=np.float64) + shift
        covariances = self.m_step_covariances(stats, nk, shift, reg_covar, overwrite)
        return weights, means, covariances

    def covariances_from_responsibilities(
            self, X: ArrayLike, resp: ArrayLike, means: ArrayLike, nk: np.ndarray,
            reg_covar: float, sample_weight: np.ndarray | None = None) -> np.ndarray:
        """Initial covariances from a sample ``X`` and its responsibilities
        (scikit-learn's ``_estimate_gaussian_parameters``), the rows weighted by
        ``sample_weight`` (n,) when given."""
        X = np.asarray(X)
        resp = np.array(resp, dtype=np.float64)
        centers = np.asarray(means, dtype=np.float64)
        if sample_weight is None:
            stats = self.block_statistics(X, resp, centers)
        else:
            stats = self.weighted_block_statistics(X, resp, centers, sample_weight)
        return self.m_step(stats, centers, reg_covar)[2]


class VariationalPrior(ABC):
    """The conjugate prior of a covariance type (Bishop 2006, 10.2).

    The shape, default and check of ``covariance_prior`` and the posterior
    quantities of ``BayesianGaussianMixture``'s update, for the types whose
    ``variational`` is true.
    """

    @abstractmethod
    def covariance_prior_shape(self, n_features: int) -> tuple[int, ...]:
        """Shape of ``covariance_prior`` (``W_0^{-1}``): a tuple, ``()`` a float."""

    @abstractmethod
    def default_covariance_prior(self, data_covariance: np.ndarray
                                 ) -> np.ndarray | float:
        """scikit-learn's default ``covariance_prior`` from the data's covariance
        (``ddof=1``; (d, d), or its diagonal (d,) for a type with a vector prior)."""

    @abstractmethod
    def check_covariance_prior(self, covariance_prior: np.ndarray | float) -> None:
        """Raise ``ValueError`` unless ``covariance_prior`` (float64, of
        :meth:`covariance_prior_shape`) is positive (definite)."""

    def posterior_degrees_of_freedom(self, degrees_of_freedom_prior: float,
                                     nk: np.ndarray) -> np.ndarray | float:
        """``nu_k = nu_0 + N_k`` (Bishop eq. 10.63; (K,), a float when shared)."""
        return degrees_of_freedom_prior + nk

    @abstractmethod
    def posterior_covariances(self, nk: np.ndarray, xk: np.ndarray, sk: np.ndarray,
                              priors: Opaque, mean_precision: np.ndarray,
                              degrees_of_freedom: np.ndarray | float) -> np.ndarray:
        """``(W_0^{-1} + N_k S_k + beta_0 N_k / beta_k (x_k - m_0)(x_k - m_0)^T) /
        nu_k`` (Bishop eq. 10.62, scikit-learn's ``_estimate_wishart_*``), from
        ``nk`` (K,), the means ``xk`` and covariances ``sk`` of the statistics and
        ``priors`` (``mean_prior``, ``mean_precision_prior``,
        ``covariance_prior``)."""

    @abstractmethod
    def weighted_mahalanobis(self, stats: Opaque, delta: np.ndarray,
                             precisions_cholesky: np.ndarray) -> np.ndarray | float:
        """``sum_i r_ik ||(x_i - mu_k) U_k||^2`` per component (summed over the
        components when shared) from statistics around centres ``mu_k - delta_k``:
        ``tr(U^T S_k U) - 2 (delta_k U).(s_k U) + N_k ||delta_k U||^2``."""


class ModelFileLayout(Sizes, Parameterisation, ABC):
    """How the fitted attributes and model files hold a covariance type.

    The fitted attributes of a model and the model's arrays from them (and those
    formed on demand), the arrays a model file stores and their check, and how
    the factors are named, their diagonals read and their triangle checked. The
    defaults read the type's ``shared``, its shapes (:class:`Sizes`) and its
    per-component factors (:class:`Parameterisation`).
    """

    def stored_shapes(self, n_components: int,
                      n_features: int) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of the fitted arrays that hold the covariances, as
        estimators (with a trailing ``_``) and model files store them."""
        return {"precisions_cholesky": self.covariance_shape(n_components, n_features)}

    def fitted_attributes(self, model: Opaque, dtype: DTypeLike,
                          precisions: np.ndarray | None) -> dict[str, np.ndarray]:
        """``{name: array}``: the fitted attributes of ``model``'s covariances in
        ``dtype`` (``precisions`` formed by the caller, as the fit's BLAS threads
        round them)."""
        # (the model's own arrays when they have the dtype: at d=900, K=200 each
        # (K, d, d) copy is 1.3 GB; precisions None: formed on first access)
        attributes = {"covariances_": model.covariances.astype(dtype, copy=False),
                      "precisions_cholesky_": model.precisions_cholesky.astype(
                          dtype, copy=False)}
        if precisions is not None:
            attributes["precisions_"] = precisions
        return attributes

    def model_arrays(self, attributes: Mapping[str, Any]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """``(covariances, precisions_cholesky)`` in float64 from the fitted
        attributes (a mapping of name to array).

        Raises
        ------
        ValueError
            If ``precisions_cholesky_`` of a triangular type is not upper
            triangular (e.g. set to ``numpy.linalg.cholesky(precisions)``, lower):
            the triangular kernels read the upper triangle only.
        """
        factors = np.asarray(attributes["precisions_cholesky_"], dtype=np.float64)
        below = self.first_below_diagonal(self.per_component(factors))
        if below is not None:
            k, i, j = below
            name = ("precisions_cholesky_" if self.shared
                    else f"precisions_cholesky_[{k}]")
            value = self.per_component(factors)[k, i, j]
            raise ValueError(not_upper_triangular_message(name, (i, j), value))
        return np.asarray(attributes["covariances_"], dtype=np.float64), factors

    def derived_attribute(self, attributes: Mapping[str, Any], name: str) -> Any:
        """A fitted attribute formed on demand from the stored ones (``attributes``,
        a mapping); ``AttributeError`` when the type has no such attribute."""
        raise AttributeError(name)

    def stored_problem(self, stored: Mapping[str, np.ndarray]) -> str | None:
        """What makes the stored arrays (:meth:`stored_shapes`) no covariances, or
        ``None``; the precision Cholesky factors are checked by the model file."""
        return None

    def factor_name(self, index: int) -> str:
        """How messages name the precision Cholesky factor of component ``index``."""
        return f"precisions_cholesky of component {index}"

    def factor_diagonals(self, stack: ArrayLike) -> np.ndarray:
        """The diagonals of the factors ``stack`` (one component per entry)."""
        return np.asarray(stack)

    def first_below_diagonal(self, stack: np.ndarray) -> tuple[int, int, int] | None:
        """``(k, i, j)`` of the first nonzero entry below a factor's diagonal in
        ``stack``, or ``None``."""
        return None


class Validation(ABC):
    """The checks of user-given parameters of a covariance type.

    Whether user-given precisions have the type's shape and are positive
    (definite), and whether the configured type can model a number of features.
    """

    @abstractmethod
    def check_precisions(self, precisions: np.ndarray, n_components: int,
                         n_features: int) -> None:
        """Raise ``ValueError`` (scikit-learn's wording) unless ``precisions``, a
        float array, has the type's shape and is positive (definite)."""

    def check_n_features(self, n_features: int) -> None:  # noqa: B027 (optional)
        """Raise ``ValueError`` when the configured type cannot model
        ``n_features`` features."""


class Sampling(ABC):
    """Draws of the components of a covariance type, as scikit-learn draws them.

    The covariances a fitted estimator samples with, and the draws.
    """

    def sampling_covariances(self, estimator: Opaque) -> np.ndarray:
        """The covariances :meth:`sample` takes, from a fitted ``estimator``."""
        return estimator.covariances_

    @abstractmethod
    def sample(self, rng: np.random.RandomState, means: np.ndarray,
               covariances: np.ndarray, counts: ArrayLike) -> list[np.ndarray]:
        """``counts[k]`` draws of each component, as scikit-learn draws them: a
        list of arrays, one per component."""


class OnlineStatistics(Kernels, ABC):
    """The running statistics of stepwise online EM (``partial_fit``).

    Their arrays and shapes, moved to new centres, implied by given covariances,
    and their M step (the :class:`Kernels` M step by default). A type without them
    keeps ``has_online_statistics`` false and refuses ``partial_fit``; the defaults
    read the type's ``name``.
    """

    name: str

    #: Whether the type has the running statistics of ``partial_fit`` (the
    #: methods below); a type without them refuses ``partial_fit``.
    has_online_statistics: bool = False

    def _no_online(self) -> NotImplementedError:
        return NotImplementedError(f"covariance_type={self.name!r} has no running "
                                   "statistics for stepwise online EM (partial_fit).")

    def second_moments_shape(self, n_components: int,
                             n_features: int) -> tuple[int, ...]:
        """Shape of the statistics' ``sum_xx`` (a tuple)."""
        raise self._no_online()

    def shift_second_moments(self, sum_xx: np.ndarray, nk: np.ndarray,
                             sum_x: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """``sum_xx`` around centres moved by ``delta`` (K, d): the parallel-axis
        shift ``S - s delta^T - delta s^T + N delta delta^T`` in the type's
        layout, from the statistics ``nk`` (K,) and ``sum_x`` (K, d) around the
        old centres. A new array."""
        raise self._no_online()

    def implied_second_moments(self, weights: np.ndarray, covariances: np.ndarray,
                               reg_covar: float, n_features: int) -> np.ndarray:
        """``sum_xx`` around the means that the M step maps to ``covariances``
        for component weights ``weights`` (K,) summing to one: ``w_k (Sigma_k -
        reg_covar I)`` in the type's layout (its inverse with ``s_k = 0``)."""
        raise self._no_online()

    def symmetrised_second_moments(self, sum_xx: np.ndarray) -> np.ndarray:
        """``sum_xx`` with what the M step does not read filled from what it
        reads (in place; 'full': the lower triangles from the upper)."""
        return sum_xx

    # The hooks below are what _engine/online.py calls. Their defaults hold the
    # Gaussian types' statistics (nk, sum_x, sum_xx) through the three methods
    # above; a type with other running statistics (more arrays: 'factor')
    # overrides all four.

    def online_statistics_shapes(self, n_components: int, n_features: int,
                                 arrays: Mapping[str, Any] | None = None
                                 ) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the running statistics' arrays, in their order:
        ``nk`` (K,), ``sum_x`` (K, d), ``sum_xx`` (:meth:`second_moments_shape`),
        then the type's own. ``arrays``: statistics at hand, from which a type
        configured by a parameter it was not given (the registry's 'factor',
        without ``n_factors``) may read it."""
        K, d = n_components, n_features
        return {"nk": (K,), "sum_x": (K, d),
                "sum_xx": self.second_moments_shape(K, d)}

    def shift_online_statistics(self, arrays: Mapping[str, np.ndarray],
                                delta: np.ndarray) -> dict[str, np.ndarray]:
        """The running statistics (``arrays``, by the names of
        :meth:`online_statistics_shapes`) around centres moved by ``delta``
        (K, d), as new arrays: ``N' = N``, ``s' = s - N delta`` and
        :meth:`shift_second_moments`."""
        nk, s = arrays["nk"], arrays["sum_x"]
        S = self.shift_second_moments(arrays["sum_xx"], nk, s, delta)
        return {"nk": nk.copy(), "sum_x": s - nk[:, None] * delta, "sum_xx": S}

    def implied_online_statistics(self, weights: np.ndarray,
                                  covariances: np.ndarray, reg_covar: float,
                                  n_features: int) -> dict[str, np.ndarray]:
        """The running statistics beyond ``nk = weights`` and ``sum_x = 0`` that
        :meth:`online_m_step` maps to ``covariances`` (around the means):
        ``sum_xx`` (:meth:`implied_second_moments`) and the type's own."""
        return {"sum_xx": self.implied_second_moments(weights, covariances,
                                                      reg_covar, n_features)}

    def online_m_step(self, stats: Opaque, reg_covar: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weights, means and covariances of running statistics (an
        :class:`~emgmm._engine.online.OnlineStatistics`, around its ``centers``):
        :meth:`m_step`, as ``fit`` takes it."""
        return self.m_step(stats, stats.centers, reg_covar)
