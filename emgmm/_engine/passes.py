"""The row-sharded passes over a source: fused E step + statistics, and scoring.

Each iteration reads every row once. A task covers a fixed range of whole blocks; for
each block it computes the log-likelihood, the responsibilities and the block's
sufficient statistics, and keeps the rows the model explains worst (candidates for
re-seeding a degenerate component). Tasks are reduced in their fixed order, so the
result does not depend on the number of workers.
"""

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .._runtime.blas import limit_blas
from .._runtime.memory import RELEASE_MIN_BYTES, release_free_memory
from .._runtime.workspace import borrow
from ..covariance._log_density import relevance_margin
from ..covariance._statistics import block_statistics
from .estep import SCORE_MARGIN, estimate_log_prob_resp, estimate_resp


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
    data: np.ndarray | None = None

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


def weighted_sum(weights, log_prob_norm):
    """``sum_i w_i log p(x_i)`` of a block (``weights`` None: the plain sum)."""
    return float(log_prob_norm.sum() if weights is None else weights @ log_prob_norm)


def worst_candidates(weights, log_prob_norm):
    """``log p(x_i)`` with the rows of zero weight out of reach of a re-seed."""
    if weights is None:
        return log_prob_norm
    return np.where(weights > 0, log_prob_norm, np.inf)


