"""One read of the data for the passes of several mixtures fitted side by side.

A grid of candidates (model selection) runs one EM loop per candidate, each in its
own thread, with :meth:`SharedPasses.statistics_pass` and
:meth:`SharedPasses.score_pass` in place of the passes of :mod:`emgmm._engine.passes`.
A pass waits until every candidate still running has asked for one, then reads each
block
once and computes every request from it, with the same task functions and in the same
order as a separate fit (so each candidate's statistics equal its separate fit's).
Candidates that converged drop out (:meth:`SharedPasses.leave`).
"""

import threading
from dataclasses import dataclass

import numpy as np

from ..covariance._log_density import relevance_margin
from .passes import release_after_pass, score_task, statistics_task, task_model


class HeldBlock:
    """A source whose rows ``start:stop`` in ``dtype`` are held in memory: every
    request of a shared pass reads them from here; any other read goes to
    ``source`` (the row a message names)."""

    def __init__(self, source, start, stop, dtype):
        self.source, self.start, self.stop = source, start, stop
        self.dtype = np.dtype(dtype)
        self.block = source.read(start, stop, dtype)
        self.description = source.description

    def read(self, start, stop, dtype=None):
        if (start, stop) == (self.start, self.stop) and np.dtype(dtype) == self.dtype:
            return self.block
        return self.source.read(start, stop, dtype)


_TASKS = {"statistics": statistics_task, "score": score_task}


def _combine(kind, a, b):
    if kind == "statistics":
        return a[0] + b[0], a[1].merge(b[1])
    labels = None if a[1] is None else np.concatenate([a[1], b[1]])
    return a[0] + b[0], labels


def shared_task(source, start, stop, block_size, requests, *, blas_threads):
    """Every request over rows ``start:stop``, each block read once per dtype.

    Parameters
    ----------
    source : Source
    start, stop, block_size : int
    requests : tuple of (kind, args)
        ``kind`` 'statistics' (``args`` those of :func:`statistics_task` after
        ``block_size``) or 'score' (of :func:`score_task`); ``args[1]`` is the
        compute dtype.
    blas_threads : int or None

    Returns
    -------
    list
        Per request, what its task returns for these rows.
    """
    results = [None] * len(requests)
    for b0 in range(start, stop, block_size):
        b1 = min(b0 + block_size, stop)
        held = {}
        for i, (kind, args) in enumerate(requests):
            dtype = np.dtype(args[1])
            if dtype not in held:
                held[dtype] = HeldBlock(source, b0, b1, dtype)
            part = _TASKS[kind](held[dtype], b0, b1, block_size, *args,
                                blas_threads=blas_threads)
            results[i] = part if results[i] is None else _combine(kind, results[i],
                                                                   part)
        del held
    return results


class FitCancelled(RuntimeError):
    """The fits of a :class:`SharedPasses` were cancelled
    (:meth:`SharedPasses.cancel`)."""


@dataclass
class _Request:
    kind: str
    args: tuple
    result: object = None
    error: BaseException | None = None
    done: bool = False


class SharedPasses:
    """The passes of ``n_members`` fits over one executor, one read per round.

    Each member (a thread running one fit) calls :meth:`statistics_pass` and
    :meth:`score_pass` as the single-fit passes, and :meth:`leave` when its fit
    ends (also when it raises). A round runs when every member still in has a
    request waiting; an error of the round is raised in every member that waited
    for it.

    Attributes
    ----------
    rounds : int
        Passes over the data run so far.
    rows_read : int
        Rows read from the source so far (each row once per round and compute
        dtype; counted in the parent).
    """

    def __init__(self, executor, tasks, block_size, n_members):
        self.executor, self.tasks, self.block_size = executor, tasks, block_size
        self._members = n_members
        self._waiting = []
        self._cond = threading.Condition()
        self._cancelled = None
        self.rounds = 0
        self.rows_read = 0

    def statistics_pass(self, executor, tasks, block_size, model, compute_dtype,
                        resp_threshold, n_worst, centers=None):
        """:func:`emgmm._engine.passes.rows_statistics_pass`'s result for ``model``."""
        model = task_model(model, compute_dtype,
                            relevance_margin(resp_threshold) is not None)
        return self._ask(_Request("statistics", (model, compute_dtype, resp_threshold,
                                                 n_worst, centers)))

    def score_pass(self, executor, tasks, block_size, model, compute_dtype,
                   want_labels, weights=None):
        """:func:`emgmm._engine.passes.score_pass`'s result for ``model`` (the
        candidates of a grid have no sample weights: ``weights`` is ``None``)."""
        if weights is not None:
            raise ValueError("shared passes take no sample weights")
        model = task_model(model, compute_dtype, True)
        return self._ask(_Request("score", (model, compute_dtype, want_labels)))

    def leave(self):
        """The calling member's fit ended: rounds no longer wait for it."""
        with self._cond:
            self._members -= 1
            self._run_if_ready()

    def cancel(self):
        """End every member at its next pass (after the round under way, if any):
        their waiting and later passes raise :class:`FitCancelled`."""
        self._cancelled = FitCancelled("the fit was stopped")
        with self._cond:
            for request in self._waiting:
                request.error, request.done = self._cancelled, True
            self._waiting = []
            self._cond.notify_all()

    def _ask(self, request):
        with self._cond:
            if self._cancelled is not None:
                raise self._cancelled
            self._waiting.append(request)
            self._run_if_ready()
            self._cond.wait_for(lambda: request.done)
        if request.error is not None:
            raise request.error
        return request.result

    def _run_if_ready(self):
        """Run a round when every member has a request (called holding the lock)."""
        if not self._waiting or len(self._waiting) < self._members:
            return
        batch, self._waiting = self._waiting, []
        try:
            results = self._round(batch)
        except BaseException as exc:  # noqa: BLE001 (every waiting member raises it)
            for request in batch:
                request.error, request.done = exc, True
        else:
            for request, result in zip(batch, results, strict=False):
                request.result, request.done = result, True
        self._cond.notify_all()

    def _round(self, batch):
        requests = tuple((r.kind, r.args) for r in batch)
        args = [(s, e, self.block_size, requests) for s, e in self.tasks]
        totals = None
        for parts in self.executor.map(shared_task, args):
            totals = parts if totals is None else [
                _combine(r.kind, t, p)
                for r, t, p in zip(batch, totals, parts, strict=False)]
        self.rounds += 1
        n_rows = self.tasks[-1][1] if self.tasks else 0
        self.rows_read += n_rows * len({np.dtype(r.args[1]) for r in batch})
        for r in batch:
            release_after_pass(r.args[0], r.args[1], min(self.block_size, n_rows))
        return totals
