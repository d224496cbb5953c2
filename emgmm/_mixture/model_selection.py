"""Choosing the number of components (and the covariance type) by BIC or AIC."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Sequence
from numbers import Integral
from typing import TYPE_CHECKING, Literal

import numpy as np
from sklearn import get_config
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .._engine.shared_pass import FitCancelled, SharedPasses
from .._io.sources import DataLike, as_source, is_file_backed
from .._runtime.executor import Executor
from .._runtime.memory import (
    available_memory,
    partition,
    row_threads_worthwhile,
    schedule_nbytes,
)
from .._runtime.worker_loss import explain_worker_loss
from ..covariance import REGISTRY
from .base import FitPlan
from .gaussian_mixture import GaussianMixture
from .parameter_docs import fill_parameter_docs
from .validation import validate_params

if TYPE_CHECKING:
    from typing_extensions import Self

#: The candidate covariance types: those that no further parameter configures
#: ('factor' is not one: its n_factors would be a grid axis of its own).
COVARIANCE_TYPES = tuple(name for name, kind in REGISTRY.items() if not kind.parameters)
CRITERIA = ("bic", "aic")
#: GaussianMixture's parameters that every candidate shares (passed through as given).
SHARED_PARAMETERS = (
    "tol", "reg_covar", "max_iter", "n_init", "init_params", "random_state",
    "n_jobs", "temp_folder", "working_memory", "block_size", "memory_limit",
    "init_max_samples", "compute_dtype", "resp_threshold", "on_degenerate",
)
#: Fitted attributes of the chosen candidate that the selector exposes as its own.
FITTED_ATTRIBUTES = (
    "weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_",
    "converged_", "n_iter_", "lower_bound_", "lower_bounds_",
)


def information_criterion(criterion, mean_log_likelihood, n_parameters, n_samples):
    """``-2 log L + p log n`` (BIC, Schwarz 1978) or ``-2 log L + 2 p`` (AIC, Akaike
    1974), with ``log L = n * mean_log_likelihood``; the lower the better."""
    penalty = math.log(n_samples) if criterion == "bic" else 2.0
    return -2.0 * mean_log_likelihood * n_samples + n_parameters * penalty


def _covariance_types(covariance_type):
    """The covariance types of the grid, in the order given ('all': every type)."""
    if isinstance(covariance_type, str):
        types = COVARIANCE_TYPES if covariance_type == "all" else (covariance_type,)
    else:
        types = tuple(covariance_type)
    unknown = [t for t in types if t not in COVARIANCE_TYPES]
    if not types or unknown or len(set(types)) != len(types):
        raise ValueError(
            f"covariance_type must be one of {', '.join(map(repr, COVARIANCE_TYPES))}, "
            f"'all' or a list of distinct ones; got {covariance_type!r}.")
    return types


@fill_parameter_docs(
    n_jobs="Here for the passes that all the candidates share.",
    block_size="The blocks are sized for the largest candidate.",
    memory_limit="Here for the models of all the candidates together.",
    init_max_samples="Each candidate has its own.")
class GaussianMixtureIC(DensityMixin, BaseEstimator):
    """Gaussian mixture with its number of components chosen by BIC or AIC.

    Fits :class:`emgmm.GaussianMixture` for every ``n_components`` from
    ``min_components`` to ``max_components`` and every covariance type of
    ``covariance_type``, and keeps the candidate with the lowest BIC or AIC on the
    training data (the first of equal ones: fewer components first). The candidates
    are fitted side by side: each pass over ``X`` reads every block once and computes
    the statistics of every candidate still iterating from it (those that converged
    drop out), so the grid costs the reads of its longest fit; the memory of all
    candidates' models is checked up front. Each criterion is computed from the
    candidate's ``lower_bound_`` (its mean log-likelihood under the returned
    parameters, as ``score(X)``), without another pass.
    After ``fit`` the estimator predicts, scores and samples with the chosen model.
    scikit-learn's issue #19338 / pull request #26735 propose the same estimator.

    Parameters
    ----------
    min_components, max_components : int, default=1 and 10
        The smallest and largest numbers of components tried (both included).
    covariance_type : str or list of str, default='full'
        'full', 'tied', 'diag', 'spherical', a list of them, or 'all' (the four).
    criterion : {'bic', 'aic'}, default='bic'
        ``-2 log L + p log n`` or ``-2 log L + 2 p``, ``p`` the free parameters.
    tol : float, default=1e-3
        Convergence threshold of every candidate's EM.
    reg_covar : float, default=1e-6
        Non-negative value added to the diagonal of every covariance ('factor':
        the floor of its noise variances, its M step's maximiser under that bound).
    max_iter : int, default=100
        EM iterations per initialisation.
    n_init : int, default=1
        Initialisations per candidate.
    init_params : str, default='kmeans'
        'kmeans', 'k-means++', 'random' or 'random_from_data', as
        :class:`emgmm.GaussianMixture`'s.
    random_state : int, RandomState instance or None, default=None
        An integer gives every candidate the fit it would have alone.
    %(n_jobs)s
    %(temp_folder)s
    %(working_memory)s
    %(block_size)s
    %(memory_limit)s
    %(init_max_samples)s
    %(compute_dtype)s
    %(resp_threshold)s
    on_degenerate : {'reinit', 'raise'}, default='reinit'
        As :class:`emgmm.GaussianMixture`'s.
    verbose : int, default=0
        1 prints each candidate's criterion.

    Attributes
    ----------
    criteria_ : ndarray of shape (n_candidates_components, n_covariance_types)
        The criterion of every candidate; rows follow ``n_components_grid_``,
        columns ``covariance_types_``.
    n_components_grid_ : ndarray of int
    covariance_types_ : tuple of str
    best_estimator_ : emgmm.GaussianMixture
        The chosen candidate, fitted.
    n_components_ : int
    covariance_type_ : str
    best_criterion_ : float
    n_passes_ : int
        Passes over ``X`` that the fit took: one per EM iteration (and final
        scoring) of the longest candidate, all candidates still iterating served by
        each (a loop of separate fits takes the sum over the candidates).
    rows_read_ : int
        Rows of ``X`` read by those passes.
    weights_, means_, covariances_, precisions_, precisions_cholesky_, converged_,
    n_iter_, lower_bound_, lower_bounds_
        The chosen candidate's.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` has string feature names.

    Examples
    --------
    >>> import numpy as np
    >>> from emgmm import GaussianMixtureIC
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(0, 1, (200, 2)), rng.normal(8, 1, (200, 2))])
    >>> selector = GaussianMixtureIC(1, 4, covariance_type=["full", "spherical"],
    ...                              random_state=0).fit(X)
    >>> selector.n_components_, selector.covariance_type_
    (2, 'spherical')
    >>> selector.criteria_.shape
    (4, 2)
    """

    def __init__(
        self,
        min_components: int = 1,
        max_components: int = 10,
        *,
        covariance_type: str | Sequence[str] = "full",
        criterion: Literal["bic", "aic"] = "bic",
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        n_init: int = 1,
        init_params: Literal["kmeans", "k-means++", "random",
                             "random_from_data"] = "kmeans",
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
        temp_folder: str | os.PathLike[str] | None = None,
        working_memory: float | None = None,
        block_size: int | None = None,
        memory_limit: float | None = None,
        init_max_samples: int = 100_000,
        compute_dtype: Literal["float32", "float64"] | None = None,
        resp_threshold: float = 1e-20,
        on_degenerate: Literal["reinit", "raise"] = "reinit",
        verbose: int = 0,
    ) -> None:
        self.min_components = min_components
        self.max_components = max_components
        self.covariance_type = covariance_type
        self.criterion = criterion
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.temp_folder = temp_folder
        self.working_memory = working_memory
        self.block_size = block_size
        self.memory_limit = memory_limit
        self.init_max_samples = init_max_samples
        self.compute_dtype = compute_dtype
        self.resp_threshold = resp_threshold
        self.on_degenerate = on_degenerate
        self.verbose = verbose

    def _grid(self):
        """``(n_components values, covariance types)``, validated."""
        low, high = self.min_components, self.max_components
        if not all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 1
                   for v in (low, high)) or low > high:
            raise ValueError(
                "min_components and max_components must be integers with 1 <= "
                f"min_components <= max_components; got {low!r} and {high!r}.")
        if self.criterion not in CRITERIA:
            raise ValueError("criterion must be 'bic' or 'aic'; "
                             f"got {self.criterion!r}.")
        return np.arange(low, high + 1), _covariance_types(self.covariance_type)

    def _candidate(self, n_components, covariance_type):
        params = {name: getattr(self, name) for name in SHARED_PARAMETERS}
        return GaussianMixture(n_components=int(n_components),
                               covariance_type=covariance_type, **params)

    def _training_data(self, X):
        """``(X for the candidates, n_samples)``: arrays validated once for all of
        them; files (paths, memory maps, HDF5) passed on as they are."""
        if is_file_backed(X):
            source = as_source(X)
            try:
                n = source.n_samples
            finally:
                source.close()
            return X, n
        X = validate_data(self, X, dtype=[np.float64, np.float32],
                          ensure_min_samples=2, ensure_all_finite=False)
        return X, X.shape[0]

    def fit(self, X: DataLike, y: None = None) -> Self:
        """Fit every candidate and keep the best by ``criterion``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str, PathLike \
