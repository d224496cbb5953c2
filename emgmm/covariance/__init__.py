"""The covariance types behind one protocol (:class:`CovarianceType`).

:class:`CovarianceType` composes one abstract base class per concern (the
protocols of :mod:`emgmm.covariance._protocols`: :class:`Sizes`,
:class:`Parameterisation`, :class:`Reseeding`, :class:`Kernels`,
:class:`VariationalPrior`, :class:`ModelFileLayout`, :class:`Validation`,
:class:`Sampling`, :class:`OnlineStatistics`); a caller that needs one concern
names that one.

:data:`REGISTRY` maps each ``covariance_type`` value to its type; the engine, the
estimators, the memory model and the model files ask it. A new type is a module
with a :class:`CovarianceType` subclass and one line here; outside the package,
one call of :func:`register_covariance_type`, which checks the type first.
"""

from ._base import (
    REGISTRY,
    CovarianceType,
    get_covariance_type,
    register_covariance_type,
)
from ._diag import DiagCovariance
from ._factor import FactorCovariance
from ._full import FullCovariance
from ._protocols import (
    Kernels,
    ModelFileLayout,
    OnlineStatistics,
    Parameterisation,
    Reseeding,
    Sampling,
    Sizes,
    Validation,
    VariationalPrior,
)
from ._spherical import SphericalCovariance
from ._tied import TiedCovariance

# (into the dict of _base.py, which the kernel modules' dispatch by name reads)
for _kind in (FullCovariance(), TiedCovariance(), DiagCovariance(),
              SphericalCovariance(), FactorCovariance()):
    register_covariance_type(_kind)
del _kind

__all__ = ["REGISTRY", "CovarianceType", "get_covariance_type",
           "register_covariance_type",
           # the protocols CovarianceType composes, one per concern
           "Sizes", "Parameterisation", "Reseeding", "Kernels", "VariationalPrior",
           "ModelFileLayout", "Validation", "Sampling", "OnlineStatistics"]
