"""The row tasks of the pairs schedule (:mod:`.pair_step`): the screen of every pair,
and the E step of the rows that more than one component may explain.

* :func:`screen_task` (one read of the task's blocks): per row, the component of
  largest screen bound (its exact log-density is computed by the component that
  owns it, :func:`~emgmm._engine.pair_components.top_pairs_task`) and the second
  largest bound, which tells whether any other pair can matter.
* :func:`rescreen_task`: the rows where one may (gathered, a block's size at a time),
  through the screened E step of
  :meth:`~emgmm.covariance._screen.ProjectionScreen.weighted_refined`: their kept
  ``(row, component, w_i r_ik)`` triples for the statistics, their log-likelihood
  and their worst-explained rows.

Rows are read and gathered in partitions fixed by the data (blocks; runs of a block's
size of the rescreened rows), so the products (and the results, bitwise) do not
depend on how they are grouped into tasks.
"""

from dataclasses import dataclass

import numpy as np

from .._runtime.blas import limit_blas
from .._runtime.workspace import borrow
from ..covariance._screen import ProjectionScreen
from .carried_bounds import (
    GroupTerms,
    group_minima,
    moved_bounds,
    pair_bounds,
    rounded_down,
    row_norms_up,
    second_bound,
)
from .estep import normalize_rows, weighted_log_prob
from .pair_state import RowBounds
from .passes import Worst, check_explained, smallest, worst_candidates


@dataclass
class RowScreen:
    """What :func:`screen_task` gives per row: ``top`` (int32) the component of
    largest bound, ``second`` the second largest bound (NaN where a bound is NaN),
    ``weights`` the rows' sample weights (``None`` without); ``carried`` the rows
    screened by their carried bounds."""

    top: np.ndarray
    second: np.ndarray
    weights: np.ndarray | None = None
    carried: int = 0


@dataclass
class CarryPlan:
    """What the row tasks of one iteration need of the carried bounds
    (:mod:`.carried_bounds`): the rows' :class:`~emgmm._engine.pair_state.RowBounds`,
    the components' ``groups`` (K,) and the iteration's
    :class:`~emgmm._engine.carried_bounds.GroupTerms`; the ``fresh`` components
    (int array) and their screen (:meth:`~emgmm.covariance._screen.ProjectionScreen.
    subset`, ``None`` when there are none), or ``reset``: every row screened
    afresh; ``margin`` the E step's (:func:`~emgmm.covariance._log_density.
    relevance_margin`)."""

    rows: RowBounds
    groups: np.ndarray
    n_groups: int
    terms: GroupTerms
    fresh: np.ndarray
    fresh_screen: ProjectionScreen | None = None
    reset: bool = False
    margin: float = 0.0


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
                carry=None, *, blas_threads):
    """:class:`RowScreen` of rows ``start:stop`` (whole blocks of ``block_size``)
    under the state's screen, or, with a :class:`CarryPlan`, under the rows'
    carried bounds where they have them (whose new values it writes)."""
    screen = state.screen()
    n = stop - start
    top, second = np.empty(n, dtype=np.int32), np.empty(n)
    w = None if weights is None else np.empty(n)
    carried = 0
    with limit_blas(blas_threads):
        for b0 in range(start, stop, block_size):
            b1 = min(b0 + block_size, stop)
            out = slice(b0 - start, b1 - start)
            if carry is None:
                top[out], second[out] = _projected(source.read(b0, b1, compute_dtype),
                                                   screen)
            else:
                carried += _carried_block(source, b0, b1, screen, state,
                                          compute_dtype, carry, top[out], second[out])
            if w is not None:
                w[out] = weights.read(b0, b1)
    return RowScreen(top, second, w, carried)


def _projected(X, screen):
    """``(top, second)`` of the rows ``X`` under the projection screen."""
    with borrow("resp", (X.shape[0], screen.offset.size), order="F") as ub:
        screen.upper_bounds(X, ub)
        return top_two(ub)


def _carried_block(source, b0, b1, screen, state, compute_dtype, carry, top,
                   second):
    """Rows ``b0:b1`` screened under ``carry`` into ``top`` and ``second``; the
    rows' bounds moved to the current model, or built afresh where a row has none,
    its top is fresh, or its moved bounds would not have left it alone with the
    last iteration's best (a projection costs less than the rescreen it would
    take), and written back. Returns the rows screened by their carried bounds
    (and the fresh components' projections)."""
    rows = carry.rows
    top[:] = rows.top[b0:b1]
    afresh = np.ones(b1 - b0, bool) if carry.reset else top < 0
    afresh[~afresh] = state.fresh[top[~afresh]]
    kept = np.flatnonzero(~afresh)
    moved = moved_bounds(rows.bounds[b0:b1][kept], rows.norms[b0:b1][kept],
                         carry.terms)
    second[kept] = second_bound(moved, carry.terms.offset)
    weak = second[kept] >= rows.best[b0:b1][kept] - carry.margin
    afresh[kept[weak]] = True
    kept, moved = kept[~weak], moved[~weak]
    X = None
    if afresh.any() or carry.fresh_screen is not None:
        X = source.read(b0, b1, compute_dtype)
    bounds = np.empty((b1 - b0, carry.n_groups))
    if afresh.any():
        part = np.asarray(X[afresh])
        t, second[afresh], bounds[afresh] = _fresh_rows(part, screen, carry)
        top[afresh] = t
        rows.norms[b0:b1][afresh] = row_norms_up(part)
    if kept.size:
        if carry.fresh_screen is not None:
            extra = _fresh_components(np.asarray(X[kept]), carry, moved)
            second[kept] = np.maximum(second[kept], extra)
        bounds[kept] = moved
    rows.top[b0:b1] = top
    rows.bounds[b0:b1] = rounded_down(bounds)
    return int(kept.size)


