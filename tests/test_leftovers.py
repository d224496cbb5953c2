"""Issue 28.5: a fit with workers leaves nothing in /dev/shm or the temporary
folder (joblib's memmapping folders included), however many fits a process runs."""

import glob
import os
import tempfile

import numpy as np
import pytest

import emgmm


def _folders():
    """joblib's and emgmm's temporary folders of this process, wherever they are."""
    pid = os.getpid()
    found = set()
    for parent in {"/dev/shm", tempfile.gettempdir(),
                   os.environ.get("JOBLIB_TEMP_FOLDER", tempfile.gettempdir())}:
        for pattern in (f"joblib_memmapping_folder_{pid}_*", f"emgmm-{pid}-*"):
            found.update(glob.glob(os.path.join(parent, pattern)))
    return found


@pytest.mark.parametrize("source", ["array", "npy"])
def test_fits_with_workers_leave_no_folders(tmp_path, source):
    X = np.random.default_rng(0).standard_normal((4000, 3))
    data = X
    if source == "npy":
        np.save(tmp_path / "x.npy", X)
        data = str(tmp_path / "x.npy")
    before = _folders()
    for seed in range(3):
        emgmm.GaussianMixture(3, n_jobs=2, max_iter=4, tol=1e3,
                              random_state=seed).fit(data)
    gm = emgmm.GaussianMixture(3, n_jobs=2, max_iter=4, tol=1e3, random_state=0)
    gm.fit(data)
    gm.predict(data)
    gm.score_samples(data)
    assert _folders() - before == set()
