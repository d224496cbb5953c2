"""The same fit on a Dask cluster: ``with joblib.parallel_config(backend="dask")``.

A ``dask.distributed.LocalCluster`` with two worker processes (one thread each) reads
file-backed data (HDF5 and .npy on a path the workers can read) and must give the
model of the local fit.
"""

import os
import tempfile
import warnings

import h5py
import joblib
import numpy as np
import pytest
from helpers import make_blobs_data, not_converging
from numpy.testing import assert_allclose, assert_array_equal

from emgmm import GaussianMixture
from emgmm._io.sources import as_source
from emgmm._runtime.executor import Executor

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

STATE = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


def where(source, start, stop, *, blas_threads):
    """A task: the process that read rows start:stop, their sum, the BLAS limit."""
    return os.getpid(), float(source.read(start, stop).sum()), blas_threads


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    # LocalCluster leaves its workers' settings in os.environ (OPENBLAS_NUM_THREADS=1,
    # MALLOC_TRIM_THRESHOLD_, ...): the tests after this module must not inherit them
    environ = dict(os.environ)
    # dask's scratch space in the test's folder, not <tmp>/dask-scratch-space: the
    # workers' local_directory, and the configuration for anything else that makes one
    folder = str(tmp_path_factory.mktemp("dask-scratch"))
    scratch = dask.config.set({"temporary-directory": folder})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dashboard port, etc.
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                                           processes=True, dashboard_address=None,
                                           local_directory=folder)
        client = distributed.Client(cluster)
    client.scratch_folder = folder
    try:
        yield client
    finally:
        client.close()
        cluster.close()
        scratch.__exit__(None, None, None)
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    X = make_blobs_data(2000, 4, 3, seed=7)
    folder = tmp_path_factory.mktemp("dask")
    np.save(folder / "x.npy", X)
    with h5py.File(folder / "x.h5", "w") as f:
        f.create_dataset("data/x", data=X, chunks=(250, 4), compression="gzip")
    return X, str(folder / "x.npy"), f"{folder / 'x.h5'}:/data/x"


@pytest.mark.slow
def test_executor_on_dask(client, files):
    X, npy, _ = files
    with joblib.parallel_config(backend="dask"):
        executor = Executor(as_source(npy), None)
        assert executor.n_workers == 2  # the cluster's threads
        assert executor.blas_threads >= 1
        with executor:
            assert executor.uses_threads is False
            out = list(executor.map(where, [(s, s + 250) for s in range(0, 2000, 250)]))
    assert [s for _, s, _ in out] == [float(X[s:s + 250].sum()) for s in range(0, 2000,
                                                                               250)]
    worker_pids = set(client.run(os.getpid).values())
    assert {pid for pid, _, _ in out} <= worker_pids
    assert os.getpid() not in {pid for pid, _, _ in out}


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_fit_on_local_cluster_equals_local_fit(client, files, schedule):
    X, npy, h5 = files
    kw = dict(n_components=3, random_state=0, block_size=250, max_iter=5, tol=0,
              schedule=schedule)
    with not_converging():  # tol=0
        local = GaussianMixture(**kw, n_jobs=1).fit(X)
        with joblib.parallel_config(backend="dask"):
            fits = [GaussianMixture(**kw).fit(npy), GaussianMixture(**kw).fit(h5)]
    for got in fits:
        # each task runs with one BLAS thread on the cluster and locally alike here
        # (d=4), so the results are bitwise equal
        for name in STATE:
            assert_array_equal(getattr(got, name), getattr(local, name), err_msg=name)
        assert_allclose(got.lower_bounds_, local.lower_bounds_, rtol=0)
        assert_array_equal(got.predict(X), local.predict(X))


def test_the_cluster_leaves_no_scratch_space_in_the_temporary_folder(client):
    """Every worker's scratch space is in the test's folder: nothing named
    dask-scratch-space is created in the temporary folder (it was left there)."""
    folders = client.run(lambda dask_worker: dask_worker.local_directory)
    assert folders and all(path.startswith(client.scratch_folder + os.sep)
                           for path in folders.values()), folders
    assert not any(path.startswith(os.path.join(tempfile.gettempdir(),
                                                "dask-scratch-space"))
                   for path in folders.values())
