"""``emgmm.covariance.register_covariance_type``: the checked entry point that adds
a covariance type to the registry, and what it refuses."""

import os
import pathlib
import re
import subprocess
import sys

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


#: A pytest plugin registering 'diag' under another name from outside the package:
#: loaded (``-p``) before the tests are collected, so that the generic tests, which
#: are parametrised over the registry, are collected for it too.
PLUGIN = """
from emgmm.covariance import register_covariance_type
from emgmm.covariance._diag import DiagCovariance


class DiagAgain(DiagCovariance):
    name = "diag_again"


register_covariance_type(DiagAgain())
"""


@pytest.mark.slow
def test_the_generic_tests_run_and_pass_on_a_type_registered_from_outside(tmp_path):
    """The quick subset's tests parametrised over the registry, run in a pytest
    whose plugin registered a type, pass on that type (those with process workers
    left out: see the next test)."""
    (tmp_path / "diag_again_plugin.py").write_text(PLUGIN)
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "diag_again_plugin",
         "-p", "no:cacheprovider", "-q", "-m", "not slow",
         "-k", "diag_again and not n_jobs_2_equals_n_jobs_1", str(root / "tests")],
        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    assert passed >= 40, result.stdout[-2000:]


@pytest.mark.slow
def test_process_workers_fit_a_type_registered_from_outside(registry):
    """Process workers import emgmm afresh: the type travels with the model they
    receive and is registered there."""
    register_covariance_type(_diag_named("diag_again"))
    X = make_blobs_data(2000, D, K, seed=4)
    new = GaussianMixture(K, covariance_type="diag_again", n_jobs=2, block_size=100,
                          random_state=0).fit(X)
    diag = GaussianMixture(K, covariance_type="diag", n_jobs=2, block_size=100,
                           random_state=0).fit(X)
    assert new.lower_bounds_ == diag.lower_bounds_
