"""The covariance-type protocol is split by concern
(``emgmm/covariance/_protocols.py``): each concern is a small abstract class,
every method of ``CovarianceType`` is defined in exactly one of them, and every
registered type implements all of them.

Each check is a function that returns what is wrong; the tests run it on the
package and, so that it can fail, on a class built to break it.
"""

import inspect
from abc import ABC

import pytest

import emgmm.covariance
from emgmm.covariance import REGISTRY, CovarianceType
from emgmm.covariance import _protocols as protocols_module

#: At most this many methods in one concern.
MAX_METHODS = 12

#: The protocols (every class that _protocols.py defines), in the order CovarianceType
#: lists its bases.
PROTOCOLS = tuple(cls for cls in CovarianceType.__bases__ if cls is not ABC)

#: What CovarianceType itself may define: the rest is in the protocols.
OWN_METHODS = {"__repr__", "__reduce__"}


def _functions(cls):
    """The names of the functions defined in the body of ``cls``."""
    return [name for name, member in vars(cls).items()
            if inspect.isfunction(member)
            or isinstance(member, (staticmethod, classmethod, property))]


def _oversized(protocols, limit=MAX_METHODS):
    return {cls.__name__: len(_functions(cls)) for cls in protocols
            if len(_functions(cls)) > limit}


def _misplaced(kind_class, protocols, own=frozenset(OWN_METHODS)):
    """``{method: [protocols defining it]}`` for every function of ``kind_class``'s
    protocol side that is not defined in exactly one protocol, and the functions
    ``kind_class`` defines itself beyond ``own`` (under the key ``kind_class``)."""
    where = {}
    for cls in protocols:
        for name in _functions(cls):
            where.setdefault(name, []).append(cls.__name__)
    everything = {name for cls in inspect.getmro(kind_class)[1:]
                  if cls.__module__.startswith("emgmm.covariance")
                  for name in _functions(cls)} - own
    wrong = {name: places for name, places in where.items() if len(places) != 1}
    wrong.update({name: [] for name in everything - set(where)})
    extra = sorted(set(_functions(kind_class)) - own)
    if extra:
        wrong[kind_class.__name__] = extra
    return wrong


def _not_implemented(kinds, protocols):
    return sorted(f"{name} is no {cls.__name__}" for name, kind in kinds.items()
                  for cls in protocols if not isinstance(kind, cls))


def test_the_protocols_are_the_classes_of_protocols_py():
    defined = {cls for _, cls in inspect.getmembers(protocols_module, inspect.isclass)
               if cls.__module__ == protocols_module.__name__}
    assert set(PROTOCOLS) == defined
    assert len(PROTOCOLS) == 9
    assert all(cls.__doc__ and cls.__doc__.strip() for cls in PROTOCOLS)
    assert set(emgmm.covariance.__all__) >= {cls.__name__ for cls in PROTOCOLS}


def test_every_protocol_is_small():
    assert _oversized(PROTOCOLS) == {}
    # (the check can fail)
    assert _oversized(PROTOCOLS, limit=1)


def test_every_method_of_covariance_type_is_in_exactly_one_protocol():
    assert _misplaced(CovarianceType, PROTOCOLS) == {}
    counted = sum(len(_functions(cls)) for cls in PROTOCOLS)
    assert counted == len({name for cls in PROTOCOLS for name in _functions(cls)})
    for name in CovarianceType.__abstractmethods__:
        assert any(name in vars(cls) for cls in PROTOCOLS), name


def test_the_placement_check_can_fail():
    class Doubled(protocols_module.Sampling):
        def sample(self, rng, means, covariances, counts):  # also in Sampling
            return []

    class Extra(CovarianceType):
        pass

    def extra_method(self):
        return None

    Extra.not_in_a_protocol = extra_method
    assert _misplaced(CovarianceType, PROTOCOLS + (Doubled,)) == {
        "sample": ["Sampling", "Doubled"]}
    assert _misplaced(CovarianceType, PROTOCOLS[1:]) != {}
    assert _misplaced(Extra, PROTOCOLS) == {"Extra": ["not_in_a_protocol"]}


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_registered_type_is_every_protocol(name):
    assert _not_implemented({name: REGISTRY[name]}, PROTOCOLS) == []


def test_the_implementation_check_can_fail():
    class OnlySampling(protocols_module.Sampling):
        def sample(self, rng, means, covariances, counts):
            return []

    found = _not_implemented({"only": OnlySampling()}, PROTOCOLS)
    assert found and "only is no Sampling" not in found
