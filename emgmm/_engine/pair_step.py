"""The pairs schedule of an EM iteration ('full'): the E step follows the pairs that
can matter, and each component owns its statistics, M step and factor.

One iteration, each phase a pass of tasks over the executor:

1. rows (:func:`~emgmm._engine.pair_rows.screen_task`, one read of ``X`` in
   blocks): every pair's screen bound; per row the component of largest bound and
   the second largest bound;
2. components (:func:`~emgmm._engine.pair_components.top_pairs_task`, a gather of
   every row once): each row's exact log-density under its top component; the
   rows no other component can explain (``r_ik = 1``: most of them, once the
   components have formed) go straight into that component's statistics;
3. rows (:func:`~emgmm._engine.pair_rows.rescreen_task`, a gather of the other
   rows): their screened E step, as the row schedule computes it, giving their
   kept ``(row, component, w_i r_ik)`` triples;
4. components (:func:`~emgmm._engine.pair_components.statistics_task`, a gather
   of the kept pairs): their statistics, the M step, the factor and the screen's
   terms of each component (its directions from the previous model's); then, in
   this process, the weights and the degenerate policy.

``X`` is read once in blocks and gathered about twice by row (every row in phase
2, the rows of several components once more in phases 3 and 4). No task holds
more than its own components' arrays: the model, the sums and the screen live in
a :class:`~emgmm._engine.pair_state.PairState` allocated once per run (in files that
the worker processes map, when there are any). The row blocks and each
component's gathers are fixed by the data and the model, so the result does not
depend on the number of workers or on how they group the work.

Each iteration's wall seconds by phase are in :attr:`PairStep.phase_seconds`
(``screen``, ``top_pairs``, ``rescreen``, ``statistics``, ``repair``), which the
iteration records of the fit carry.
"""

import contextlib
import time

import numpy as np

from ..covariance._log_density import _shift, _use_packed, relevance_margin
from ..covariance._screen import _SUBSPACE_STEPS
from .carried_bounds import GROUP_SIZE, carry_pays, component_groups, group_terms
from .pair_components import (
    ComponentRows,
    screen_terms_task,
    set_screen,
    statistics_task,
    top_pairs_task,
)
from .pair_rows import CarryPlan, RowScreen, Triples, rescreen_task, screen_task
from .pair_state import PairState, RowBounds
from .passes import Worst

#: Steps of subspace iteration for the screen's directions started from those of
#: the previous model, before their Rayleigh-Ritz step (a cold start takes
#: ``_SUBSPACE_STEPS``).
WARM_STEPS = 0
#: Component ranges per worker (or row thread): shares for a balanced load.
RANGES_PER_WORKER = 4
#: Beyond this many bytes, the rows' carried bounds live in a file of the
#: temporary folder, not in memory (nor in ``/dev/shm``).
ROWS_IN_MEMORY_BYTES = 64 * 2**20


def pairs_apply(kind, n_components, n_features, resp_threshold):
    """Whether the pairs schedule serves this model: a covariance type whose
    components own their statistics (``kind.owns_statistics``: 'full'), a
    ``resp_threshold`` that leaves the negligible pairs out, and features beyond the
    packed estimate's range (which computes every pair at the GEMM rate)."""
    return bool(getattr(kind, "owns_statistics", False) and resp_threshold > 0.0
                and not _use_packed(n_features, n_components))


