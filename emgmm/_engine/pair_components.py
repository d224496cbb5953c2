"""The component tasks of the pairs schedule (:mod:`.pair_step`): each task owns a
range of components, their rows, sums, M step, factor and screen terms.

* :func:`top_pairs_task`: the exact log-density of every row whose largest screen
  bound is one of the task's components, and the statistics of the rows that no
  other component can explain (responsibility 1): one product per component over
  all its rows (a few per row across the components), the same gathered rows for
  both.
* :func:`statistics_task`: the statistics of the other kept pairs, the M step,
  the factorisation (:mod:`emgmm.covariance._full_component`) and the screen's
  terms of each component (from its previous directions, the factor still in
  cache).
* :func:`screen_terms_task`: the screen's terms of a model without them (the
  first of a run).

A component's rows are gathered in row order, ``GATHER_ROWS`` at a time: its sums
do not depend on how the components are grouped into tasks.
"""

from dataclasses import dataclass

import numpy as np

from .._runtime.blas import limit_blas
from ..covariance._drift import metric_drift
from ..covariance._full_component import add_moments, factor_in_place, m_step_in_place
from ..covariance._m_step import _RECENTRE_RATIO
from ..covariance._screen import component_screen, factor_norms, pair_values
from .carried_bounds import FRESH_SCALE
from .pair_rows import Triples, worst_of
from .passes import Worst, worst_candidates

#: Rows of a component gathered at a time (at least ``d`` keeps the products of
#: the sums efficient).
GATHER_ROWS = 1024


@dataclass
class ComponentRows:
    """Rows of consecutive components: those of component ``k0 + j`` are
    ``rows[bounds[j]:bounds[j + 1]]`` (sorted), with per-row ``values`` (a screen
    bound, or the weights ``w_i r_ik`` of kept pairs) and ``weights`` (or
    ``None``)."""

    bounds: np.ndarray
    rows: np.ndarray
    values: np.ndarray
    weights: np.ndarray | None = None

    def of(self, j):
        """``(rows, values, weights or None)`` of the range's ``j``-th component."""
        a, b = self.bounds[j], self.bounds[j + 1]
        w = None if self.weights is None else self.weights[a:b]
        return self.rows[a:b], self.values[a:b], w

    @classmethod
    def split(cls, comps, rows, values, weights, ranges):
        """One :class:`ComponentRows` per ``(k0, k1)`` of ``ranges`` from pairs
        sorted by component (``comps``), then row."""
        edges = np.searchsorted(comps, np.arange(ranges[-1][1] + 1))
        out = []
        for k0, k1 in ranges:
            a, b = edges[k0], edges[k1]
            out.append(cls(edges[k0:k1 + 1] - a, rows[a:b], values[a:b],
                           None if weights is None else weights[a:b]))
        return out


def _chunks(n):
    for a in range(0, n, GATHER_ROWS):
        yield a, min(a + GATHER_ROWS, n)


@dataclass
class TopPairs:
    """What :func:`top_pairs_task` gives per task: the rows that need the E step of
    every pair (:func:`~emgmm._engine.pair_rows.rescreen_task`, ``others``); the
    rest as kept pairs of responsibility 1 (``singles``, with their weights); the
    summed ``w_i log p(x_i)`` of the rest per component, and their worst rows."""

    others: np.ndarray
    singles: Triples
    log_likelihoods: np.ndarray
    worst: Worst


def top_pairs_task(source, k0, k1, tops, state, compute_dtype, margin, n_worst,
                   row_bounds=None, *, blas_threads):
    """For components ``k0:k1``: the exact log-density of each row of ``tops``
    (:class:`ComponentRows`, values the rows' second largest bound); a row whose
    second bound lies below the rejection limit of that value
    (:meth:`~emgmm.covariance._screen.ProjectionScreen.rejection_limit`) has
    ``r_ik = 1`` (the others are below ``exp(-margin)``) and ``log p(x_i)`` that
    value. The values go to the rows' ``best`` of ``row_bounds``
    (:class:`~emgmm._engine.pair_state.RowBounds`), when given."""
    screen = state.screen()
    others, sums, worst = [], np.zeros(k1 - k0), Worst(n_worst)
    singles = []
    with limit_blas(blas_threads):
        for j, k in enumerate(range(k0, k1)):
            rows, second, weights = tops.of(j)
            for a, b in _chunks(rows.size):
                X = source.take_rows(rows[a:b], compute_dtype)
                value, err = np.empty(b - a), np.empty(b - a)
                pair_values(np.subtract(X, state.means[k], dtype=np.float64),
                            state.factors[k], screen.offset[k], value,
                            screen.u_norm[k], err)
                if row_bounds is not None:
                    row_bounds.best[rows[a:b]] = value
                # (a value that overflowed, -inf, makes no row single: the row
                # goes to the rescreen, which checks whether any pair explains it)
                single = second[a:b] < screen.rejection_limit(value, err, k, margin)
                w = np.ones(b - a) if weights is None else weights[a:b]
                sums[j] += float(w[single] @ value[single])
                others.append(rows[a:b][~single])
                singles.append(Triples(rows[a:b][single],
                                       np.full(np.count_nonzero(single), k, np.int32),
                                       w[single]))
                worst = worst.merge(worst_of(
                    n_worst, worst_candidates(w[single], value[single]),
                    rows[a:b][single], X[single]))
    return TopPairs(_joined(others, np.int64), Triples.joined(singles), sums, worst)


