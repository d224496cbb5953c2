"""One EM run over a source: passes of fused E step + statistics, then the M step.

Each iteration reads every row once. A task covers a fixed range of whole blocks; for
each block it computes the log-likelihood, the responsibilities and the block's
sufficient statistics, and keeps the rows the model explains worst (candidates for
re-seeding a degenerate component). Tasks are reduced in their fixed order, so the
result does not depend on the number of workers.
"""

import collections
import dataclasses
import time
import warnings
from concurrent.futures import BrokenExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..covariance.cholesky import _ill_defined_message, factorize
from .estep import SCORE_MARGIN, estimate_log_prob_resp, estimate_resp
from ..covariance.log_density import centred_products, relevance_margin
from ..covariance.m_step import m_step, needs_recentring
from ..covariance.packed_estimate import prepare_log_prob
from ..covariance.statistics import block_statistics
from ..runtime.memory import (
    RELEASE_MIN_BYTES,
    available_memory,
    bytes_per_row,
    release_free_memory,
)
from ..runtime.blas import limit_blas
from ..runtime.workspace import borrow

_MIB = 2**20
#: Re-seeds of one component after which its collapsing once more (a covariance not
#: positive definite) ends the fit with scikit-learn's error: a flat cluster
#: without reg_covar takes every re-seed back within two iterations, while the
#: singleton cases of CASES C09 settled after at most 5.
MAX_RESEEDS = 10
# Errors of a worker pool whose worker process died: loky's TerminatedWorkerError and
# BrokenProcessPool derive from BrokenExecutor; dask reports KilledWorker.
_WORKER_DEATH_NAMES = ("KilledWorker",)


@dataclass
class Model:
    """Mixture parameters in scikit-learn's shapes (covariances may be ``None``).

    ``prepared`` holds the work on the parameters that every block of a pass shares
    (:func:`emgmm.covariance.packed_estimate.prepare_log_prob`), built once by :meth:`prepare`; the
    parent builds it before a pass so that the workers receive it (as memory maps,
    like the parameters) instead of each rebuilding it.
    """

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    precisions_cholesky: np.ndarray
    covariance_type: str
    prepared: object = field(default=None, repr=False, compare=False)
    prepared_for: str = field(default=None, repr=False, compare=False)

    def prepare(self, compute_dtype):
        """:func:`~emgmm.covariance.packed_estimate.prepare_log_prob` for ``compute_dtype``,
        kept (also when it is ``None``)."""
        key = np.dtype(compute_dtype).str
        if self.prepared_for != key:
            self.prepared = prepare_log_prob(self.weights, self.means,
                                             self.precisions_cholesky,
                                             self.covariance_type, compute_dtype)
            self.prepared_for = key
        return self.prepared


def smallest(values, size):
    """Indices of the ``size`` smallest of ``values`` (1-D), ties in index order:
    ``np.argsort(values, kind="stable")[:size]`` in O(n) time (one partition)."""
    if size >= values.size:
        return np.argsort(values, kind="stable")
    kth = np.partition(values, size - 1)[size - 1]
    if np.isnan(kth):
        return np.argsort(values, kind="stable")[:size]
    candidates = np.flatnonzero(values <= kth)
    return candidates[np.argsort(values[candidates], kind="stable")[:size]]


@dataclass
class Worst:
    """The rows with the lowest log-likelihood seen so far (at most ``size``)."""

    size: int
    values: np.ndarray = field(default_factory=lambda: np.empty(0))
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    data: np.ndarray = None

    def update(self, values, first_row, X):
        if self.size == 0:
            return self
        keep = smallest(values, self.size)
        other = Worst(self.size, values[keep], first_row + keep, np.asarray(X[keep]))
        return self.merge(other)

    def merge(self, other):
        if self.data is None:
            return other
        if other.data is None:
            return self
        values = np.concatenate([self.values, other.values])
        rows = np.concatenate([self.rows, other.rows])
        data = np.concatenate([self.data, other.data])
        order = np.lexsort((rows, values))[: self.size]
        return Worst(self.size, values[order], rows[order], data[order])


