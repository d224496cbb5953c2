"""The covariance-type protocol: what the engine, the estimators, the memory model
and the model files ask of a covariance type.

A covariance type is a stateless object (one instance per type, in
:data:`emgmm.covariance.REGISTRY`) that owns everything specific to it: the shapes
of its parameters and their count, the factorisation of the covariances into
precision Cholesky factors and back, the log-density and statistics kernels of a
block, the covariance part of the M step, the sizes the memory model needs, the
layout of its factors in a model file and the validation of user-given precisions.

Shapes follow scikit-learn's ``covariances_`` (``(K, d, d)`` 'full', ``(d, d)``
'tied', ``(K, d)`` 'diag', ``(K,)`` 'spherical'); ``U`` is the precision Cholesky
factor with ``U @ U.T == precision`` (scikit-learn's ``precisions_cholesky_``).
Adding a type is one module with a subclass of :class:`CovarianceType` and one
line in the registry.

The methods are grouped by concern into the abstract base classes of
:mod:`emgmm.covariance._protocols` (sizes, parameterisation, re-seeding, kernels,
variational prior, model-file layout, validation, sampling, online statistics);
:class:`CovarianceType` composes them and holds the class attributes.
"""

from __future__ import annotations

from abc import ABC
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

# (FloatArray, Opaque and not_upper_triangular_message moved to _protocols.py and
# stay importable from here)
from ._protocols import FloatArray as FloatArray
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
from ._protocols import Opaque as Opaque
from ._protocols import not_upper_triangular_message as not_upper_triangular_message

#: ``covariance_type`` -> its :class:`CovarianceType`, in scikit-learn's order; filled
#: by ``emgmm/covariance/__init__.py`` (which Python runs before any module of the
#: package), kept here so that the kernel modules that dispatch by name and the
#: types that use those kernels do not import each other.
REGISTRY: dict[str, CovarianceType] = {}


def get_covariance_type(covariance_type: str | CovarianceType) -> CovarianceType:
    """The :class:`CovarianceType` registered under ``covariance_type``.

    Parameters
    ----------
    covariance_type : str or CovarianceType
        A name of :data:`emgmm.covariance.REGISTRY`, or a covariance type (returned
        as it is).

    Returns
    -------
    CovarianceType

    Raises
    ------
    ValueError
        If the name is not registered.
    """
    if isinstance(covariance_type, CovarianceType):
        return covariance_type
    try:
        return REGISTRY[covariance_type]
    except (KeyError, TypeError):
        raise ValueError(f"unknown covariance_type {covariance_type!r} (one of "
                         f"{', '.join(map(repr, REGISTRY))})") from None


