"""Same model whatever the source and block size; files untouched; validation of files.

Sources (``conftest.SOURCE_KINDS``): ndarray, np.memmap, .npy path (str and Path),
open h5py.Dataset stored contiguously, open h5py.Dataset chunked (64 rows), and the
string ``"file.h5:/group/chunked"``.
"""

import copy
import os
import pickle
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    FILE_KINDS,
    IGNORE_NOT_CONVERGED,
    PARAMS,
    SKLEARN_COVARIANCE_TYPES,
    SOURCE_KINDS,
    accepts_precisions_init,
    covariance_type_params,
    file_fingerprint,
    make_blobs_data,
    not_converging,
    quiet_fit,
    type_settings,
)
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from emgmm import GaussianMixture
from emgmm._io import sources as _sources
from emgmm._io.sources import MemmapSource, as_source
from emgmm._runtime import memory
from emgmm.covariance import REGISTRY as KINDS

N = 200  # 7 and 64 do not divide 200
D = 3  # the features of the module's data
BLOCK_SIZES = (1, 7, 64, N)


@pytest.fixture(scope="module")
def data():
    X = make_blobs_data(N, D, 3, seed=5)
    X.setflags(write=False)
    return X


def fit(X, covariance_type="full", n_features=D, **kw):
    """A short fit (6 iterations) of ``X``, which has ``n_features`` features, with
    the settings ``covariance_type`` needs (``type_settings``)."""
    params = dict(n_components=3, random_state=0, tol=0.0, max_iter=6,
                  **type_settings(covariance_type, n_features))
    params.update(kw)
    with not_converging():
        return GaussianMixture(**params).fit(X)


_reference_cache = {}


def reference(X, covariance_type, **kw):
    key = (covariance_type, tuple(sorted(kw.items())), X.dtype.str)
    if key not in _reference_cache:
        _reference_cache[key] = fit(np.array(X), covariance_type, **kw)
    return _reference_cache[key]


def assert_same_fit(a, b, rtol=1e-10):
    for name in PARAMS:
        assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, atol=0,
                        err_msg=name)
    assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=rtol, atol=0)
    assert_allclose(a.lower_bound_, b.lower_bound_, rtol=rtol)
    assert a.n_iter_ == b.n_iter_ and a.converged_ == b.converged_


# ------------------------------------------------------------ same result everywhere


@pytest.mark.slow
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_same_result_any_source_and_block_size(make_sources, data, kind, block_size):
    ref = reference(data, "full")
    src = make_sources.one(data, kind)
    gm = fit(src.obj, "full", block_size=block_size)
    assert_same_fit(gm, ref)
    # and the predictions read from the same source
    assert_array_equal(gm.predict(src.obj), ref.predict(data))
    assert_allclose(gm.score_samples(src.obj), ref.score_samples(data), rtol=1e-10)
    # probabilities live in [0, 1]: below 1e-12 only an absolute check is meaningful
    # (a relative one would ask more of log r than the 1e-10 asked of score_samples)
    assert_allclose(gm.predict_proba(src.obj), ref.predict_proba(data), rtol=1e-10,
                    atol=1e-12)
    assert_allclose(gm.score(src.obj), ref.score(data), rtol=1e-10)
    assert_allclose(gm.bic(src.obj), ref.bic(data), rtol=1e-10)
    assert_allclose(gm.aic(src.obj), ref.aic(data), rtol=1e-10)


@pytest.mark.parametrize("block_size", (7, N))
@pytest.mark.parametrize("kind", ("memmap", "npy", "h5", "h5_string"))
@pytest.mark.parametrize("covariance_type",
                         [ct for ct in COVARIANCE_TYPES if ct != "full"])  # above
def test_same_result_other_covariance_types(make_sources, data, covariance_type, kind,
                                            block_size):
    ref = reference(data, covariance_type)
    src = make_sources.one(data, kind)
    assert_same_fit(fit(src.obj, covariance_type, block_size=block_size), ref)


def test_fit_predict_from_file_equals_fit_then_predict(make_sources, data):
    src = make_sources.one(data, "h5_string")
    labels = GaussianMixture(n_components=3, random_state=0,
                             block_size=7).fit_predict(src.obj)
    gm = GaussianMixture(n_components=3, random_state=0).fit(data)
    assert_array_equal(labels, gm.predict(data))


@pytest.mark.slow
@pytest.mark.parametrize("block_size", (1, 7, 64))
@pytest.mark.parametrize("kind", ("memmap", "h5_chunked"))
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_float32_sources_agree(make_sources, data, covariance_type, kind, block_size):
    """float32 data: the fitted attributes are float32 (like sklearn's), so 1e-10 is
    below their resolution. With statistics accumulated in float64 (the contract), a
    different block partition changes the float64 sums by ~1e-16 relative, which can
    move a float32 result by at most one ulp (2**-23 relative); allow two."""
    X32 = data.astype(np.float32)
    ref = reference(X32, covariance_type)
    src = make_sources.one(X32, kind)
    gm = fit(src.obj, covariance_type, block_size=block_size)
    assert gm.means_.dtype == ref.means_.dtype == np.float32
    assert_same_fit(gm, ref, rtol=2 * float(np.finfo(np.float32).eps))


