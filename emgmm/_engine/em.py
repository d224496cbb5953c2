"""One EM run over a source: :func:`em_step` (a pass of fused E step + statistics,
the M step, recentring, factorisation and the degenerate policy) and the loop
around it (:func:`run_em`: tolerance, callback, checkpoint hook)."""

import collections
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from ..covariance._cholesky import factorize
from .degenerate import POLICIES, reseed_streaks
from .model import RunResult
from .passes import release_after_pass, rows_statistics_pass
from .update import MaximumLikelihood


@dataclass
class EMSettings:
    """What an EM run does with each pass: the estimator's parameters.

    Attributes
    ----------
    max_iter, tol, reg_covar, compute_dtype, resp_threshold
        As the estimator's parameters.
    on_degenerate : {'reinit', 'raise'}
        The degenerate policy (:data:`~emgmm._engine.degenerate.POLICIES`).
    min_count : float, default=1e-3
        A component whose ``N_k`` falls below this is starved (a thousandth of one
        sample: a k-means singleton, ``N_k`` just below 1, is kept as scikit-learn
        keeps it; a component the data have left, ``N_k`` near 0, is not).
    update : MaximumLikelihood or another update rule
        E-step parameters, parameters from statistics, lower bound.
    """

    max_iter: int
    tol: float
    reg_covar: float
    compute_dtype: type
    resp_threshold: float
    on_degenerate: str
    min_count: float = 1e-3
    update: object = field(default_factory=MaximumLikelihood)

    def policy(self):
        """A new policy object of ``on_degenerate``."""
        return POLICIES[self.on_degenerate](self.reg_covar, self.compute_dtype)


@dataclass
class DataPass:
    """A statistics pass of one schedule over fixed rows:
    ``statistics_pass(executor, tasks, block_size, model, compute_dtype,
    resp_threshold, n_worst[, centers=][, weights=])``.

    ``weights`` are the rows' sample weights (a
    :class:`~emgmm._io.weights.WeightSource` the tasks can read, or ``None``) and
    ``total_weight`` their sum (``n_samples`` without weights): the ``n`` of the
    lower bound. ``passes`` counts the calls (an iteration makes one, or two when
    its statistics are summed again around the new means)."""

    statistics_pass: object
    executor: object
    tasks: list
    block_size: int
    n_samples: int
    compute_dtype: type
    resp_threshold: float
    weights: object = None
    total_weight: float | None = None
    passes: int = 0

    def __post_init__(self):
        if self.total_weight is None:
            self.total_weight = self.n_samples

    def __call__(self, model, n_worst, centers=None):
        args = (self.executor, self.tasks, self.block_size, model, self.compute_dtype,
                self.resp_threshold, n_worst)
        kwargs = {} if centers is None else {"centers": centers}
        if self.weights is not None:
            kwargs["weights"] = self.weights
        self.passes += 1
        return self.statistics_pass(*args, **kwargs)


def em_step(data_pass, take_model, settings, policy, seeds, used_rows, n_iter,
            streaks=None):
    """One EM iteration from the model ``take_model()`` returns.

    The model is let go as soon as it is no longer needed: its covariances before
    the pass (the E step uses the factors), the rest after the M step, before the
    new factors are formed. For 'full' at d=900, K=200 each ``(K, d, d)`` array is
    1.3 GB: the iteration holds the factors and the tasks' statistics during the
    pass, then the covariances (in the statistics' memory) and the new factors.

    Parameters
    ----------
    data_pass : DataPass
    take_model : callable
        Returns the model; the caller keeps no reference to it.
    settings : EMSettings
    policy : RaisePolicy or ReinitPolicy
    seeds : collections.Counter
        Re-seeds of each component so far in the run.
    used_rows : list of int
        Rows used by the run's re-seeds (appended to).
    n_iter : int
        The number of this iteration.
    streaks : collections.Counter or None, default=None
        Each component's current streak of re-seeds (:func:`reseed_streaks`; the
        ``MAX_RESEEDS`` cap); ``None``: ``seeds``.

    Returns
    -------
    new_model : Model
    lower_bound : float
        Of the E step's parameters (the update rule's; for maximum likelihood the
        mean log-likelihood).
    reseeded : list of int
    """
    update = settings.update
    model = dataclasses.replace(update.e_step_model(take_model()), covariances=None)
    K = model.means.shape[0]
    n_worst = min(K + len(used_rows), 2 * K)
    stats, worst = data_pass(model, n_worst)
    release_after_pass(model, settings.compute_dtype,
                       min(data_pass.block_size, data_pass.n_samples))
    log_likelihood = stats.log_likelihood
    stats, new = update.parameters_from_statistics(data_pass, model, stats,
                                                   settings.reg_covar)
    # (the E step's factors, for a repair that keeps the bound: small for the
    # types that have one)
    previous = model.precisions_cholesky if model.kind.holds_degenerate else None
    del model
    new.precisions_cholesky, bad = factorize(
        new.covariances, new.kind, settings.compute_dtype,
        threads=data_pass.executor.component_threads)
    bad = policy.hold(new, bad, previous, n_iter)
    del previous
    # a component re-seeded before that starves again is kept, as scikit-learn
    # keeps it (its covariance is positive definite; re-seeding it on every
    # iteration would keep the fit from converging, e.g. K close to n)
    starved = [int(k) for k in np.flatnonzero(stats.nk < settings.min_count)
               if int(k) not in seeds]
    # the statistics (K d^2 values for 'full') are not needed in the next pass
    del stats
    streaks = seeds if streaks is None else streaks
    new.precisions_cholesky, reseeded = policy.repair(new, bad, starved, worst, streaks,
                                                      used_rows, n_iter)
    return (new, update.lower_bound(log_likelihood, data_pass.total_weight, new),
            reseeded)


