"""Component-sharded schedule of the statistics pass.

A task is a slice of components and a range of rows; a worker holds only its slice's
means, factors and statistics, never the whole model. The rows are processed in
ranges of whole blocks (:func:`emgmm._runtime.memory.buffer_rows`) so that the
shared buffer holds ``range rows x K`` float64 values whatever ``n``. For every range:

1. *log-probabilities*: each (slice, rows) task writes ``log N(x_i | mu_k,
   Lambda_k) + log w_k`` of its components into the buffer, a memory-mapped file in
   ``emgmm-<pid>-<space>-<id>`` under joblib's temporary folder. With a
   ``resp_threshold`` they are computed as the row schedule computes them (for
   'full', an estimate with the pairs that matter recomputed exactly), the pairs
   that matter being those near the best component of the slice: a superset of
   those near the row's best;
2. *normalisation*: each rows task subtracts ``log p(x_i)`` (log-sum-exp over the
   row) in place and returns the block log-likelihoods and its worst-explained rows;
3. *statistics*: each (slice, rows) task reads its columns of the normalised
   log-responsibilities and accumulates its components' sufficient statistics.

``X`` is read twice per iteration by each slice. The component split and the row
split depend only on ``K``, ``d``, ``n`` and the block size, and the parent reduces
in a fixed order, so the result does not depend on ``n_jobs``; it equals the
row-sharded schedule up to the order of the floating-point sums (1e-12 relative).
The folder is removed at the end of the pass, also when a task raises.
"""

import dataclasses
import os
import shutil

import numpy as np

from .._runtime.blas import limit_blas
from .._runtime.disk import reserve
from .._runtime.executor import make_temp_folder
from .._runtime.memory import buffer_rows, component_slices, range_pieces
from ..covariance._log_density import relevance_margin
from ..covariance._protocols import Kernels
from ..covariance._statistics import block_statistics
from .estep import exp_flushed, logsumexp_rows, weighted_log_prob
from .model import Model
from .passes import Worst, check_explained, smallest, weighted_sum, worst_candidates


class SharedBuffer:
    """A float64 ``(rows, K)`` file mapped by every process that uses it.

    Pickles as its path and shape; each task maps it itself and unmaps it when done.
    """

    def __init__(self, path, shape):
        self.path = path
        self.shape = tuple(shape)

    @classmethod
    def create(cls, folder, shape):
        """Allocate the file (:func:`~emgmm._runtime.disk.reserve`, so a full
        disk raises ``OSError`` here instead of ``SIGBUS`` on a later write)."""
        path = os.path.join(folder, "log_resp.dat")
        nbytes = 8 * shape[0] * shape[1]
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            reserve(fd, nbytes, path)
        finally:
            os.close(fd)
        return cls(path, shape)

    def open(self, writable):
        return np.memmap(self.path, dtype=np.float64, mode="r+" if writable else "r",
                         shape=self.shape)


def _slice_model(model, k0, k1):
    """The slice's parameters (no covariances: the tasks only need the factors)."""
    u = model.kind.slice_factors(model.precisions_cholesky, k0, k1)
    return Model(model.weights[k0:k1], model.means[k0:k1], None, u,
                 model.covariance_type)


def log_prob_task(source, r0, start, stop, block_size, model, k0, buffer, compute_dtype,
                  margin, *, blas_threads):
    """Write ``log N + log w`` of components ``k0:k1`` for rows ``start:stop``
    (:func:`~emgmm._engine.estep.weighted_log_prob` with ``margin`` and the slice's
    prepared estimates)."""
    with limit_blas(blas_threads):
        buf = buffer.open(writable=True)
        k1 = k0 + model.means.shape[0]
        prepared = None if margin is None else model.prepare(compute_dtype)
        for b0 in range(start, stop, block_size):
            b1 = min(b0 + block_size, stop)
            X = source.read(b0, b1, compute_dtype)
            buf[b0 - r0:b1 - r0, k0:k1] = weighted_log_prob(
                X, model.weights, model.means, model.precisions_cholesky,
                model.covariance_type, margin, prepared)
        buf.flush()
        del buf