@pytest.mark.parametrize("covariance_type",
                         covariance_type_params(slow_beyond_sklearn=True))
@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # 10 iterations, tol=0
def test_float32_lower_bound_is_the_score_of_the_returned_model(covariance_type):
    """float32 data: the fitted attributes are rounded to float32, and lower_bound_
    is the mean log-likelihood of those (not of the float64 parameters before
    rounding, which differ by 1e-4 relative here: a tight component 1e5 from the
    origin), so n_init compares the models it returns."""
    rng = np.random.default_rng(0)
    X = (np.vstack([rng.normal(c, s, (600, 4)) for c, s in ((-3, 1), (0, 0.01), (3,
                                                                                 2))])
         + 1e5).astype(np.float32)
    gm = GaussianMixture(3, **type_settings(covariance_type, X.shape[1]),
                         random_state=0, max_iter=10, tol=0.0, n_init=2).fit(X)
    assert gm.means_.dtype == np.float32
    assert gm.lower_bound_ == gm.score(X)
    assert_array_equal(gm.fit_predict(X), gm.predict(X))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_compute_dtype_float64_also_scores_float32_data_in_float64(covariance_type):
    """compute_dtype='float64' with float32 data: predict, score_samples and
    predict_proba compute in float64, as fit does (same results as for the same
    values given as float64)."""
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(c, 1, (400, 5)) for c in (-4, 0, 4)]).astype(np.float32)
    with not_converging():
        gm = GaussianMixture(3, **type_settings(covariance_type, X.shape[1]),
                             random_state=0, max_iter=5, tol=0.0,
                             compute_dtype="float64").fit(X)
    X64 = X.astype(np.float64)
    assert gm.means_.dtype == np.float64
    assert gm.lower_bound_ == gm.score(X)
    assert_array_equal(gm.score_samples(X), gm.score_samples(X64))
    assert_array_equal(gm.predict_proba(X), gm.predict_proba(X64))


@pytest.mark.parametrize("kind", ("ndarray", "npy", "h5_chunked"))
def test_integer_data_cast_per_block(make_sources, data, kind):
    """Integer data: the same model as the same values given as float64 (as sklearn's
    validation casts integers to float64)."""
    Xi = np.round(data * 10).astype(np.int32)
    ref = fit(Xi.astype(np.float64), "full")
    sk = SkGaussianMixture(n_components=3, random_state=0, tol=0.0, max_iter=8)
    with not_converging():
        sk.fit(Xi)
    gm = fit(make_sources.one(Xi, kind).obj, "full", block_size=7)
    assert gm.means_.dtype == np.float64
    assert_same_fit(gm, ref)
    assert_allclose(gm.means_, sk.means_, rtol=1e-7)


# ------------------------------------------------------------ monotone lower bound


@pytest.mark.slow
@pytest.mark.parametrize("kind, block_size", [("ndarray", N), ("h5_chunked", 7), ("npy",
                                                                                  64)])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_lower_bound_never_decreases(make_sources, covariance_type, kind, block_size):
    """EM never decreases the likelihood (exact M step: reg_covar=0 on data that needs
    no regularisation); allow rounding of 1e-12 relative. Random init so that the run
    is long and the bound moves substantially."""
    X = make_blobs_data(N, D, 4, spread=2.0, seed=9)
    src = make_sources.one(X, kind)
    gm = fit(src.obj, covariance_type, n_components=4, reg_covar=0.0,
             init_params="random",
             max_iter=30, block_size=block_size)
    lb = np.asarray(gm.lower_bounds_)
    assert len(lb) == 30
    assert lb[-1] - lb[0] > 1e-5  # the run moves well beyond rounding
    steps = np.diff(lb)
    assert np.all(steps >= -1e-12 * np.abs(lb[1:])), steps.min()
    assert gm.lower_bound_ >= lb[-1] - 1e-12 * abs(lb[-1])


# ------------------------------------------------------------ files are left alone


