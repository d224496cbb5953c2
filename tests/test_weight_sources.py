"""Weight sources (emgmm._io.weights): every kind reads the same checked blocks."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from emgmm._io import weights as ws
from emgmm._io.sources import MissingDatasetError

REPO_ROOT = Path(ws.__file__).resolve().parents[2]
N = 100


@pytest.fixture
def w():
    return np.random.default_rng(0).uniform(0.0, 3.0, size=N)


def _kinds(w, tmp_path):
    """(kind, object) for every way of passing ``w``; h5py handles closed by caller."""
    npy = tmp_path / "w.npy"
    np.save(npy, w)
    dat = tmp_path / "w.dat"
    offset = 16
    raw = np.memmap(dat, dtype=np.float64, mode="w+", offset=offset, shape=w.shape)
    raw[:] = w
    raw.flush()
    del raw
    h5 = tmp_path / "w.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("g/w", data=w, chunks=(16,))
    handle = h5py.File(h5, "r")
    writable = h5py.File(tmp_path / "rw.h5", "w")
    writable.create_dataset("w", data=w)
    return [
        ("ndarray", w.copy()), ("list", list(w)),
        ("memmap", np.memmap(dat, dtype=np.float64, mode="r", offset=offset,
                             shape=w.shape)),
        ("npy", str(npy)), ("npy_path", npy), ("h5_string", f"{h5}:/g/w"),
        ("h5_dataset", handle["g/w"]), ("h5_writable", writable["w"]),
    ], (handle, writable)


def test_every_kind_reads_the_same_blocks(w, tmp_path):
    kinds, handles = _kinds(w, tmp_path)
    try:
        for kind, obj in kinds:
            source = ws.as_weight_source(obj, N)
            assert source.n_samples == N, kind
            for a, b in ((0, 17), (17, 64), (64, N), (N - 1, N)):
                block = source.read(a, b)
                assert block.dtype == np.float64 and not block.flags.writeable, kind
                np.testing.assert_array_equal(block, w[a:b], err_msg=kind)
            totals = ws.check_weights(source, n_components=3)
            np.testing.assert_allclose(totals.total, w.sum(), rtol=1e-14)
            assert totals.n_positive == np.count_nonzero(w)
            source.close()
    finally:
        for f in handles:
            f.close()


def test_file_backed_sources_travel_by_reference(w, tmp_path):
    kinds, handles = _kinds(w, tmp_path)
    try:
        for kind, obj in kinds:
            if kind in ("ndarray", "list", "h5_writable"):
                continue
            source = ws.as_weight_source(obj, N)
            source.read(0, 10)  # opened here: the pickle must not carry the handle
            payload = pickle.dumps(source)
            assert len(payload) < 2000, kind  # no n-sized copy
            np.testing.assert_array_equal(pickle.loads(payload).read(30, 60), w[30:60])
        writable = ws.as_weight_source(kinds[-1][1], N)
        assert not writable.shareable
        with pytest.raises(TypeError, match="worker processes cannot read it"):
            pickle.dumps(writable)
    finally:
        for f in handles:
            f.close()


def test_integer_bool_float32_and_scalar_weights():
    ints = np.arange(N) % 4
    np.testing.assert_array_equal(ws.as_weight_source(ints, N).read(0, N), ints)
    np.testing.assert_array_equal(ws.as_weight_source(ints.astype(bool), N).read(0, N),
                                  (ints > 0).astype(float))
    f32 = (np.arange(N) / 7).astype(np.float32)
    np.testing.assert_array_equal(ws.as_weight_source(f32, N).read(0, N),
                                  f32.astype(np.float64))
    np.testing.assert_array_equal(ws.as_weight_source(2.5, N).read(10, 20),
                                  np.full(10, 2.5))
    assert ws.as_weight_source(None, N) is None


@pytest.mark.parametrize("row, value, match", [
    (7, -1.0, r"sample_weight has a negative value \(-1.0\) at row 7\b"),
    (3, np.nan, r"sample_weight has NaN at row 3\b"),
    (5, np.inf, r"sample_weight has infinity \(inf\) at row 5\b"),
])
def test_bad_values_name_the_row(row, value, match, tmp_path):
    w = np.ones(N)
    w[row] = value
    with pytest.raises(ValueError, match=match):
        ws.as_weight_source(w, N)
    npy = tmp_path / "bad.npy"
    np.save(npy, w)
    source = ws.as_weight_source(str(npy), N)
    source.read(0, row)  # the rows before it are fine
    with pytest.raises(ValueError, match=rf"bad\.npy has .* at row {row}\b"):
        source.read(0, N)
    with pytest.raises(ValueError, match=rf"at row {row}\b"):
        ws.check_weights(source)


def test_scalar_weight_checked():
    with pytest.raises(ValueError, match="negative"):
        ws.as_weight_source(-1.0, N)


@pytest.mark.parametrize("value, match", [
    (np.ones(N - 1), r"sample_weight has 99 values, but X has 100 rows"),
    (np.ones((N, 1)), r"sample_weight must be 1-D .* got shape \(100, 1\)"),
    (np.array(["a"] * N), r"sample_weight has dtype <U1"),
    (np.ones(N, dtype=complex), r"sample_weight has dtype complex128"),
])
def test_shape_and_dtype_errors(value, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        ws.as_weight_source(value, N)
    if value.dtype.kind in "fc":
        npy = tmp_path / "shape.npy"
        np.save(npy, value)
        with pytest.raises(ValueError, match="shape.npy"):
            ws.as_weight_source(npy, N)


def test_all_zero_and_too_few_positive_rows():
    with pytest.raises(ValueError, match="sample_weight sums to zero"):
        ws.check_weights(ws.as_weight_source(np.zeros(N), N))
    w = np.zeros(N)
    w[[4, 9]] = 1.0
    assert ws.check_weights(ws.as_weight_source(w, N), n_components=2).n_positive == 2
    with pytest.raises(ValueError, match="2 rows of positive weight, fewer than "
                                         "n_components=3"):
        ws.check_weights(ws.as_weight_source(w, N), n_components=3)


def test_missing_files_and_datasets(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        ws.as_weight_source(str(tmp_path / "missing.npy"), N)
    h5 = tmp_path / "w.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("w", data=np.ones(N))
    with pytest.raises(MissingDatasetError, match="no dataset '/nope'") as info:
        ws.as_weight_source(f"{h5}:/nope", N)
    assert str(info.value).startswith("HDF5 file")  # (its message, as for X)
    text = tmp_path / "w.txt"
    text.write_text("1\n2\n")
    with pytest.raises(ValueError, match="not a .npy file"):
        ws.as_weight_source(text, N)


def test_a_file_replaced_during_reading_is_an_error(tmp_path):
    npy = tmp_path / "w.npy"
    np.save(npy, np.ones(N))
    source = ws.as_weight_source(npy, N)
    source.read(0, 10)
    np.save(npy, np.ones(N + 5))
    with pytest.raises(OSError, match="replaced or modified"):
        source.read(10, 20)


_CUT_AFTER_CHECK = """
import sys
import numpy as np
from emgmm._io import weights as ws
path, n = sys.argv[1], int(sys.argv[2])
source = ws.as_weight_source(path, n)
source.read(0, 10)  # (a source over a memory map would hold its map from here)
check = ws._check_file_unchanged