def run_em(executor, tasks, block_size, model, n_samples, *, settings, callback=None,
           init_index=0, start=None, on_iteration=None,
           statistics_pass=rows_statistics_pass, weights=None, total_weight=None,
           step=None, previous_bound=-np.inf):
    """Iterate :func:`em_step` from ``model`` until ``|change of mean log-likelihood|
    < tol`` or ``max_iter`` iterations.

    Parameters
    ----------
    executor : Executor
    tasks : list of (start, stop)
    block_size : int
    model : Model or callable
        Starting parameters, or a function without arguments that returns them: then
        nothing outside keeps the starting model, which is freed after the first
        iteration (``K d^2`` values twice for 'full').
    n_samples : int
    settings : EMSettings
    callback : callable or None
        Called with each iteration's history record.
    init_index : int
    start : RunResult or None
        Resume from this state (checkpoint).
    on_iteration : callable or None
        ``on_iteration(run_result)`` after every iteration (checkpointing), before
        ``callback``.
    statistics_pass : callable
        The schedule: ``(executor, tasks, block_size, model, compute_dtype,
        resp_threshold, n_worst) -> (SufficientStatistics, Worst)``.
    weights : WeightSource or None, default=None
        Sample weights the tasks read with the rows.
    total_weight : float or None, default=None
        Their sum, the ``n`` of the lower bound (``n_samples`` without weights).
    step : callable or None, default=None
        An iteration of another shape than :func:`em_step` over ``statistics_pass``
        (:class:`~emgmm._engine.pair_step.PairStep`): ``step(take_model, settings,
        policy, seeds, used_rows, n_iter, streaks) -> (model, lower_bound,
        reseeded)``.
    previous_bound : float, default=-inf
        What the first iteration's change is measured against: for a warm start,
        the previous fit's last bound (scikit-learn's rule: a loop of warm-started
        ``max_iter=1`` fits converges as one fit does). A resumed run measures from
        its own last bound instead.

    Returns
    -------
    RunResult
    """
    if callable(model):
        model = model()
    data_pass = None
    if step is None:
        data_pass = DataPass(statistics_pass, executor, tasks, block_size, n_samples,
                             settings.compute_dtype, settings.resp_threshold, weights,
                             total_weight)

        def step(take_model, _settings, *args):
            return em_step(data_pass, take_model, _settings, *args)

    policy = settings.policy()
    state = RunResult(model, [], 0, False, []) if start is None else start
    del model
    lower_bound = state.lower_bounds[-1] if state.lower_bounds else previous_bound
    while state.n_iter < settings.max_iter and not state.converged:
        tic = time.perf_counter()
        n_iter = state.n_iter + 1
        used_rows = list(state.reseed_rows)
        seeds = collections.Counter(k for record in state.history
                                    for k in record["reseeded"])
        streaks = reseed_streaks(state.history, n_iter)
        prev = lower_bound
        # the model goes to em_step alone, which lets it go part by part
        held = [state.model]
        state = dataclasses.replace(state, model=None)
        passes = None if data_pass is None else data_pass.passes
        new, lower_bound, reseeded = step(held.pop, settings, policy, seeds,
                                          used_rows, n_iter, streaks)
        record = {
            "event": "iteration",
            "init": init_index,
            "n_iter": n_iter,
            "lower_bound": lower_bound,
            "change": lower_bound - prev,
            "seconds": time.perf_counter() - tic,
            "reseeded": reseeded,
        }
        # (the pairs schedule reads rows by phases: it gives pairs_per_row instead)
        record["passes"] = None if data_pass is None else data_pass.passes - passes
        for name in ("pairs_per_row", "rows_carried", "rows_rescreened",
                     "phase_seconds"):  # (the pairs schedule's)
            value = getattr(step, name, None)
            if value is not None:
                record[name] = value
        state = RunResult(new, state.lower_bounds + [lower_bound], n_iter,
                          abs(record["change"]) < settings.tol and not reseeded,
                          state.history + [record], used_rows)
        del new  # (the state holds it alone: em_step lets it go part by part)
        if on_iteration is not None:
            on_iteration(state)
        if callback is not None:
            callback(dict(record))
    return state
