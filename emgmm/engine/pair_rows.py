"""The row tasks of the pairs schedule (:mod:`.pair_step`): the screen of every pair,
and the E step of the rows that more than one component may explain.

* :func:`screen_task` (one read of the task's blocks): per row, the component of
  largest screen bound (its exact log-density is computed by the component that
  owns it, :func:`~emgmm.engine.pair_components.top_pairs_task`) and the second
  largest bound, which tells whether any other pair can matter.
* :func:`rescreen_task`: the rows where one may (gathered by row, block by block),
  through the screened E step of
  :meth:`~emgmm.covariance.screen.ProjectionScreen.weighted_refined`: their kept
  ``(row, component, w_i r_ik)`` triples for the statistics, their log-likelihood
  and their worst-explained rows.

Rows are gathered per block of the pass's fixed partition, so the products (and the
results, bitwise) do not depend on how the blocks are grouped into tasks.
"""

from dataclasses import dataclass

import numpy as np

from ..runtime.blas import limit_blas
from ..runtime.workspace import borrow
from .estep import normalize_rows, weighted_log_prob
from .passes import Worst, check_explained, smallest, worst_candidates


@dataclass
class RowScreen:
    """What :func:`screen_task` gives per row: ``top`` (int32) the component of
    largest bound, ``second`` the second largest bound (NaN where a bound is NaN),
    ``weights`` the rows' sample weights (``None`` without)."""

    top: np.ndarray
    second: np.ndarray
    weights: np.ndarray = None


def top_two(ub):
    """Per row of the bounds ``ub`` (n, K): the column of the largest and the second
    largest value (``-inf`` for one component; NaN when a NaN is among them, so that
    no comparison with it prunes anything)."""
    t = ub.T  # (K, n): contiguous rows for a column-major ub
    n = t.shape[1]
    top = np.argmax(t, axis=0)
    cols = np.arange(n)
    first = t[top, cols].copy()
    t[top, cols] = -np.inf
    second = t.max(axis=0)
    t[top, cols] = first
    second[np.isnan(first)] = np.nan
    return top.astype(np.int32), second


def screen_task(source, start, stop, block_size, state, compute_dtype, weights=None,
                *, blas_threads):
    """:class:`RowScreen` of rows ``start:stop`` (whole blocks of ``block_size``)
    under the state's screen."""
    screen = state.screen()
    K = state.means.shape[0]
    n = stop - start
    top, second = np.empty(n, dtype=np.int32), np.empty(n)
    w = None if weights is None else np.empty(n)
    with limit_blas(blas_threads):
        for b0 in range(start, stop, block_size):
            b1 = min(b0 + block_size, stop)
            X = source.read(b0, b1, compute_dtype)
            with borrow("resp", (b1 - b0, K), order="F") as ub:
                screen.upper_bounds(X, ub)
                top[b0 - start:b1 - start], second[b0 - start:b1 - start] = top_two(ub)
            if w is not None:
                w[b0 - start:b1 - start] = weights.read(b0, b1)
            del X
    return RowScreen(top, second, w)


@dataclass
class Triples:
    """Kept pairs ``(rows[j], comps[j])`` with their weights ``wr[j] = w_i r_ik``,
    sorted by component, then row."""

    rows: np.ndarray
    comps: np.ndarray
    wr: np.ndarray

    @classmethod
    def empty(cls):
        return cls(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0))

    @classmethod
    def joined(cls, parts):
        """The triples of ``parts``, one after another."""
        if not parts:
            return cls.empty()
        return cls(np.concatenate([p.rows for p in parts]),
                   np.concatenate([p.comps for p in parts]),
                   np.concatenate([p.wr for p in parts]))

    def sorted(self, n_samples):
        """The triples sorted by component, then row (each pair once)."""
        order = np.argsort(self.comps.astype(np.int64) * max(n_samples, 1)
                           + self.rows)
        return Triples(self.rows[order], self.comps[order], self.wr[order])


def worst_of(size, values, rows, X):
    """:class:`~emgmm.engine.passes.Worst` of gathered rows: the ``size`` lowest
    ``values`` with their row numbers ``rows`` and data ``X``."""
    if size == 0 or values.size == 0:
        return Worst(size)
    keep = smallest(values, size)
    return Worst(size, values[keep], rows[keep], np.asarray(X[keep]))


def check_rows_explained(log_prob_norm, rows, source, dtype, means):
    """:func:`~emgmm.engine.passes.check_explained` of gathered rows ``rows``."""
    bad = np.flatnonzero(~np.isfinite(log_prob_norm))
    if bad.size:
        i = int(bad[0])
        check_explained(log_prob_norm[i:i + 1], int(rows[i]), source, dtype, means)


def rescreen_task(source, groups, state, compute_dtype, margin, resp_threshold,
                  n_worst, *, blas_threads):
    """The screened E step of gathered rows: for each of ``groups`` (the rows of
    one block, ``(rows, weights or None)``), every pair that may lie within
    ``margin`` of its row's best computed exactly.

    Returns
    -------
    triples : list of Triples
        Per group, the pairs with ``r_ik > resp_threshold``.
    log_likelihoods : list of float
        Per group, ``sum_i w_i log p(x_i)``.
    worst : Worst
    computed : int
        The pairs computed (the others were proven negligible).
    """
    model = state.model()
    prepared = (state.screen(),)
    K = state.means.shape[0]
    triples, sums, worst, computed = [], [], Worst(n_worst), 0
    with limit_blas(blas_threads):
        for rows, w in groups:
            X = source.take_rows(rows, compute_dtype)
            with borrow("resp", (rows.size, K), order="F") as out:
                resp = weighted_log_prob(
                    X, model.weights, model.means, model.precisions_cholesky, "full",
                    margin, prepared, out=out)
                computed += int(np.count_nonzero(resp > -np.inf))
                log_prob_norm = normalize_rows(resp)
                check_rows_explained(log_prob_norm, rows, source, compute_dtype,
                                     model.means)
                comps, idx = np.nonzero(resp.T > resp_threshold)
                r = resp[idx, comps]
            triples.append(Triples(rows[idx], comps.astype(np.int32),
                                   r if w is None else w[idx] * r))
            sums.append(float(log_prob_norm.sum() if w is None
                              else w @ log_prob_norm))
            worst = worst.merge(worst_of(n_worst, worst_candidates(w, log_prob_norm),
                                         rows, X))
            del X
    return triples, sums, worst, computed