or h5py.Dataset
            As :meth:`emgmm.GaussianMixture.fit`'s.
        y : None
            Ignored.

        Returns
        -------
        GaussianMixtureIC
            The fitted selector (``self``).

        Raises
        ------
        ValueError
            Invalid parameters, ``max_components`` above the number of samples, or
            what a candidate's fit raises (the estimator then keeps its previous
            state).
        """
        saved = dict(self.__dict__)
        try:
            self._fit_grid(X)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise
        return self

    def _fit_grid(self, X):
        grid, types = self._grid()
        X, n = self._training_data(X)
        if grid[-1] > n:
            raise ValueError(
                f"max_components={grid[-1]} exceeds the number of samples ({n}).")
        criteria = np.empty((len(grid), len(types)))
        candidates = [self._candidate(k, kind) for k in grid for kind in types]
        if not get_config()["skip_parameter_validation"]:
            validate_params(GaussianMixture._parameter_constraints,
                            candidates[0].get_params(deep=False), type(self).__name__)
        _seed(candidates, self.random_state)
        passes = fit_side_by_side(candidates, X)
        names = getattr(self, "feature_names_in_", None)
        for c in candidates:  # (X was validated here, on the selector)
            if names is not None:
                c.feature_names_in_ = names
        self.n_passes_, self.rows_read_ = passes.rounds, passes.rows_read
        best = None
        for i, k in enumerate(grid):
            for j, kind in enumerate(types):
                model = candidates[i * len(types) + j]
                criteria[i, j] = information_criterion(
                    self.criterion, model.lower_bound_, model._n_parameters(), n)
                if self.verbose:
                    print(f"n_components={k}, covariance_type={kind!r}: "
                          f"{self.criterion} {criteria[i, j]:.6g}")
                if best is None or criteria[i, j] < best[0]:
                    best = (criteria[i, j], model)
        self._set_best(best[1], criteria, grid, types)

    def _set_best(self, model, criteria, grid, types):
        self.criteria_ = criteria
        self.n_components_grid_ = grid
        self.covariance_types_ = types
        self.best_estimator_ = model
        self.n_components_ = model.n_components
        self.covariance_type_ = model.covariance_type
        self.best_criterion_ = float(criteria.min())
        self.n_features_in_ = model.n_features_in_
        for name in FITTED_ATTRIBUTES:
            setattr(self, name, getattr(model, name))

    # ---------------------------------------------------------- the chosen model

    def _best(self):
        check_is_fitted(self)
        return self.best_estimator_

    def predict(self, X: DataLike) -> np.ndarray:
        """Label of the most responsible component of each sample, chosen model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        ndarray of shape (n_samples,)
            As :meth:`emgmm.GaussianMixture.predict` of ``best_estimator_``.
        """
        return self._best().predict(X)

    def predict_proba(self, X: DataLike) -> np.ndarray:
        """Compute the responsibilities of each sample under the chosen model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        ndarray of shape (n_samples, ``n_components_``)
            As :meth:`emgmm.GaussianMixture.predict_proba` of ``best_estimator_``.
        """
        return self._best().predict_proba(X)

    def score_samples(self, X: DataLike) -> np.ndarray:
        """Log-likelihood of each sample under the chosen model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        ndarray of shape (n_samples,)
            As :meth:`emgmm.GaussianMixture.score_samples` of ``best_estimator_``.
        """
        return self._best().score_samples(X)

    def score(self, X: DataLike, y: None = None) -> float:
        """Mean per-sample log-likelihood under the chosen model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        y : None
            Ignored.

        Returns
        -------
        float
            Nats per sample; higher is better (what ``GridSearchCV`` maximises).
        """
        return self._best().score(X)

    def sample(self, n_samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Draw samples from the chosen model.

        Parameters
        ----------
        n_samples : int, default=1
            Number of samples to draw.

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
            The samples, ordered by component.
        y : ndarray of shape (n_samples,)
            Component of each sample.
        """
        return self._best().sample(n_samples)

    def bic(self, X: DataLike) -> float:
        """Bayesian information criterion of the chosen model on ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        float
            ``-2 log L + p log n``; the lower the better.
        """
        return self._best().bic(X)

    def aic(self, X: DataLike) -> float:
        """Akaike information criterion of the chosen model on ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        float
            ``-2 log L + 2 p``; the lower the better.
        """
        return self._best().aic(X)

    def fit_predict(self, X: DataLike, y: None = None) -> np.ndarray:
        """Fit every candidate, then label ``X`` with the chosen one.

        Parameters
        ----------
        X : array-like, np.memmap, str, PathLike or h5py.Dataset
            As :meth:`fit`'s.
        y : None
            Ignored.

        Returns
        -------
        ndarray of shape (n_samples,)
            The labels under the chosen model.
        """
        return self.fit(X).predict(X)