def _joined(parts, dtype):
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def statistics_task(source, k0, k1, kept, state, compute_dtype, reg_covar, limit,
                    centres, steps, with_drift=False, *, blas_threads):
    """For components ``k0:k1``: the statistics of the ``kept`` pairs
    (:class:`ComponentRows`, values ``w_i r_ik``), centred on the component's
    mean, then the M step (new mean, covariance in the memory of the sums; summed
    again around the new mean where the shift cancelled too much), the precision
    factor (:func:`~emgmm.covariance._full_component.factor_in_place`, entries below
    ``limit``) and the screen's terms (:func:`~emgmm.covariance._screen.
    component_screen` from the previous directions, ``steps`` steps; ``centres``
    where the clusters lie, the previous means); ``with_drift``: each component's
    :func:`~emgmm.covariance._drift.metric_drift` into ``state.drift`` (a component
    whose scale falls below ``FRESH_SCALE``, or whose factor fails, is fresh).

    Returns
    -------
    list of int
        The components whose covariance is not positive definite.
    """
    bad = []
    screen = state.screen()
    with limit_blas(blas_threads):
        for j, k in enumerate(range(k0, k1)):
            rows, wr, _ = kept.of(j)
            state.fresh[k] = True
            before = (state.means[k].copy(), state.factors[k].copy(),
                      screen.u_norm[k]) if with_drift else None
            centre = state.means[k].copy()
            delta = _summed_m_step(source, rows, wr, centre, state, k, compute_dtype,
                                   reg_covar)
            if _cancelled(delta, centre, state.covariances[k], state.nk[k]):
                centre = centre + delta
                delta = _summed_m_step(source, rows, wr, centre, state, k,
                                       compute_dtype, reg_covar)
            state.means[k] = centre + delta
            if not factor_in_place(state.covariances[k], state.factors[k], limit):
                bad.append(k)
                continue
            norms = factor_norms(state.factors[k])
            if before is not None:
                _set_drift(state, k, before, norms[0])
            set_screen(screen, state, k, centres, screen.directions[k], steps, norms)
    return bad


def _set_drift(state, k, before, u_norm):
    """Component ``k``'s drift from ``before`` (its mean, factor and factor norm
    bound in the last E step's model) to the state's."""
    mean_old, u_old, u_norm_old = before
    drift = metric_drift(u_old, state.factors[k], mean_old, state.means[k],
                         u_norm_old, u_norm)
    state.drift[k] = (drift.scale, drift.error, drift.shift)
    state.fresh[k] = not (drift.scale >= FRESH_SCALE
                          and np.isfinite(drift.error + drift.shift))


def _summed_m_step(source, rows, weights, centre, state, k, compute_dtype,
                   reg_covar):
    """Component ``k``'s statistics of ``rows`` (weights ``w_i r_ik``) around
    ``centre``, gathered ``GATHER_ROWS`` at a time, and its M step in place; the
    shift of the mean from ``centre``."""
    state.nk[k], state.sum_x[k], state.covariances[k] = 0.0, 0.0, 0.0
    for a, b in _chunks(rows.size):
        y = np.subtract(source.take_rows(rows[a:b], compute_dtype), centre,
                        dtype=np.float64)
        state.nk[k] += add_moments(y, weights[a:b], state.covariances[k],
                                   state.sum_x[k])
    return m_step_in_place(state.covariances[k], state.sum_x[k], state.nk[k],
                           reg_covar)


def set_screen(screen, state, k, centres, start, steps, norms=None):
    """Component ``k``'s screen terms from its factor and mean in the state
    (``norms``: :func:`~emgmm.covariance._screen.factor_norms` of its factor, when
    the caller has them)."""
    uk = state.factors[k]
    screen.set_component(k, component_screen(
        uk, centres, state.means[k], screen.g, screen.p, start, steps,
        norms=factor_norms(uk) if norms is None else norms))


def _cancelled(delta, centre, covariance, nk):
    """Whether the M step of a component lost too many digits to the shift of its
    mean (:func:`~emgmm.covariance._m_step.needs_recentring`, for one component)."""
    if not nk > 0.0:
        return False
    shift = np.abs(delta)
    moved = shift * (shift + 2.0 * np.abs(centre + delta))
    var = np.maximum(np.diagonal(covariance), 0.0)
    return bool(((moved > _RECENTRE_RATIO * var) & (moved > 0.0)).any())


def screen_terms_task(source, k0, k1, state, steps, *, blas_threads):
    """The screen's terms of components ``k0:k1`` of the state's model, their
    directions from a seeded start (``steps`` steps), around the shift the parent
    stored in the screen."""
    screen = state.screen()
    centres = np.array(state.means)
    with limit_blas(blas_threads):
        for k in range(k0, k1):
            set_screen(screen, state, k, centres, None, steps)
