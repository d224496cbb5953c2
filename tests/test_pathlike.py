"""Every path-like is taken where a ``str`` path is (data, model files,
checkpoints, the temp_folder)."""

import os
import pathlib

import numpy as np
import pytest

import emgmm
from emgmm._io.model_file import read_header, save_model
from emgmm._mixture.loading import load_model
from emgmm._runtime import executor as _parallel


class OtherPath(os.PathLike):
    """A path-like that is not a pathlib.Path."""

    def __init__(self, path):
        self._path = str(path)

    def __fspath__(self):
        return self._path


@pytest.mark.parametrize("wrap", [pathlib.Path, OtherPath])
def test_joblib_temp_folder_given_as_a_path(tmp_path, wrap, monkeypatch):
    folder = tmp_path / "joblib-temp"
    folder.mkdir()
    monkeypatch.delenv("JOBLIB_TEMP_FOLDER", raising=False)
    assert _parallel.joblib_temp_folder(wrap(folder)) == str(folder)
    assert _parallel.joblib_temp_folder(str(folder)) == str(folder)
    assert _parallel.Executor(None, 2, wrap(folder)).temp_folder == str(folder)


def test_fit_shares_x_in_a_path_temp_folder(tmp_path):
    """X is written for the workers into the pathlib.Path temp_folder (seen there
    from the callback, during the fit) and removed afterwards."""
    folder = tmp_path / "joblib-temp"
    folder.mkdir()
    seen = []

    def in_folder(record):
        seen.extend(path.relative_to(folder).parts[0] for path in folder.rglob("*")
                    if path.is_file())

    X = np.random.default_rng(0).standard_normal((2000, 3))
    emgmm.GaussianMixture(2, n_jobs=2, max_iter=3, tol=1e3, random_state=0,
                          temp_folder=pathlib.Path(folder), callback=in_folder).fit(X)
    assert seen and all(name.startswith(_parallel.TEMP_PREFIX) for name in seen), seen
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("wrap", [pathlib.Path, OtherPath])
def test_path_likes_for_data_models_and_checkpoints(tmp_path, wrap):
    X = np.random.default_rng(0).standard_normal((300, 2))
    np.save(tmp_path / "x.npy", X)
    gm = emgmm.GaussianMixture(2, random_state=0, max_iter=3, tol=1e3,
                               checkpoint=wrap(tmp_path / "c.npz"))
    gm.fit(wrap(tmp_path / "x.npy"))
    save_model(gm, wrap(tmp_path / "m.h5"))
    assert read_header(wrap(tmp_path / "m.h5"))["n_components"] == 2
    again = load_model(wrap(tmp_path / "m.h5"))
    np.testing.assert_array_equal(again.predict(wrap(tmp_path / "x.npy")),
                                  gm.predict(X))