def _seed(candidates, random_state):
    """A ``RandomState`` instance is shared by all candidates' threads: give each
    candidate a seed of its own drawn from it, in grid order (reproducible). An int
    or ``None`` is each candidate's as given, as for separate fits."""
    if isinstance(random_state, np.random.RandomState):
        for c in candidates:
            c.random_state = int(random_state.randint(np.iinfo(np.int32).max))


def _check_memory(candidates, n_features, n_workers, memory_limit):
    """The bytes of every candidate's model over the parent and the workers; raises
    ``MemoryError`` up front when their sum exceeds the budget."""
    total = sum(schedule_nbytes("rows", c.n_components, n_features, c._kind(),
                                n_workers) for c in candidates)
    budget = available_memory() if memory_limit is None else memory_limit * 2**20
    if total > budget:
        raise MemoryError(
            f"The {len(candidates)} candidates fitted side by side need about "
            f"{total / 2**20:,.1f} MiB for their models with {n_workers} worker(s), "
            f"more than the budget of {budget / 2**20:,.1f} MiB. Use a smaller grid "
            "(max_components, covariance_type), fewer n_jobs, or raise memory_limit.")
    return total


def fit_side_by_side(candidates, X):
    """Fit every :class:`GaussianMixture` of ``candidates`` (in place) with one read
    of ``X`` per EM iteration for all those still iterating.

    Each candidate's fit runs in a thread of its own through
    :class:`~emgmm._engine.shared_pass.SharedPasses`: its passes wait for the others'
    and are computed from the same blocks, by the row-sharded schedule, in blocks
    small enough for the largest candidate. The candidates share every parameter
    but ``n_components`` and ``covariance_type``; they have no ``*_init``.

    Returns
    -------
    SharedPasses
        Its ``rounds`` and ``rows_read`` count the passes and the rows read.

    Raises
    ------
    MemoryError
        When the candidates' models together exceed the memory budget.
    Exception
        The first error of a candidate's fit (every fit is then abandoned).
    """
    first = candidates[0]
    source = first._source(X, reset=True)
    try:
        n, d = source.shape
        compute_dtype = first._compute_dtype(source)
        out_dtype = first._output_dtype(compute_dtype, source.dtype)
        block_size = min(c._block_size(source) for c in candidates)
        tasks = partition(n, block_size)
        executor = Executor(source, first.n_jobs, first.temp_folder)
        widest = max(candidates, key=lambda c: c.n_components)
        if not row_threads_worthwhile(n, len(tasks), widest.n_components, d,
                                      widest._kind()):
            executor.row_threads = 0
        estimate = _check_memory(candidates, d, executor.n_workers, first.memory_limit)
        block_nbytes = block_size * sum(REGISTRY["full"].bytes_per_row(
            d, c.n_components, np.dtype(compute_dtype).itemsize)
            for c in candidates)
        plan = FitPlan(n, d, (None, None, None), compute_dtype, out_dtype, block_size,
                       tasks, True, None, None, executor, None, estimate, block_nbytes,
                       None)
        with explain_worker_loss(estimate, block_nbytes, executor.n_workers), executor:
            passes = SharedPasses(executor, tasks, block_size, len(candidates))
            plan = dataclasses.replace(plan, statistics_pass=passes.statistics_pass,
                                       score_pass=passes.score_pass, total_weight=n)
            errors = _run_members(candidates, source, passes, plan)
    finally:
        source.close()
    if errors:
        raise errors[0]
    for c in candidates:
        c.n_features_in_ = d
    return passes