def register_covariance_type(kind: CovarianceType, *,
                             replace: bool = False) -> CovarianceType:
    """Register a covariance type under its ``name``, checked first.

    The estimators (``covariance_type=kind.name``), the memory model and the model
    files then use it; :data:`emgmm.covariance.REGISTRY` keeps the order of
    registration. The four types of scikit-learn and 'factor' are registered so.

    Parameters
    ----------
    kind : CovarianceType
        An instance of a subclass of ``emgmm.covariance.CovarianceType`` (which
        cannot be made while an abstract method is left undefined).
    replace : bool, default=False
        Whether ``kind`` may take the place of a type registered under its name.

    Returns
    -------
    CovarianceType
        ``kind``, as :func:`get_covariance_type` returns it from now on.

    Raises
    ------
    TypeError
        If ``kind`` is not a ``CovarianceType`` instance.
    ValueError
        If its ``name`` is not a non-empty identifier, is ``'all'`` (which
        ``GaussianMixtureIC`` reads as every type), or is registered already
        (without ``replace``); if ``parameters`` is not a tuple of identifiers,
        or ``attribute_names`` not a non-empty tuple of names ending in ``_``.
    """
    if not isinstance(kind, CovarianceType):
        got = (f"the class {kind.__name__}" if isinstance(kind, type)
               else type(kind).__name__)
        raise TypeError("a covariance type must be an instance of a CovarianceType "
                        f"subclass, got {got}")
    name = getattr(kind, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or name == "all":
        raise ValueError(f"{type(kind).__name__}.name must be a non-empty identifier "
                         f"other than 'all', got {name!r}")
    if name in REGISTRY and not replace:
        raise ValueError(f"covariance_type {name!r} is registered already "
                         f"({REGISTRY[name]!r}); pass replace=True to replace it")
    parameters, attributes = kind.parameters, kind.attribute_names
    if not (isinstance(parameters, tuple)
            and all(isinstance(p, str) and p.isidentifier() for p in parameters)):
        raise ValueError(f"{type(kind).__name__}.parameters must be a tuple of "
                         f"parameter names, got {parameters!r}")
    if not (isinstance(attributes, tuple) and attributes and all(
            isinstance(a, str) and a.isidentifier() and a.endswith("_")
            for a in attributes)):
        raise ValueError(f"{type(kind).__name__}.attribute_names must be a non-empty "
                         "tuple of fitted attribute names ending in '_', got "
                         f"{attributes!r}")
    REGISTRY[name] = kind
    return kind


def check_shape(array: np.ndarray, shape: tuple[int, ...], name: str) -> None:
    """Raise ``ValueError`` (scikit-learn's wording) unless ``array.shape == shape``."""
    if array.shape != shape:
        raise ValueError(f"The parameter '{name}' should have the shape of {shape}, "
                         f"but got {array.shape}")


class CovarianceType(ModelFileLayout, Sizes, Parameterisation, Reseeding,
                     OnlineStatistics, Kernels, VariationalPrior, Validation,
                     Sampling, ABC):
    """One covariance type: its parameters, kernels, sizes and file layout.

    It composes the concerns of :mod:`emgmm.covariance._protocols`, each an
    abstract base class with its methods:

    - :class:`~emgmm.covariance._protocols.Sizes`: shapes, counts, bytes and work
      per row (the memory model).
    - :class:`~emgmm.covariance._protocols.Parameterisation`: the precision
      Cholesky factors, ``log det``, feature variances, per-component factors.
    - :class:`~emgmm.covariance._protocols.Reseeding`: pooled covariances, the
      repair of degenerate components, the widest axis of a split.
    - :class:`~emgmm.covariance._protocols.Kernels`: the log-densities,
      statistics and M step of a block.
    - :class:`~emgmm.covariance._protocols.VariationalPrior`: the conjugate prior
      of ``BayesianGaussianMixture``.
    - :class:`~emgmm.covariance._protocols.ModelFileLayout`: fitted attributes and
      the arrays of a model file.
    - :class:`~emgmm.covariance._protocols.Validation`: checks of user-given
      precisions and feature counts.
    - :class:`~emgmm.covariance._protocols.Sampling`: draws of the components.
    - :class:`~emgmm.covariance._protocols.OnlineStatistics`: the running
      statistics of stepwise online EM.

    A protocol whose defaults read another comes before it among the bases
    (:class:`~emgmm.covariance._protocols.ModelFileLayout` before ``Sizes`` and
    ``Parameterisation``, ``OnlineStatistics`` before ``Kernels``), as Python's
    method resolution order requires.

    Attributes
    ----------
    name : str
        The ``covariance_type`` value that selects it.
    shared : bool
        One covariance for all components ('tied'): the components' statistics
        pool into it, a degenerate component cannot be re-seeded alone, and the
        component schedule keeps one slice.
    triangular : bool
        The factors are triangular matrices (checked upper triangular).
    statistics_need_products : bool
        Its statistics need the block's products (:meth:`block_products`) also
        where no E step of the same block made them (the component schedule).
    stores_covariances : bool
        The fitted attributes hold the covariance parameters, not the factors
        ('factor'): float32 attributes are scored with factors formed again from
        the rounded parameters.
    streams_blocks : bool
        Cheap per-row work: blocks are capped at the memory model's streaming size.
    chunked_blocks : bool
        Its kernels work on a block by row chunks of their own: blocks are
        capped at the memory model's ``CHUNKED_BLOCK_MIB``.
    holds_degenerate : bool
        A degenerate component of the M step can keep part of its E-step
        parameters instead of being re-seeded (:meth:`hold_degenerate`), so that
        the lower bound cannot decrease.
    variational : bool
        It has the conjugate prior of ``BayesianGaussianMixture`` (the methods
        of :class:`~emgmm.covariance._protocols.VariationalPrior`).
    parameters : tuple of str
        The estimator parameters that configure it (read by :meth:`for_params`).
    attribute_names : tuple of str
        The fitted attributes that hold the covariances
        (:meth:`fitted_attributes`).
    """

    name: str
    shared: bool = False
    triangular: bool = False
    statistics_need_products: bool = False
    stores_covariances: bool = False
    streams_blocks: bool = False
    chunked_blocks: bool = False
    holds_degenerate: bool = False
    variational: bool = True
    parameters: tuple[str, ...] = ()
    attribute_names: tuple[str, ...] = ("covariances_", "precisions_cholesky_",
                                        "precisions_")

    def __repr__(self) -> str:
        return f"<covariance type {self.name!r}>"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # one instance per type, also in worker processes
        return (get_covariance_type, (self.name,))


def widest_axis_of_matrix(covariance: ArrayLike) -> np.ndarray:
    """One standard deviation along the leading eigenvector of the (d, d)
    ``covariance`` (:meth:`CovarianceType.widest_axis` of the dense types)."""
    values, vectors = np.linalg.eigh(np.asarray(covariance, dtype=np.float64))
    return np.sqrt(max(values[-1], 0.0)) * vectors[:, -1]