def normalize_task(source, r0, start, stop, block_size, buffer, n_worst, compute_dtype,
                   means, weights=None, *, blas_threads):
    """Normalise rows ``start:stop`` of the buffer to log-responsibilities in place.

    Returns
    -------
    log_likelihoods : list of float
        ``sum log p(x_i)`` of each block, in order.
    values, rows : ndarray
        The (at most ``n_worst``) lowest ``log p(x_i)`` and their rows, ordered by
        value then row.
    """
    buf = buffer.open(writable=True)
    sums = []
    values, rows = np.empty(0), np.empty(0, dtype=np.int64)
    for b0 in range(start, stop, block_size):
        b1 = min(b0 + block_size, stop)
        weighted = np.array(buf[b0 - r0:b1 - r0])
        log_prob_norm = logsumexp_rows(weighted)
        check_explained(log_prob_norm, b0, source, compute_dtype, means)
        with np.errstate(under="ignore", invalid="ignore"):
            weighted -= log_prob_norm[:, np.newaxis]
        buf[b0 - r0:b1 - r0] = weighted
        w = None if weights is None else weights.read(b0, b1)
        sums.append(weighted_sum(w, log_prob_norm))
        if n_worst:
            log_prob_norm = worst_candidates(w, log_prob_norm)
            keep = smallest(log_prob_norm, n_worst)
            values = np.concatenate([values, log_prob_norm[keep]])
            rows = np.concatenate([rows, b0 + keep])
            order = np.lexsort((rows, values))[:n_worst]
            values, rows = values[order], rows[order]
    buf.flush()
    del buf
    return sums, values, rows


def component_statistics_task(source, r0, start, stop, block_size, model, k0, buffer,
                              compute_dtype, resp_threshold, centers, weights=None, *,
                              blas_threads):
    """Sufficient statistics of components ``k0:k1`` over rows ``start:stop``, centred
    on ``centers`` (those of the slice)."""
    with limit_blas(blas_threads):
        buf = buffer.open(writable=False)
        k1 = k0 + model.means.shape[0]
        total = None
        for b0 in range(start, stop, block_size):
            b1 = min(b0 + block_size, stop)
            X = source.read(b0, b1, compute_dtype)
            resp = exp_flushed(np.array(buf[b0 - r0:b1 - r0, k0:k1]))
            products = (model.kind.block_products(X, model)
                        if model.kind.statistics_need_products else None)
            total = block_statistics(
                X, resp, centers, model.covariance_type, resp_threshold, products,
                out=total,
                sample_weight=None if weights is None else weights.read(b0, b1))
        del buf
    return total


def _worst_rows(source, values, rows, n_worst, compute_dtype):
    """The worst-explained rows with their data, read one by one in the parent."""
    if n_worst == 0 or rows.size == 0:
        return Worst(n_worst)
    order = np.lexsort((rows, values))[:n_worst]
    values, rows = values[order], rows[order]
    data = np.concatenate([source.read(int(r), int(r) + 1) for r in rows])
    return Worst(n_worst, values, rows, data.astype(compute_dtype, copy=False))


def _concatenate(parts, n_samples, log_likelihood, kind: Kernels):
    """Join per-slice statistics along the component axis (a shared covariance,
    'tied', has one slice)."""
    stats = parts[0] if len(parts) == 1 else kind.concatenate_statistics(parts)
    stats.log_likelihood = log_likelihood
    stats.n_samples = n_samples
    return stats


def _slice_models(model, slices, compute_dtype, margin):
    """The models of the component ``slices``, their estimates prepared once here
    (shared with the workers) when there is a ``margin``, and the same models
    without estimates for the statistics tasks, which do not use them."""
    models = [_slice_model(model, k0, k1) for k0, k1 in slices]
    if margin is not None:
        for m in models:
            m.prepare(compute_dtype)
    bare = [dataclasses.replace(m, prepared=None, prepared_for=None) for m in models]
    return models, bare


