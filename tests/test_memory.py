"""Memory: what a fit holds and what it refuses. A model too large for the memory
is refused up front, before any large allocation, naming its size and the budget
(CASES.md C13); per-block outputs and the statistics of an iteration are freed as
the fit goes; a worker killed for memory is explained as a memory error (C21).
"""

import os
import signal
import tracemalloc
import weakref

import numpy as np
import psutil
import pytest
from helpers import (
    IGNORE_NOT_CONVERGED,
    PARAMS,
    assert_valid_model,
    not_converging,
)

from emgmm import GaussianMixture
from emgmm._runtime import memory as emgmm_memory


@pytest.fixture(scope="module")
def c13_npy(tmp_path_factory):
    """3000 x 6001: two identity blocks and one numeric column, as a .npy file
    written row block by row block (no 144 MB array in memory)."""
    path = tmp_path_factory.mktemp("c13") / "X.npy"
    n = 3000
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n,
                                                                            2 * n + 1))
    for s in range(0, n, 250):
        e = min(s + 250, n)
        block = np.zeros((e - s, 2 * n + 1))
        idx = np.arange(e - s)
        block[idx, s + idx] = 1.0
        block[idx, n + s + idx] = 1.0
        block[:, -1] = np.arange(s, e) / n
        X[s:e] = block
    X.flush()
    del X
    return path


def test_case_c13_refused_up_front_without_large_allocation(c13_npy):
    gm = GaussianMixture(200, covariance_type="full", random_state=0)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryError) as info:
            gm.fit(c13_npy)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "MiB" in message and "budget" in message
    need = float(message.split("needs about ")[1].split(" MiB")[0].replace(",", ""))
    assert need > 200 * 6001**2 * 8 / 2**20  # at least one copy of the covariances
    # nothing close to one data copy (144 MB) or one covariance (288 MB) was allocated
    assert peak < 16 * 2**20, peak
    assert not hasattr(gm, "weights_")


@pytest.mark.slow
def test_case_c13_diag_fits_the_same_data(c13_npy):
    gm = GaussianMixture(200, covariance_type="diag", max_iter=2, tol=0.0,
                         init_params="random_from_data", random_state=0)
    with not_converging():
        gm.fit(c13_npy)
    assert gm.means_.shape == (200, 6001)
    assert_valid_model(gm)


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_per_block_outputs_hold_the_result_and_about_one_block(covariance_type):
    """predict_proba fills one C-ordered result block by block: the traced peak is
    the result plus a few blocks' arrays, not a second copy of it (a list of parts
    and their concatenation took 2-3x the result), and every block lands in its
    rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200_000, 4))
    gm = GaussianMixture(50, covariance_type=covariance_type, max_iter=2,
                         init_params="random_from_data", random_state=0)
    with not_converging():
        gm.fit(X[:5000])
    tracemalloc.start()
    try:
        proba = gm.predict_proba(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert proba.shape == (200_000, 50) and proba.flags.c_contiguous
    # a second copy would be 2x; the two row threads' block arrays add 0.4x, or
    # 0.56x when both threads' temporaries peak at once (seen on a loaded machine)
    assert peak < 1.75 * proba.nbytes, (peak, proba.nbytes)
    for rows in (slice(0, 2000), slice(57_000, 59_000), slice(198_000, None)):
        np.testing.assert_allclose(proba[rows], gm.predict_proba(X[rows]),
                                   rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gm.score_samples(X)[57_000:59_000],
                               gm.score_samples(X[57_000:59_000]), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_factor_block_holds_no_projections_of_its_rows(monkeypatch, dtype):
    """'factor': the E step (float32: with the margin's refinement) and the dense
    statistics of a block form the rows' projections and posterior means (``K q``
    values per row) by row chunks, never for the whole block: the traced peak is
    4.2 (float64) and 6.1 (float32) ``(n, K)`` float64 arrays here, 19 and 23 when
    the block's ``(n, K q)`` projections were kept for the statistics."""
    from emgmm.covariance import _factor_log_density as fdensity
    from emgmm.covariance import _factor_parameters as fparams
    from emgmm.covariance import _factor_statistics as fstats

    for module in (fdensity, fstats):  # chunks of 16 to 64 rows
        monkeypatch.setattr(module, "_CHUNK_BYTES", 2**16)
        monkeypatch.setattr(module, "_MIN_PRODUCT_ROWS", 16)
    rng = np.random.default_rng(0)
    n, d, K, q = 4000, 40, 30, 16
    means = rng.normal(size=(K, d))
    W = rng.normal(size=(K, d, q))
    psi = rng.uniform(0.5, 1.0, size=(K, d))
    X = (means[rng.integers(K, size=n)] + rng.normal(size=(n, d))).astype(dtype)
    prec = fparams.factorize(W, psi)
    weights = np.full(K, 1.0 / K)
    resp = rng.dirichlet(np.ones(K), size=n)  # every pair: the dense statistics
    assert fstats.dense_pays(resp)
    tracemalloc.start()
    try:
        log_prob, proj = fdensity.estimate_log_prob(X, means, prec, weights, dtype,
                                                    margin=30.0)
        stats = fstats.block_statistics(X, resp, means, prec, proj)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert log_prob.shape == (n, K) and stats.sum_xz.shape == (K, d, q)
    assert peak < 8 * (8 * n * K), peak / (8 * n * K)


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # 3 iterations, tol=0
@pytest.mark.parametrize("n_jobs", [1, None])
def test_starting_model_and_statistics_are_freed_after_their_iteration(monkeypatch,
                                                                       n_jobs):
    """Only the current model (and for the M step the current statistics) stay in
    memory: the starting model and the statistics of the iteration before are freed,
    not held through the next pass (for 'full' each is K d^2 float64 values,
    gigabytes at d = 900)."""
    from emgmm._engine import update as _em
    from emgmm._mixture import base as gaussian_mixture

    refs = {"model": [], "stats": []}
    initial_model = GaussianMixture._initial_model

    def spy_model(self, *args, **kwargs):
        model = initial_model(self, *args, **kwargs)
        refs["model"].append(weakref.ref(model.precisions_cholesky))
        return model

    m_step = _em.m_step

    def spy_stats(stats, *args, **kwargs):
        refs["stats"].append(weakref.ref(stats))  # its sum_xx becomes the covariances
        return m_step(stats, *args, **kwargs)

    alive = []

    def spy_pass(*args, **kwargs):
        if len(refs["stats"]) == 1:  # the second iteration's pass
            alive.append((refs["model"][0]() is not None,
                          refs["stats"][0]() is not None))
        return statistics_pass(*args, **kwargs)

    statistics_pass = gaussian_mixture.rows_statistics_pass
    monkeypatch.setattr(GaussianMixture, "_initial_model", spy_model)
    monkeypatch.setattr(_em, "m_step", spy_stats)
    monkeypatch.setattr(gaussian_mixture, "rows_statistics_pass", spy_pass)
    X = np.random.default_rng(0).normal(size=(3000, 5))
    GaussianMixture(3, max_iter=3, tol=0, random_state=0, n_jobs=n_jobs).fit(X)
    assert alive == [(False, False)]


