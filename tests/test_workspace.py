"""The per-thread work buffers (emgmm._runtime.workspace): lending rules, and fits that
reuse buffers holding stale values equal fits that allocate every array afresh,
bitwise."""

import threading

import numpy as np
import pytest
from helpers import make_blobs_data, not_converging
from numpy.testing import assert_array_equal

import emgmm._runtime.workspace as workspace
from emgmm import GaussianMixture


def test_borrow_without_a_workspace_lends_fresh_arrays():
    with workspace.borrow("a", (3, 4), np.float32, "F") as a, \
            workspace.borrow("a", (3, 4)) as b:
        assert a.shape == (3, 4) and a.dtype == np.float32 and a.flags.f_contiguous
        assert b.dtype == np.float64 and b.flags.c_contiguous
        assert not np.shares_memory(a, b)


def test_a_name_is_lent_to_one_user_at_a_time_and_kept_between_uses():
    def lend():
        with workspace.borrow("x", (100, 7)) as first:
            first[...] = 1.0
        with workspace.borrow("x", (50, 7), order="F") as again, \
                workspace.borrow("x", (10,)) as nested, \
                workspace.borrow("y", (100, 7)) as other:
            # the buffer is reused (a smaller array over its start) ...
            assert np.shares_memory(again, first)
            assert again.flags.f_contiguous and again.flags.writeable
            # ... but never lent twice at once, nor under another name
            assert not np.shares_memory(nested, again)
            assert not np.shares_memory(other, again)
        with workspace.borrow("x", (300, 7)) as grown:
            grown[...] = 2.0  # a larger buffer: writable to its end
            assert grown.shape == (300, 7)
        return True

    assert workspace.per_thread(lend)()


def test_threads_get_workspaces_of_their_own():
    barrier = threading.Barrier(2)
    lent = []

    def hold():
        with workspace.borrow("x", (1000,)) as a:
            a[...] = threading.get_ident()
            barrier.wait()  # both threads hold their buffer now
            lent.append(a.copy())
            barrier.wait()

    run = workspace.per_thread(hold)
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lent) == 2
    for values in lent:
        assert np.unique(values).size == 1  # not overwritten by the other thread
    assert lent[0][0] != lent[1][0]


def _fit(X, **params):
    kw = dict(n_components=8, random_state=0, max_iter=5, tol=0.0, block_size=300,
              n_jobs=1)
    kw.update(params)
    with not_converging():  # tol=0
        est = GaussianMixture(**kw).fit(X)
    return est, est.predict_proba(X), est.score_samples(X)


@pytest.mark.parametrize("compute_dtype", ["float64", "float32"])
@pytest.mark.parametrize("resp_threshold", [1e-20, 0.0])
def test_fits_over_reused_buffers_equal_fresh_arrays_bitwise(compute_dtype,
                                                            resp_threshold,
                                                            monkeypatch):
    # blocks of 300 rows and a last one of 100 (smaller views of the buffers);
    # separated clusters: refined pairs, gathered and packed statistics
    X = make_blobs_data(1000, 6, 8, seed=5)
    params = dict(compute_dtype=compute_dtype, resp_threshold=resp_threshold)
    # lent arrays full of NaN: a kernel that read a borrowed buffer before writing
    # it would change the fit
    monkeypatch.setattr(workspace, "FILL", np.nan)
    reused = _fit(X, **params)
    monkeypatch.setattr(workspace, "REUSE", False)
    fresh = _fit(X, **params)
    for name in ("weights_", "means_", "precisions_cholesky_", "lower_bounds_"):
        assert_array_equal(getattr(reused[0], name), getattr(fresh[0], name), name)
    assert_array_equal(reused[1], fresh[1])
    assert_array_equal(reused[2], fresh[2])
