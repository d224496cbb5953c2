"""Shared fixtures for the emgmm test-suite (the helpers they use are in
``helpers.py``).
"""

import gc

import pytest
from helpers import COVARIANCE_TYPES, SourceFactory, make_blobs_data


@pytest.fixture(scope="session", autouse=True)
def freeze_the_imports():
    """Keep the objects alive when the tests start (the imported libraries) out of
    the collections after each test: a full collection of that heap took ~0.1 s."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def collect_garbage():
    """Run the garbage collector after every test, so that an object a test leaves
    unclosed (a file, a memory map) warns in that test's teardown, where
    ``filterwarnings = error`` fails the test that leaked it, and not in whichever
    later test the collector happens to run in."""
    yield
    gc.collect()


@pytest.fixture
def make_sources(tmp_path):
    """Factory: ``make_sources(X, kinds=SOURCE_KINDS, chunk_rows=64)``.

    Returns a list of Source.
    """
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
def temp_folder(tmp_path, monkeypatch):
    """joblib's temporary folder for the test (joblib's and emgmm's files), set by
    ``JOBLIB_TEMP_FOLDER`` as a user without a ``temp_folder`` parameter would."""
    folder = tmp_path / "joblib_tmp"
    folder.mkdir()
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(folder))
    return folder
