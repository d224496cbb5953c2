"""HDF5 model files: round trips, metadata, atomic writes and bad files."""

import json
import os
import pickle
import re
import shutil
import warnings

import h5py
import joblib
import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    SKLEARN_COVARIANCE_TYPES,
    make_blobs_data,
    type_settings,
)

import emgmm
from emgmm._io.model_file import (
    FORMAT_NAME,
    FORMAT_VERSION,
    ModelFileError,
    read_header,
    save_model,
)
from emgmm._mixture.loading import load_model


def _fit(X, covariance_type, **kwargs):
    return emgmm.GaussianMixture(
        3, **type_settings(covariance_type, X.shape[1]), random_state=0, **kwargs
    ).fit(X)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_round_trip_gives_identical_predictions(tmp_path, blobs, covariance_type):
    model = _fit(blobs, covariance_type)
    path = tmp_path / "model.h5"
    save_model(model, path)
    loaded = load_model(path)

    assert type(loaded) is emgmm.GaussianMixture
    np.testing.assert_array_equal(loaded.predict(blobs), model.predict(blobs))
    np.testing.assert_array_equal(loaded.predict_proba(blobs),
                                  model.predict_proba(blobs))
    np.testing.assert_array_equal(loaded.score_samples(blobs),
                                  model.score_samples(blobs))
    for name in ("weights_", "means_", "precisions_cholesky_"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(model, name))
    # recomputed from the Cholesky factor, checked against the fitted values
    np.testing.assert_allclose(loaded.covariances_, model.covariances_, rtol=1e-10)
    np.testing.assert_allclose(loaded.precisions_, model.precisions_, rtol=1e-10)
    assert loaded.n_iter_ == model.n_iter_
    assert loaded.converged_ == model.converged_
    assert loaded.lower_bound_ == model.lower_bound_
    assert list(loaded.lower_bounds_) == list(model.lower_bounds_)
    assert loaded.n_features_in_ == blobs.shape[1]
    assert not hasattr(loaded, "feature_names_in_")
    assert loaded.get_params() == model.get_params()


def test_full_covariances_are_inverse_of_precisions(tmp_path, blobs):
    model = _fit(blobs, "full")
    save_model(model, tmp_path / "m.h5")
    loaded = load_model(tmp_path / "m.h5")
    for cov, prec, chol in zip(loaded.covariances_, loaded.precisions_,
                               loaded.precisions_cholesky_, strict=False):
        np.testing.assert_allclose(chol @ chol.T, prec, rtol=1e-12)
        np.testing.assert_allclose(cov @ prec, np.eye(3), atol=1e-10)
        np.testing.assert_array_equal(cov, cov.T)


def test_header_records_metadata(tmp_path, blobs):
    model = _fit(blobs, "diag", max_iter=7, tol=1e-5)
    save_model(model, tmp_path / "m.h5")
    header = read_header(tmp_path / "m.h5")
    assert header["format"] == FORMAT_NAME
    assert header["format_version"] == FORMAT_VERSION
    assert header["emgmm_version"] == emgmm.__version__
    assert header["covariance_type"] == "diag"
    assert (header["n_components"], header["n_features_in"]) == (3, 3)
    assert header["params"]["max_iter"] == 7
    assert header["params"]["tol"] == 1e-5
    assert header["n_iter"] == model.n_iter_
    with h5py.File(tmp_path / "m.h5", "r") as f:
        assert json.loads(f.attrs["params"])["random_state"] == 0
        assert f["means"].shape == (3, 3)


def test_feature_names_and_array_params_round_trip(tmp_path, blobs):
    means_init = blobs[[0, 200, 400]]
    model = _fit(blobs, "tied", means_init=means_init)
    # as set by a fit on a DataFrame with string column names
    model.feature_names_in_ = np.array(["a", "b", "é"], dtype=object)
    save_model(model, tmp_path / "m.h5")
    loaded = load_model(tmp_path / "m.h5")
    assert list(loaded.feature_names_in_) == ["a", "b", "é"]
    np.testing.assert_array_equal(loaded.means_init, means_init)
    assert loaded.weights_init is None