def _open_fds_to(path):
    path = os.path.realpath(path)
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")) == path:
                out.append(fd)
        except OSError:
            pass
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_take_rows_gathers_the_rows_of_every_source(make_sources, data, kind, dtype):
    """Rows by index (runs of consecutive rows and single rows, the first and the
    last) equal the array's, cast to the compute dtype; no row gives no row."""
    X = (data * 100).astype(dtype)
    rows = np.array([0, 1, 2, 5, 9, 10, 63, 64, 65, 130, N - 1])
    for source_dtype in (None, np.float64):
        src = as_source(make_sources(X, (kind,))[0].obj) if kind != "ndarray" \
            else _sources.ArraySource(X)
        try:
            got = src.take_rows(rows, source_dtype)
            expected = X[rows].astype(src.compute_dtype if source_dtype is None
                                      else source_dtype)
            assert got.dtype == expected.dtype
            assert_array_equal(got, expected)
            assert src.take_rows(np.empty(0, dtype=np.int64)).shape == (0, 3)
        finally:
            src.close()


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_cast_reads_by_chunks_equal_the_cast_block(monkeypatch, make_sources, data,
                                                   kind):
    """float64 data read as float32 by chunks of 2 rows (also a last, shorter one):
    the block equals the whole block's cast; a value beyond float32's range in a
    later chunk is named by its row and column."""
    monkeypatch.setattr(_sources, "CAST_CHUNK_BYTES", 2 * 3 * 8)
    X = np.array(data) * 100
    X[77, 1] = 1e39
    src = as_source(make_sources(X, (kind,))[0].obj) if kind != "ndarray" \
        else _sources.ArraySource.__new__(_sources.ArraySource)
    if kind == "ndarray":  # (an ArraySource checks its whole array when made)
        src.array, src.shape, src.dtype, src.description = X, X.shape, X.dtype, "X"
        src.known_finite = False
    try:
        got = src.read(3, 64, np.float32)
        assert got.dtype == np.float32
        assert_array_equal(got, X[3:64].astype(np.float32))
        with pytest.raises(ValueError, match="row 77, column 1"):
            src.read(70, 81, np.float32)
    finally:
        src.close()


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_take_rows_names_the_row_of_a_nan(make_sources, data, kind):
    X = np.array(data)
    X[77, 2] = np.nan
    src = as_source(make_sources(X, (kind,))[0].obj) if kind != "ndarray" \
        else _sources.ArraySource.__new__(_sources.ArraySource)
    if kind == "ndarray":  # (an ArraySource checks its whole array when made)
        src.array, src.shape, src.dtype, src.description = X, X.shape, X.dtype, "X"
        src.known_finite = False
    try:
        with pytest.raises(ValueError, match="row 77, column 2"):
            src.take_rows(np.array([3, 40, 77, 78]))
    finally:
        src.close()


def test_take_rows_of_a_file_rewritten_since_is_refused(make_sources, data):
    source = make_sources(data, ("npy",))[0]
    src = as_source(source.obj)
    X = np.array(data)
    X[0] += 1.0
    np.save(source.path, X)
    with pytest.raises(OSError, match="modified|replaced|changed"):
        src.take_rows(np.array([0, 5]))
    src.close()


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_files_unchanged_and_estimator_holds_no_source(make_sources, data, kind):
    src = make_sources.one(data, kind)
    before = file_fingerprint(src.path)
    fds_before = _open_fds_to(src.path)
    gm = GaussianMixture(n_components=3, random_state=0, block_size=64).fit(src.obj)
    gm.predict(src.obj)
    gm.predict_proba(src.obj)
    gm.score(src.obj)
    gm.bic(src.obj)
    after = file_fingerprint(src.path)
    assert after[0] == before[0], "file content changed"
    assert after[1:] == before[1:], "file mtime/size changed"
    # no file opened by emgmm stays open (the user's own h5py handle may be open)
    assert _open_fds_to(src.path) == fds_before
    # the estimator holds no source, no open file and no data
    for name, value in vars(gm).items():
        assert not isinstance(value, (h5py.File, h5py.Dataset, h5py.Group,
                                      np.memmap)), name
        assert "Source" not in type(value).__name__, name
        assert not hasattr(value, "read") and not hasattr(value, "fileno"), name
        if isinstance(value, (str, Path)):
            assert str(src.path) not in str(value), name
    blob = pickle.dumps(gm)
    assert len(blob) < 20_000  # X is 7 kB here; see the larger check below
    gm2 = pickle.loads(blob)
    assert_array_equal(gm2.predict(data), gm.predict(data))
    if kind in ("h5", "h5_chunked"):  # the user's handle is still usable
        assert_array_equal(src.obj[:5], data[:5])


def test_pickled_model_does_not_contain_data(make_sources):
    """Fitted on 40,000 x 4 (1.3 MB) from a file: the pickle is a few kB."""
    X = make_blobs_data(40_000, 4, 3, seed=2)
    for src in make_sources(X, ("npy", "h5_string", "ndarray")):
        gm = GaussianMixture(n_components=3, random_state=0, max_iter=5,
                             tol=1e-2).fit(src.obj)
        assert len(pickle.dumps(gm)) < 50_000, src


# ------------------------------------------------------------ validation of files


@pytest.fixture(scope="module")
def fitted3(data):
    """GaussianMixture(n_components=3, random_state=0) fitted on ``data`` (copy per
    use)."""
    return GaussianMixture(n_components=3, random_state=0).fit(data)


def sk_error(X, method="fit", fitted_on=None, **kw):
    gm = SkGaussianMixture(**kw)
    if fitted_on is not None:
        gm.fit(fitted_on)
    with pytest.raises(Exception) as info, warnings.catch_warnings():
        # (scikit-learn's finiteness check sums the data: +inf and -inf give NaN)
        warnings.filterwarnings("ignore", "invalid value encountered in reduce",
                                RuntimeWarning)
        getattr(gm, method)(X)
    return info.value


def key(exc):
    """scikit-learn's message up to the first line break (it then adds advice or, for
    1-D input, a dump of the array, which a file source cannot sensibly repeat)."""
    return str(exc).split("\n")[0].rstrip(".: ")


def snapshot(est):
    return copy.deepcopy(vars(est))


