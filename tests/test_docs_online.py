"""The code of docs/online.rst runs as written and does what the page says.

The blocks are read from the page itself: an edit of the page that breaks an example
fails here. The stream example's second half ("later, in another process") runs in
a new interpreter that has only the model file.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import make_blobs_data

import emgmm

REPO_ROOT = Path(emgmm.__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "online.rst"
LATER = "# later, in another process"


def _python_blocks():
    """The ``.. code-block:: python`` blocks of the page, dedented."""
    blocks, lines = [], PAGE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() != ".. code-block:: python":
            continue
        body = []
        for text in lines[i + 1:]:
            if text.strip() and not text.startswith("   "):
                break
            body.append(text[3:])
        blocks.append("\n".join(body).strip("\n") + "\n")
    return blocks


def _stream_block():
    (block,) = [b for b in _python_blocks() if LATER in b]
    return block


def test_the_page_has_both_examples():
    blocks = _python_blocks()
    assert len(blocks) == 2
    assert "sample_weight=" in blocks[0] and "partial_fit" in blocks[1]


def test_weighted_example_runs_on_an_hdf5_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    X = make_blobs_data(2000, 3, 8, seed=4)
    duration = np.random.default_rng(0).uniform(0.5, 2.0, size=len(X))
    with h5py.File("frames.h5", "w") as f:
        f["X"], f["duration"] = X, duration
    namespace = {}
    exec(_python_blocks()[0], namespace)  # noqa: S102 (the page's own code)
    gm = namespace["gm"]
    ref = emgmm.GaussianMixture(n_components=8, random_state=0).fit(
        X, sample_weight=duration)
    np.testing.assert_allclose(gm.means_, ref.means_, rtol=1e-12)


@pytest.mark.slow
def test_stream_example_resumes_in_another_process(tmp_path, monkeypatch):
    """Part one (40 batches from a generator, saved every 10) in this process, part
    two (20 more) in a new one from the file: 60 steps, the three centres."""
    monkeypatch.chdir(tmp_path)
    block = _stream_block()
    head, later = block.split(LATER)
    definitions = head[:head.index("gm = GaussianMixture(")]
    namespace = {}
    exec(head, namespace)  # noqa: S102 (the page's own code)
    assert namespace["gm"].n_steps_ == 40
    assert emgmm.load_model("stream.h5").n_steps_ == 40
    script = definitions + later + "print(repr((gm.n_steps_, gm.means_.tolist())))\n"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run([sys.executable, "-c", script], check=True, env=env,
                         timeout=300, capture_output=True, text=True).stdout
    steps, means = ast.literal_eval(out.strip().splitlines()[-1])
    assert steps == 60
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    means = np.array(means)[np.argsort(np.array(means) @ [1.0, 10.0])]
    np.testing.assert_allclose(means, centres[[0, 1, 2]], atol=0.05)