def statistics_task(source, start, stop, block_size, model, compute_dtype,
                    resp_threshold, n_worst, centers=None, weights=None, *,
                    blas_threads):
    """Sufficient statistics and worst-explained rows of rows ``start:stop``.

    ``weights`` (a :class:`~emgmm._io.weights.WeightSource` or ``None``) are read in
    the same blocks as the rows: the statistics and the log-likelihood are those of
    ``w_i r_ik`` and ``w_i log p(x_i)``, and rows of zero weight are never among
    the worst.

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
            w = None if weights is None else weights.read(b0, b1)
            # ('diag'/'spherical') the centred block of the E step serves the M step
            products = model.kind.block_products(X, model)
            with borrow("resp", (b1 - b0, len(model.weights)), order="F") as out:
                log_prob_norm, resp = estimate_resp(
                    X, model.weights, model.means, model.precisions_cholesky,
                    model.covariance_type, margin, prepared, products, out,
                )
                check_explained(log_prob_norm, b0, source, compute_dtype, model.means)
                total = block_statistics(X, resp, centers, model.covariance_type,
                                         resp_threshold, products, out=total,
                                         sample_weight=w)
                total.log_likelihood += weighted_sum(w, log_prob_norm)
                worst = worst.update(worst_candidates(w, log_prob_norm), b0, X)
                # release this block's arrays before the next block allocates its own
                del X, products, log_prob_norm, resp
    return total, worst


def release_after_pass(model, compute_dtype, block_rows):
    """After a pass whose blocks took at least ``RELEASE_MIN_BYTES`` each, hand the
    free pages they left in the allocator's arenas back to the system
    (:func:`~emgmm._runtime.memory.release_free_memory`), between the passes, when no
    task allocates: every row thread's arena would otherwise keep its own
    high-water mark
    resident (on [100k, 64], K=200 'full': 241-250 MiB above the data against
    155-180 MiB with the release, at the same speed; releasing after every task
    instead cost ~5%: each block faulted its pages in again). Worker processes
    (``n_jobs >= 2``) run their tasks in one thread, and so in one arena each."""
    K, d = model.means.shape
    itemsize = np.dtype(compute_dtype).itemsize
    if block_rows * model.kind.bytes_per_row(d, K, itemsize) >= RELEASE_MIN_BYTES:
        release_free_memory()


def scored_blocks(source, start, stop, block_size, model, compute_dtype):
    """Yield ``(b0, b1, log_prob_norm, log_resp)`` for the blocks of rows
    ``start:stop``, evaluated as the last pass of ``fit`` evaluates them
    (``SCORE_MARGIN``), each block's log-likelihoods checked finite
    (:func:`check_explained`). ``log_resp`` is a work array that the next block
    overwrites."""
    prepared = model.prepare(compute_dtype)
    for b0 in range(start, stop, block_size):
        b1 = min(b0 + block_size, stop)
        X = source.read(b0, b1, compute_dtype)
        with borrow("resp", (b1 - b0, len(model.weights)), order="F") as out:
            log_prob_norm, log_resp = estimate_log_prob_resp(
                X, model.weights, model.means, model.precisions_cholesky,
                model.covariance_type, SCORE_MARGIN, prepared, out,
            )
            del X  # before the next block is read
            check_explained(log_prob_norm, b0, source, compute_dtype, model.means)
            yield b0, b1, log_prob_norm, log_resp


def score_task(source, start, stop, block_size, model, compute_dtype, want_labels,
               weights=None, *, blas_threads):
    """Summed (weighted) log-likelihood, and labels if asked, of rows
    ``start:stop``."""
    with limit_blas(blas_threads):
        total = 0.0
        labels = np.empty(stop - start, dtype=np.int64) if want_labels else None
        for b0, b1, log_prob_norm, log_resp in scored_blocks(
                source, start, stop, block_size, model, compute_dtype):
            total += weighted_sum(
                None if weights is None else weights.read(b0, b1), log_prob_norm)
            if want_labels:
                labels[b0 - start:b1 - start] = log_resp.argmax(axis=1)
    return total, labels


def normalised_exp(log_resp):
    """``exp(log_resp)`` with every row divided by its sum (in place of the exp)."""
    resp = np.exp(log_resp)
    resp /= resp.sum(axis=1, keepdims=True)
    return resp


#: The per-row outputs of :func:`output_task`, from a block's ``log p(x_i)`` and
#: ``log r_ik``: (function, whether there is one column per component).
ROW_OUTPUTS = {
    "log_prob": (lambda log_prob_norm, _: log_prob_norm, False),
    "labels": (lambda _, log_resp: log_resp.argmax(axis=1), False),
    "proba": (lambda _, log_resp: normalised_exp(log_resp), True),
}


def output_task(source, start, stop, block_size, model, compute_dtype, output, dtype,
                *, blas_threads):
    """One of :data:`ROW_OUTPUTS` (``output``) for rows ``start:stop``, as an
    array of ``dtype``: ``(stop - start,)``, or ``(stop - start, K)`` for
    ``'proba'``."""
    func, per_component = ROW_OUTPUTS[output]
    width = (len(model.weights),) if per_component else ()
    result = np.empty((stop - start,) + width, dtype)
    with limit_blas(blas_threads):
        for b0, b1, log_prob_norm, log_resp in scored_blocks(
                source, start, stop, block_size, model, compute_dtype):
            result[b0 - start:b1 - start] = func(log_prob_norm, log_resp)
    return result


def task_model(model, compute_dtype, prepare):
    """What the tasks of a pass need of ``model``: no covariances (the workers use the
    factors), and the shared work on the parameters built once here if ``prepare``."""
    if prepare:
        model.prepare(compute_dtype)
    return dataclasses.replace(model, covariances=None)


def rows_statistics_pass(executor, tasks, block_size, model, compute_dtype,
                         resp_threshold, n_worst, centers=None, weights=None):
    """Row-sharded schedule: every task computes all components over its rows.

    Returns
    -------
    stats : SufficientStatistics
        Summed over all tasks in their fixed order, centred on ``centers`` (default
        ``model.means``).
    worst : Worst
    """
    model = task_model(model, compute_dtype,
                       relevance_margin(resp_threshold) is not None)
    args = [(s, e, block_size, model, compute_dtype, resp_threshold, n_worst, centers,
             weights) for s, e in tasks]
    stats, worst = None, None
    for task_stats, task_worst in executor.map(statistics_task, args):
        if stats is None:
            stats, worst = task_stats, task_worst
        else:
            stats += task_stats
            worst = worst.merge(task_worst)
    return stats, worst


def score_pass(executor, tasks, block_size, model, compute_dtype, want_labels,
               weights=None):
    """Total (weighted) log-likelihood of all rows (and their labels) under
    ``model``."""
    model = task_model(model, compute_dtype, True)
    args = [(s, e, block_size, model, compute_dtype, want_labels, weights)
            for s, e in tasks]
    n_samples = tasks[-1][1] if tasks else 0
    total = 0.0
    labels = np.empty(n_samples, dtype=np.int64) if want_labels else None
    for (start, stop), (task_total, part) in zip(
            tasks, executor.map(score_task, args), strict=True):
        total += task_total
        if want_labels:
            labels[start:stop] = part
    release_after_pass(model, compute_dtype, min(block_size, n_samples))
    return total, labels


def output_pass(executor, tasks, block_size, model, compute_dtype, output, out):
    """One of :data:`ROW_OUTPUTS` (``output``) for all rows under ``model``, written
    into ``out`` (``(n,)`` or ``(n, K)``, any dtype the values cast to) task by task
    as the tasks finish, in order: the parent holds ``out`` and the tasks in flight,
    whose size ``tasks`` bounds (:func:`~emgmm._runtime.memory.partition`'s
    ``max_rows``).

    Returns
    -------
    out : ndarray
    """
    model = task_model(model, compute_dtype, True)
    args = [(s, e, block_size, model, compute_dtype, output, out.dtype)
            for s, e in tasks]
    for (start, stop), part in zip(tasks, executor.map(output_task, args),
                                   strict=True):
        out[start:stop] = part
    n_samples = tasks[-1][1] if tasks else 0
    release_after_pass(model, compute_dtype, min(block_size, n_samples))
    return out
