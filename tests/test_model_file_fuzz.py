"""Every way a damaged model file can fail to load raises
ModelFileError naming the file and what is wrong (load_model, read_header and
``emgmm info``): truncation at many offsets, overwritten bytes, replaced datasets,
attributes of the wrong type."""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import emgmm
from emgmm._io.model_file import ModelFileError, read_header, save_model
from emgmm._mixture.loading import load_model


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory):
    X = np.random.default_rng(0).standard_normal((200, 3))
    path = tmp_path_factory.mktemp("model") / "m.h5"
    gm = emgmm.GaussianMixture(2, random_state=0, means_init=X[:2]).fit(X)
    save_model(gm, path)
    return path.read_bytes()


def _loads_or_model_file_error(path):
    """load_model and read_header either succeed (a damage HDF5 cannot see, in the
    numbers of a valid mixture) or raise ModelFileError naming the file."""
    for read in (read_header, load_model):
        try:
            read(path)
        except ModelFileError as exc:
            assert str(path) in str(exc), str(exc)
        # anything else propagates and fails the test


def test_truncated_at_many_offsets(tmp_path, model_bytes):
    offsets = np.unique(np.linspace(0, len(model_bytes) - 1, 60).astype(int))
    for cut in offsets:
        path = tmp_path / f"cut{cut}.h5"
        path.write_bytes(model_bytes[:cut])
        with pytest.raises(ModelFileError, match=str(path)):
            load_model(path)
        with pytest.raises(ModelFileError, match=str(path)):
            read_header(path)


@pytest.mark.slow
def test_overwritten_bytes(tmp_path, model_bytes):
    rng = np.random.default_rng(1)
    for trial in range(150):
        raw = bytearray(model_bytes)
        start = int(rng.integers(0, len(raw)))
        length = int(rng.integers(1, 64))
        raw[start:start + length] = rng.integers(0, 256, length,
                                                 dtype=np.uint8).tobytes()
        path = tmp_path / f"over{trial}.h5"
        path.write_bytes(bytes(raw[:len(model_bytes)]))
        _loads_or_model_file_error(path)


def _replace_dataset(f, name, value):
    del f[name]
    if value == "group":
        f.create_group(name)
    elif value == "strings":
        f.create_dataset(name, data=["a", "b"], dtype=h5py.string_dtype())
    elif value == "scalar":
        f[name] = 1.5
    elif value == "wrong-shape":
        f[name] = np.ones((7, 5))
    elif value == "compound":
        f[name] = np.zeros(2, dtype=[("a", "f8"), ("b", "i4")])


@pytest.mark.parametrize("name", ["weights", "means", "precisions_cholesky",
                                  "fit/lower_bounds", "feature_names_in", "params",
                                  "fit"])
@pytest.mark.parametrize("value", ["group", "strings", "scalar", "wrong-shape",
                                   "compound"])
def test_replaced_datasets(tmp_path, model_bytes, name, value):
    path = tmp_path / "m.h5"
    path.write_bytes(model_bytes)
    with h5py.File(path, "r+") as f:
        if name == "feature_names_in" or name not in f:
            f.create_dataset(name, data=["a", "b", "c"], dtype=h5py.string_dtype())
        _replace_dataset(f, name, value)
    if name == "params" and value == "group":
        load_model(path)  # (an empty group of array parameters: a valid file)
        return
    with pytest.raises(ModelFileError, match=str(path)):
        load_model(path)


@pytest.mark.parametrize("where,attr", [
    ("/", "n_components"), ("/", "n_features_in"), ("/", "covariance_type"),
    ("/", "params"), ("/", "params_dropped"), ("/", "emgmm_version"),
    ("/", "attributes_dtype"), ("/", "format_version"), ("fit", "n_iter"),
    ("fit", "converged"), ("fit", "lower_bound")])
@pytest.mark.parametrize("value", [np.array([1.0, 2.0]), "text", '{"a": [1, 2',
                                   -3, np.float64(np.nan)])
def test_attributes_of_the_wrong_type(tmp_path, model_bytes, where, attr, value):
    path = tmp_path / "m.h5"
    path.write_bytes(model_bytes)
    with h5py.File(path, "r+") as f:
        f[where].attrs[attr] = value
    if ((attr == "emgmm_version" and isinstance(value, str))
            or (attr == "lower_bound" and isinstance(value, int))):
        assert load_model(path).n_components == 2  # a valid value of its kind
        return
    with pytest.raises(ModelFileError, match=str(path)):
        load_model(path)


def test_missing_attributes(tmp_path, model_bytes):
    with h5py.File(tmp_path / "probe.h5", "w"):
        pass
    for where, attr in [("/", "n_components"), ("/", "params"), ("fit", "n_iter"),
                        ("/", "covariance_type")]:
        path = tmp_path / f"{attr}.h5"
        path.write_bytes(model_bytes)
        with h5py.File(path, "r+") as f:
            del f[where].attrs[attr]
        with pytest.raises(ModelFileError, match=str(path)):
            load_model(path)


@pytest.mark.slow
def test_cli_info_on_damaged_files_is_one_line(tmp_path, model_bytes):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cases = []
    path = tmp_path / "cut.h5"
    path.write_bytes(model_bytes[: len(model_bytes) // 2])
    cases.append(path)
    path = tmp_path / "attr.h5"
    path.write_bytes(model_bytes)
    with h5py.File(path, "r+") as f:
        f.attrs["n_components"] = "two"
    cases.append(path)
    for path in cases:
        out = subprocess.run([sys.executable, "-m", "emgmm", "info", str(path)],
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 1, out.stderr
        assert out.stderr.startswith("emgmm info: error: ") and str(path) in out.stderr
        assert "Traceback" not in out.stderr
