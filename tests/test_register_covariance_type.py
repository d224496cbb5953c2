"""``emgmm.covariance.register_covariance_type``: the checked entry point that adds
a covariance type to the registry, and what it refuses."""

import numpy as np
import pytest
from helpers import make_blobs_data

from emgmm import GaussianMixture
from emgmm.covariance import REGISTRY, get_covariance_type, register_covariance_type
from emgmm.covariance._diag import DiagCovariance

K, D = 3, 4


@pytest.fixture
def registry():
    """The registry, restored as it was (order included) after the test."""
    saved = dict(REGISTRY)
    yield REGISTRY
    REGISTRY.clear()
    REGISTRY.update(saved)


def _diag_named(name, **attributes):
    """'diag' under another ``name`` (and class attributes)."""
    return type("Renamed", (DiagCovariance,), {"name": name, **attributes})()


def test_a_registered_type_fits_as_the_type_it_copies(registry):
    kind = _diag_named("diag_again")
    assert register_covariance_type(kind) is kind
    assert list(registry)[-1] == "diag_again"
    assert get_covariance_type("diag_again") is kind
    X = make_blobs_data(300, D, K, seed=4)
    new = GaussianMixture(K, covariance_type="diag_again", random_state=0).fit(X)
    diag = GaussianMixture(K, covariance_type="diag", random_state=0).fit(X)
    assert new.lower_bounds_ == diag.lower_bounds_
    np.testing.assert_array_equal(new.covariances_, diag.covariances_)


def test_a_name_registered_already_is_replaced_only_when_asked(registry):
    kind = _diag_named("diag")
    with pytest.raises(ValueError, match="'diag' is registered already"):
        register_covariance_type(kind)
    assert registry["diag"] is not kind
    assert register_covariance_type(kind, replace=True) is registry["diag"]


@pytest.mark.parametrize(("kind", "match"), [
    (DiagCovariance, "CovarianceType subclass, got the class DiagCovariance"),
    ("diag", "must be an instance of a CovarianceType subclass, got str"),
    (_diag_named(""), "name must be a non-empty identifier"),
    (_diag_named("all"), "other than 'all'"),
    (_diag_named("two words"), "name must be a non-empty identifier"),
    (_diag_named(None), "name must be a non-empty identifier"),
    (_diag_named("p", parameters=["n_factors"]), "parameters must be a tuple"),
    (_diag_named("a", attribute_names=()), "attribute_names must be a non-empty"),
    (_diag_named("b", attribute_names=("covariances",)), "ending in '_'"),
])
def test_what_is_no_covariance_type_is_refused(registry, kind, match):
    before = dict(registry)
    with pytest.raises((TypeError, ValueError), match=match):
        register_covariance_type(kind)
    assert registry == before
