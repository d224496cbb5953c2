"""Per-row outputs (predict, predict_proba, score_samples): scikit-learn's dtypes,
``out=`` to stream them into an array or memmap, numeric strings refused as
scikit-learn refuses them."""

import numpy as np
import pytest
import sklearn.mixture
from numpy.lib.format import open_memmap

import emgmm


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(m, 1.0, (300, 3)) for m in (-4, 0, 4)])
    out = {}
    for dtype in (np.float32, np.float64):
        Xd = X.astype(dtype)
        init = dict(means_init=X[[0, 300, 600]], random_state=0)
        out[dtype] = (Xd, emgmm.GaussianMixture(3, **init).fit(Xd),
                      sklearn.mixture.GaussianMixture(3, **init).fit(Xd))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["predict_proba", "score_samples", "predict"])
def test_dtypes_follow_scikit_learn(fitted, dtype, method):
    X, ours, theirs = fitted[dtype]
    got, expected = getattr(ours, method)(X), getattr(theirs, method)(X)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    if method != "predict":
        rtol = 1e-4 if dtype == np.float32 else 1e-9
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("method,shape,dtype", [
    ("predict", (900,), np.int64), ("predict_proba", (900, 3), np.float64),
    ("score_samples", (900,), np.float64)])
def test_out_array_and_memmap_are_filled_and_returned(fitted, tmp_path, method, shape,
                                                      dtype):
    X, ours, _ = fitted[np.float64]
    expected = getattr(ours, method)(X)
    out = np.full(shape, -7, dtype=dtype)
    assert getattr(ours, method)(X, out=out) is out
    np.testing.assert_array_equal(out, expected)
    mm = open_memmap(tmp_path / "out.npy", mode="w+", dtype=dtype, shape=shape)
    assert getattr(ours, method)(X, out=mm) is mm
    np.testing.assert_array_equal(mm, expected)


def test_out_of_the_wrong_shape_or_kind_is_refused(fitted):
    X, ours, _ = fitted[np.float64]
    with pytest.raises(ValueError, match=r"out has shape \(10,\), not \(900, 3\)"):
        ours.predict_proba(X, out=np.empty(10))
    with pytest.raises(ValueError, match="out has dtype int64; predict_proba writes"):
        ours.predict_proba(X, out=np.empty((900, 3), dtype=np.int64))
    readonly = np.empty(900, dtype=np.int64)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        ours.predict(X, out=readonly)


@pytest.mark.parametrize("method", ["fit", "score", "score_samples", "predict",
                                    "predict_proba"])
def test_numeric_strings_are_refused(fitted, method):
    X, ours, _ = fitted[np.float64]
    strings = X.astype(str)
    with pytest.raises(ValueError, match="not compatible with arrays of bytes/strings"):
        getattr(emgmm.GaussianMixture(3) if method == "fit" else ours, method)(strings)
    with pytest.raises(ValueError, match="not compatible with arrays of bytes/strings"):
        getattr(emgmm.GaussianMixture(3) if method == "fit" else ours,
                method)(strings.tolist())






def test_out_is_no_routed_metadata():
    """``out=`` is not metadata for scikit-learn's routing: no ``set_*_request``
    methods appear, and a Pipeline with routing enabled predicts as without it."""
    from numpy.testing import assert_array_equal
    from sklearn import config_context
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    for estimator in (emgmm.GaussianMixture, emgmm.BayesianGaussianMixture):
        assert not {"set_predict_request", "set_predict_proba_request",
                    "set_score_samples_request"} & set(dir(estimator))
    X = np.random.default_rng(0).normal(size=(60, 2))
    with config_context(enable_metadata_routing=True):
        pipe = make_pipeline(StandardScaler(), emgmm.GaussianMixture(2, random_state=0))
        routed = pipe.fit(X).predict(X)
    plain = make_pipeline(StandardScaler(), emgmm.GaussianMixture(2, random_state=0))
    assert_array_equal(routed, plain.fit(X).predict(X))