def assert_unchanged(est, snap):
    now = vars(est)
    assert set(now) == set(snap)
    for k, v in snap.items():
        if isinstance(v, np.ndarray):
            assert_array_equal(now[k], v, err_msg=k)
        elif isinstance(v, list):
            assert_array_equal(np.asarray(now[k]), np.asarray(v), err_msg=k)
        else:
            assert now[k] == v or (now[k] is v), k


def bad_data(data, what):
    X = np.array(data)
    if what == "nan":
        X[137, 2] = np.nan
        X[190, 0] = np.nan
        return X, 137
    if what == "inf":
        X[61, 1] = np.inf
        X[150, 0] = -np.inf
        return X, 61
    raise ValueError(what)


@pytest.mark.parametrize("what", ["nan", "inf"])
@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_nan_inf_named_by_first_row(make_sources, data, fitted3, kind, what):
    X, row = bad_data(data, what)
    expected = sk_error(X, n_components=3)
    src = make_sources.one(X, kind)
    fitted = copy.deepcopy(fitted3)
    for gm in (GaussianMixture(n_components=3, random_state=0, block_size=64), fitted):
        snap = snapshot(gm)
        with pytest.raises(type(expected)) as info:
            gm.fit(src.obj)
        assert key(expected) in str(info.value)
        if kind != "ndarray":
            # the global row index (137 sits in the third block of 64 rows)
            assert f"row {row}" in str(info.value), str(info.value)
        assert_unchanged(gm, snap)
    # scoring bad data from a file also names the row
    with pytest.raises(type(expected)) as info:
        fitted.score_samples(src.obj)
    assert key(expected) in str(info.value)
    if kind != "ndarray":
        assert f"row {row}" in str(info.value)


@pytest.mark.parametrize("kind", SOURCE_KINDS)
@pytest.mark.parametrize(
    "case",
    ["1d", "3d", "one_sample", "fewer_samples_than_components"],
)
def test_shape_errors_like_sklearn(make_sources, data, fitted3, kind, case):
    if case == "1d":
        X, kw = np.array(data[:, 0]), dict(n_components=3)
    elif case == "3d":
        X, kw = np.array(data[:60]).reshape(20, 3, 3), dict(n_components=3)
    elif case == "one_sample":
        X, kw = np.array(data[:1]), dict(n_components=1)
    else:
        X, kw = np.array(data[:3]), dict(n_components=5)
    expected = sk_error(X, **kw)
    src = make_sources.one(X, kind)
    fitted = copy.deepcopy(fitted3).set_params(**kw)  # a fitted estimator, kw applied
    for gm in (GaussianMixture(**kw), fitted):
        snap = snapshot(gm)
        with pytest.raises(type(expected)) as info:
            gm.fit(src.obj)
        assert key(expected) in str(info.value), (str(info.value), key(expected))
        assert_unchanged(gm, snap)


@pytest.mark.parametrize("method", ["predict", "predict_proba", "score_samples",
                                    "score", "bic", "aic"])
@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_feature_count_mismatch_at_predict(make_sources, data, fitted3, kind, method):
    X4 = np.hstack([data, data[:, :1]])
    expected = sk_error(X4, method=method, fitted_on=data, n_components=3,
                        random_state=0)
    gm = copy.deepcopy(fitted3)
    snap = snapshot(gm)
    with pytest.raises(type(expected)) as info:
        getattr(gm, method)(make_sources.one(X4, kind).obj)
    assert key(expected) in str(info.value)
    assert_unchanged(gm, snap)


def test_missing_files_and_datasets(tmp_path, make_sources, data):
    gm = GaussianMixture(n_components=2)
    with pytest.raises(FileNotFoundError):
        gm.fit(str(tmp_path / "nope.npy"))
    with pytest.raises(FileNotFoundError):
        gm.fit(f"{tmp_path / 'nope.h5'}:/X")
    h5 = make_sources.one(data, "h5_string")
    fname = h5.obj.split(":")[0]
    with pytest.raises((KeyError, ValueError)) as info:
        gm.fit(f"{fname}:/group/missing")
    assert "missing" in str(info.value)
    assert not hasattr(gm, "means_")


def test_paths_that_name_no_data_are_refused_naming_what_is_missing(tmp_path, data):
    """A text file, a directory, an empty path and an HDF5 file without its dataset
    (with or without the separator) get a message saying what to pass."""
    np.savetxt(tmp_path / "x.csv", data, delimiter=",")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("X", data=data)
    gm = GaussianMixture(n_components=2)
    cases = {
        str(tmp_path / "x.csv"): "is not a .npy file",
        str(tmp_path): "is a directory",
        "": "empty path",
        str(tmp_path / "d.h5"): "name the dataset too",
        f"{tmp_path / 'd.h5'}:": "name the dataset too",
    }
    for spec, message in cases.items():
        with pytest.raises(ValueError, match=message):
            gm.fit(spec)
    assert not hasattr(gm, "means_")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_a_named_pipe_as_data_or_weights_is_refused_unopened(tmp_path, data):
    """A named pipe (EM would read it once per iteration) as ``X`` or as
    ``sample_weight`` is refused as not a regular file, without opening it: nothing
    writes to it here, so an open would hang."""
    os.mkfifo(tmp_path / "fifo")
    gm = GaussianMixture(n_components=2)
    with pytest.raises(ValueError, match="fifo is not a regular file"):
        gm.fit(str(tmp_path / "fifo"))
    with pytest.raises(ValueError, match="sample_weight .*fifo: not a regular file"):
        gm.fit(data, sample_weight=str(tmp_path / "fifo"))
    assert not hasattr(gm, "means_")


