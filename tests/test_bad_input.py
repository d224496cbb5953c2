"""Bad input everywhere: a clear exception naming the problem, the user's files left
untouched (bytes and modification time) and the estimator's state unchanged."""

import copy
import os
import subprocess
import sys
import warnings

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    COVARIANCE_TYPES,
    FILE_KINDS,
    SKLEARN_COVARIANCE_TYPES,
    file_fingerprint,
    not_converging,
    type_settings,
)
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from emgmm import GaussianMixture

PARAMS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


def good_data(n=300, d=3, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d))


@pytest.fixture(scope="module")
def _fitted_once():
    gm = GaussianMixture(2, random_state=0, max_iter=5)
    with not_converging():
        gm.fit(good_data())
    return gm


@pytest.fixture
def fitted(_fitted_once):
    """A fitted estimator (a fresh copy for every test)."""
    return copy.deepcopy(_fitted_once)


def snapshot(gm):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v)
            for k, v in gm.__dict__.items()}


def assert_state_unchanged(gm, before):
    assert set(gm.__dict__) == set(before)
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(gm.__dict__[key], value, err_msg=key)
        elif key != "callback":
            assert gm.__dict__[key] == value or key.endswith("_init"), key


def check_refused(gm, method, X, exc, match, paths=()):
    """``method(X)`` raises ``exc`` matching ``match``; files and state unchanged."""
    prints = [file_fingerprint(p) for p in paths]
    before = snapshot(gm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(exc, match=match):
            getattr(gm, method)(X)
    assert_state_unchanged(gm, before)
    for path, fp in zip(paths, prints, strict=False):
        assert file_fingerprint(path) == fp, path


# ----------------------------------------------------------- NaN and infinity


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("row", [0, 157, 299])
@pytest.mark.parametrize("kind", FILE_KINDS)
def test_nonfinite_at_any_row_of_a_file(make_sources, fitted, kind, row, value):
    X = good_data()
    X[row, 1] = value
    source = make_sources.one(X, kind)
    what = "NaN" if np.isnan(value) else "infinity"
    match = rf"contains {what}.*{source.path.name}.*row {row}, column 1"
    check_refused(fitted, "fit", source.obj, ValueError, match, [source.path])
    for method in ("predict", "score_samples"):
        check_refused(fitted, method, source.obj, ValueError, match, [source.path])


@pytest.mark.parametrize("kind", ["npy", "h5_string"])
def test_nonfinite_row_outside_the_init_subsample_with_workers(make_sources, kind):
    """The bad row is found by a worker during an EM pass, not by the initialisation."""
    X = good_data(2000)
    X[1777, 2] = np.nan
    source = make_sources.one(X, kind)
    gm = GaussianMixture(2, random_state=0, init_max_samples=10, n_jobs=2,
                         block_size=100)
    check_refused(gm, "fit", source.obj, ValueError, r"row 1777, column 2",
                  [source.path])
    assert not hasattr(gm, "weights_")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nonfinite_in_memory_named_by_row_and_column(fitted, value, dtype):
    X = good_data().astype(dtype)
    X[42, 2] = value
    what = "NaN" if np.isnan(value) else "infinity"
    match = rf"Input X contains {what}.*row 42, column 2"
    for method in ("fit", "predict", "score_samples"):
        check_refused(fitted, method, X, ValueError, match)


@pytest.mark.parametrize("kind", ["ndarray", "npy"])
def test_value_beyond_float32_with_float32_compute(make_sources, kind):
    """float64 data with compute_dtype='float32': a value the cast turns into
    infinity is refused by row and column, not fitted into a broken model."""
    X = good_data()
    X[123, 1] = 1e39
    obj = X if kind == "ndarray" else make_sources.one(X, kind).obj
    gm = GaussianMixture(2, random_state=0, compute_dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow warning either
        with pytest.raises(ValueError,
                           match=r"too large for dtype\('float32'\).*row 123, "
                                             r"column 1"):
            gm.fit(obj)
    assert not hasattr(gm, "weights_")


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("n_jobs", [1, 2])
@pytest.mark.parametrize("data_dtype", [np.float32, np.float64])
def test_value_whose_square_overflows_float32_is_refused_by_row(schedule, n_jobs,
                                                                data_dtype):
    """A value within float32's range whose squared distance to every component is
    not (3e38) makes log-likelihoods overflow in float32 compute: refused naming a
    row, its largest value and column and the means' largest coordinate (after the
    initialisation put a component on it, the other rows overflow too), and the way
    out; not fitted into an ill-defined covariance. In float64 the same data fits."""
    X = good_data().astype(np.float32)
    X[123, 1] = 3e38
    X = X.astype(data_dtype)
    gm = GaussianMixture(2, random_state=0, compute_dtype="float32", n_jobs=n_jobs,
                         schedule=schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the overflow itself
        with pytest.raises(ValueError, match=r"Row \d+ of X: .* overflows float32 "
                                             r"\(its largest value .* at column \d+; "
                                             r"the largest mean coordinate .*\)\. "
                                             r".*compute_dtype='float64'"):
            gm.fit(X)
    assert not hasattr(gm, "weights_")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = GaussianMixture(2, random_state=0, compute_dtype="float64").fit(X)
    assert np.isfinite(fitted.covariances_).all()


def test_row_overflowing_float32_is_refused_by_predict_and_score():
    """After a float32 fit, a query row whose squared distance overflows float32 is
    refused by every scoring method, naming the row (as fit refuses it), not scored
    as NaN responsibilities and a -inf log-likelihood; in float64 it is scored."""
    X = (good_data(n=600) + np.repeat(np.eye(3) * 6, 200, axis=0)).astype(np.float32)
    gm = GaussianMixture(3, random_state=0).fit(X)
    query = X[:5].copy()
    query[2, 1] = 1e30
    for method in (gm.predict, gm.predict_proba, gm.score_samples, gm.score):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the overflow itself
            with pytest.raises(ValueError, match=r"Row 2 of X: .* overflows float32 .*"
                                                 r"at column 1"):
                method(query)
    gm.set_params(compute_dtype="float64")
    assert np.isfinite(gm.predict_proba(query)).all()
    assert np.isfinite(gm.score_samples(query)).all()


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_far_outlier_gets_responsibilities_that_sum_to_one(covariance_type):
    """A query row so far out (a netCDF fill value, 9.97e36) that the log-densities
    of the components agree to float64's precision: ``log sum exp`` rounds to their
    common value, and ``exp(log_resp)`` alone gave 1 to each (scikit-learn returns
    rows summing to K there). predict_proba's rows sum to one, the tie split
    equally, and ordinary rows keep ``exp(log_resp)`` to rounding."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.standard_normal((500, 3)), rng.standard_normal((500,
                                                                            3)) + 5])
    gm = GaussianMixture(2, covariance_type=covariance_type, random_state=0).fit(X)
    query = np.vstack([np.full((1, 3), 9.96921e36), [[1e17, 0.0, 0.0]], X[:50]])
    proba = gm.predict_proba(query)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-15)
    # the oracle: scikit-learn's exp(log_resp) from the same parameters, normalised
    sk = SkGaussianMixture(2, covariance_type=covariance_type)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        setattr(sk, name, getattr(gm, name))
    with np.errstate(all="ignore"):
        expected = sk.predict_proba(query)
    if covariance_type == "tied":
        assert expected[0].sum() == 2.0  # the tie this test is about
    np.testing.assert_allclose(proba, expected / expected.sum(axis=1, keepdims=True),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("covariance_type, scale",
                         [("full", 1e20), ("diag", 1e20), ("full", 1e30)])
def test_model_beyond_float32_attributes_is_refused(covariance_type, scale, tmp_path):
    """float32 data of scale 1e20 (variances 1e40, beyond float32; precisions
    1e-40, subnormal) or 1e30 (precisions 1e-60, zero in float32): the fitted
    float32 attributes could not hold the model, so the fit is refused, naming the
    variances and the way out, and leaves no fitted attributes and no checkpoint
    (a resumed fit would end the same way, and one kept refused the suggested retry,
    whose compute_dtype differs); with compute_dtype='float64' (float64 attributes)
    the same data fits, with the same checkpoint path. (At 1e-20 the fit is refused
    earlier, as an ill-defined covariance.)"""
    X = ((good_data(n=600) + np.repeat(np.eye(3) * 6, 200, axis=0)) * scale)
    X = X.astype(np.float32)
    checkpoint = tmp_path / "ck.npz"
    gm = GaussianMixture(3, covariance_type=covariance_type, random_state=0,
                         reg_covar=0.0, checkpoint=checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"^The (starting|fitted) model does "
                                             r"not fit in float32 attributes .* "
                                             r"variances range from .*compute_dtype="
                                             r"'float64'"):
            gm.fit(X)
        assert not hasattr(gm, "weights_")
        assert not checkpoint.exists()
        fitted = gm.set_params(compute_dtype="float64").fit(X)
    assert fitted.covariances_.dtype == np.float64
    assert np.isfinite(fitted.covariances_).all() and (fitted.precisions_ != 0).any()
    assert np.isfinite(fitted.sample(3)[0]).all()


# ------------------------------------------------------------- wrong dtypes


@pytest.mark.parametrize("X,match", [
    (np.array([[1, "a"], [2, "b"], [3, "c"]], dtype=object), "could not convert"),
    # (as scikit-learn: every array of strings, numeric or not, 28.6)
    (np.array([["1", "a"], ["2", "b"], ["3", "c"]]), "not compatible with arrays of "
                                                     "bytes/strings"),
    (good_data() + 1j, "Complex data not supported"),
], ids=["object", "string", "complex"])
def test_non_real_arrays(fitted, X, match):
    check_refused(fitted, "fit", X, ValueError, match)


@pytest.mark.parametrize("array,match", [
    (good_data() + 1j, "Complex data not supported: .*complex128"),
    (np.array([["1", "a"], ["2", "b"]]), "needs real numbers"),
], ids=["complex", "string"])
def test_non_real_npy(tmp_path, fitted, array, match):
    path = tmp_path / "X.npy"
    np.save(path, array)
    check_refused(fitted, "fit", str(path), ValueError, match, [path])


def test_object_npy_needs_pickle_and_is_refused(tmp_path, fitted):
    path = tmp_path / "X.npy"
    np.save(path, np.array([[1, "a"], [2, "b"]], dtype=object), allow_pickle=True)
    check_refused(fitted, "fit", str(path), ValueError, str(path.name), [path])


@pytest.mark.parametrize("data,match", [
    (np.array([[b"a", b"b"]] * 5), "needs real numbers"),
    (good_data().astype(np.complex64), "Complex data not supported"),
], ids=["bytes", "complex"])
def test_non_real_hdf5(tmp_path, fitted, data, match):
    path = tmp_path / "X.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=data)
    check_refused(fitted, "fit", f"{path}:/d", ValueError, match, [path])


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse_input_is_refused(fitted, fmt):
    X = sp.random(300, 3, density=0.5, format=fmt, random_state=0)
    for method in ("fit", "predict", "score_samples"):
        check_refused(fitted, method, X, TypeError, "Sparse data was passed.*toarray")


# ------------------------------------------------------------------- shapes


@pytest.mark.parametrize("kind", ["ndarray", "npy", "h5_string"])
@pytest.mark.parametrize("shape,match", [
    ((0, 3), "0 sample"), ((1, 3), "1 sample"), ((5, 0), "0 feature"),
], ids=["empty", "one sample", "no feature"])
def test_empty_and_one_sample(tmp_path, fitted, kind, shape, match):
    X = good_data(1) if shape == (1, 3) else np.zeros(shape)
    paths = []
    if kind == "npy":
        paths = [tmp_path / "X.npy"]
        np.save(paths[0], X)
        X = str(paths[0])
    elif kind == "h5_string":  # contiguous: h5py cannot chunk an empty dataset
        paths = [tmp_path / "X.h5"]
        with h5py.File(paths[0], "w") as f:
            f.create_dataset("d", data=X)
        X = f"{paths[0]}:/d"
    check_refused(fitted, "fit", X, ValueError, match, paths)


@pytest.mark.parametrize("kind", ["ndarray", "npy", "h5_string"])
def test_too_few_samples_for_the_components(make_sources, kind):
    source = make_sources.one(good_data(4), kind)
    gm = GaussianMixture(5, random_state=0)
    check_refused(gm, "fit", source.obj, ValueError,
                  "n_samples >= n_components.*n_components = 5, n_samples = 4",
                  [source.path] if source.path else [])


@pytest.mark.parametrize("kind", ["ndarray", "npy", "h5", "h5_string"])
@pytest.mark.parametrize("method", ["predict", "predict_proba", "score_samples",
                                    "score", "bic"])
def test_feature_count_mismatch(make_sources, fitted, kind, method):
    source = make_sources.one(good_data(20, 4), kind)
    check_refused(fitted, method, source.obj, ValueError,
                  "X has 4 features, but GaussianMixture is expecting 3",
                  [source.path] if source.path else [])


def test_one_dimensional_file(tmp_path, fitted):
    path = tmp_path / "X.npy"
    np.save(path, np.arange(10.0))
    check_refused(fitted, "fit", str(path), ValueError, "Expected 2D array", [path])


# -------------------------------------------------------- initial parameters


@pytest.mark.parametrize("covariance_type,precisions,match", [
    ("full", np.array([np.eye(3), -np.eye(3)]), "symmetric, positive-definite"),
    ("full", np.array([np.eye(3), [[1, 2, 0], [2, 1, 0], [0, 0, 1]]]),
     "symmetric, positive-definite"),
    ("full", np.array([np.eye(2), np.eye(2)]), r"shape of \(2, 3, 3\)"),
    ("tied", -np.eye(3), "symmetric, positive-definite"),
    ("tied", np.eye(4), r"shape of \(3, 3\)"),
    ("diag", -np.ones((2, 3)), "should be positive"),
    ("diag", np.ones((3, 3)), r"shape of \(2, 3\)"),
    ("spherical", np.array([1.0, 0.0]), "should be positive"),
    ("spherical", np.ones(3), r"shape of \(2,\)"),
])
def test_bad_precisions_init(fitted, covariance_type, precisions, match):
    fitted.set_params(covariance_type=covariance_type, precisions_init=precisions)
    check_refused(fitted, "fit", good_data(), ValueError, match)


@pytest.mark.parametrize("weights,match", [
    ([0.3, 0.3], "should be normalized"),
    ([1.5, -0.5], r"should be in the range \[0, 1\]"),
    ([0.2, 0.3, 0.5], r"shape of \(2,\)"),
])
def test_bad_weights_init(fitted, weights, match):
    fitted.set_params(weights_init=weights)
    check_refused(fitted, "fit", good_data(), ValueError, match)


@pytest.mark.parametrize("means", [np.zeros((2, 4)), np.zeros((3, 3)), np.zeros(3)])
def test_bad_means_init(fitted, means):
    fitted.set_params(means_init=means)
    check_refused(fitted, "fit", good_data(), ValueError,
                  r"'means' should have the shape")


# -------------------------------------------------------------------- files


def test_hdf5_file_locked_by_a_writer(tmp_path, fitted):
    if os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE":
        pytest.skip("HDF5 file locking is disabled in this environment")
    path = tmp_path / "X.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=good_data())
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, h5py; f = h5py.File(sys.argv[1], 'r+'); "
         "print('open', flush=True); time.sleep(120)", str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        # (fingerprinted after the writer opened it: opening for writing marks the file)
        check_refused(fitted, "fit", f"{path}:/d", OSError,
                      rf"{path.name}.*locked.*HDF5_USE_FILE_LOCKING", [path])
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()  # (left open, its pipe is a ResourceWarning)


@pytest.mark.parametrize("cut", ["data", "header"])
def test_truncated_npy(tmp_path, fitted, cut):
    path = tmp_path / "X.npy"
    np.save(path, good_data())
    raw = path.read_bytes()
    path.write_bytes(raw[:-100] if cut == "data" else raw[:40])
    check_refused(fitted, "fit", str(path), ValueError, rf"{path.name}", [path])
    check_refused(fitted, "predict", str(path), ValueError, rf"{path.name}", [path])


def test_missing_files(tmp_path, fitted):
    check_refused(fitted, "fit", str(tmp_path / "nope.npy"), FileNotFoundError,
                  "nope.npy")
    path = tmp_path / "X.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=good_data())
    check_refused(fitted, "fit", f"{path}:/missing", KeyError, "missing", [path])


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_float64_data_whose_variances_overflow_get_the_overflow_message(
        covariance_type):
    """Data of scale 1e200: the variances (1e400) overflow float64. The message says
    so, not scikit-learn's "ill-defined covariance ... collapsed samples"."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(300, 3)), rng.normal(size=(300, 3)) + 5])
    gm = GaussianMixture(2, **type_settings(covariance_type, X.shape[1]),
                         random_state=0)
    with pytest.raises(ValueError, match="not finite: the data's variances overflow "
                                         "float64") as info:
        gm.fit(X * 1e200)
    assert "Scale the input data" in str(info.value)
    assert not hasattr(gm, "means_")


def test_init_max_samples_below_n_components_names_the_parameter():
    """The data has enough rows; the initialisation subsample does not: the message
    names init_max_samples, not a wrong n_samples."""
    X = good_data(n=300)
    with pytest.raises(ValueError, match=r"init_max_samples=2 is below n_components=3"):
        GaussianMixture(3, init_max_samples=2, random_state=0).fit(X)


def test_temp_folder_short_of_space_gives_both_sizes_and_the_spare(tmp_path,
                                                                    monkeypatch):
    """1.6 MB to write into a folder with 2 MiB free: the message read '2 MiB free;
    ... needs 2 MiB' (whole MiB, the 1 MiB kept to spare unsaid)."""
    import shutil

    from emgmm._runtime import executor as _parallel

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: usage._replace(free=2 * 2**20))
    with pytest.raises(OSError, match=r"has 2\.0 MiB free; sharing X with the workers "
                                      r"needs 1\.6 MiB and 1 MiB to spare"):
        _parallel.make_temp_folder(str(tmp_path), int(1.6 * 2**20),
                                   "sharing X with the workers")
    assert os.listdir(tmp_path) == []


def test_temp_folder_that_is_a_file_says_so(tmp_path):
    """temp_folder naming a file: an OSError naming that folder and how to choose
    another, not a bare errno on an internal path."""
    not_a_folder = tmp_path / "afile"
    not_a_folder.write_text("")
    with pytest.raises(OSError, match=r"Temporary folder .*afile is not usable "
                                      r"\(Not a directory\)") as info:
        GaussianMixture(3, n_jobs=2, temp_folder=str(not_a_folder),
                        random_state=0).fit(good_data(n=300))
    assert "emgmm-" not in str(info.value)
    assert "temp_folder parameter" in str(info.value)


@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_memory_refusal_suggests_only_another_schedule(schedule):
    """The refusal's advice names schedule='components' only when the fit would run
    another schedule."""
    X = np.zeros((300, 300))
    gm = GaussianMixture(200, n_jobs=2, schedule=schedule, memory_limit=1.0)
    with pytest.raises(MemoryError, match=f"under the '{schedule}' schedule") as info:
        gm.fit(X)
    assert ("schedule='components'" in str(info.value)) == (schedule == "rows")