def check_explained(log_prob_norm, start, source, dtype, means):
    """Raise ``ValueError`` naming the first row whose log-likelihood is not finite.

    Its squared distance to every component overflowed the compute dtype (e.g. a
    value of 3e38 in float32, or components spread that far apart), which would
    otherwise surface later as an ill-defined covariance. ``log_prob_norm`` holds
    rows ``start:`` of ``source``, read in ``dtype`` (only the offending row is read
    again, for the message); ``means`` are the components' (K, d).
    """
    if np.isfinite(log_prob_norm).all():
        return
    row = start + int(np.flatnonzero(~np.isfinite(log_prob_norm))[0])
    values = source.read(row, row + 1, dtype)[0]
    col = int(np.argmax(np.abs(values)))
    raise ValueError(
        f"Row {row} of {source.description}: its squared distance to every component "
        f"overflows {np.dtype(dtype)} (its largest value {values[col]:.3g} at column "
        f"{col}; the largest mean coordinate {np.abs(means).max():.3g}). Scale the "
        "data, or compute in float64 (compute_dtype='float64') if it is float32."
    )


def statistics_task(source, start, stop, block_size, model, compute_dtype,
                    resp_threshold, n_worst, centers=None, *, blas_threads):
    """Sufficient statistics and worst-explained rows of rows ``start:stop``.

    Returns
    -------
    stats : SufficientStatistics
        Centred on ``centers`` (default ``model.means``), with the summed
        log-likelihood.
    worst : Worst
    """
    if centers is None:
        centers = model.means
    margin = relevance_margin(resp_threshold)
    prepared = None if margin is None else model.prepare(compute_dtype)
    with limit_blas(blas_threads):
        total, worst = None, Worst(n_worst)
        for b0 in range(start, stop, block_size):
            b1 = min(b0 + block_size, stop)
            X = source.read(b0, b1, compute_dtype)
            # 'diag'/'spherical': the centred block of the E step serves the M step
            products = (centred_products(X, model.means, model.weights)
                        if model.covariance_type in ("diag", "spherical") else None)
            with borrow("resp", (b1 - b0, len(model.weights)), order="F") as out:
                log_prob_norm, resp = estimate_resp(
                    X, model.weights, model.means, model.precisions_cholesky,
                    model.covariance_type, margin, prepared, products, out,
                )
                check_explained(log_prob_norm, b0, source, compute_dtype, model.means)
                total = block_statistics(X, resp, centers, model.covariance_type,
                                         resp_threshold, products, out=total)
                total.log_likelihood += float(log_prob_norm.sum())
                worst = worst.update(log_prob_norm, b0, X)
                # release this block's arrays before the next block allocates its own
                del X, products, log_prob_norm, resp
    return total, worst


def release_after_pass(model, compute_dtype, block_rows):
    """After a pass whose blocks took at least ``RELEASE_MIN_BYTES`` each, hand the
    free pages they left in the allocator's arenas back to the system
    (:func:`~emgmm.runtime.memory.release_free_memory`), between the passes, when no task
    allocates: every row thread's arena would otherwise keep its own high-water mark
    resident (on [100k, 64], K=200 'full': 241-250 MiB above the data against
    155-180 MiB with the release, at the same speed; releasing after every task
    instead cost ~5%: each block faulted its pages in again). Worker processes
    (``n_jobs >= 2``) run their tasks in one thread, and so in one arena each."""
    K, d = model.means.shape
    itemsize = np.dtype(compute_dtype).itemsize
    if block_rows * bytes_per_row(d, K, itemsize) >= RELEASE_MIN_BYTES:
        release_free_memory()


def score_task(source, start, stop, block_size, model, compute_dtype, want_labels,
               *, blas_threads):
    """Summed log-likelihood (and labels if asked) of rows ``start:stop``."""
    with limit_blas(blas_threads):
        total = 0.0
        labels = np.empty(stop - start, dtype=np.int64) if want_labels else None
        for b0 in range(start, stop, block_size):
            b1 = min(b0 + block_size, stop)
            X = source.read(b0, b1, compute_dtype)
            with borrow("resp", (b1 - b0, len(model.weights)), order="F") as out:
                log_prob_norm, log_resp = estimate_log_prob_resp(
                    X, model.weights, model.means, model.precisions_cholesky,
                    model.covariance_type, SCORE_MARGIN, model.prepare(compute_dtype),
                    out,
                )
                total += float(log_prob_norm.sum())
                if want_labels:
                    labels[b0 - start:b1 - start] = log_resp.argmax(axis=1)
                del X, log_prob_norm, log_resp
    return total, labels


