"""The precision parameterisation: a fitted model's weights, means and precisions
as ``*_init`` give back that model, and the stored factor is the one the docstrings
name (CASES.md C04, C05).
"""

import re

import numpy as np
import pytest
from helpers import (
    PARAMS,
    SKLEARN_COVARIANCE_TYPES,
    quiet_fit,
)
from numpy.testing import assert_allclose, assert_array_equal

from emgmm import GaussianMixture


@pytest.fixture(scope="module")
def three_blobs():
    rng = np.random.default_rng(0)
    centers = np.array([[0, 0, 0, 0], [10, 0, 0, 0], [0, 10, 0, 0]], dtype=float)
    return np.vstack([c + rng.standard_normal((300, 4)) for c in centers])


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_case_c04_fitted_model_as_init_gives_that_model_back(
        three_blobs, covariance_type):
    X = three_blobs
    A = quiet_fit(GaussianMixture(n_components=3, covariance_type=covariance_type,
                                  tol=1e-12, max_iter=1000, random_state=0), X)
    B = quiet_fit(GaussianMixture(n_components=3, covariance_type=covariance_type,
                                  weights_init=A.weights_, means_init=A.means_,
                                  precisions_init=A.precisions_), X)
    assert_allclose(B.lower_bounds_[0], A.score(X), rtol=1e-10)
    assert_allclose(B.lower_bounds_[0], A.lower_bound_, rtol=1e-10)
    # A is a fixed point of EM (converged to 1e-12): B stays there
    for name in PARAMS:
        assert_allclose(getattr(B, name), getattr(A, name), rtol=1e-8, atol=1e-12,
                        err_msg=name)
    # and with max_iter=0, B is exactly A's parameters
    C = quiet_fit(GaussianMixture(n_components=3, covariance_type=covariance_type,
                                  max_iter=0,
                                  weights_init=A.weights_, means_init=A.means_,
                                  precisions_init=A.precisions_), X)
    for name in PARAMS:
        assert_allclose(getattr(C, name), getattr(A, name), rtol=1e-10, atol=1e-14,
                        err_msg=name)
    assert_allclose(C.score(X), A.score(X), rtol=1e-12)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_case_c05_stored_factor_times_its_transpose_is_the_precision(
        three_blobs, covariance_type):
    gm = GaussianMixture(n_components=3, covariance_type=covariance_type,
                         random_state=0)
    gm.fit(three_blobs)
    U, P, C = gm.precisions_cholesky_, gm.precisions_, gm.covariances_
    d = three_blobs.shape[1]
    if covariance_type == "full":
        for u, p, c in zip(U, P, C, strict=False):
            assert_array_equal(np.tril(u, -1), 0.0)  # upper triangular
            assert_allclose(u @ u.T, p, rtol=1e-12, atol=1e-12 * np.abs(p).max())
            assert_allclose(p @ c, np.eye(d), atol=1e-10)
    elif covariance_type == "tied":
        assert_array_equal(np.tril(U, -1), 0.0)
        assert_allclose(U @ U.T, P, rtol=1e-12, atol=1e-12 * np.abs(P).max())
        assert_allclose(P @ C, np.eye(d), atol=1e-10)
    else:
        assert_allclose(U**2, P, rtol=1e-12)
        assert_allclose(P * C, 1.0, rtol=1e-10)
    doc = GaussianMixture.__doc__
    m = re.search(r"precisions_cholesky_\s*:(.*?)(?=\n\s{4}\w+\s*:|\Z)", doc, re.S)
    assert m, "precisions_cholesky_ is not documented"
    text = " ".join(m.group(1).split())
    assert re.search(r"(?i)upper", text), text
    assert re.search(r"U\s*@\s*U\.T|U\s*U\^T|U U\^\{?T\}?", text), text
