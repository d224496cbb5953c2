"""HDF5 read by worker processes: an open h5py.Dataset passed to a fit with process
workers, compressed chunks read concurrently after the parent read, and the file
locking of parent and workers (CASES.md C22-C24).
"""

import hashlib
import os
import pickle
import subprocess
import sys
import textwrap

import h5py
import joblib
import numpy as np
import pytest
from helpers import assert_same_state, make_blobs_data, quiet_fit
from numpy.testing import assert_array_equal

import emgmm._runtime.executor as parallel
from emgmm import GaussianMixture
from emgmm._io.sources import as_source


def test_case_c22_open_h5py_dataset_fits_with_process_workers(tmp_path):
    X = make_blobs_data(1000, 3, 3, seed=5)
    path = tmp_path / "c22.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/x", data=X)
    ref = quiet_fit(GaussianMixture(3, random_state=0, n_jobs=1, block_size=128), X)
    with h5py.File(path, "r") as f:
        ds = f["data/x"]
        with pytest.raises(TypeError):
            pickle.dumps(ds)  # why the workers must open the file themselves
        got = quiet_fit(GaussianMixture(3, random_state=0, n_jobs=2, block_size=128),
                        ds)
        assert ds.id.valid and ds[0, 0] == X[0, 0]  # the user's handle still works
    assert_same_state(got, ref)


def checksum_task(source, start, stop, *, blas_threads):
    return os.getpid(), hashlib.sha256(source.read(start, stop).tobytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["loky", "multiprocessing"])
def test_case_c23_compressed_hdf5_read_concurrently_after_parent_read(tmp_path,
                                                                      backend):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 8))
    path = tmp_path / "c23.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=X, chunks=(256, 8), compression="gzip")
    ranges = [(s, min(s + 2500, 20_000)) for s in range(0, 20_000, 2500)]
    with h5py.File(path, "r") as parent:
        head = parent["x"][100:300]  # the parent has read before the workers start
        assert_array_equal(head, X[100:300])
        serial = [hashlib.sha256(parent["x"][s:e].tobytes()).hexdigest()
                  for s, e in ranges]
        source = as_source(f"{path}:/x")
        source.read(0, 10)  # and the source's own handle is open in the parent
        pids = set()
        with joblib.parallel_config(backend=backend):
            with parallel.Executor(source, 2) as executor:
                assert executor.n_workers == 2
                for _ in range(50):
                    out = list(executor.map(checksum_task, ranges))
                    pids |= {pid for pid, _ in out}
                    assert [c for _, c in out] == serial
        source.close()
    assert os.getpid() not in pids


def env_task(source, *, blas_threads):
    return os.getpid(), os.environ.get("HDF5_USE_FILE_LOCKING")


def test_case_c24_workers_open_while_parent_holds_file(tmp_path):
    X = make_blobs_data(1500, 4, 3, seed=6)
    path = tmp_path / "c24.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=X, chunks=(100, 4))
    ref = quiet_fit(GaussianMixture(3, random_state=0, block_size=100), X)
    with h5py.File(path, "r") as held:
        for _ in range(3):
            got = quiet_fit(GaussianMixture(3, random_state=0, block_size=100,
                                            n_jobs=2),
                            f"{path}:/x")
            assert_same_state(got, ref)
        assert_array_equal(held["x"][:5], X[:5])
        # one locking setting for parent and workers
        with parallel.Executor(as_source(f"{path}:/x"), 2) as executor:
            settings = set(v for _, v in executor.map(env_task, [()] * 4))
        assert settings == {os.environ.get("HDF5_USE_FILE_LOCKING")}


WRITER = textwrap.dedent("""
    import sys, time, h5py
    f = h5py.File(sys.argv[1], "a")
    print("open", flush=True)
    sys.stdin.readline()
    f.close()
""")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE",
                    reason="file locking disabled in this environment")
def test_case_c24_lock_failure_names_hdf5_use_file_locking(tmp_path):
    path = tmp_path / "locked.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.ones((100, 2)))
    source = as_source(f"{path}:/x")  # opened before the writer: workers will fail
    source.close()
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="TRUE")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        with pytest.raises(OSError, match="HDF5_USE_FILE_LOCKING"):
            GaussianMixture(2, n_jobs=2).fit(f"{path}:/x")
        with pytest.raises(OSError, match="HDF5_USE_FILE_LOCKING"):
            with parallel.Executor(source, 2) as executor:
                list(executor.map(checksum_task, [(0, 50), (50, 100)]))
    finally:
        writer.communicate("close\n", timeout=30)
        writer.stdout.close()  # (left open, its pipe is a ResourceWarning)
    # after the writer closed the file, the fit works (one component: the data
    # are constant rows)
    quiet_fit(GaussianMixture(1, n_jobs=2, random_state=0), f"{path}:/x")