def _normalize_range(executor, range_, n_worst, means, weights, running):
    """Normalise the log-probabilities of one buffer range's ``pieces`` and fold
    their log-likelihood and worst rows into ``running``.

    Parameters
    ----------
    range_ : tuple
        ``(r0, pieces, block_size, buffer, compute_dtype)``.
    running : tuple
        ``(log_likelihood, values, rows)`` so far: the sum is continued term by
        term, in task order (a fixed reduction order).

    Returns
    -------
    tuple
        The updated ``(log_likelihood, values, rows)``.
    """
    r0, pieces, block_size, buffer, compute_dtype = range_
    log_likelihood, values, rows = running
    for sums, v, r in executor.map(normalize_task, [
            (r0, a, b, block_size, buffer, n_worst, compute_dtype, means, weights)
            for a, b in pieces]):
        for s in sums:
            log_likelihood += s
        values = np.concatenate([values, v])
        rows = np.concatenate([rows, r])
        order = np.lexsort((rows, values))[:n_worst]
        values, rows = values[order], rows[order]
    return log_likelihood, values, rows


def _add_statistics(parts, results, n_pieces):
    """Add the statistics ``results`` (``n_pieces`` per slice, slice by slice) into
    ``parts``, one entry per slice (``None`` until its first)."""
    for j in range(len(parts)):
        for _ in range(n_pieces):
            stats = next(results)
            if parts[j] is None:
                parts[j] = stats
            else:
                parts[j] += stats


def component_statistics_pass(executor, tasks, block_size, model, compute_dtype,
                              resp_threshold, n_worst, centers=None, weights=None):
    """Component-sharded schedule of one statistics pass (see the module notes).

    Same signature, semantics and result as
    :func:`emgmm._engine.passes.rows_statistics_pass`:
    the statistics are centred on ``centers`` (default ``model.means``), the
    log-likelihood is the sum over
    all rows, and ``worst`` holds the ``n_worst`` rows of lowest log-likelihood.
    ``tasks`` gives the rows (their union); the row split of this schedule is
    ``buffer_rows`` ranges of whole blocks, each cut by ``range_pieces``.

    Returns
    -------
    stats : SufficientStatistics
    worst : Worst

    Raises
    ------
    OSError
        If the temporary folder lacks the space for the buffer.
    """
    n_samples = tasks[-1][1] if tasks else 0
    K, d = model.means.shape
    kind = model.kind
    slices = component_slices(K, d, kind)
    margin = relevance_margin(resp_threshold)
    models, bare = _slice_models(model, slices, compute_dtype, margin)
    if centers is None:
        centers = model.means
    range_rows = buffer_rows(n_samples, K, block_size)
    folder = make_temp_folder(executor.temp_folder, 8 * range_rows * K,
                              "the log-responsibility buffer of the component schedule")
    try:
        buffer = SharedBuffer.create(folder, (range_rows, K))
        parts = [None] * len(slices)
        log_likelihood = 0.0
        values, rows = np.empty(0), np.empty(0, dtype=np.int64)
        for r0 in range(0, n_samples, range_rows):
            r1 = min(r0 + range_rows, n_samples)
            pieces = [(r0 + a, r0 + b) for a, b in
                      range_pieces(r1 - r0, block_size, K, d, kind, len(slices))]
            for _ in executor.map(log_prob_task, [
                    (r0, a, b, block_size, m, k0, buffer, compute_dtype, margin)
                    for (k0, _k1), m in zip(slices, models, strict=False)
                    for a, b in pieces]):
                pass
            log_likelihood, values, rows = _normalize_range(
                executor, (r0, pieces, block_size, buffer, compute_dtype), n_worst,
                model.means, weights, (log_likelihood, values, rows))
            results = executor.map(component_statistics_task, [
                (r0, a, b, block_size, m, k0, buffer, compute_dtype, resp_threshold,
                 centers[k0:k1], weights)
                for (k0, k1), m in zip(slices, bare, strict=False) for a, b in pieces])
            _add_statistics(parts, results, len(pieces))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    stats = _concatenate(parts, n_samples, log_likelihood, kind)
    worst = _worst_rows(executor.source, values, rows, n_worst, compute_dtype)
    return stats, worst