def _quiet(gm, X):
    with not_converging():
        return gm.fit(X)


def test_writable_hdf5_dataset_is_read_through_its_handle(tmp_path, data):
    """A dataset of a file open for writing: unflushed changes are what gets fitted
    (read in process); worker processes, which would reopen the file by name and
    could read stale data, are refused."""
    path = tmp_path / "rw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("g/X", data=data)
    with h5py.File(path, "r+") as f:
        ds = f["g/X"]
        ds[:50] = 0.0  # not flushed
        got = _quiet(GaussianMixture(3, random_state=0), ds)
        want = _quiet(GaussianMixture(3, random_state=0), np.array(ds))
        assert_array_equal(got.means_, want.means_)
        with pytest.raises(ValueError, match="open for writing or held in memory"):
            GaussianMixture(3, random_state=0, n_jobs=2).fit(ds)
        assert f.mode == "r+" and f.id.valid  # the user's handle stays open


def test_in_memory_hdf5_dataset(data):
    f = h5py.File("in-memory.h5", "w", driver="core", backing_store=False)
    try:
        ds = f.create_dataset("X", data=data)
        got = _quiet(GaussianMixture(3, random_state=0), ds)
        want = _quiet(GaussianMixture(3, random_state=0), data)
        assert_array_equal(got.means_, want.means_)
    finally:
        f.close()
    assert not os.path.exists("in-memory.h5")


def test_hdf5_dataset_of_a_python_file_object(data):
    """h5py's 'fileobj' driver: no file name to reopen; read through the handle."""
    import io

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.create_dataset("X", data=data)
    with h5py.File(buffer, "r") as f:
        got = _quiet(GaussianMixture(3, random_state=0), f["X"])
    want = _quiet(GaussianMixture(3, random_state=0), data)
    assert_array_equal(got.means_, want.means_)


def test_hdf5_dataset_of_a_file_family_is_read_through_its_handle(tmp_path, data):
    """Driver 'family' (one file in several parts) cannot be reopened by one name."""
    pattern = str(tmp_path / "part%d.h5")
    with h5py.File(pattern, "w", driver="family", memb_size=2**14) as f:
        f.create_dataset("X", data=data)
    with h5py.File(pattern, "r", driver="family", memb_size=2**14) as f:
        got = _quiet(GaussianMixture(3, random_state=0), f["X"])
    want = _quiet(GaussianMixture(3, random_state=0), data)
    assert_array_equal(got.means_, want.means_)


def test_npy_file_of_any_suffix(tmp_path, data):
    """The .npy format is recognised by its magic string, not by the suffix."""
    with open(tmp_path / "data.bin", "wb") as f:
        np.save(f, data)
    got = _quiet(GaussianMixture(3, random_state=0), str(tmp_path / "data.bin"))
    want = _quiet(GaussianMixture(3, random_state=0), data)
    assert_array_equal(got.means_, want.means_)


@pytest.mark.parametrize("suffix", [".h5", ".hdf5", ".HDF5"])
def test_npy_file_named_as_hdf5_is_read_as_npy(tmp_path, data, suffix):
    """A .npy file named like an HDF5 file is recognised by its magic string; given
    with a dataset path, it is named as the .npy file it is."""
    path = tmp_path / f"data{suffix}"
    with open(path, "wb") as f:
        np.save(f, data)
    got = _quiet(GaussianMixture(3, random_state=0), str(path))
    want = _quiet(GaussianMixture(3, random_state=0), data)
    assert_array_equal(got.means_, want.means_)
    with pytest.raises(ValueError, match=f"{path.name} is a .npy file, not HDF5"):
        GaussianMixture(3).fit(f"{path}:/X")


def test_hdf5_file_named_as_npy_is_read_as_hdf5(tmp_path, data):
    """An HDF5 file named '.npy' is recognised by its signature: with a dataset path
    (also without its leading '/') it is fitted, without one the message asks for
    the dataset (not 'is not a .npy file')."""
    path = tmp_path / "data.npy"
    with h5py.File(path, "w") as f:
        f.create_dataset("g/X", data=data)
    want = _quiet(GaussianMixture(3, random_state=0), data)
    for spec in (f"{path}:/g/X", f"{path}:g/X"):
        got = _quiet(GaussianMixture(3, random_state=0), spec)
        assert_array_equal(got.means_, want.means_)
    for spec in (str(path), f"{path}:"):
        with pytest.raises(ValueError, match="is an HDF5 file: name the dataset too"):
            GaussianMixture(3).fit(spec)