def contiguous_ranges(n, parts):
    """``parts`` (at most ``n``) consecutive ``(a, b)`` ranges covering ``0..n``."""
    parts = max(1, min(parts, n))
    edges = np.linspace(0, n, parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def balanced_ranges(costs, parts):
    """At most ``parts`` consecutive, non-empty ``(a, b)`` ranges covering the
    ``costs`` (K,) of the components, cut where the running cost crosses each
    multiple of the total over ``parts``: a task per range, of about equal work
    (a component with many rows does not hold up the phase's other tasks)."""
    K = len(costs)
    total = np.cumsum(np.asarray(costs, dtype=np.float64))
    targets = total[-1] * np.arange(1, max(1, min(parts, K))) / max(1, min(parts, K))
    cuts = np.searchsorted(total, targets, side="left") + 1
    edges = np.unique(np.concatenate([[0], np.clip(cuts, 1, K), [K]]))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


class PairStep:
    """:func:`~emgmm._engine.em.em_step` of the pairs schedule, for ``run_em``.

    Parameters
    ----------
    executor : Executor
    block_size, n_samples : int
    compute_dtype : type
    resp_threshold : float
        Must be positive (the screen needs a margin).
    weights : WeightSource or None
    total_weight : float
    owns_start : bool
        Whether the run's starting model may become its state (not a warm
        start's: the estimator's attributes stay as they are until the fit ends).

    The state lives in this process, or, when the executor's tasks run in worker
    processes, in one memory-mapped file in a folder of
    :meth:`~emgmm._runtime.executor.Executor.shared_folder`, which :meth:`close`
    removes.
    """

    def __init__(self, executor, block_size, n_samples, compute_dtype, resp_threshold,
                 weights=None, total_weight=None, owns_start=True):
        self.executor = executor
        self.block_size, self.n_samples = block_size, n_samples
        self.compute_dtype = compute_dtype
        self.resp_threshold = resp_threshold
        self.margin = relevance_margin(resp_threshold)
        self.weights = weights
        self.total_weight = n_samples if total_weight is None else total_weight
        self.owns_start = owns_start
        self.folder = self.rows_folder = None
        self.state = self.rows = None
        self.groups = None
        #: Share of the rows screened by their carried bounds in the last iteration
        #: (``None`` when the run carries none: :func:`~emgmm._engine.
        #: carried_bounds.carry_pays`).
        self.rows_carried = None
        #: Share of the rows rescreened pair by pair in the last iteration.
        self.rows_rescreened = None
        #: Pairs computed per row in the last iteration (the others were proven
        #: negligible without touching their rows).
        self.pairs_per_row = None
        #: Wall seconds of each phase of the last iteration, by name.
        self.phase_seconds = None
        units = max(executor.n_workers, executor.row_threads, 1)
        self.units = RANGES_PER_WORKER * units
        blocks = [(s, min(s + block_size, n_samples))
                  for s in range(0, n_samples, block_size)]
        self.blocks = blocks
        self.row_tasks = [(blocks[a][0], blocks[b - 1][1])
                          for a, b in contiguous_ranges(len(blocks), self.units)]

    def _start(self, model):
        K, d = model.means.shape
        self.folder = self.executor.shared_folder(PairState.nbytes(K, d),
                                                  "the model that the workers share")
        self.state = PairState.allocate(model, self.folder, adopt=self.owns_start)
        if not self.state.has_screen:  # (a resumed run has its model's)
            screen = self.state.screen()
            screen.g[:] = _shift(self.state.means, self.state.weights)
            self._map(screen_terms_task, [(k0, k1, self.state, _SUBSPACE_STEPS)
                                          for k0, k1 in contiguous_ranges(
                                              K, self.units)])
            screen.set_offsets(self.state.weights)
        if carry_pays(self.n_samples, d, self.state.p):
            n_groups = -(-K // GROUP_SIZE)
            self.rows_folder = self._rows_folder(RowBounds.nbytes(self.n_samples,
                                                                  n_groups))
            self.rows = RowBounds.allocate(self.n_samples, n_groups, self.rows_folder)

    def _rows_folder(self, nbytes):
        """Where the rows' bounds live: a file of the temporary folder when they are
        large (memory independent of ``n``), else the workers' shared folder or
        this process's memory."""
        what = "the bounds the rows carry"
        if nbytes > ROWS_IN_MEMORY_BYTES:
            return self.executor.file_folder(nbytes, what)
        return self.executor.shared_folder(nbytes, what)

    def _carry_plan(self):
        """The :class:`~emgmm._engine.pair_rows.CarryPlan` of this iteration, or
        ``None`` when the run carries no bounds."""
        if self.rows is None:
            return None
        state, screen = self.state, self.state.screen()
        n_groups = self.rows.bounds.shape[1]
        fresh = np.flatnonzero(state.fresh)
        reset = 2 * fresh.size > state.fresh.size
        if reset or self.groups is None:  # (every row's bounds are built afresh)
            self.groups = component_groups(np.array(screen.offset), n_groups)
        terms = group_terms(self.groups, n_groups, np.array(state.drift),
                            np.array(state.fresh), np.array(screen.offset))
        return CarryPlan(self.rows, self.groups, n_groups, terms, fresh,
                         screen.subset(fresh) if fresh.size and not reset else None,
                         reset, self.margin)

    def __call__(self, take_model, settings, policy, seeds, used_rows, n_iter,
                 streaks=None):
        if self.state is None:
            self._start(take_model())
        state = self.state
        K = state.means.shape[0]
        n_worst = min(K + len(used_rows), 2 * K)
        self.phase_seconds = {}
        # (each per-row array is let go once its phase is done: the parent holds
        # O(n) bytes, a few tens per row and per kept pair, never an n x K array)
        carry = self._carry_plan()
        with self._phase("screen"):
            screened = self._screen_rows(carry)
            tops = self._tops(screened)
            row_weights = screened.weights
            del screened
        with self._phase("top_pairs"):
            log_likelihood, worst, others, singles = self._top_pairs(tops, n_worst)
            del tops
        with self._phase("rescreen"):
            triples, rows_log_likelihood, rows_worst = self._rescreen(
                others, row_weights, n_worst, carry)
            del others, row_weights
        with self._phase("statistics"):
            parts = [singles, triples]
            del singles, triples
            bad = self._statistics(parts, settings)
        log_likelihood += rows_log_likelihood
        worst = worst.merge(rows_worst)
        with self._phase("repair"):
            reseeded = self._repair(settings, policy, seeds, streaks, bad, worst,
                                    used_rows, n_iter)
        new = state.model()
        return (new, settings.update.lower_bound(log_likelihood, self.total_weight,
                                                 new), reseeded)

    @contextlib.contextmanager
    def _phase(self, name):
        tic = time.perf_counter()
        yield
        self.phase_seconds[name] = time.perf_counter() - tic

    def close(self):
        """Let the state go and remove its folder (the model of the last
        iteration must have been copied out first: :meth:`Model.in_memory`)."""
        if self.state is not None:
            self.state.close()
            self.state = None
        if self.rows is not None:
            self.rows.close()
            self.rows = None
        for name in ("folder", "rows_folder"):
            if getattr(self, name) is not None:
                self.executor.remove_folder(getattr(self, name))
                setattr(self, name, None)

    def _map(self, func, args):
        return list(self.executor.map(func, args))

    def _screen_rows(self, carry):
        parts = self._map(screen_task, [
            (s, e, self.block_size, self.state, self.compute_dtype, self.weights,
             carry) for s, e in self.row_tasks])
        if carry is not None:
            self.rows_carried = sum(p.carried for p in parts) / max(self.n_samples, 1)
        return RowScreen(np.concatenate([p.top for p in parts]),
                         np.concatenate([p.second for p in parts]),
                         None if self.weights is None
                         else np.concatenate([p.weights for p in parts]))

    def _tops(self, screened):
        """The rows by their top component, in component ranges of about equal
        numbers of rows (the phase's work)."""
        order = np.argsort(screened.top, kind="stable")
        K = self.state.means.shape[0]
        ranges = balanced_ranges(np.bincount(screened.top, minlength=K) + 1,
                                 self.units)
        return ranges, ComponentRows.split(
            screened.top[order], order, screened.second[order],
            None if screened.weights is None else screened.weights[order], ranges)

    def _top_pairs(self, tops, n_worst):
        ranges, tops = tops
        parts = self._map(top_pairs_task, [
            (k0, k1, part, self.state, self.compute_dtype, self.margin, n_worst,
             self.rows)
            for (k0, k1), part in zip(ranges, tops, strict=True)])
        log_likelihood = float(sum(float(s) for p in parts for s in p.log_likelihoods))
        worst = Worst(n_worst)
        for p in parts:
            worst = worst.merge(p.worst)
        others = np.sort(np.concatenate([p.others for p in parts]))
        return (log_likelihood, worst, others,
                Triples.joined([p.singles for p in parts]))

    def _rescreen(self, others, row_weights, n_worst, carry):
        """The rescreened rows' triples (sorted by component), log-likelihood and
        worst rows, gathered ``block_size`` rows at a time (a partition fixed by the
        rows, whatever the tasks: each gather's per-component products are the
        same for any number of workers)."""
        groups = []
        for a in range(0, others.size, self.block_size):
            rows = others[a:a + self.block_size]
            groups.append((rows, None if row_weights is None else row_weights[rows]))
        tasks = [groups[a:b] for a, b in contiguous_ranges(len(groups), self.units)]
        parts = self._map(rescreen_task, [
            (task, self.state, self.compute_dtype, self.margin, self.resp_threshold,
             n_worst, carry) for task in tasks if task])
        triples = Triples.joined([t for p in parts for t in p[0]])
        log_likelihood = float(sum(s for p in parts for s in p[1]))
        worst = Worst(n_worst)
        for p in parts:
            worst = worst.merge(p[2])
        # the top pair of every row, and the pairs the rescreened rows computed
        # beyond it
        self.rows_rescreened = others.size / max(self.n_samples, 1)
        self.pairs_per_row = (self.n_samples - others.size
                              + sum(p[3] for p in parts)) / max(self.n_samples, 1)
        return triples, log_likelihood, worst

    def _statistics(self, parts, settings):
        """Phase 4: each component's statistics, M step, factor and screen terms
        from the kept pairs of the :class:`Triples` in ``parts`` (emptied: the
        parts, then the joined triples, go as soon as they are copied); the new
        model's screen is around the mixture mean of the previous model, its
        directions started from the previous ones and the clusters where they
        were (any shift and directions give a valid screen; these a tight one)."""
        state = self.state
        triples = Triples.joined(parts)
        parts.clear()
        triples = triples.sorted(self.n_samples)
        K, d = state.means.shape
        # a component's work: its factorisation and M step (~2 d rows' worth of
        # syrk) and its kept rows
        ranges = balanced_ranges(np.bincount(triples.comps, minlength=K) + 2 * d,
                                 self.units)
        kept = ComponentRows.split(triples.comps, triples.rows, triples.wr, None,
                                   ranges)
        limit = state.model().kind.factor_limit(state.means.shape[1],
                                                settings.compute_dtype)
        self.centres = np.array(state.means)
        state.screen().g[:] = _shift(self.centres, state.weights)
        parts = self._map(statistics_task, [
            (k0, k1, part, state, self.compute_dtype, settings.reg_covar, limit,
             self.centres, WARM_STEPS, self.rows is not None)
            for (k0, k1), part in zip(ranges, kept, strict=True)])
        return [k for p in parts for k in p]

    def _repair(self, settings, policy, seeds, streaks, bad, worst, used_rows,
                n_iter):
        """Weights from the counts, then the degenerate policy on the new model
        (in place in the state)."""
        state = self.state
        eps = np.finfo(np.float64).eps
        counts = state.nk + 10 * eps
        state.weights[:] = counts / counts.sum()
        starved = [int(k) for k in np.flatnonzero(state.nk < settings.min_count)
                   if int(k) not in seeds]
        streaks = seeds if streaks is None else streaks
        _, reseeded = policy.repair(state.model(), bad, starved, worst, streaks,
                                    used_rows, n_iter)
        screen = state.screen()
        for k in reseeded:
            state.fresh[k] = True
            set_screen(screen, state, k, self.centres, screen.directions[k],
                       _SUBSPACE_STEPS)
        screen.set_offsets(state.weights)
        return reseeded
