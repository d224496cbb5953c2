"""Issue 29.3: on a terminal the progress bar is cleared at the end of every pass
(nothing is glued to it), and the final scoring pass is announced."""

import os
import pty
import subprocess
import sys
import textwrap

import numpy as np
import pytest

_CHILD = textwrap.dedent("""
    import sys
    from emgmm.cli.progress import ProgressReporter
    from emgmm.cli import main
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
