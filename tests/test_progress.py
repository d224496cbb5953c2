"""Progress events: a bar over the blocks of a pass, and per-iteration records; on a
terminal the bar is cleared at the end of every pass (nothing is glued to it), and
the final scoring pass is announced."""

import io
import os
import pty
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import not_converging

from emgmm import GaussianMixture
from emgmm._cli.progress import ProgressReporter


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


_CHILD = textwrap.dedent("""
    import sys
    from emgmm._cli.progress import ProgressReporter
    from emgmm._cli import main
    ProgressReporter.bar_after = 0.0  # a bar from the first block on
    sys.exit(main(sys.argv[1:]))
""")


def _render(raw):
    """The lines a terminal shows for ``raw``: carriage return, ESC[K (erase to the
    end of the line) and newline are applied."""
    lines, line, col = [], [], 0
    i = 0
    while i < len(raw):
        if raw.startswith("\x1b[K", i):
            del line[col:]
            i += 3
            continue
        ch = raw[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("".join(line))
            line, col = [], 0
        else:
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
    if line:
        lines.append("".join(line))
    return lines


def _run_on_a_terminal(argv):
    primary, secondary = pty.openpty()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, *argv],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=secondary, env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert child.wait(timeout=300) == 0
    return b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.mark.slow
def test_bar_cleared_and_final_pass_announced(tmp_path):
    X = np.random.default_rng(0).standard_normal((4000, 3))
    np.save(tmp_path / "x.npy", X)
    raw = _run_on_a_terminal(["fit", str(tmp_path / "x.npy"), "-k", "3",
                              "--block-size", "100", "--max-iter", "3", "--tol", "0",
                              "--random-state", "0", "-o", str(tmp_path / "m.h5")])
    assert "blocks" in raw  # bars were drawn
    lines = _render(raw)
    # every bar was cleared before the next text: no bar left on the screen
    assert not [line for line in lines if "blocks" in line], lines
    iterations = [i for i, line in enumerate(lines) if line.startswith("iter ")]
    final = [i for i, line in enumerate(lines) if "final pass" in line]
    warning = [i for i, line in enumerate(lines) if "ConvergenceWarning" in line]
    assert len(iterations) == 3 and len(final) == 1 and len(warning) == 1, lines
    assert iterations[-1] < final[0] < warning[0]
    assert lines[warning[0]].startswith("emgmm fit: ConvergenceWarning")
    assert lines[-1].startswith("did not converge after 3 iterations")
