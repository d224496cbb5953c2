"""Issue 28.1: errors classified by what can be checked (the file's signature and
size, a retry with HDF5 file locking off, the .npy header), never by words of
another library's message."""

import numpy as np
import pytest

from emgmm import GaussianMixture
from emgmm.io.sources import as_source

h5py = pytest.importorskip("h5py")


def _hdf5_bytes(tmp_path):
    path = tmp_path / "good.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.random.default_rng(0).standard_normal((100, 3))
    return bytearray(path.read_bytes())


def _damaged(tmp_path, how):
    raw = _hdf5_bytes(tmp_path)
    if how == "superblock-version":  # h5py: "bad superblock version number"
        raw[8] = 7
    elif how == "eof-address":
        raw[40:56] = b"\xff" * 16
    elif how == "truncated":
        raw = raw[: len(raw) // 2]
    path = tmp_path / f"{how}.h5"
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("how", ["superblock-version", "eof-address", "truncated"])
def test_damaged_hdf5_file_is_not_called_locked(tmp_path, how):
    path = _damaged(tmp_path, how)
    with pytest.raises(OSError) as info:
        as_source(f"{path}:/x")
    message = str(info.value)
    assert "HDF5_USE_FILE_LOCKING" not in message and "locked" not in message
    assert str(path) in message
    assert "damaged or truncated" in message
    assert f"{path.stat().st_size} bytes" in message


def test_hdf5_error_from_fit_names_the_damage(tmp_path):
    path = _damaged(tmp_path, "superblock-version")
    with pytest.raises(OSError, match="damaged or truncated"):
        GaussianMixture(2).fit(f"{path}:/x")


def test_file_without_hdf5_signature_given_as_a_dataset(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("not hdf5 at all\n" * 100)
    with pytest.raises(OSError, match="no HDF5 signature") as info:
        as_source(f"{path}:/x")
    assert "HDF5_USE_FILE_LOCKING" not in str(info.value)


def test_object_npy_for_init_array_is_told_by_its_header(tmp_path, monkeypatch):
    """The CLI tells an object array by the .npy header's dtype, not by numpy's
    words ('allow_pickle')."""
    from emgmm.cli import command as cli

    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)

    def load_fails_otherwise(*args, **kwargs):
        raise ValueError("some other wording of numpy's")

    monkeypatch.setattr(np, "load", load_fails_otherwise)
    with pytest.raises(cli.CommandError, match="holds Python objects, not numbers"):
        cli._load_init_array(str(path), "--means-init")


def test_missing_dataset_message_is_not_a_quoted_repr(tmp_path):
    """29.6: a KeyError's str() is the repr of its argument ("'...'" quoted twice);
    the missing-dataset error prints as its message."""
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((10, 2))
    with pytest.raises(KeyError) as info:
        as_source(f"{path}:/missing")
    assert str(info.value) == f"HDF5 file {path} has no dataset '/missing'."