#: What the initial 'tied' covariance of each init_params but 'kmeans' pools beyond
#: the spread within clusters (see initial_factors).
_TIED_INIT_POOLS = {
    "random": ("the spread between clusters", "clusters far apart relative to their "
               "spread"),
    "k-means++": ("the spread of the rows around the origin (as in scikit-learn)",
                  "data far from the origin relative to their spread"),
}
_TIED_INIT_POOLS["random_from_data"] = _TIED_INIT_POOLS["k-means++"]


def initial_factors(covariances, covariance_type, on_degenerate, dtype=np.float64,
                    init_params=None):
    """Precision factors of an initial model, applying the degenerate policy.

    An initialisation can give a component a covariance that is not positive definite
    (a k-means cluster of fewer than ``d + 1`` distinct points with ``reg_covar=0``).
    With 'reinit' such a component keeps its mean and weight and gets the pooled
    covariance of the healthy components (there is no pass yet to re-seed it from);
    with 'raise', or when no component is healthy, scikit-learn's error is raised.

    Parameters
    ----------
    covariances : ndarray
        Modified in place for the repaired components.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    on_degenerate : {'reinit', 'raise'}
    dtype : numpy dtype
    init_params : str or None, default=None
        The initialisation the covariances come from, for the error message.

    Returns
    -------
    precisions_cholesky : ndarray

    Raises
    ------
    ValueError
        scikit-learn's ill-defined covariance message naming the component; for a
        finite 'tied' covariance of ``init_params`` 'random', 'k-means++' or
        'random_from_data', also what that initialisation pooled into it.
    """
    u, bad = factorize(covariances, covariance_type, dtype)
    if not bad:
        return u
    healthy = np.setdiff1d(np.arange(len(covariances)), bad)
    if on_degenerate == "raise" or covariance_type == "tied" or healthy.size == 0:
        message = _ill_defined_message(
            None if covariance_type == "tied" else bad[0], dtype, covariances)
        pooled = _TIED_INIT_POOLS.get(init_params)
        if covariance_type == "tied" and pooled and np.isfinite(covariances).all():
            message += (
                " With covariance_type='tied' the initial covariance is one matrix "
                f"pooled over all components, and init_params={init_params!r} pools "
                f"{pooled[0]} into it: with {pooled[1]}, that is too ill-conditioned "
                "to factor in float64. init_params='kmeans' pools only the spread "
                "within clusters.")
        raise ValueError(message)
    covariances[bad] = covariances[healthy].mean(axis=0)
    warnings.warn(
        f"Initialisation: components {bad} had a covariance that is not positive "
        "definite; they start from the mean covariance of the other components. "
        "Increase reg_covar to avoid this.",
        UserWarning,
    )
    u, _ = factorize(covariances, covariance_type, dtype)
    return u


def reseed(weights, means, covariances, components, worst, covariance_type, used_rows):
    """Re-seed ``components`` on the worst-explained rows (in place).

    A re-seeded component gets a worst-explained row as its mean, the weighted average
    covariance of the healthy components ('tied': the shared covariance is kept) and
    the weight ``1 / K`` before the weights are renormalised. Rows already used for a
    re-seed in this run come last, so that a row no component can hold (a singleton
    with ``reg_covar=0``) does not capture a component again and again.

    Parameters
    ----------
    weights, means, covariances : ndarray
        The M step's parameters, modified in place.
    components : list of int
        The degenerate components.
    worst : Worst
        Candidate rows from the pass.
    covariance_type : str
    used_rows : list of int
        Rows used by earlier re-seeds of this run; the rows used now are appended.

    Returns
    -------
    list of int
        The components that could be re-seeded (as many as there are candidate rows).
    """
    K = len(weights)
    healthy = np.setdiff1d(np.arange(K), components)
    if healthy.size == 0 or worst.data is None:
        return []
    used = set(used_rows)
    order = sorted(range(len(worst.rows)), key=lambda i: int(worst.rows[i]) in used)
    done = []
    if covariance_type != "tied":
        hw = weights[healthy] / weights[healthy].sum()
        pooled = np.tensordot(hw, covariances[healthy], axes=1)
    for k, i in zip(components, order):
        means[k] = worst.data[i]
        if covariance_type != "tied":
            covariances[k] = pooled
        weights[k] = 1.0 / K
        used_rows.append(int(worst.rows[i]))
        done.append(int(k))
    weights /= weights.sum()
    return done