def test_copy_on_write_memmap_is_fitted_with_its_changes(tmp_path, data):
    """A memmap of mode 'c' holds changes the file does not: fitted as an array."""
    path = tmp_path / "X.npy"
    np.save(path, data)
    mm = np.load(path, mmap_mode="c")
    mm *= 100.0
    got = _quiet(GaussianMixture(3, random_state=0), mm)
    want = _quiet(GaussianMixture(3, random_state=0), data * 100.0)
    assert_allclose(got.means_, want.means_, rtol=1e-12)
    assert_array_equal(np.load(path), data)  # the file itself unchanged


@pytest.mark.parametrize("n_jobs", [None, 2])
def test_relative_paths_resolved_when_given(tmp_path, monkeypatch, data, n_jobs):
    """A relative .npy path, 'file.h5:/X' string or h5py file opened by a relative
    name means the file in the working directory of that moment: a later chdir (or
    process workers started elsewhere and reused) must not read another file of the
    same name."""
    for sub, offset in (("a", 0.0), ("b", 1000.0)):
        (tmp_path / sub).mkdir()
        np.save(tmp_path / sub / "X.npy", data + offset)
        with h5py.File(tmp_path / sub / "d.h5", "w") as f:
            f.create_dataset("X", data=data + offset)
    want = {sub: _quiet(GaussianMixture(3, random_state=0), data + offset).means_
            for sub, offset in (("a", 0.0), ("b", 1000.0))}
    kw = dict(n_components=3, random_state=0, n_jobs=n_jobs)
    monkeypatch.chdir(tmp_path / "a")
    for spec in ("X.npy", "d.h5:/X"):
        assert_allclose(_quiet(GaussianMixture(**kw), spec).means_, want["a"])
    with h5py.File("d.h5", "r") as f:
        monkeypatch.chdir(tmp_path / "b")
        for spec in ("X.npy", "d.h5:/X"):  # workers that started in a/ are reused
            assert_allclose(_quiet(GaussianMixture(**kw), spec).means_, want["b"])
        assert_allclose(_quiet(GaussianMixture(**kw), f["X"]).means_, want["a"])


def test_hdf5_dataset_path_without_leading_slash(tmp_path, data):
    path = tmp_path / "rel.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/X", data=data)
    got = _quiet(GaussianMixture(3, random_state=0), f"{path}:train/X")
    want = _quiet(GaussianMixture(3, random_state=0), f"{path}:/train/X")
    assert_array_equal(got.means_, want.means_)


# ------------------------------------------------------ files deleted or replaced


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("what", ["deleted", "replaced by another file"])
def test_hdf5_dataset_of_a_file_deleted_or_replaced_while_open(tmp_path, data, what):
    """An open 'sec2' dataset is reopened by the path of its descriptor: when its file
    was deleted (the link then ends with ' (deleted)') or replaced, the error says
    so and names the path it was opened by."""
    path = tmp_path / "X.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=data)
    with h5py.File(path, "r") as f:
        os.unlink(path)
        if what != "deleted":
            with h5py.File(path, "w") as g:
                g.create_dataset("X", data=data[:10] + 100.0)
        with pytest.raises(FileNotFoundError) as info:
            fit(f["X"])
    message = str(info.value)
    assert f"HDF5 file {path} was {what} while it was open" in message
    assert "(deleted)" not in message


@pytest.mark.parametrize("what", ["deleted", "replaced by a shorter file",
                                  "replaced by a file of the same size", "truncated"])
def test_memmap_of_a_file_deleted_or_replaced(tmp_path, data, what):
    """A memmap is read again by its file name: a file deleted since, replaced by
    another (of any size: found by the mapped file's identity, Linux), or truncated
    is named with what happened (not numpy's 'mmap length is greater than file
    size', nor a fit of the new file's values)."""
    path = tmp_path / "X.npy"
    np.save(path, data)
    mm = np.load(path, mmap_mode="r")
    if what == "truncated":
        with open(path, "r+b") as fh:
            fh.truncate(200)
        error, message = ValueError, "truncated or replaced after the memmap was opened"
    else:
        os.unlink(path)
        error = OSError
        message = "of memmap .* was replaced after the memmap was opened"
    if what == "deleted":
        error, message = FileNotFoundError, "of this memmap was deleted or moved"
    elif what.startswith("replaced"):
        np.save(path, data[:10] if "shorter" in what else data[::-1])
        if _sources._mapped_file(mm.ctypes.data) is None:
            pytest.skip("/proc/self/map_files is not readable here")
    with pytest.raises(error, match=message) as info:
        fit(mm)
    assert str(path) in str(info.value)


def test_memmap_view_through_another_array_is_fitted_as_an_array(tmp_path, data):
    """A memmap whose chain of bases passes through a plain array (``as_strided(...,
    subok=True)``) is no range of the file's bytes that can be computed: it is
    fitted as an in-memory array, with its own values; rows of a contiguous view are
    numbered from the view."""
    from numpy.lib.stride_tricks import as_strided

    path = tmp_path / "X.npy"
    np.save(path, data)
    mm = np.load(path, mmap_mode="r")
    view = as_strided(mm[10:], shape=(len(data) - 10, data.shape[1]),
                      strides=mm.strides, subok=True)
    assert isinstance(view, np.memmap) and MemmapSource.from_memmap(view) is None
    got, ref = fit(view, n_jobs=1), fit(np.array(view), n_jobs=1)
    np.testing.assert_array_equal(got.means_, ref.means_)
    bad = np.array(data)
    bad[15, 1] = np.nan
    np.save(path, bad)
    mm = np.load(path, mmap_mode="r")
    with pytest.raises(ValueError, match=r"X \(a view of memmap .*\), row 5, column 1"):
        fit(mm[10:])