def _run_members(candidates, source, passes, plan):
    """Run every candidate's fit in its own thread; their errors, in grid order."""
    errors = [None] * len(candidates)

    def member(i):
        try:
            _fit_member(candidates[i], source, plan)
        except BaseException as exc:  # noqa: BLE001 (raised in the caller's thread)
            errors[i] = exc
            passes.cancel()  # the first error ends every fit
        finally:
            passes.leave()

    threads = [threading.Thread(target=member, args=(i,), name=f"candidate-{i}")
               for i in range(len(candidates))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:  # (Ctrl-C in this thread) the members end at their next pass
        passes.cancel()
        for t in threads:
            t.join()
        raise
    # the first real error (the others' FitCancelled follow from it)
    errors = [e for e in errors if e is not None]
    return sorted(errors, key=lambda e: isinstance(e, FitCancelled))


def _fit_member(candidate, source, plan):
    """``candidate.fit`` on the shared passes of ``plan``: BaseMixture's restarts
    and fitted attributes, without warm start or checkpoints."""
    plan = dataclasses.replace(plan, n_init=candidate.n_init,
                               random_state=check_random_state(candidate.random_state))
    best = candidate._best_run(plan, source, False)
    model = best[1].model
    precisions = model.kind.precisions_from_cholesky(
        model.precisions_cholesky.astype(plan.out_dtype))
    candidate._finish(best, precisions, plan.out_dtype)
