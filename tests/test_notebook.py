"""notebooks/patch_prior.ipynb runs top to bottom at CI size.

Executed with nbclient on the python3 kernel.
"""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import emgmm

REPO_ROOT = Path(emgmm.__file__).resolve().parent.parent
NOTEBOOK = REPO_ROOT / "notebooks" / "patch_prior.ipynb"


@pytest.mark.slow
def test_patch_prior_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("EMGMM_NB_PATCHES", "3000")
    monkeypatch.setenv("EMGMM_NB_COMPONENTS", "8")
    monkeypatch.setenv("EMGMM_NB_MAX_ITER", "15")
    monkeypatch.setenv("EMGMM_NB_N_JOBS", "1")
    # the kernel imports this checkout of emgmm even when it is not installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    before = NOTEBOOK.read_bytes()
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [out for cell in nb.cells if cell.cell_type == "code"
               for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    text = "".join(out.get("text", "") for out in outputs
                   if out.output_type == "stream")
    assert "3000 training patches" in text
    assert "held-out log-likelihood" in text
    assert "8 components" in text
    psnr_line = next(line for line in text.splitlines() if line.startswith("PSNR"))
    noisy, denoised = (float(word) for word in psnr_line.split() if word[0].isdigit()
                       and "." in word)
    assert denoised > noisy + 3
    images = [out for out in outputs if out.output_type == "display_data"
              and "image/png" in out.data]
    assert len(images) == 3  # lower-bound plot, component tiles, clean|noisy|denoised
    assert NOTEBOOK.read_bytes() == before  # executed in memory, file untouched
    assert os.listdir(tmp_path) == []
