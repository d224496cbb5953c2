"""Shared fixtures for the emgmm test-suite.

Everything here is generic: data generators and a helper that writes one array to every
kind of source emgmm accepts, so that any test file can check "same result whatever the
source".

Source kinds (see ``SOURCE_KINDS``):

``ndarray``     the array itself (in memory)
``memmap``      ``np.memmap`` of a raw ``.dat`` file opened read-only
``npy``         the path (``str``) of a ``.npy`` file
``npy_path``    the same ``.npy`` file as a ``pathlib.Path``
``h5``          an open, read-only ``h5py.Dataset`` stored contiguously
``h5_chunked``  an open, read-only ``h5py.Dataset`` chunked by rows (``(64, d)`` by default)
``h5_string``   the string ``"file.h5:/group/ds"`` naming the chunked dataset
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import h5py
import joblib
import numpy as np
import pytest

SOURCE_KINDS = ("ndarray", "memmap", "npy", "npy_path", "h5", "h5_chunked", "h5_string")
FILE_KINDS = tuple(k for k in SOURCE_KINDS if k != "ndarray")
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def make_blobs_data(
    n_samples=600,
    n_features=3,
    n_centers=3,
    *,
    spread=6.0,
    seed=0,
    dtype=np.float64,
):
    """Well separated Gaussian blobs with random anisotropic covariances.

    Deterministic for a given ``seed``; returns an ``(n_samples, n_features)`` C-contiguous
    array of ``dtype``.
    """
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=spread, size=(n_centers, n_features))
    labels = rng.integers(n_centers, size=n_samples)
    X = np.empty((n_samples, n_features))
    for k in range(n_centers):
        A = rng.normal(size=(n_features, n_features)) / np.sqrt(n_features)
        A += np.eye(n_features)
        idx = labels == k
        X[idx] = centers[k] + rng.normal(size=(idx.sum(), n_features)) @ A
    return np.ascontiguousarray(X, dtype=dtype)


def random_spd(rng, n_features, *, cond=10.0):
    """A random symmetric positive definite matrix with condition number ``cond``."""
    Q, _ = np.linalg.qr(rng.normal(size=(n_features, n_features)))
    eig = np.geomspace(1.0, cond, n_features) / np.sqrt(cond)
    M = (Q * eig) @ Q.T
    return (M + M.T) / 2


@dataclasses.dataclass
class Source:
    """One way of handing the same array to emgmm."""

    kind: str
    obj: object  # what is passed to fit / predict
    path: Path | None = None  # backing file, if any

    def __repr__(self):  # short ids in assertion messages
        return f"Source({self.kind})"


class SourceFactory:
    """Writes arrays to files under ``tmp_path`` and opens them as emgmm sources.

    Every ``h5py.File`` it opens is closed at teardown.
    """

    def __init__(self, tmp_path: Path):
        self.tmp_path = Path(tmp_path)
        self._files = []
        self._counter = 0

    def _stem(self, name):
        self._counter += 1
        return self.tmp_path / f"{name}{self._counter}"

    def __call__(self, X, kinds=SOURCE_KINDS, *, chunk_rows=64, name="X"):
        """Return a list of ``Source`` holding ``X`` in each of ``kinds``."""
        X = np.asarray(X)
        unknown = set(kinds) - set(SOURCE_KINDS)
        if unknown:
            raise ValueError(f"unknown source kinds {sorted(unknown)}")
        stem = self._stem(name)
        out = []
        npy = stem.with_suffix(".npy")
        h5 = stem.with_suffix(".h5")
        if any(k in kinds for k in ("npy", "npy_path")):
            np.save(npy, X)
        if any(k.startswith("h5") for k in kinds):
            with h5py.File(h5, "w") as f:
                f.create_dataset("contiguous", data=X)
                chunks = (max(1, min(chunk_rows, X.shape[0])),) + X.shape[1:]
                f.create_dataset("group/chunked", data=X, chunks=chunks)
        for kind in kinds:
            if kind == "ndarray":
                out.append(Source(kind, X.copy()))
            elif kind == "memmap":
                dat = stem.with_suffix(".dat")
                mm = np.memmap(dat, dtype=X.dtype, mode="w+", shape=X.shape)
                mm[...] = X
                mm.flush()
                del mm
                out.append(
                    Source(kind, np.memmap(dat, dtype=X.dtype, mode="r", shape=X.shape), dat)
                )
            elif kind == "npy":
                out.append(Source(kind, str(npy), npy))
            elif kind == "npy_path":
                out.append(Source(kind, npy, npy))
            elif kind in ("h5", "h5_chunked"):
                f = h5py.File(h5, "r")
                self._files.append(f)
                ds = f["contiguous"] if kind == "h5" else f["group/chunked"]
                out.append(Source(kind, ds, h5))
            elif kind == "h5_string":
                out.append(Source(kind, f"{h5}:/group/chunked", h5))
        return out

    def one(self, X, kind, **kwargs):
        """A single ``Source`` of ``kind`` holding ``X``."""
        return self(X, (kind,), **kwargs)[0]

    def close(self):
        for f in self._files:
            try:
                f.close()
            except Exception:  # pragma: no cover - already closed
                pass
        self._files.clear()


def file_fingerprint(path):
    """Bytes and modification time of a file (to prove it was not modified)."""
    path = Path(path)
    st = os.stat(path)
    return path.read_bytes(), st.st_mtime_ns, st.st_size


@pytest.fixture
def make_sources(tmp_path):
    """Factory: ``make_sources(X, kinds=SOURCE_KINDS, chunk_rows=64)`` -> list of Source."""
    factory = SourceFactory(tmp_path)
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def blobs():
    """600 x 3 float64, three well separated anisotropic blobs (read-only)."""
    X = make_blobs_data(600, 3, 3, seed=0)
    X.setflags(write=False)
    return X


@pytest.fixture(scope="session")
def blobs_small():
    """200 x 2 float64, three blobs (read-only)."""
    X = make_blobs_data(200, 2, 3, seed=1)
    X.setflags(write=False)
    return X


@pytest.fixture(params=COVARIANCE_TYPES)
def covariance_type(request):
    return request.param


@pytest.fixture
def temp_folder(tmp_path):
    """joblib's temporary folder for the test (joblib's and emgmm's files)."""
    folder = tmp_path / "joblib_tmp"
    folder.mkdir()
    with joblib.parallel_config(temp_folder=str(folder)):
        yield folder
