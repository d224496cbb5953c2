"""The base class of emgmm's mixture estimators: sources, restarts, warm start,
resume, and ``fit``/``fit_predict``/``predict``/``predict_proba``/``score_samples``/
``score`` (as scikit-learn's ``sklearn.mixture._base.BaseMixture``).

The estimators plug in through hooks over parameters and sufficient statistics,
never over an ``n x K`` array:

- :meth:`BaseMixture._check_initial_parameters` and
  :meth:`BaseMixture._initial_model`: the starting :class:`~emgmm._engine.model.Model`
  from user-given parameters and a bounded sample of the data;
- :meth:`BaseMixture._update_rule`: the engine's
  :class:`~emgmm._engine.update.MaximumLikelihood` or another rule with its own
  E-step parameters (per-component log offsets), parameters from statistics and
  lower bound (a variational posterior);
- :meth:`BaseMixture._set_model` and :meth:`BaseMixture._fitted_model`: the fitted
  attributes.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TYPE_CHECKING

import numpy as np
from sklearn import config_context, get_config
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state, metadata_routing
from sklearn.utils.validation import check_is_fitted, validate_data

from .._engine.component_schedule import component_statistics_pass
from .._engine.em import EMSettings, run_em
from .._engine.model import Model
from .._engine.pair_step import PairStep, pairs_apply
from .._engine.passes import output_pass, rows_statistics_pass, score_pass
from .._engine.update import MaximumLikelihood
from .._io.checkpoint import open_checkpointer
from .._io.sources import (
    ArraySource,
    DataLike,
    WeightLike,
    as_source,
    is_file_backed,
)
from .._io.weights import as_weight_source, check_weights, unit_exponent
from .._runtime.executor import Executor
from .._runtime.memory import (
    OUTPUT_TASK_BYTES,
    block_rows,
    choose_schedule,
    max_row_tasks,
    partition,
    row_threads_worthwhile,
    schedule_nbytes,
    tasks_are_tiny,
)
from .._runtime.worker_loss import explain_worker_loss
from ..covariance import Sizes, get_covariance_type
from .initialization import init_rows, init_sample, subsample_indices
from .online import OnlineMixin, initial_model, shared_weights
from .validation import (
    Interval,
    StrOptions,
    check_attributes_hold,
    check_variances_fit,
    validate_params,
)

if TYPE_CHECKING:
    from typing_extensions import Self

def _as_stored(model, dtype):
    """``model`` as the fitted attributes of ``dtype`` hold it, in float64."""
    if np.dtype(dtype) == np.float64:
        return model
    stored = [np.asarray(a).astype(dtype).astype(np.float64) for a in (
        model.weights, model.means, model.covariances, model.precisions_cholesky)]
    kind = model.kind
    if kind.stores_covariances:
        # the attributes hold the covariance parameters: their factors are formed
        # from them again (as score(X) forms them), not rounded themselves
        stored[3] = kind.factorize(stored[2])[0]
    return Model(*stored, model.covariance_type)


def _refuse_strings(X):
    """Raise scikit-learn's error for data of strings or bytes (a list of them
    too), which validation with a list of float dtypes would convert silently."""
    dtype = getattr(X, "dtype", None)
    if dtype is None and isinstance(X, (list, tuple)):
        dtype = np.asarray(X).dtype
    if getattr(dtype, "kind", None) in ("U", "S"):
        raise ValueError("dtype='numeric' is not compatible with arrays of "
                         "bytes/strings. Convert your data to numeric values "
                         "explicitly instead.")


def _check_out(out, shape, dtype, method):
    """``out`` checked to take the per-row output of ``method`` (shape, dtype kind,
    writable), or a new C-ordered array of ``shape`` and ``dtype`` when ``None``.

    Raises
    ------
    ValueError
        Naming what does not fit.
    """
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise ValueError("out must be a numpy array or memmap, got "
                         f"{type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, not {shape}")
    if np.dtype(out.dtype).kind != np.dtype(dtype).kind:
        raise ValueError(f"out has dtype {out.dtype}; {method} writes "
                         f"{np.dtype(dtype)} values (an out array of kind "
                         f"{np.dtype(dtype).kind!r})")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    return out


def _limit_threads(executor, schedule, n_samples, tasks, n_components, n_features,
                   kind):
    """Row threads only where their tasks are worth it (the pairs schedule's hold no
    statistics of their own); one BLAS thread for tiny tasks."""
    if schedule == "components" or (schedule == "rows" and not row_threads_worthwhile(
            n_samples, len(tasks), n_components, n_features, kind)):
        executor.row_threads = 0
    if tasks_are_tiny(n_samples, len(tasks), n_components, n_features, kind):
        executor.one_blas_thread()


def _pairs_step(plan, resp_threshold, owns_start):
    """The :class:`~emgmm._engine.pair_step.PairStep` of a run under the pairs
    schedule (``None`` under the others)."""
    if plan.schedule != "pairs":
        return None
    return PairStep(plan.executor, plan.block_size, plan.n_samples,
                    plan.compute_dtype, resp_threshold, plan.weights,
                    plan.total_weight, owns_start)


@dataclass
class FitPlan:
    """What one ``fit`` decided before its first pass: dtypes, blocks, tasks,
    restarts, the executor and schedule, the checkpointer."""

    n_samples: int
    n_features: int
    inits: tuple
    compute_dtype: type
    out_dtype: type
    block_size: int
    tasks: list
    do_init: bool
    n_init: int
    random_state: np.random.RandomState
    executor: Executor
    statistics_pass: object
    model_nbytes: int
    block_nbytes: int
    checkpointer: object
    sample_weights: object = None
    total_weight: float | None = None
    weights: object = None  # the sample weights as the tasks read them (once entered)
    #: The scoring pass (a shared one when several fits read the data together).
    score_pass: object = score_pass
    #: 'rows', 'components' or 'pairs' (:func:`~emgmm._runtime.memory.choose_schedule`).
    schedule: str = "rows"


@dataclass
class EStepPlan:
    """What a pass of ``predict``, ``predict_proba``, ``score_samples`` or ``score``
    runs on: the executor, the tasks, the blocks and dtype, and the memory estimates
    that explain a worker's death."""

    executor: Executor
    tasks: list
    block_size: int
    compute_dtype: type
    model_nbytes: int
    block_nbytes: int


