"""The public API is annotated throughout (the package ships ``py.typed``).

Every callable that ``emgmm`` exports (its lazy facade ``_PUBLIC``), that
``emgmm.covariance`` exports (the registration entry point and the protocol a
registered type implements), and the :class:`Source` that ``as_source`` returns
must annotate each parameter (``self`` and ``cls`` aside) and its return; for a
class, so must ``__init__`` and every public method, property and descriptor it or
an emgmm base class defines (scikit-learn's own methods are scikit-learn's).
``python -m mypy`` (in .ci/run) checks that the annotations hold; this test keeps
them from being dropped.
"""

import functools
import inspect

import pytest

import emgmm
import emgmm.covariance
from emgmm._io.sources import Source

OBJECTS = {
    **{f"emgmm.{name}": getattr(emgmm, name) for name in emgmm._PUBLIC},
    **{f"emgmm.covariance.{name}": getattr(emgmm.covariance, name)
       for name in emgmm.covariance.__all__
       if callable(getattr(emgmm.covariance, name))},
    "Source (what emgmm.as_source returns)": Source,
}


def _function(member):
    """The function behind a class member (method, property, cached property,
    class or static method, scikit-learn's ``available_if``), or ``None``."""
    if isinstance(member, (classmethod, staticmethod)):
        return member.__func__
    if isinstance(member, property):
        return member.fget
    if isinstance(member, functools.cached_property):
        return member.func
    if inspect.isfunction(member):
        return member
    return getattr(member, "fn", None)  # sklearn.utils.metaestimators.available_if


def _callables(name, obj):
    """``[(qualified name, function)]`` that ``obj`` puts in the public API."""
    if not inspect.isclass(obj):
        return [(name, obj)]
    found = {}
    for base in reversed(obj.__mro__):
        if not base.__module__.startswith("emgmm"):
            continue
        for attr, member in vars(base).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            function = _function(member)
            if function is not None:
                found[attr] = (f"{name}.{attr}", function)
    return sorted(found.values())


CALLABLES = [entry for name, obj in OBJECTS.items()
             for entry in _callables(name, obj)]


def _missing(function):
    """The parameters (and ``'return'``) of ``function`` without an annotation."""
    signature = inspect.signature(function)
    params = list(signature.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_the_walk_finds_the_public_api():
    names = {name for name, _ in CALLABLES}
    for expected in ("emgmm.GaussianMixture.__init__", "emgmm.GaussianMixture.fit",
                     "emgmm.GaussianMixture.partial_fit", "emgmm.GaussianMixture.bic",
                     "emgmm.BayesianGaussianMixture.score_samples",
                     "emgmm.GaussianMixtureIC.sample", "emgmm.save_model",
                     "emgmm.load_model", "emgmm.as_source",
                     "emgmm.covariance.register_covariance_type",
                     "emgmm.covariance.CovarianceType.log_prob",
                     "Source (what emgmm.as_source returns).read"):
        assert expected in names


@pytest.mark.parametrize(("name", "function"), CALLABLES,
                         ids=[name for name, _ in CALLABLES])
def test_public_callable_is_annotated(name, function):
    assert _missing(function) == [], f"{name} lacks annotations"


def test_the_check_fails_on_a_missing_annotation():
    def partly(self, a: int, b, *args, **kwargs: int):
        return a

    assert _missing(partly) == ["b", "args", "return"]
