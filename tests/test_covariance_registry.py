"""The covariance-type registry: every registered type against scikit-learn (shapes,
parameter counts, factorisation round trips, the errors of user-given parameters),
and a type added by one class and one registry entry fits through the whole stack."""

import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    SKLEARN_COVARIANCE_TYPES,
    make_blobs_data,
    random_spd,
)
from numpy.testing import assert_allclose
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from emgmm import GaussianMixture
from emgmm.covariance import REGISTRY, CovarianceType, get_covariance_type
from emgmm.covariance._diag import DiagCovariance

K, D = 3, 4


def test_registry_holds_scikit_learns_types_in_order_then_emgmms():
    assert tuple(REGISTRY) == COVARIANCE_TYPES
    assert COVARIANCE_TYPES[:4] == SKLEARN_COVARIANCE_TYPES == (
        "full", "tied", "diag", "spherical")
    for name, kind in REGISTRY.items():
        assert isinstance(kind, CovarianceType) and kind.name == name
        assert get_covariance_type(name) is kind and get_covariance_type(kind) is kind
    with pytest.raises(ValueError, match="unknown covariance_type 'banana'"):
        get_covariance_type("banana")


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_shapes_and_parameter_count_match_scikit_learn(covariance_type):
    X = make_blobs_data(300, D, K, seed=2)
    sk = SkGaussianMixture(K, covariance_type=covariance_type, random_state=0).fit(X)
    kind = REGISTRY[covariance_type]
    assert kind.covariance_shape(K, D) == sk.covariances_.shape
    em = GaussianMixture(K, covariance_type=covariance_type, random_state=0).fit(X)
    assert em._n_parameters() == sk._n_parameters()


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_factor_round_trips(covariance_type):
    """covariances -> factors -> precisions and covariances again, against numpy's
    inverse."""
    rng = np.random.default_rng(0)
    kind = REGISTRY[covariance_type]
    full = np.stack([random_spd(rng, D) for _ in range(K)])
    cov = {"full": full, "tied": full[0], "diag": np.diagonal(full, axis1=1, axis2=2),
           "spherical": full[:, 0, 0]}[covariance_type]
    u, bad = kind.factorize(cov)
    assert bad == []
    assert_allclose(kind.covariances_from_cholesky(u), cov, rtol=1e-10)
    precisions = kind.precisions_from_cholesky(u)
    inverse = (np.linalg.inv(cov) if cov.ndim >= 2 and covariance_type != "diag"
               else 1.0 / cov)
    assert_allclose(precisions, inverse, rtol=1e-10)
    assert_allclose(kind.precisions_cholesky_from_precisions(precisions), u, rtol=1e-10)


def _sk_error(**init):
    with pytest.raises(ValueError) as info:
        SkGaussianMixture(K, max_iter=1, **init).fit(make_blobs_data(60, D, K))
    return str(info.value)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_bad_initial_parameters_raise_scikit_learns_errors(covariance_type):
    shape = REGISTRY[covariance_type].covariance_shape(K, D)
    bad_precisions = [np.zeros(shape), np.ones(shape[:-1] + (shape[-1] + 1,))]
    if REGISTRY[covariance_type].triangular:
        asymmetric = np.broadcast_to(np.eye(D), shape).copy()
        asymmetric[..., 0, 1] = 0.5
        bad_precisions.append(asymmetric)
    cases = [dict(precisions_init=p) for p in bad_precisions]
    cases += [dict(weights_init=np.full(K, 0.5)), dict(weights_init=[-0.5, 1.0, 0.5]),
              dict(weights_init=np.ones(K + 1) / (K + 1)),
              dict(means_init=np.zeros((K, D + 1)))]
    X = make_blobs_data(60, D, K)
    for init in cases:
        expected = _sk_error(covariance_type=covariance_type, **init)
        with pytest.raises(ValueError) as info:
            GaussianMixture(K, covariance_type=covariance_type, max_iter=1,
                            **init).fit(X)
        assert str(info.value) == expected


class _DiagCopy(DiagCovariance):
    """'diag' under another name: a type added by one class and one registry line."""

    name = "diag_copy"


def test_a_new_type_is_one_class_and_one_registry_entry(monkeypatch, tmp_path):
    from emgmm import load_model, save_model

    monkeypatch.setitem(REGISTRY, "diag_copy", _DiagCopy())
    X = make_blobs_data(400, D, K, seed=3)
    new = GaussianMixture(K, covariance_type="diag_copy", random_state=0).fit(X)
    diag = GaussianMixture(K, covariance_type="diag", random_state=0).fit(X)
    assert new.lower_bounds_ == diag.lower_bounds_
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        np.testing.assert_array_equal(getattr(new, name), getattr(diag, name))
    save_model(new, tmp_path / "m.h5")
    np.testing.assert_array_equal(load_model(tmp_path / "m.h5").score_samples(X),
                                  new.score_samples(X))