def _fresh_rows(X, screen, carry):
    """``(top, second, bounds)`` of rows screened afresh: every pair's projection
    bound, and per group the smallest distance bound of its other components."""
    shape = (X.shape[0], screen.offset.size)
    with borrow("roots", shape, order="F") as roots, \
            borrow("resp", shape, order="F") as ub:
        screen.root_bounds(X, roots)
        top, second = top_two(pair_bounds(roots, screen.offset, out=ub))
        return top, second, group_minima(roots, carry.groups, carry.n_groups, top)


def _fresh_components(X, carry, moved):
    """The largest projection bound of each row over the fresh components; their
    distance bounds folded into the rows' group bounds ``moved`` (in place)."""
    sub = carry.fresh_screen
    with borrow("fresh_roots", (X.shape[0], carry.fresh.size), order="F") as roots:
        sub.root_bounds(X, roots)
        for j, k in enumerate(carry.fresh):
            g = carry.groups[k]
            np.minimum(moved[:, g], roots[:, j], out=moved[:, g])
        return second_bound(roots, sub.offset)


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
    """:class:`~emgmm._engine.passes.Worst` of gathered rows: the ``size`` lowest
    ``values`` with their row numbers ``rows`` and data ``X``."""
    if size == 0 or values.size == 0:
        return Worst(size)
    keep = smallest(values, size)
    return Worst(size, values[keep], rows[keep], np.asarray(X[keep]))


def _screened(X, model, screen, margin, out, roots):
    """The screened E step of gathered rows ``X`` into ``out``, with the screen's
    distance bounds into ``roots`` (when given) from the same projections; where
    the screen refuses the rows, the E step of
    :func:`~emgmm._engine.estep.weighted_log_prob` and the bounds on their own."""
    if roots is not None:
        weighted = screen.weighted_refined(X, margin, out, roots=roots)
        if weighted is not None:
            return weighted
        screen.root_bounds(X, roots)
    return weighted_log_prob(X, model.weights, model.means, model.precisions_cholesky,
                             "full", margin, (screen,), out=out)


def _rebuild(carry, rows, X, roots, top, best):
    """Write the carried bounds of gathered ``rows`` afresh: their ``top``, per
    group the smallest of the ``roots`` of its other components, their norms and
    ``best`` (their log-likelihoods, for the next screen's choice)."""
    bounds = group_minima(roots, carry.groups, carry.n_groups, top)
    carry.rows.top[rows] = top
    carry.rows.bounds[rows] = rounded_down(bounds)
    carry.rows.norms[rows] = row_norms_up(X)
    carry.rows.best[rows] = best


def check_rows_explained(log_prob_norm, rows, source, dtype, means):
    """:func:`~emgmm._engine.passes.check_explained` of gathered rows ``rows``."""
    bad = np.flatnonzero(~np.isfinite(log_prob_norm))
    if bad.size:
        i = int(bad[0])
        check_explained(log_prob_norm[i:i + 1], int(rows[i]), source, dtype, means)


def rescreen_task(source, groups, state, compute_dtype, margin, resp_threshold,
                  n_worst, carry=None, *, blas_threads):
    """The screened E step of gathered rows: for each of ``groups`` (the rows of
    one gather, ``(rows, weights or None)``), every pair that may lie within
    ``margin`` of its row's best computed exactly. With a :class:`CarryPlan`,
    the rows' carried bounds are built afresh (top, and the projection bounds of
    every other pair).

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
    screen = state.screen()
    K = state.means.shape[0]
    triples, sums, worst, computed = [], [], Worst(n_worst), 0
    with limit_blas(blas_threads):
        for rows, w in groups:
            X = source.take_rows(rows, compute_dtype)
            roots = None if carry is None else np.empty((rows.size, K), order="F")
            with borrow("resp", (rows.size, K), order="F") as out:
                resp = _screened(X, model, screen, margin, out, roots)
                computed += int(np.count_nonzero(resp > -np.inf))
                log_prob_norm = normalize_rows(resp)
                check_rows_explained(log_prob_norm, rows, source, compute_dtype,
                                     model.means)
                comps, idx = np.nonzero(resp.T > resp_threshold)
                r = resp[idx, comps]
                if carry is not None:
                    _rebuild(carry, rows, X, roots, np.argmax(resp, axis=1),
                             log_prob_norm)
            triples.append(Triples(rows[idx], comps.astype(np.int32),
                                   r if w is None else w[idx] * r))
            sums.append(float(log_prob_norm.sum() if w is None
                              else w @ log_prob_norm))
            worst = worst.merge(worst_of(n_worst, worst_candidates(w, log_prob_norm),
                                         rows, X))
            del X
    return triples, sums, worst, computed