def test_unpicklable_params_are_dropped_and_listed(tmp_path, blobs):
    seen = []
    model = _fit(blobs, "spherical", callback=seen.append)
    assert seen, "callback was not called"
    save_model(model, tmp_path / "m.h5")
    header = read_header(tmp_path / "m.h5")
    assert header["params_dropped"] == ["callback"]
    assert load_model(tmp_path / "m.h5").callback is None


def test_checkpoint_path_is_not_stored(tmp_path, blobs):
    """The checkpoint belongs to the fit: a model file that kept it made a later
    warm start checkpoint into the old folder, or fail once that folder was gone."""
    run = tmp_path / "run1"
    run.mkdir()
    model = _fit(blobs, "diag", checkpoint=str(run / "ck.npz"))
    save_model(model, tmp_path / "m.h5")
    assert model.checkpoint == str(run / "ck.npz")  # the estimator is not changed
    assert read_header(tmp_path / "m.h5")["params"]["checkpoint"] is None
    run.rmdir()
    loaded = load_model(tmp_path / "m.h5")
    assert loaded.checkpoint is None
    loaded.set_params(warm_start=True, max_iter=2).fit(blobs)
    assert not run.exists()
    # a file written before, with the path stored: not restored either
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        params = json.loads(f.attrs["params"])
        f.attrs["params"] = json.dumps(dict(params, checkpoint=str(run / "ck.npz")))
    assert load_model(tmp_path / "m.h5").checkpoint is None


def test_failed_save_keeps_existing_file_and_leaves_no_temp(tmp_path, blobs):
    path = tmp_path / "m.h5"
    path.write_bytes(b"previous content")
    model = _fit(blobs, "full")
    model.lower_bounds_ = ["not a number"]
    with pytest.raises(ValueError):
        save_model(model, path)
    assert path.read_bytes() == b"previous content"
    assert os.listdir(tmp_path) == ["m.h5"]


def test_unfitted_estimator_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unfitted"):
        save_model(emgmm.GaussianMixture(2), tmp_path / "m.h5")
    assert os.listdir(tmp_path) == []


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load_model(tmp_path / "nope.h5")


@pytest.mark.parametrize("kind", ["text", "npy", "hdf5_data"])
def test_not_a_model_file(tmp_path, kind):
    path = tmp_path / "thing"
    if kind == "text":
        path.write_text("hello\n")
    elif kind == "npy":
        with open(path, "wb") as f:
            np.save(f, np.zeros((3, 2)))
    else:
        with h5py.File(path, "w") as f:
            f["X"] = np.zeros((3, 2))
    with pytest.raises(ModelFileError, match="not an emgmm model file"):
        load_model(path)
    assert issubclass(ModelFileError, ValueError)