def _write(path, X):
    """X as a .npy file, or as dataset /X of an HDF5 file (by the suffix)."""
    if path.suffix == ".npy":
        np.save(path, X)
    else:
        with h5py.File(path, "w") as f:
            f.create_dataset("X", data=X, chunks=(64, X.shape[1]))


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".npy", ".h5"])
@pytest.mark.parametrize("what, n_jobs", [("deleted", 2), ("replaced", 2),
                                          ("rewritten", None), ("rewritten", 1)])
def test_file_deleted_or_replaced_during_the_fit(tmp_path, data, suffix, what, n_jobs):
    """After the first iteration, a file deleted (or moved), replaced by another of
    the same size, or rewritten in place (the same inode: a fit that reads in its
    own process keeps it open, and its map sees the new bytes) is an error at the
    next read that says so and names the file, not a bare 'No such file' or a fit
    that goes on with other data. Worker processes reopen the file by name in every
    pass; the fitting process checks the file at every read."""
    path = tmp_path / f"X{suffix}"
    _write(path, data)
    spec = str(path) if suffix == ".npy" else f"{path}:/X"
    changed = []

    def change(*_):
        if changed:
            return
        changed.append(path)
        state = os.stat(path)
        if what == "deleted":
            os.unlink(path)
            return
        target = tmp_path / f"other{suffix}" if what == "replaced" else path
        if what == "replaced":
            _write(target, np.ascontiguousarray(data[::-1]))
            assert os.path.getsize(target) == state.st_size
        elif suffix == ".npy":  # new values over the old ones, in the same file
            with open(path, "r+b") as f:
                f.seek(state.st_size - data.nbytes)
                f.write(np.ascontiguousarray(data[::-1]).tobytes())
        # a clock of coarse resolution must not hide the change
        os.utime(target, ns=(state.st_atime_ns, state.st_mtime_ns + 10**9))
        if what == "replaced":
            os.replace(target, path)

    error, message = (
        (FileNotFoundError, "was deleted or moved while emgmm was reading it")
        if what == "deleted" else
        (OSError, "was replaced or modified while emgmm was reading it"))
    with pytest.raises(error, match=message) as info:
        fit(spec, n_jobs=n_jobs, callback=change)
    assert changed and str(path) in str(info.value)


@pytest.mark.parametrize("view", ["reshape", "rows", "flat rows", "view of a view"])
def test_contiguous_view_of_a_memmap_is_read_from_its_file(tmp_path, view):
    """A reshape or a range of rows of a memory map (``np.load(..., mmap_mode='r')
    .reshape(-1, d)``) is read from its bytes of the file, as the map is (workers
    then share the file instead of a copy of X), and fits as its values do."""
    X = make_blobs_data(600, 4, 3, seed=2)
    np.save(tmp_path / "X.npy", X)
    mm = np.load(tmp_path / "X.npy", mmap_mode="r")
    V = {"reshape": mm.reshape(-1, 8), "rows": mm[150:450],
         "flat rows": mm.reshape(-1)[8:2008].reshape(-1, 4),
         "view of a view": mm[:, :].T.T}[view]
    source = as_source(V)
    assert isinstance(source, MemmapSource)
    np.testing.assert_array_equal(source.read(0, V.shape[0]), np.asarray(V))
    source.close()
    ref = fit(np.array(V), n_jobs=1)
    got = fit(V, n_jobs=1)
    np.testing.assert_array_equal(got.means_, ref.means_)
    assert got.lower_bounds_ == ref.lower_bounds_


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["npy", "h5"])
def test_threads_sharing_a_fresh_source_read_what_one_thread_reads(tmp_path, kind,
                                                                    monkeypatch):
    """Threads of one process share a source (GaussianMixtureIC's candidates take
    their initialisation rows from it at once): its file handle is opened once, not
    once per thread with all but the last closed under their readers (which read
    from a closed descriptor: EBADF). Opening is slowed down (as on a loaded
    machine) so that the threads meet there."""
    import builtins
    import threading
    import time

    def slow(opener):
        def opened(*args, **kwargs):
            handle = opener(*args, **kwargs)
            time.sleep(0.005)
            return handle
        return opened

    monkeypatch.setattr(_sources, "open", slow(builtins.open), raising=False)
    monkeypatch.setattr(h5py, "File", slow(h5py.File))

    X = np.random.default_rng(0).normal(size=(2000, 3))
    if kind == "npy":
        np.save(tmp_path / "X.npy", X)
        where = str(tmp_path / "X.npy")
    else:
        with h5py.File(tmp_path / "X.h5", "w") as f:
            f["X"] = X
        where = f"{tmp_path / 'X.h5'}:/X"
    rows = np.arange(0, 2000, 7)
    for _ in range(20):
        source = as_source(where)
        barrier = threading.Barrier(8)
        results, errors = [], []

        def take(barrier=barrier, source=source, results=results, errors=errors):
            barrier.wait()
            try:
                results.append(source.take(rows, 64))
            except Exception as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=take) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        source.close()
        assert errors == []
        for got in results:
            assert_array_equal(got, X[rows])