@dataclass
class RunResult:
    model: Model
    lower_bounds: list
    n_iter: int
    converged: bool
    history: list
    reseed_rows: list = field(default_factory=list)


def _task_model(model, compute_dtype, prepare):
    """What the tasks of a pass need of ``model``: no covariances (the workers use the
    factors), and the shared work on the parameters built once here if ``prepare``."""
    if prepare:
        model.prepare(compute_dtype)
    return dataclasses.replace(model, covariances=None)


def rows_statistics_pass(executor, tasks, block_size, model, compute_dtype,
                         resp_threshold, n_worst, centers=None):
    """Row-sharded schedule: every task computes all components over its rows.

    Returns
    -------
    stats : SufficientStatistics
        Summed over all tasks in their fixed order, centred on ``centers`` (default
        ``model.means``).
    worst : Worst
    """
    model = _task_model(model, compute_dtype, relevance_margin(resp_threshold) is not None)
    args = [(s, e, block_size, model, compute_dtype, resp_threshold, n_worst, centers)
            for s, e in tasks]
    stats, worst = None, None
    for task_stats, task_worst in executor.map(statistics_task, args):
        if stats is None:
            stats, worst = task_stats, task_worst
        else:
            stats += task_stats
            worst = worst.merge(task_worst)
    return stats, worst


def run_em(executor, tasks, block_size, model, n_samples, *, max_iter, tol, reg_covar,
           compute_dtype, resp_threshold, on_degenerate, min_count, callback=None,
           init_index=0, start=None, on_iteration=None,
           statistics_pass=rows_statistics_pass):
    """Iterate EM from ``model`` until ``|change of mean log-likelihood| < tol``.

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
    max_iter, tol, reg_covar, compute_dtype, resp_threshold, on_degenerate
        As the estimator's parameters.
    min_count : float
        A component whose ``N_k`` falls below this is degenerate.
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

    Returns
    -------
    RunResult
    """
    if callable(model):
        model = model()
    ct = model.covariance_type
    K = model.means.shape[0]
    if start is None:
        state = RunResult(model, [], 0, False, [])
    else:
        state = start
    lower_bound = state.lower_bounds[-1] if state.lower_bounds else -np.inf
    while state.n_iter < max_iter and not state.converged:
        tic = time.perf_counter()
        n_iter = state.n_iter + 1
        model = state.model
        used_rows = list(state.reseed_rows)
        n_worst = min(K + len(used_rows), 2 * K)
        stats, worst = statistics_pass(executor, tasks, block_size, model,
                                       compute_dtype, resp_threshold, n_worst)
        release_after_pass(model, compute_dtype, min(block_size, n_samples))
        prev, lower_bound = lower_bound, stats.log_likelihood / n_samples
        # (the covariances replace the second moments: only N_k and s_k are read on)
        weights, means, covariances = m_step(stats, model.means, reg_covar, ct,
                                             overwrite=True)
        if needs_recentring(stats, means, covariances, ct).any():
            # a tight component moved far from its centre: the same responsibilities
            # summed again around the new means (one more pass, rarely needed)
            stats, _ = statistics_pass(executor, tasks, block_size, model,
                                       compute_dtype, resp_threshold, 0, centers=means)
            weights, means, covariances = m_step(stats, means, reg_covar, ct,
                                                 overwrite=True)
        u, bad = factorize(covariances, ct, compute_dtype)
        # a component re-seeded before that starves again is kept, as scikit-learn
        # keeps it (its covariance is positive definite; re-seeding it on every
        # iteration would keep the fit from converging, e.g. K close to n)
        seeds = collections.Counter(k for record in state.history
                                    for k in record["reseeded"])
        starved = [int(k) for k in np.flatnonzero(stats.nk < min_count)
                   if int(k) not in seeds]
        reseeded = []
        if on_degenerate == "raise" or (ct == "tied" and bad):
            if bad:
                raise ValueError(_ill_defined_message(
                    None if ct == "tied" else bad[0], compute_dtype, covariances))
        elif bad or starved:
            # a component that collapses on every re-seed (a flat cluster without
            # reg_covar: every other iteration) would be re-seeded to the end
            again = [k for k in bad if seeds[k] >= MAX_RESEEDS]
            if again:
                raise ValueError(
                    f"EM iteration {n_iter}: component {again[0]} is degenerate again "
                    f"after {seeds[again[0]]} re-seeds. "
                    + _ill_defined_message(again[0], compute_dtype, covariances))
            degenerate = sorted(set(bad) | set(starved))
            reseeded = reseed(weights, means, covariances, degenerate, worst, ct,
                              used_rows)
            if reseeded:
                warnings.warn(
                    f"EM iteration {n_iter}: components {reseeded} were degenerate "
                    "(weight below one sample or covariance not positive definite) "
                    "and were re-seeded on the worst-explained samples. If this "
                    f"repeats, increase reg_covar (now {reg_covar}): a component on "
                    "a flat cluster or on fewer distinct points than features has no "
                    "positive definite covariance without it.",
                    UserWarning,
                )
                u, bad = factorize(covariances, ct, compute_dtype)
            if bad:
                raise ValueError(_ill_defined_message(bad[0], compute_dtype,
                                                      covariances))
        # the statistics (K d^2 values for 'full') are not needed in the next pass
        del stats, worst
        change = lower_bound - prev
        record = {
            "event": "iteration",
            "init": init_index,
            "n_iter": n_iter,
            "lower_bound": lower_bound,
            "change": change,
            "seconds": time.perf_counter() - tic,
            "reseeded": reseeded,
        }
        state = RunResult(Model(weights, means, covariances, u, ct),
                          state.lower_bounds + [lower_bound], n_iter,
                          abs(change) < tol and not reseeded,
                          state.history + [record], used_rows)
        if on_iteration is not None:
            on_iteration(state)
        if callback is not None:
            callback(dict(record))
    return state


