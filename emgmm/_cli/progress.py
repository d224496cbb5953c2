"""Progress reporting for long fits, driven by the estimator's ``callback``."""

import math
import sys
import time


def plural(count, word):
    """``"1 iteration"``, ``"2 iterations"``: ``count`` and ``word``, with an ``s``
    unless ``count`` is 1.

    Parameters
    ----------
    count : int
    word : str

    Returns
    -------
    text : str
    """
    return f"{count} {word}{'' if count == 1 else 's'}"


#: How the start line names the initialisations of ``init_params``.
_INIT_NAMES = {"kmeans": "k-means", "k-means++": "k-means++", "random": "random",
               "random_from_data": "random rows"}


def format_seconds(seconds):
    """Format a duration as ``"1h02m"``, ``"3m05s"`` or ``"4.2s"``.

    Parameters
    ----------
    seconds : float
        Non-negative duration in seconds.

    Returns
    -------
    text : str
    """
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"


#: A variational fit's summary counts the components whose weight is above this
#: over ``n_components`` (a hundredth of an equal share): those that carry weight.
WEIGHT_THRESHOLD = 0.01


class ProgressReporter:
    """Print one line per EM iteration; pass an instance as ``callback``.

    Each line shows the run (``init``) when ``n_init > 1``, the iteration,
    the lower bound (mean log-likelihood per sample) and its change, the
    seconds the iteration took and an estimate of the time left, assuming
    every remaining run goes to ``max_iter`` iterations (an upper bound:
    runs that converge stop earlier).

    Parameters
    ----------
    max_iter : int
        The estimator's ``max_iter``.
    n_init : int, default=1
        The estimator's ``n_init``.
    stream : file-like, default=None
        Where to write; ``None`` means ``sys.stderr`` at call time.
    quiet : bool, default=False
        Record the iterations (for :meth:`summary`) without printing.

    Attributes
    ----------
    history : list of dict
        Every iteration dict received from the estimator, in order.
    bar_after : float
        Seconds into an iteration after which a bar over its blocks is drawn (on a
        terminal only: none into files and pipes).
    """

    bar_after = 2.0
    #: Ask the estimator for progress events within passes (see its ``callback``).
    wants_progress = True
    #: Ask for the ``'plan'`` event before the first pass: the start line.
    wants_plan = True

    def __init__(self, max_iter, n_init=1, *, stream=None, quiet=False):
        self.max_iter = max_iter
        self.n_init = n_init
        self.stream = stream
        self.quiet = quiet
        self.history = []
        self._start = time.perf_counter()
        self._iteration_start = self._start
        self._bar_shown = False

    def __call__(self, info):
        """Record and print the progress dict of one EM iteration, or draw the bar.

        Parameters
        ----------
        info : dict
            ``event='progress'`` dicts (``done``, ``total`` tasks of a pass) draw a
            bar over the blocks once the iteration has run :attr:`bar_after`
            seconds, cleared when the pass ends (``done == total``).
            ``event='final_pass'`` (key ``init``) announces the pass that scores
            a run's final parameters. Iteration dicts have keys ``n_iter`` (int,
            1-based),
            ``lower_bound`` (float),
            ``change`` (float; not shown when None or not finite, as on
            the first iteration),
            ``seconds`` (float, duration of the iteration), ``init`` (int,
            0-based index of the run) and optionally ``reseeded`` (list of
            the components re-seeded in this iteration).
        """
        if info.get("event") == "progress":
            self._draw_bar(info["done"], info["total"])
            if info["done"] >= info["total"]:
                self._clear_bar()  # (the pass is over: nothing glued to its bar)
            return
        if info.get("event") == "final_pass":
            self._announce_final_pass(info)
            return
        if info.get("event") == "plan":
            self._announce_start(info)
            return
        self.history.append(dict(info))
        self._iteration_start = time.perf_counter()
        if self.quiet:
            return
        self._clear_bar()
        seconds = [h["seconds"] for h in self.history]
        per_iter = sum(seconds) / len(seconds)
        runs_left = self.n_init - info["init"] - 1
        iters_left = self.max_iter - info["n_iter"] + runs_left * self.max_iter
        change = info.get("change")
        finite = change is not None and math.isfinite(change)
        change_text = f"  change {change:+.3e}" if finite else ""
        run_text = f"init {info['init'] + 1}/{self.n_init}  " if self.n_init > 1 else ""
        reseeded = info.get("reseeded")
        reseeded_text = f"  re-seeded components {list(reseeded)}" if reseeded else ""
        width = len(str(self.max_iter))
        print(
            f"{run_text}iter {info['n_iter']:>{width}}/{self.max_iter}"
            f"  lower bound {info['lower_bound']:.6g}{change_text}"
            f"  {info['seconds']:.2f} s/iter"
            f"  <= {format_seconds(iters_left * per_iter)} left{reseeded_text}",
            file=self.stream or sys.stderr,
            flush=True,
        )

    def _announce_start(self, info):
        """Say, before the initialisation and the workers' start-up (which take a
        while on large data, and show nothing else), how the fit starts: from a
        checkpoint, an initialisation or the warm-start model."""
        self._iteration_start = time.perf_counter()
        if self.quiet:
            return
        resume = info.get("resume")
        workers = info.get("n_workers", 1)
        workers_text = f", {plural(workers, 'worker')}" if workers > 1 else ""
        if resume is not None:
            run_text = (f" of init {resume['init'] + 1}/{self.n_init}"
                        if self.n_init > 1 else "")
            text = (f"resuming from {resume['path']} after "
                    f"{plural(resume['n_iter'], 'iteration')}{run_text}")
        elif info.get("init_params") is not None:
            method = _INIT_NAMES.get(info["init_params"], info["init_params"])
            text = (f"initialising {plural(info['n_components'], 'component')} "
                    f"({method} on {plural(info['init_rows'], 'row')})")
        else:
            text = "starting from the warm-start model"
        print(f"{text}{workers_text} ...", file=self.stream or sys.stderr, flush=True)

    def _announce_final_pass(self, info):
        """Say that the run's parameters are scored in one more pass (its time is
        not in the iterations' estimate)."""
        self._iteration_start = time.perf_counter()
        if self.quiet:
            return
        self._clear_bar()
        run_text = f"init {info['init'] + 1}/{self.n_init}  " if self.n_init > 1 else ""
        print(f"{run_text}final pass: scoring the fitted parameters (one more pass "
              "over the data)", file=self.stream or sys.stderr, flush=True)

    def _draw_bar(self, done, total):
        if self.quiet or time.perf_counter() - self._iteration_start < self.bar_after:
            return
        stream = self.stream or sys.stderr
        if not getattr(stream, "isatty", lambda: False)():
            return  # a log file would keep every redraw (carriage returns, ESC[K)
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} blocks",
              end="", file=self.stream or sys.stderr, flush=True)
        self._bar_shown = True

    def _clear_bar(self):
        if self._bar_shown:
            print("\r\033[K", end="", file=self.stream or sys.stderr, flush=True)
            self._bar_shown = False

    def summary(self, estimator):
        """Summarise a finished fit.

        Parameters
        ----------
        estimator : fitted GaussianMixture

        Returns
        -------
        summary : dict
            ``n_components``, ``covariance_type``, ``n_features``,
            ``converged``, ``n_iter``, ``lower_bound``, ``seconds`` (wall
            time since this reporter was created) and ``seconds_per_iter``
            (mean over all reported iterations, ``None`` if none was
            reported); for a variational fit (``weight_concentration_prior_type``)
            also ``n_weighted_components``, the components whose weight is above
            :data:`WEIGHT_THRESHOLD` ``/ n_components``.
        """
        self._clear_bar()
        seconds = [h["seconds"] for h in self.history]
        extra = {}
        if hasattr(estimator, "weight_concentration_prior_type"):
            threshold = WEIGHT_THRESHOLD / estimator.n_components
            extra["n_weighted_components"] = int(
                (estimator.weights_ > threshold).sum())
        return {
            "n_components": int(estimator.n_components),
            "covariance_type": estimator.covariance_type,
            "n_features": int(estimator.n_features_in_),
            "converged": bool(estimator.converged_),
            "n_iter": int(estimator.n_iter_),
            "lower_bound": float(estimator.lower_bound_),
            "seconds": time.perf_counter() - self._start,
            "seconds_per_iter": sum(seconds) / len(seconds) if seconds else None,
            **extra,
        }


def format_summary(summary):
    """One-line human-readable text of :meth:`ProgressReporter.summary`.

    Parameters
    ----------
    summary : dict

    Returns
    -------
    text : str
    """
    state = "converged" if summary["converged"] else "did not converge"
    weighted = ""
    if "n_weighted_components" in summary:
        weighted = (f" ({summary['n_weighted_components']} of "
                    f"{summary['n_components']} carry weight > 1/(100 K))")
    return (
        f"{state} after {plural(summary['n_iter'], 'iteration')}; lower bound "
        f"{summary['lower_bound']:.6g}; {summary['n_components']} "
        f"{summary['covariance_type']} components{weighted} on "
        f"{summary['n_features']} features; {format_seconds(summary['seconds'])} total"
    )
