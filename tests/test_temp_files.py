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


@pytest.mark.slow
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


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_any_fit_removes_what_a_killed_fit_left_in_shared_memory():
    """A killed pairs fit leaves its shared model in /dev/shm (gigabytes at the
    workload's size): the next fit, of any schedule and without workers, removes
    it."""
    import subprocess
    import sys

    from emgmm.runtime import executor

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    name = (f"{executor.TEMP_PREFIX}{int(dead.stdout)}-{executor.process_space()}"
            "-0123456789ab")
    stray = os.path.join(executor.SHARED_MEMORY, name)
    os.makedirs(stray)
    try:
        X = np.random.default_rng(0).normal(size=(200, 3))
        emgmm.GaussianMixture(2, random_state=0).fit(X)
        assert not os.path.exists(stray)
    finally:
        if os.path.exists(stray):
            os.rmdir(stray)
