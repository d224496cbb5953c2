"""Issue 29.1: ``n_jobs=1`` keeps the fit on one core: one BLAS thread while it
runs (threadpoolctl's threadpool_info inside the fit), the limit restored after."""

import joblib
import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import emgmm


def _blas_threads():
    return [info["num_threads"] for info in threadpool_info()
            if info["user_api"] == "blas"]


def _threads_seen_in(method, **params):
    seen = []

    def callback(info):
        seen.append(_blas_threads())

    X = np.random.default_rng(0).standard_normal((20000, 32))
    gm = emgmm.GaussianMixture(5, max_iter=2, tol=0, random_state=0, callback=callback,
                               **params)
    with pytest.warns(Warning):  # (not converged in 2 iterations)
        gm.fit(X)
    return seen


@pytest.fixture
def two_blas_threads():
    if not _blas_threads():
        pytest.skip("no BLAS loaded")
    with threadpool_limits(limits=2, user_api="blas"):
        if max(_blas_threads()) < 2:
            pytest.skip("BLAS runs one thread here")
        yield


def test_n_jobs_1_runs_one_blas_thread(two_blas_threads):
    seen = _threads_seen_in("fit", n_jobs=1)
    assert seen and all(threads == [1] * len(threads) for threads in seen), seen
    assert max(_blas_threads()) == 2  # restored after the fit


def test_parallel_config_n_jobs_1_runs_one_blas_thread(two_blas_threads):
    with joblib.parallel_config(n_jobs=1):
        seen = _threads_seen_in("fit")
    assert seen and all(threads == [1] * len(threads) for threads in seen), seen