def _loky_workers():
    workers = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "loky" in cmdline and "resource_tracker" not in cmdline:
            workers.append(child)
    return workers


@pytest.mark.slow
@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # fits of 2 and 3 iterations
@pytest.mark.parametrize("memory", ["tight", "plenty"])
def test_case_c21_worker_killed_for_memory_is_named_as_the_cause(
        tmp_path, monkeypatch, memory):
    """Workers SIGKILLed in the middle of a pass, as the out-of-memory killer does.

    (Workers killed while idle between two passes are replaced by joblib without
    losing work, so the kill comes from the progress callback of the second pass,
    after its first of 40 tasks: the others are still running or queued.) The
    message blames the out-of-memory killer when the fit's estimate is a fair part
    of the memory available ("tight": 1 MiB available); with far more available,
    it names the likelier causes.
    """
    if memory == "tight":
        # the machine as the message sees it after the kill: 1 MiB available (the
        # fit's own check takes memory_limit instead)
        meminfo = tmp_path / "meminfo"
        meminfo.write_text("MemTotal: 4096 kB\nMemAvailable: 1024 kB\n")
        monkeypatch.setattr(emgmm_memory, "MEMINFO", str(meminfo))
    temp = tmp_path / "joblib-temp"
    temp.mkdir()
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(temp))
    X = np.random.default_rng(0).normal(size=(200_000, 8))
    gm = GaussianMixture(2, random_state=0, max_iter=2).fit(X[:1000])
    before = {name: getattr(gm, name).copy() for name in PARAMS}
    before_bounds = list(gm.lower_bounds_)
    killed = []

    def kill_workers():
        workers = _loky_workers()
        for worker in workers:
            os.kill(worker.pid, signal.SIGKILL)
        killed.extend(psutil.wait_procs(workers, timeout=10)[0])

    class KillDuringSecondPass:
        wants_progress = True
        passes_done = 0

        def __call__(self, record):
            if record["event"] == "iteration":
                self.passes_done += 1
            elif self.passes_done == 1 and record["done"] == 1 and not killed:
                kill_workers()

    gm.set_params(n_jobs=2, max_iter=3, tol=0.0, block_size=5000,
                  memory_limit=4096, callback=KillDuringSecondPass())
    with pytest.raises(MemoryError) as info:
        gm.fit(X)
    assert killed
    message = str(info.value)
    if memory == "tight":
        assert "likely cause is the operating system's out-of-memory killer" in message
    else:
        assert "far below the memory available now" in message
        assert "out-of-memory" not in message
    assert "MiB" in message and "n_jobs" in message
    assert info.value.__cause__ is not None
    # previous fitted state kept, temporary files removed
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(gm, name), value)
    assert gm.lower_bounds_ == before_bounds
    assert list(temp.iterdir()) == [], list(temp.iterdir())
    # and the next fit works
    gm.set_params(callback=None, max_iter=2).fit(X[:20_000])
    assert_valid_model(gm)