def score_pass(executor, tasks, block_size, model, compute_dtype, want_labels):
    """Mean log-likelihood of all rows (and their labels) under ``model``."""
    model = _task_model(model, compute_dtype, True)
    args = [(s, e, block_size, model, compute_dtype, want_labels) for s, e in tasks]
    total, parts = 0.0, []
    for task_total, labels in executor.map(score_task, args):
        total += task_total
        parts.append(labels)
    n_samples = tasks[-1][1] if tasks else 0
    release_after_pass(model, compute_dtype, min(block_size, n_samples))
    labels = np.concatenate(parts) if want_labels else None
    return total, labels


@contextmanager
def explain_worker_loss(model_nbytes, block_nbytes, n_workers):
    """Turn the death of a worker process into a ``MemoryError`` with the estimate.

    A worker that disappears (loky's ``TerminatedWorkerError``, any
    ``BrokenExecutor``, dask's ``KilledWorker``) was most often killed by the
    out-of-memory killer. The estimator enters this context outside its executor, so
    the pool and the temporary files are gone when the error is raised.

    Parameters
    ----------
    model_nbytes : int
        Bytes of the model over the parent and the workers (the memory model's
        estimate for the chosen schedule).
    block_nbytes : int
        Working memory of one block in one worker.
    n_workers : int

    Raises
    ------
    MemoryError
        Chained to the pool's error; names the likely cause and the estimate.
    """
    try:
        yield
    except Exception as exc:
        names = {cls.__name__ for cls in type(exc).__mro__}
        if not (isinstance(exc, BrokenExecutor) or names & set(_WORKER_DEATH_NAMES)):
            raise
        total = model_nbytes + n_workers * block_nbytes
        available = available_memory()
        # (the dead workers' memory is free again: what is available now is an upper
        # bound of what was when they died)
        cause = ("The likely cause is the operating system's out-of-memory killer."
                 if 4 * total > available else
                 "The fit's estimate is far below the memory available now: a signal "
                 "(e.g. kill), a crash in a native library, or other processes' memory "
                 "use are likelier causes than this fit's.")
        raise MemoryError(
            f"A worker process died during the fit ({type(exc).__name__}). {cause} "
            f"The fit needs about {total / _MIB:,.1f} MiB: "
            f"{model_nbytes / _MIB:,.1f} MiB for the model (parent and {n_workers} "
            f"worker(s)) and {block_nbytes / _MIB:,.1f} MiB of block working memory "
            f"per worker; {available / _MIB:,.0f} MiB are available now. If memory "
            "ran out, lower n_jobs, working_memory or block_size, use a cheaper "
            "covariance_type, or set memory_limit to what this machine can spare."
        ) from exc