@pytest.fixture(scope="module")
def c11_data():
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=4.0, size=(5, 4))
    return centers[rng.integers(5, size=1000)] + rng.standard_normal((1000, 4))


def _c11_init(X):
    """A fixed initialisation (independent of row order) for the permutation check."""
    rng = np.random.default_rng(1)
    means = X[rng.choice(len(X), 5, replace=False)]
    return dict(weights_init=np.full(5, 0.2), means_init=means,
                precisions_init=np.stack([np.eye(4) * 0.5] * 5))


C11_FIT = dict(n_components=5, tol=0.0, max_iter=10, random_state=0)


@pytest.fixture(scope="module")
def c11_reference(c11_data):
    return quiet_fit(GaussianMixture(**C11_FIT), c11_data)


def _assert_c11(gm, ref, rtol):
    # Another block size adds the same float64 terms in another order. Each sum then
    # moves by a few ulps of the size of its terms: for an off-diagonal covariance
    # entry that is the product of the two standard deviations, not the entry, which
    # can be 1e-5 of it. So "1e-12 relative" is measured against the largest entry of
    # each array (norm-wise), and elementwise wherever that is the stricter bound.
    for name in PARAMS:
        expected = np.asarray(getattr(ref, name))
        assert_allclose(getattr(gm, name), expected, rtol=rtol,
                        atol=rtol * np.abs(expected).max(), err_msg=name)
    assert_allclose(gm.lower_bounds_, ref.lower_bounds_, rtol=rtol)
    lb = np.asarray(gm.lower_bounds_)
    assert np.all(np.diff(lb) >= -1e-12 * np.abs(lb[1:]))


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 7, 128, 1000])
@pytest.mark.parametrize("kind", ["ndarray", "memmap", "npy", "h5", "h5_chunked"])
def test_case_c11_every_source_and_block_size_agree(
        make_sources, c11_data, c11_reference, kind, block_size):
    if block_size == 1 and kind in ("npy", "h5"):
        pytest.skip("1-row blocks: covered by ndarray, memmap and h5_chunked "
                    "(run time)")
    src = make_sources.one(c11_data, kind)
    gm = quiet_fit(GaussianMixture(**C11_FIT, block_size=block_size), src.obj)
    _assert_c11(gm, c11_reference, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [7, 1000])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_case_c11_permuted_rows_give_the_same_model(
        c11_data, covariance_type, block_size):
    X = c11_data
    perm = np.random.default_rng(3).permutation(len(X))
    kw = dict(C11_FIT, **type_settings(covariance_type, X.shape[1]), **_c11_init(X))
    if (covariance_type in SKLEARN_COVARIANCE_TYPES
            and accepts_precisions_init(covariance_type)):
        if covariance_type != "full":  # in scikit-learn's layouts
            P = kw["precisions_init"]
            kw["precisions_init"] = {"tied": P[0],
                                     "diag": np.diagonal(P, axis1=1, axis2=2),
                                     "spherical": P[:, 0, 0]}[covariance_type]
        ref = quiet_fit(GaussianMixture(**kw), X)
        gm = quiet_fit(GaussianMixture(**kw, block_size=block_size), X[perm])
    else:
        # no precisions_init: both fits warm-start from one model (its first
        # iteration from the fixed weights and means on X), so that neither
        # initialisation reads the rows in their order
        del kw["precisions_init"]
        start = quiet_fit(GaussianMixture(**dict(kw, max_iter=1), warm_start=True), X)
        ref = quiet_fit(copy.deepcopy(start).set_params(max_iter=kw["max_iter"]), X)
        gm = quiet_fit(copy.deepcopy(start).set_params(max_iter=kw["max_iter"],
                                                       block_size=block_size),
                       X[perm])
    _assert_c11(gm, ref, rtol=1e-10)
    assert_array_equal(gm.predict(X[perm]), ref.predict(X)[perm])


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_chunk_warning_names_the_limiting_row_count_and_the_init_read(covariance_type):
    n, d, K = 200_000, 50, 4
    per_row = KINDS["full"].bytes_per_row(d, K, 4)
    budget = int(8 * 2**20 // per_row)
    chunk = 2 * budget
    with pytest.warns(UserWarning) as record:
        rows = memory.block_rows(n, d, K, 4, 8, chunk_rows=chunk,
                                 covariance_type=KINDS[covariance_type],
                                 description="X.h5:/x")
    (warning,) = record
    text = str(warning.message)
    # the count that limits the block, and what sets it
    assert (f"one chunk ({chunk} rows) exceeds the {budget} rows that fit "
            f"working_memory (8 MiB at {per_row} bytes per row)") in text, text
    assert f"blocks of {rows} rows" in text
    # the initialisation's subsample read pays the same
    assert "initialisation" in text and "init_max_samples" in text