def check_then_cut(*args):  # the file cut between the check and the read
    check(*args)
    with open(path, "r+b") as fh:
        fh.truncate(256)

ws._check_file_unchanged = check_then_cut
source.read(n - 10, n)
"""


def test_weights_cut_during_a_read_are_an_error_naming_the_file(tmp_path):
    """A weights ``.npy`` truncated after the check of its size and before the read
    of a range beyond the cut: an ``OSError`` naming the file (the range is read from
    the file, not from a memory map, whose pages would fault with SIGBUS)."""
    npy = tmp_path / "w.npy"
    np.save(npy, np.ones(N * 100))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run([sys.executable, "-c", _CUT_AFTER_CHECK, str(npy),
                          str(N * 100)], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("OSError") and str(npy) in last and "truncated" in last, last


def test_dump_weights_writes_one_checked_file(w, tmp_path):
    source = ws.as_weight_source(w, N)
    dumped = ws.dump_weights(source, str(tmp_path))
    assert isinstance(dumped, ws.MemmapWeights) and dumped.checked
    np.testing.assert_array_equal(dumped.read(0, N), w)
    assert len(pickle.dumps(dumped)) < 2000
    npy = tmp_path / "given.npy"
    np.save(npy, w)
    file_backed = ws.as_weight_source(npy, N)
    assert ws.dump_weights(file_backed, str(tmp_path)) is file_backed


def test_a_view_of_a_memmap_is_read_as_an_array(w, tmp_path):
    dat = tmp_path / "w.dat"
    mm = np.memmap(dat, dtype=np.float64, mode="w+", shape=(2 * N,))
    mm[::2] = w
    mm.flush()
    view = np.memmap(dat, dtype=np.float64, mode="r", shape=(2 * N,))[::2]
    source = ws.as_weight_source(view, N)
    assert isinstance(source, ws.ArrayWeights)
    np.testing.assert_array_equal(source.read(0, N), w)


def test_take_reads_the_rows_of_a_subsample(w, tmp_path):
    npy = tmp_path / "w.npy"
    np.save(npy, w)
    idx = np.array([0, 3, 17, 18, 64, 99])
    for obj in (w, str(npy)):
        np.testing.assert_array_equal(ws.as_weight_source(obj, N).take(idx, 16), w[idx])
    assert ws.as_weight_source(w, N).take(np.array([], dtype=int), 16).shape == (0,)


def test_fingerprint_tells_weights_apart_whatever_the_source(w, tmp_path):
    npy = tmp_path / "w.npy"
    np.save(npy, w.astype(np.float32).astype(np.float64))
    a = ws.weights_fingerprint(ws.as_weight_source(w.astype(np.float32), N))
    assert a == ws.weights_fingerprint(ws.as_weight_source(npy, N))
    other = w.astype(np.float32).astype(np.float64)
    other[50] += 1.0
    assert a != ws.weights_fingerprint(ws.as_weight_source(other, N))
    assert ws.weights_fingerprint(None) is None


def test_truncated_npy_weights_are_named_truncated(tmp_path):
    """A .npy of weights cut short says so, naming the weights."""
    path = tmp_path / "w.npy"
    np.save(path, np.ones(N))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 16)
    with pytest.raises(ValueError, match=r"sample_weight.*truncated"):
        ws.as_weight_source(str(path), N)