def test_incompatible_format_version(tmp_path, blobs):
    save_model(_fit(blobs, "full"), tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        f.attrs["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(ModelFileError, match=f"version {FORMAT_VERSION + 1}"):
        load_model(tmp_path / "m.h5")


def test_damaged_model_file(tmp_path, blobs):
    save_model(_fit(blobs, "full"), tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        del f["means"]
    with pytest.raises(ModelFileError, match="damaged"):
        load_model(tmp_path / "m.h5")
    shutil.copy(tmp_path / "m.h5", tmp_path / "n.h5")
    with h5py.File(tmp_path / "n.h5", "r+") as f:
        f["means"] = np.zeros((2, 3))  # wrong number of components
    with pytest.raises(ModelFileError, match="inconsistent"):
        load_model(tmp_path / "n.h5")


@pytest.mark.parametrize("damage, covariance_type", [
    (damage, covariance_type)
    for covariance_type in COVARIANCE_TYPES
    for damage in ("negative_weight", "nan_mean", "zero_factor")
    # the file holds precisions_cholesky in scikit-learn's layouts
    if damage != "zero_factor" or covariance_type in SKLEARN_COVARIANCE_TYPES])
def test_model_file_with_invalid_parameters_is_refused(tmp_path, blobs,
                                                       covariance_type, damage):
    """Never a NaN model from a file: parameters that are no mixture are named."""
    save_model(_fit(blobs, covariance_type), tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        if damage == "negative_weight":
            w = f["weights"][()]
            w[0], w[1] = -w[0], w[1] + 2 * w[0]  # still sums to one
            f["weights"][...] = w
        elif damage == "nan_mean":
            m = f["means"][()]
            m[1, 0] = np.nan
            f["means"][...] = m
        else:
            u = f["precisions_cholesky"][()]
            u.reshape(-1)[0] = 0.0  # the first diagonal entry in every layout
            f["precisions_cholesky"][...] = u
    expected = {"negative_weight": "weights", "nan_mean": "means",
                "zero_factor": "precisions_cholesky"}[damage]
    with pytest.raises(ModelFileError, match=f"no valid mixture: {expected}"):
        load_model(tmp_path / "m.h5")


def _entry(covariance_type, row, col):
    """Index of entry [row, col] of component 1's factor (the tied factor for
    'tied'; a 'diag' factor is one row, a 'spherical' one a number)."""
    return {"full": (1, row, col), "tied": (row, col), "diag": (1, col),
            "spherical": (1,)}[covariance_type]


@pytest.mark.parametrize("covariance_type, damage", [
    (covariance_type, damage)
    for damage in ("lower_entry", "huge_entry", "tiny_diagonal")
    for covariance_type in SKLEARN_COVARIANCE_TYPES
    # 'diag' and 'spherical' factors are square roots of the precisions: no triangle
    if damage != "lower_entry" or covariance_type in ("full", "tied")])
def test_factor_not_upper_triangular_or_overflowing_is_refused(tmp_path, blobs,
                                                               covariance_type, damage):
    """A factor that is not the upper U of U @ U.T == precisions_ (scikit-learn's
    convention), or whose precisions or covariances overflow, is refused naming the
    component and what is wrong; a lower entry is never silently ignored."""
    save_model(_fit(blobs, covariance_type), tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        u = f["precisions_cholesky"][()]
        if damage == "lower_entry":  # finite, positive diagonal, not upper triangular
            u[_entry(covariance_type, 2, 0)] = 0.5
        elif damage == "huge_entry":  # U @ U.T overflows float64
            u[_entry(covariance_type, 0, 1)] = 1e160
        else:  # finite and positive, but the covariance overflows
            u[_entry(covariance_type, 0, 0)] = 1e-200
        f["precisions_cholesky"][...] = u
    which = re.escape("precisions_cholesky (tied)" if covariance_type == "tied"
                      else "precisions_cholesky of component 1")
    what = {"lower_entry": r"is not upper triangular: entry \[2, 0\] below the "
                           r"diagonal is 0\.5",
            "huge_entry": "has an entry of magnitude 1e\\+160: its precisions "
                          "overflow float64",
            "tiny_diagonal": "is too close to singular: its covariance .* overflows "
                             "float64"}[damage]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warnings on the way
        with pytest.raises(ModelFileError, match=f"no valid mixture: {which} {what}"):
            load_model(tmp_path / "m.h5")


def test_pickle_and_joblib_still_work(tmp_path, blobs):
    model = _fit(blobs, "full")
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.score_samples(blobs),
                                  model.score_samples(blobs))
    joblib.dump(model, tmp_path / "m.joblib")
    again = joblib.load(tmp_path / "m.joblib")
    np.testing.assert_array_equal(again.predict(blobs), model.predict(blobs))


def test_outputs_get_the_permissions_of_a_new_file(tmp_path):
    from emgmm._io.atomic import atomic_output

    old = os.umask(0o022)
    try:
        target = tmp_path / "out.bin"
        with atomic_output(target) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(b"x")
        assert (os.stat(target).st_mode & 0o777) == 0o644
    finally:
        os.umask(old)


def test_atomic_output_names_the_users_path_when_its_folder_refuses(tmp_path,
                                                                     monkeypatch):
    """An error creating the temporary file (a full or read-only file system) names
    the output the user asked for, not the hidden temporary name."""
    import tempfile

    from emgmm._io.atomic import atomic_output

    def refuse(*args, **kwargs):
        raise OSError(30, "Read-only file system", str(tmp_path / ".m.h5.x.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    target = tmp_path / "m.h5"
    with pytest.raises(OSError,
                       match="Cannot write .*m.h5 .Read-only file system") as info:
        with atomic_output(target):
            pytest.fail("no temporary file to write to")
    assert ".tmp" not in str(info.value) and info.value.errno == 30
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_model_fitted_in_float32_keeps_float32_attributes(tmp_path, covariance_type):
    """A model fitted on float32 data has float32 attributes; the file stores float64
    and load_model gives the attributes their dtype back (the values unchanged)."""
    X = make_blobs_data(400, 3, 2, seed=4).astype(np.float32)
    model = emgmm.GaussianMixture(2, covariance_type=covariance_type,
                                  random_state=0).fit(X)
    assert model.means_.dtype == np.float32
    save_model(model, tmp_path / "m.h5")
    loaded = load_model(tmp_path / "m.h5")
    for name in ("weights_", "means_", "precisions_cholesky_", "covariances_",
                 "precisions_"):
        assert getattr(loaded, name).dtype == np.float32, name
        np.testing.assert_allclose(getattr(loaded, name), getattr(model, name),
                                   rtol=1e-6, err_msg=name)
    for name in ("weights_", "means_", "precisions_cholesky_"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(model, name))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))


def test_atomic_outputs_replace_all_or_none(tmp_path):
    """A body that fails leaves every earlier file as it was and no temporary file;
    one that succeeds replaces them all."""
    from emgmm._io.atomic import atomic_outputs

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"old a")
    with pytest.raises(RuntimeError):
        with atomic_outputs([a, b]) as (ta, tb):
            with open(ta, "wb") as fh:
                fh.write(b"new a")
            raise RuntimeError("the second output failed")
    assert a.read_bytes() == b"old a" and not b.exists()
    assert sorted(os.listdir(tmp_path)) == ["a"]
    with atomic_outputs([a, b]) as (ta, tb):
        for tmp, content in ((ta, b"new a"), (tb, b"new b")):
            with open(tmp, "wb") as fh:
                fh.write(content)
    assert a.read_bytes() == b"new a" and b.read_bytes() == b"new b"
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_atomic_outputs_failed_rename_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A rename that fails (an immutable file at the second path) names that path,
    not the temporary one, stops the renames and leaves no temporary file; the first
    output was replaced, the second is as it was."""
    from emgmm._io.atomic import atomic_outputs

    a, b = tmp_path / "a", tmp_path / "b"
    b.write_bytes(b"old b")
    real = os.replace

    def replace(src, dst):
        if os.fspath(dst) == os.fspath(b):
            raise PermissionError(1, "Operation not permitted", src)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PermissionError, match=f"Cannot replace {b} ") as info:
        with atomic_outputs([a, b]) as tmps:
            for tmp in tmps:
                with open(tmp, "wb") as fh:
                    fh.write(b"new")
    assert ".tmp" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]
    assert a.read_bytes() == b"new" and b.read_bytes() == b"old b"


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate")
def test_save_model_on_a_full_file_system(tmp_path, blobs, monkeypatch):
    """The model file's space is reserved before HDF5 writes it (HDF5 meeting a full
    file system crashed the process): the error names the file, nothing is left; and
    the reserve (over 1 MiB) does not stay in the file (HDF5 cuts it back on close)."""
    import errno

    gm = _fit(blobs, "full")
    save_model(gm, tmp_path / "m.h5")
    size = os.path.getsize(tmp_path / "m.h5")
    arrays = gm.weights_.nbytes + gm.means_.nbytes + gm.precisions_cholesky_.nbytes
    assert size < arrays + 64 * 1024
    calls = []

    def full(fd, offset, length):
        calls.append(length)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    target = tmp_path / "full.h5"
    with pytest.raises(OSError, match=f"Cannot write {target}: No space left"):
        save_model(gm, target)
    assert calls and calls[0] >= 2 * arrays
    assert os.listdir(tmp_path) == ["m.h5"]
