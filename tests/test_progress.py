"""Progress events: a bar over the blocks of a pass, and per-iteration records."""

import io

import numpy as np
from helpers import not_converging

from emgmm import GaussianMixture
from emgmm.cli.progress import ProgressReporter


def _fit(callback, n_jobs=None):
    X = np.random.default_rng(0).normal(size=(3000, 3))
    with not_converging():
        return GaussianMixture(2, max_iter=3, tol=0, block_size=100, random_state=0,
                               n_jobs=n_jobs, callback=callback).fit(X)


class Recorder(list):
    """A callback that asks for progress events."""

    wants_progress = True

    def __call__(self, record):
        self.append(record)


def test_plain_callbacks_get_only_iterations():
    events = []
    _fit(events.append)
    assert [e["n_iter"] for e in events] == [1, 2, 3]
    assert all(e["event"] == "iteration" for e in events)


def test_progress_events_count_every_task_of_every_pass():
    events = Recorder()
    gm = _fit(events)
    progress = [e for e in events if e["event"] == "progress"]
    iterations = [e for e in events if e["event"] == "iteration"]
    assert [e["n_iter"] for e in iterations] == [1, 2, 3]
    assert [e["lower_bound"] for e in iterations] == gm.lower_bounds_
    # 3000 rows in blocks of 100: 30 blocks split into tasks; 3 EM passes + 1 score pass
    total = progress[0]["total"]
    assert all(e["total"] == total for e in progress)
    assert [e["done"] for e in progress] == list(range(1, total + 1)) * 4


def test_progress_events_with_workers_arrive_in_order():
    events = Recorder()
    _fit(events, n_jobs=2)
    done = [e["done"] for e in events if e["event"] == "progress"]
    total = events[0]["total"]
    assert done == list(range(1, total + 1)) * 4


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_reporter_draws_a_bar_and_clears_it():
    out = Terminal()
    reporter = ProgressReporter(3, stream=out)
    reporter.bar_after = 0.0
    gm = _fit(reporter)
    text = out.getvalue()
    assert "] " in text and " blocks" in text
    assert len(reporter.history) == 3  # bars are not iterations
    reporter.summary(gm)
    assert out.getvalue().endswith("\r\033[K")


def test_reporter_draws_no_bar_into_a_file():
    """Redirected to a file or a pipe, the log gets the iteration lines only (the
    bar's carriage returns and ESC[K filled the demo's and the CLI's logs)."""
    out = io.StringIO()
    reporter = ProgressReporter(3, stream=out)
    reporter.bar_after = 0.0
    _fit(reporter)
    text = out.getvalue()
    assert " blocks" not in text and "\r" not in text and "\033" not in text
    assert text.count("lower bound") == 3


def test_quiet_reporter_draws_nothing():
    out = io.StringIO()
    reporter = ProgressReporter(3, stream=out, quiet=True)
    reporter.bar_after = 0.0
    _fit(reporter)
    assert out.getvalue() == ""