class BaseMixture(OnlineMixin, DensityMixin, BaseEstimator, metaclass=abc.ABCMeta):
    """Base class of the mixture estimators fitted by blocked EM over a source.

    Subclasses define ``__init__`` (scikit-learn's conventions), the
    ``_parameter_constraints`` dict, and the abstract hooks of the module notes
    (``abc.abstractmethod``, as in scikit-learn's ``BaseMixture``); they
    must have the parameters of the base's ``_parameter_constraints``, which they
    extend, and ``covariance_type`` and ``on_degenerate`` (a parameter or a class
    attribute; see :class:`~emgmm.GaussianMixture`).
    """

    #: The constraints of the parameters every subclass has (scikit-learn's
    #: convention); a subclass extends the dict with those of its own parameters
    #: (``covariance_type`` among them: the types it fits).
    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="left")],
        "reg_covar": [Interval(Real, 0.0, None, closed="left")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "init_params": [
            StrOptions({"kmeans", "random", "random_from_data", "k-means++"})
        ],
        "random_state": ["random_state"],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "verbose_interval": [Interval(Integral, 1, None, closed="left")],
        # joblib gives 0 no meaning ("n_jobs == 0 in Parallel has no meaning")
        "n_jobs": [Interval(Integral, None, -1, closed="right"),
                   Interval(Integral, 1, None, closed="left"), None],
        "temp_folder": [str, os.PathLike, None],
        "working_memory": [Interval(Real, 0, None, closed="neither"), None],
        "block_size": [Interval(Integral, 1, None, closed="left"), None],
        "memory_limit": [Interval(Real, 0, None, closed="neither"), None],
        "schedule": [StrOptions({"auto", "rows", "components", "pairs"})],
        "init_max_samples": [Interval(Integral, 1, None, closed="left")],
        "compute_dtype": [StrOptions({"float32", "float64"}), None],
        "resp_threshold": [Interval(Real, 0.0, 1.0, closed="left")],
        "callback": [callable, None],
        "checkpoint": [str, os.PathLike, None],
        "checkpoint_interval": [Interval(Real, 0.0, None, closed="left")],
    }
    #: scikit-learn's estimator keeps float32 data's dtype in its outputs.
    _keeps_float32 = True
    # ``out=`` is where a method writes, not metadata for scikit-learn's routing
    __metadata_request__predict = {"out": metadata_routing.UNUSED}
    __metadata_request__predict_proba = {"out": metadata_routing.UNUSED}
    __metadata_request__score_samples = {"out": metadata_routing.UNUSED}

    # ------------------------------------------------------------------ input

    def _source(self, X, *, reset):
        """Validate ``X`` and wrap it in a Source (sklearn validation for arrays)."""
        if is_file_backed(X):
            source = as_source(X)
            n, d = source.shape
            if reset:
                if n < 2:
                    raise ValueError(
                        f"Found array with {n} sample(s) (shape={source.shape}) while "
                        f"a minimum of 2 is required by {type(self).__name__} "
                        f"({source.description})."
                    )
                if d < 1:
                    raise ValueError(
                        f"Found array with 0 feature(s) (shape={source.shape}) while a "
                        f"minimum of 1 is required by {type(self).__name__} "
                        f"({source.description})."
                    )
                self.n_features_in_ = d
                if hasattr(self, "feature_names_in_"):
                    del self.feature_names_in_
            else:
                if n < 1:
                    raise ValueError(
                        f"Found array with 0 sample(s) (shape={source.shape}) while a "
                        f"minimum of 1 is required ({source.description})."
                    )
                if d != self.n_features_in_:
                    raise ValueError(
                        f"X has {d} features, but {type(self).__name__} is expecting "
                        f"{self.n_features_in_} features as input "
                        f"({source.description})."
                    )
            return source
        _refuse_strings(X)
        X = validate_data(
            self, X, dtype=[np.float64, np.float32], reset=reset,
            ensure_min_samples=2 if reset else 1, ensure_all_finite=False,
        )
        # ArraySource's check names the row and column, as for file-backed data
        return ArraySource(X)

    def _compute_dtype(self, source):
        if self.compute_dtype is None:
            return source.compute_dtype
        return np.dtype(self.compute_dtype).type

    def _block_size(self, source):
        if self.block_size is not None:
            return int(min(self.block_size, max(source.n_samples, 1)))
        budget = self.working_memory
        if budget is None:
            budget = get_config()["working_memory"]
        return block_rows(
            source.n_samples, source.n_features, self.n_components,
            np.dtype(self._compute_dtype(source)).itemsize, budget,
            source.chunk_rows, source.description, covariance_type=self._kind(),
        )

    # ------------------------------------------------------------------ hooks

    @abc.abstractmethod
    def _check_initial_parameters(self, n_features):
        """Validated copies of the user-given initial parameters (never stored on
        self), handed to :meth:`_initial_model`."""

    @abc.abstractmethod
    def _initial_model(self, source, random_state, inits, block_size,
                       sample_weights=None):
        """The starting :class:`~emgmm._engine.model.Model` of one initialisation
        (``sample_weights``: a :class:`~emgmm._io.weights.WeightSource` of the
        rows' weights, or ``None``)."""

    def _init_sample(self, source, random_state, block_size, sample_weights=None):
        """``(rows, their weights or None)`` the initialisation sees: all rows, or
        a random subsample of :meth:`_init_rows` (sorted), checked and in float64
        (:func:`~emgmm._mixture.initialization.init_sample`)."""
        weights = None
        rows = self._init_rows(source.n_samples, source.n_features, block_size)
        if isinstance(source, ArraySource) and source.n_samples <= rows:
            sample = source.array
            if sample_weights is not None:
                weights = sample_weights.read(0, source.n_samples)
        else:
            idx = subsample_indices(source.n_samples, rows, random_state)
            if idx is None:
                idx = np.arange(source.n_samples)
            sample = source.take(idx, block_size)
            if sample_weights is not None:
                weights = sample_weights.take(idx, block_size)
        sample = init_sample(sample, source.description)
        if sample.shape[0] < self.n_components:
            # (n_samples >= n_components was checked: the subsample is short)
            raise ValueError(
                f"init_max_samples={self.init_max_samples} is below n_components="
                f"{self.n_components}: the initialisation subsample needs at least "
                "one row per component.")
        return sample, weights

    def _init_rows(self, n_samples, n_features, block_size):
        """Rows of the initialisation subsample
        (:func:`~emgmm._mixture.initialization.init_rows`, for the fit's blocks of
        ``block_size`` rows)."""
        return init_rows(self.init_max_samples, n_samples, n_features,
                         self.n_components, block_size)

    def _update_rule(self):
        """The engine's update rule: E-step parameters, parameters from statistics
        and the lower bound (default: maximum likelihood)."""
        return MaximumLikelihood()

    @abc.abstractmethod
    def _fitted_model(self):
        """The fitted attributes as a float64 :class:`~emgmm._engine.model.Model`."""

    @abc.abstractmethod
    def _set_model(self, model, dtype, precisions):
        """Store the fitted ``model`` as attributes of ``dtype``."""

    #: Whether float64 ``precisions_`` are formed on first access: then
    #: :meth:`_set_model` gets ``precisions=None`` for them.
    _precisions_on_demand = False

    def _stored_precisions(self, precisions_cholesky):
        """The precisions of the factors ``precisions_cholesky`` (attributes'
        dtype), as :meth:`_set_model` stores them."""
        return self._kind().precisions_from_cholesky(np.asarray(precisions_cholesky))

    def _current_model(self, continued_by="warm_start=True"):
        """The fitted parameters to warm-start from, checked against the parameters.

        Raises
        ------
        ValueError
            When ``n_components``, ``covariance_type`` or the number of features
            differ from the fitted model's (the message names ``continued_by``).
        """
        K, d = self.n_components, self.n_features_in_
        kind = self._kind()
        expected = {"means": (K, d), **kind.stored_shapes(K, d)}
        found = {name: np.shape(self.__dict__[name + "_"])
                 if name + "_" in self.__dict__ else None for name in expected}
        if found != expected:
            shapes = ", ".join(f"{name} missing" if shape is None
                               else f"{name} of shape {shape}"
                               for name, shape in found.items())
            params = "".join(f", {name}={getattr(self, name)!r}"
                             for name in kind.parameters)
            remedy = ("Set warm_start=False to fit a new model"
                      if continued_by.startswith("warm_start")
                      else "Call fit to fit a new model, or set the parameters back")
            raise ValueError(
                f"{continued_by} continues the fitted model ({shapes}), which does "
                f"not match n_components={K}, covariance_type={self.covariance_type!r}"
                f"{params} and {d} features. {remedy}."
            )
        return self._fitted_model()

    def _output_dtype(self, compute_dtype, data_dtype):
        """The dtype of the fitted attributes and float per-row outputs: float32 for
        float32 data computed in float32 where scikit-learn's estimator keeps float32
        (``_keeps_float32``), else float64."""
        keep = (self._keeps_float32 and compute_dtype == np.float32
                and data_dtype == np.float32)
        return np.float32 if keep else np.float64

    def _kind(self):
        """The :class:`~emgmm.covariance.CovarianceType` of ``covariance_type``,
        configured by the estimator's parameters."""
        return get_covariance_type(self.covariance_type).for_params(
            self.get_params(deep=False))

    # -------------------------------------------------------------------- fit

    def fit(self, X: DataLike, y: None = None,
            sample_weight: WeightLike | None = None) -> Self:
        """Estimate the parameters with EM, keeping the best of ``n_init`` runs.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str, PathLike, \
h5py.Dataset or Source
            Training data: in memory, memory-mapped, a ``.npy`` path, an
            ``h5py.Dataset``, ``"file.h5:/path/to/dataset"`` or an
            ``emgmm._io.sources.Source`` (read as it is). float64 and float32 are
            used as they are; integer data is cast per block.
        y : None
            Ignored.
        sample_weight : array-like of shape (n_samples,), np.memmap, str, PathLike, \
h5py.Dataset or None, default=None
            Weights of the rows: in memory, memory-mapped, a ``.npy`` path or
            ``"file.h5:/path/to/weights"``, read in the row blocks of ``X``. Every
            sufficient statistic sums ``w_i r_ik``; the lower bound is the weighted
            mean log-likelihood (``tol`` keeps its meaning); the initialisation
            weighs the rows too. Integer weights fit as repeated rows, weight 0 as
            a dropped row. A component is starved below a thousandth of the mean
            weight (``sum w / n``).

        Returns
        -------
        object
            The fitted estimator (``self``).

        Raises
        ------
        ValueError
            Invalid parameters or data (NaN/inf, names the row for files), invalid
            weights (negative, NaN or infinite: names the row and file; a length
            other than ``n_samples``; all zero), or an ill-defined covariance with
            ``on_degenerate='raise'``.
        MemoryError
            When the model cannot fit ``memory_limit``, or when a worker process died
            (most likely killed for memory); the message gives the estimate. The
            estimator then keeps its previous state.
        OSError
            When the data cannot be shared with the workers (temporary folder full),
            or a data file is cut, replaced or rewritten during the fit (named).
        """
        self._fit(X, want_labels=False, sample_weight=sample_weight)
        return self

    def fit_predict(self, X: DataLike, y: None = None,
                    sample_weight: WeightLike | None = None) -> np.ndarray:
        """Fit, then return the labels of ``X`` from a final E step.

        ``fit_predict(X)`` equals ``fit(X).predict(X)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        y : None
            Ignored.
        sample_weight : see :meth:`fit`
            Weights of the rows, as :meth:`fit` takes them.

        Returns
        -------
        ndarray of shape (n_samples,), int64
            The most responsible component of each sample.
        """
        return self._fit(X, want_labels=True, sample_weight=sample_weight)

    def _validate(self):
        # (scikit-learn's _fit_context: the parameters checked once, and nested
        # estimators, e.g. the k-means of the initialisation, not checked again)
        if not get_config()["skip_parameter_validation"]:
            validate_params(self._parameter_constraints, self.get_params(deep=False),
                            type(self).__name__)

    def _fit(self, X, want_labels, sample_weight=None):
        self._validate()
        saved = dict(self.__dict__)
        try:
            with config_context(skip_parameter_validation=True):
                return self._fit_unsafe(X, want_labels, sample_weight)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def _fit_unsafe(self, X, want_labels, sample_weight):
        source = self._source(X, reset=True)
        plan = None
        try:
            plan = self._plan(source, sample_weight)
            self._report_plan(plan)
            # (the checkpointer first: it holds its path from open_checkpointer on,
            # and must let it go also when the executor refuses to start)
            with plan.checkpointer or nullcontext(), \
                    explain_worker_loss(plan.model_nbytes, plan.block_nbytes,
                                        plan.executor.n_workers, source), \
                    plan.executor, \
                    shared_weights(plan.executor, plan.sample_weights) as weights:
                plan.weights = weights
                best = self._best_run(plan, source, want_labels)
                # formed now under the fit's BLAS threads, unless the estimator
                # forms float64 precisions on first access (float32 attributes are
                # checked to hold them)
                precisions = None
                if not (self._precisions_on_demand and plan.out_dtype == np.float64):
                    factors = best[1].model.precisions_cholesky
                    precisions = self._stored_precisions(
                        factors.astype(plan.out_dtype, copy=False))
                if plan.checkpointer is not None:
                    plan.checkpointer.remove()  # (while it holds the path)
        finally:
            source.close()
            if plan is not None and plan.sample_weights is not None:
                plan.sample_weights.close()
        return self._finish(best, precisions, plan.out_dtype)

    def _plan(self, source, sample_weight=None, stream=False):
        """Check the data (and weights) against the parameters and plan the fit
        (refusing, before writing X for the workers or starting them, a model that
        cannot fit). ``stream``: for :meth:`partial_fit` (no checkpointer of fit;
        the initialisation only on an unfitted estimator)."""
        n, d = source.shape
        first = not (stream and hasattr(self, "means_"))
        if first and n < self.n_components:
            raise ValueError(
                "Expected n_samples >= n_components but got n_components = "
                f"{self.n_components}, n_samples = {n}"
            )
        inits = self._check_initial_parameters(d) if first else None
        sample_weights, total_weight = self._weights_and_total(
            sample_weight, n, first)
        compute_dtype = self._compute_dtype(source)
        out_dtype = self._output_dtype(compute_dtype, source.dtype)
        block_size = self._block_size(source)
        do_init = (first if stream
                   else not (self.warm_start and hasattr(self, "converged_")))
        random_state = check_random_state(self.random_state)
        executor = self._executor(source)
        kind = self._kind()
        schedule, estimate = self._schedule(kind, d, executor, stream)
        tasks = partition(n, block_size, self._max_tasks(schedule, kind, d))
        _limit_threads(executor, schedule, n, tasks, self.n_components, d, kind)
        checkpointer = None if stream else open_checkpointer(
            self, source, compute_dtype, random_state,
            None if do_init else self._current_model(), sample_weights)
        block_nbytes = block_size * kind.bytes_per_row(
            d, self.n_components, np.dtype(compute_dtype).itemsize)
        return FitPlan(
            n, d, inits, compute_dtype, out_dtype, block_size, tasks, do_init,
            self.n_init if do_init else 1, random_state, executor,
            component_statistics_pass if schedule == "components"
            else rows_statistics_pass,
            estimate, block_nbytes, checkpointer, sample_weights, total_weight,
            schedule=schedule)

    def _weights_and_total(self, sample_weight, n_samples, first):
        """``(sample_weights, total_weight)`` of a fit: the checked weights source
        (``None`` without weights) and their sum (``n_samples`` without); ``first``:
        the weights must give every component a share. They are read scaled to a
        mean of about one (:func:`~emgmm._io.weights.unit_exponent`), so weights
        of any scale fit alike; also a stream's batch, whose statistics are
        normalised by their total weight."""
        sample_weights = as_weight_source(sample_weight, n_samples)
        try:
            total_weight = n_samples if sample_weights is None else check_weights(
                sample_weights, self.n_components if first else None).total
        except BaseException:
            sample_weights.close()
            raise
        if sample_weights is not None:
            sample_weights.exponent = unit_exponent(total_weight, n_samples)
            total_weight = float(np.ldexp(total_weight, sample_weights.exponent))
        return sample_weights, total_weight

    def _executor(self, source):
        """The :class:`Executor` of a fit on ``source``, reporting each task to a
        callback that ``wants_progress``."""
        executor = Executor(source, self.n_jobs, self.temp_folder)
        if getattr(self.callback, "wants_progress", False):
            executor.on_task = self._task_callback
        return executor

    def _pairs_apply(self, kind, n_features, executor, stream=False):
        """Whether the pairs schedule serves a fit (maximum likelihood, not a stream:
        :func:`~emgmm._engine.pair_step.pairs_apply`)."""
        return (not stream and type(self._update_rule()) is MaximumLikelihood
                and executor.shares_arrays
                and pairs_apply(kind, self.n_components, n_features,
                                self.resp_threshold))

    def _schedule(self, kind: Sizes, n_features, executor, stream=False):
        """:func:`~emgmm._runtime.memory.choose_schedule` of the fit, with the pairs
        schedule where it applies (:meth:`_pairs_apply`)."""
        pairs = self._pairs_apply(kind, n_features, executor, stream)
        return choose_schedule(self.schedule, self.n_components, n_features, kind,
                               executor.n_workers, self.memory_limit, pairs=pairs)

    def _max_tasks(self, schedule, kind: Sizes, n_features):
        """The most tasks the passes of a fit under ``schedule`` split the rows
        into (:func:`~emgmm._runtime.memory.partition`)."""
        if schedule == "pairs":
            return 64
        return max_row_tasks(self.n_components, n_features, kind)

    def _report_plan(self, plan):
        """Call a callback whose attribute ``wants_plan`` is true with the fit's plan
        (the ``'plan'`` event of ``callback``)."""
        if getattr(self.callback, "wants_plan", False):
            resume = None if plan.checkpointer is None else plan.checkpointer.resume
            initialises = plan.do_init and resume is None
            self.callback({
                "event": "plan",
                "schedule": plan.schedule,
                "block_size": plan.block_size,
                "n_tasks": len(plan.tasks),
                "n_workers": plan.executor.n_workers,
                "row_threads": plan.executor.row_threads,
                "n_samples": plan.n_samples,
                "n_components": self.n_components,
                "init_params": self.init_params if initialises else None,
                "init_rows": (self._init_rows(plan.n_samples, plan.n_features,
                                              plan.block_size)
                              if initialises else 0),
                "resume": None if resume is None else {
                    "path": plan.checkpointer.path, "init": resume.init_index,
                    "n_iter": resume.run.n_iter},
            })

    def _best_run(self, plan, source, want_labels):
        """Run every initialisation (from a checkpoint's, if resuming); return
        ``(score, run, labels)`` of the best (:meth:`_run_score`)."""
        self._before_runs(plan)
        resume, first, best = self._resume_point(plan)
        for init in range(first, plan.n_init):
            if self.verbose:
                print(f"Initialization {init}")
            start = None
            if resume is not None and init == first:
                plan.random_state.set_state(resume.rng_state)
                start = resume.run
            run = self._run_once(plan, source, init, start, best)
            score, labels = self._run_score(plan, init, run, want_labels)
            if self.verbose:
                status = "converged" if run.converged else "did not converge"
                print(f"Initialization {status}. lower bound {score:.5f}.")
            if best is None or score > best[0] or best[0] == -np.inf:
                best = (score, run, labels)
        if want_labels and best[2] is None:  # not scored with labels, or restored
            best = best[:2] + (self._best_labels(plan, best[1]),)
        return best

    def _resume_point(self, plan):
        """``(resume, first, best)``: the checkpoint's resume state (``None`` if
        not resuming), the initialisation to start from, and the best run so far
        as ``(score, run, None)`` (``None`` if none); says so if verbose."""
        checkpointer = plan.checkpointer
        resume = None if checkpointer is None else checkpointer.resume
        best, first = None, 0
        if resume is not None:
            first = resume.init_index
            if resume.best_run is not None:
                best = (resume.best_score, resume.best_run, None)
            if self.verbose:
                done = resume.run.n_iter
                print(f"Resuming from {checkpointer.path} after {done} "
                      f"iteration{'' if done == 1 else 's'} of initialization "
                      f"{first}.")
        return resume, first, best

    def _best_labels(self, plan, run):
        """The component labels of the data under ``run``'s final parameters."""
        _, labels = plan.score_pass(plan.executor, plan.tasks, plan.block_size,
                                    self._labels_model(plan, run.model),
                                    plan.compute_dtype, True, plan.weights)
        return labels

    def _before_runs(self, plan):
        """Called once before the initialisations of a fit (default: nothing)."""

    def _run_score(self, plan, init, run, want_labels):
        """``(score, labels or None)`` that compares the runs: the mean
        log-likelihood of the run's final parameters as stored (rounded to float32
        for float32 data), from one more pass, so that ``lower_bound_`` is
        ``score(X)``."""
        if plan.executor.on_task is not None:
            self.callback({"event": "final_pass", "init": init})
        total, labels = plan.score_pass(plan.executor, plan.tasks, plan.block_size,
                                        self._labels_model(plan, run.model),
                                        plan.compute_dtype, want_labels, plan.weights)
        return total / plan.total_weight, labels

    def _labels_model(self, plan, model):
        """The model whose E step labels the rows: ``model`` as stored."""
        return _as_stored(model, plan.out_dtype)

    def _run_once(self, plan, source, init, start, best):
        """One EM run of initialisation ``init`` (from ``start`` when resuming)."""
        # built here (before the checkpointer records the random state) and handed
        # over in a list that run_em empties, so that nothing here keeps it after
        # the first iteration (K d^2 values twice)
        starting = [start.model if start is not None else
                    initial_model(self, source, plan.random_state, plan.inits,
                                  plan.block_size, plan.sample_weights)
                    if plan.do_init else self._current_model()]
        check_variances_fit(starting[0], plan.out_dtype)
        settings = EMSettings(self.max_iter, self.tol, self.reg_covar,
                              plan.compute_dtype, self.resp_threshold,
                              self.on_degenerate,
                              # starved: below a thousandth of the mean row weight
                              min_count=EMSettings.min_count * plan.total_weight
                              / plan.n_samples,
                              update=self._update_rule())
        checkpointer = plan.checkpointer
        step = _pairs_step(plan, self.resp_threshold,
                           owns_start=plan.do_init or start is not None)
        try:
            run = run_em(
                plan.executor, plan.tasks, plan.block_size, starting.pop,
                plan.n_samples, settings=settings, callback=self._iteration_callback,
                init_index=init, statistics_pass=plan.statistics_pass, start=start,
                step=step, on_iteration=(None if checkpointer is None else
                                         checkpointer.saver(init, plan.random_state,
                                                            best)),
                weights=plan.weights, total_weight=plan.total_weight,
                previous_bound=(-np.inf if plan.do_init
                                else self._warm_start_bound()),
            )
            # (a pairs run's model is its state's: out of the folder removed next)
            return dataclasses.replace(run, model=run.model.in_memory())
        finally:
            if step is not None:
                step.close()

    def _warm_start_bound(self):
        """The bound a warm start's first change is measured against: the previous
        fit's last iteration's, ``lower_bounds_[-1]`` (scikit-learn's
        ``lower_bound_``; ``-inf`` after ``max_iter=0``). Not ``lower_bound_``, the
        score of the returned parameters: the first iteration computes that value
        again, so the change would be 0 and every warm start would stop at once."""
        return self.lower_bounds_[-1] if len(self.lower_bounds_) else -np.inf

    def _finish(self, best, precisions, out_dtype):
        """Set the fitted attributes from the best run; return its labels."""
        score, run, labels = best
        # (the checkpoint is gone: resuming would end in this error again)
        check_attributes_hold(run.model, precisions, out_dtype)
        if not run.converged and self.max_iter > 0:
            warnings.warn(
                "Best performing initialization did not converge. Try different init "
                "parameters, or increase max_iter, tol, or check for degenerate data.",
                ConvergenceWarning, stacklevel=1,
            )
        self._set_model(run.model, out_dtype, precisions)
        self.converged_ = run.converged
        self.n_iter_ = run.n_iter
        self.lower_bound_ = score
        self.lower_bounds_ = run.lower_bounds
        self.history_ = run.history
        # a stream continued by partial_fit starts from this model
        self.n_steps_ = 0
        self._online_statistics = None
        return labels

    def _task_callback(self, done, total):
        self.callback({"event": "progress", "done": done, "total": total})

    def _iteration_callback(self, record):
        if self.verbose and record["n_iter"] % self.verbose_interval == 0:
            if self.verbose >= 2:
                print(f"  Iteration {record['n_iter']}\t time lapse "
                      f"{record['seconds']:.5f}s\t ll change {record['change']:.5f}")
            else:
                print(f"  Iteration {record['n_iter']}")
        if self.callback is not None:
            self.callback(record)

    # ---------------------------------------------------------------- predict

    def _e_step_pass(self, X, output=None, out=None, sample_weight=None, method=""):
        """One parallel E step over ``X``, as the last pass of ``fit`` (the same
        executor, tasks, BLAS threads and ``SCORE_MARGIN``): ``(n, total)`` of the
        (weighted) log-likelihood when ``output`` is ``None``, else the per-row
        ``output`` (see :data:`~emgmm._engine.passes.ROW_OUTPUTS`) written into
        ``out`` (:meth:`_output_array`), which is returned.

        The model's arrays and one block per task in flight are all that the pass
        allocates besides ``out``: with ``output`` each task holds at most
        ``OUTPUT_TASK_BYTES`` of it, whatever the number of rows. Without, the
        tasks are the fit's, so that ``score(X)`` of the training data is
        ``lower_bound_``.
        """
        check_is_fitted(self)
        source = self._source(X, reset=False)
        weights = None
        try:
            if output is not None:
                out = self._output_array(source, output, out, method)
            weights = as_weight_source(sample_weight, source.n_samples)
            total_weight = (source.n_samples if weights is None
                            else check_weights(weights).total)
            plan = self._e_step_plan(source, out)
            model = self._update_rule().e_step_model(self._fitted_model())
            args = (plan.executor, plan.tasks, plan.block_size, model,
                    plan.compute_dtype)
            with explain_worker_loss(plan.model_nbytes, plan.block_nbytes,
                                     plan.executor.n_workers, source), \
                    plan.executor, shared_weights(plan.executor, weights) as shared:
                if output is not None:
                    return output_pass(*args, output, out)
                total, _ = score_pass(*args, False, shared)
                return total_weight, total
        finally:
            source.close()
            if weights is not None:
                weights.close()

    def _output_array(self, source, output, out, method):
        """``out`` checked for the per-row ``output`` of ``source`` (a new C-ordered
        array when ``None``): int64 labels; float32 log-likelihoods or
        responsibilities for float32 data computed in float32 (as scikit-learn
        returns them), else float64."""
        n = source.n_samples
        shape = (n, self.n_components) if output == "proba" else (n,)
        dtype = (np.int64 if output == "labels" else
                 self._output_dtype(self._compute_dtype(source), source.dtype))
        return _check_out(out, shape, dtype, method)

    def _e_step_plan(self, source, out):
        """The :class:`EStepPlan` of :meth:`_e_step_pass`: the fit's executor and
        tasks (``out``, when given, caps the rows per task)."""
        n, d = source.shape
        kind = self._kind()
        compute_dtype = self._compute_dtype(source)
        block_size = self._block_size(source)
        # (a source that worker processes cannot reopen is read in this process,
        # where fit refuses it with workers)
        executor = Executor(source, self.n_jobs if source.shareable else 1)
        schedule = "rows"
        if self.schedule in ("auto", "pairs") and self._pairs_apply(kind, d, executor):
            schedule = "pairs"
        max_rows = None
        if out is not None:
            row_bytes = out.itemsize * (out.size // max(n, 1))
            max_rows = OUTPUT_TASK_BYTES // max(row_bytes, 1)
        tasks = partition(n, block_size, self._max_tasks(schedule, kind, d), max_rows)
        _limit_threads(executor, "rows", n, tasks, self.n_components, d, kind)
        return EStepPlan(
            executor, tasks, block_size, compute_dtype,
            schedule_nbytes("rows", self.n_components, d, kind, executor.n_workers),
            block_size * kind.bytes_per_row(d, self.n_components,
                                            np.dtype(compute_dtype).itemsize))

    def score_samples(self, X: DataLike, out: np.ndarray | None = None) -> np.ndarray:
        """Log-likelihood of each sample, ``log sum_k w_k N(x | mu_k, Sigma_k)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        out : ndarray or np.memmap of shape (n_samples,) or None, default=None
            Where to write the result, block by block (a memmap for sources larger
            than memory); any float dtype.

        Returns
        -------
        ndarray of shape (n_samples,)
            The log-likelihood of each sample, in nats: float32 for float32 data
            computed in float32 (as scikit-learn), else float64; ``out`` when given.

        Raises
        ------
        ValueError
            If ``out`` has another shape, a non-float dtype or is read-only.
        """
        return self._e_step_pass(X, "log_prob", out, method="score_samples")

    def score(self, X: DataLike, y: None = None,
              sample_weight: WeightLike | None = None) -> float:
        """Mean per-sample log-likelihood of ``X`` (nats per sample).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        y : None
            Ignored.
        sample_weight : see :meth:`fit`
            The weighted mean ``sum_i w_i log p(x_i) / sum_i w_i``.

        Returns
        -------
        float
            The mean log-likelihood per sample, in nats.
        """
        return self._n_and_score(X, sample_weight)[1]

    def _n_and_score(self, X, sample_weight=None):
        """``(n, mean log-likelihood)`` of ``X`` from one pass; with weights
        ``n = sum w`` and the weighted mean (the weights read in blocks beside the
        rows)."""
        n, total = self._e_step_pass(X, sample_weight=sample_weight)
        return n, total / n

    def predict(self, X: DataLike, out: np.ndarray | None = None) -> np.ndarray:
        """Label of the most responsible component for each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        out : ndarray or np.memmap of shape (n_samples,) or None, default=None
            Where to write the result, block by block; any integer dtype.

        Returns
        -------
        ndarray of shape (n_samples,), int64
            The most responsible component of each sample; ``out`` when given.

        Raises
        ------
        ValueError
            If ``out`` has another shape, a non-integer dtype or is read-only.
        """
        return self._e_step_pass(X, "labels", out, method="predict")

    def predict_proba(self, X: DataLike, out: np.ndarray | None = None) -> np.ndarray:
        """Compute the responsibilities ``r_ik`` of every component for each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        out : ndarray or np.memmap of shape (n_samples, n_components) or None, \
default=None
            Where to write the result, block by block; any float dtype.

        Returns
        -------
        ndarray of shape (n_samples, n_components)
            Rows sum to 1; float32 for float32 data computed in float32, else
            float64; ``out`` when given. A sample so far out that several
            components' log-densities agree to float64's precision gets them in
            equal shares, where scikit-learn gives each of them 1.

        Raises
        ------
        ValueError
            If ``out`` has another shape, a non-float dtype or is read-only.
        """
        return self._e_step_pass(X, "proba", out, method="predict_proba")

    def sample(self, n_samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Draw samples from the fitted mixture (as scikit-learn draws them).

        Parameters
        ----------
        n_samples : int, default=1
            Number of samples to draw.

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
            The samples, float64, ordered by component.
        y : ndarray of shape (n_samples,), int64
            Component of each sample.

        Raises
        ------
        ValueError
            If ``n_samples < 1``.
        """
        check_is_fitted(self)
        if n_samples < 1:
            raise ValueError(
                f"Invalid value for 'n_samples': {n_samples} . The sampling requires "
                "at least one sample."
            )
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        kind = self._kind()
        parts = kind.sample(rng, self.means_, kind.sampling_covariances(self), counts)
        X = np.vstack(parts).astype(np.float64)
        y = np.concatenate([np.full(int(s), k, dtype=np.int64)
                            for k, s in enumerate(counts)])
        return X, y
