"""Validation of the estimators' parameters and of user-given initial parameters.

scikit-learn's parameter constraints (``sklearn.utils._param_validation``) and its
checks of ``weights_init``/``means_init``/``precisions_init``
(``sklearn.mixture._gaussian_mixture``) are private; these small equivalents give
the same messages (``"The 'tol' parameter of GaussianMixture must be a float in the
range [0.0, inf). Got -1.0 instead."``) and the same exception types. Also the
checks that float32 attributes can hold a model (before ``fit`` and after each
``fit`` or ``partial_fit`` step).
"""

import operator
from numbers import Integral, Real

import numpy as np
from sklearn.utils.validation import check_array

from ..covariance import get_covariance_type
from ..covariance._base import check_shape


class InvalidParameterError(ValueError, TypeError):
    """A constructor parameter of an estimator has an invalid type or value (a
    ``ValueError`` and a ``TypeError``, as scikit-learn's)."""


class Interval:
    """Numbers of ``type`` (``Integral`` or ``Real``) between ``left`` and ``right``
    (``None``: unbounded); ``closed`` in {'left', 'right', 'both', 'neither'}."""

    def __init__(self, type, left, right, *, closed):
        if type is Real:  # (the bounds print as floats)
            left, right = (None if b is None else float(b) for b in (left, right))
        self.type, self.left, self.right, self.closed = type, left, right, closed

    def is_satisfied_by(self, value):
        if not isinstance(value, self.type):
            return False
        if not isinstance(value, Integral) and np.isnan(value):
            return False
        left_ok = operator.ge if self.closed in ("left", "both") else operator.gt
        right_ok = operator.le if self.closed in ("right", "both") else operator.lt
        return ((self.left is None or left_ok(value, self.left))
                and (self.right is None or right_ok(value, self.right)))

    def __str__(self):
        kind = "an int" if self.type is Integral else "a float"
        left = "[" if self.closed in ("left", "both") else "("
        right = "]" if self.closed in ("right", "both") else ")"
        low = "-inf" if self.left is None else self.left
        high = "inf" if self.right is None else self.right
        return f"{kind} in the range {left}{low}, {high}{right}"


class StrOptions:
    """One of the strings ``options`` (a set, or a mapping whose keys are read when
    a value is checked, e.g. :data:`emgmm.covariance.REGISTRY`)."""

    def __init__(self, options):
        self.options = options

    def is_satisfied_by(self, value):
        return isinstance(value, str) and value in self.options

    def __str__(self):
        return f"a str among {{{', '.join(repr(o) for o in self.options)}}}"


class _InstanceOf:
    def __init__(self, type, label=None):
        self.type = type
        self.label = label or f"{type.__module__}.{type.__qualname__}".replace(
            "builtins.", "")

    def is_satisfied_by(self, value):
        return isinstance(value, self.type)

    def __str__(self):
        return f"an instance of {self.label!r}"


class _Test:
    """A constraint given by a predicate and its description."""

    def __init__(self, test, text):
        self.test, self.text = test, text

    def is_satisfied_by(self, value):
        return self.test(value)

    def __str__(self):
        return self.text


def _is_array_like(value):
    return ((hasattr(value, "__len__") or hasattr(value, "shape")
             or hasattr(value, "__array__")) and not np.isscalar(value))


def _constraints(spec):
    """The constraint objects of one entry of ``_parameter_constraints``."""
    out = []
    for c in spec:
        if c is None:
            out.append(_Test(lambda v: v is None, "None"))
        elif c == "array-like":
            out.append(_Test(_is_array_like, "an array-like"))
        elif c == "random_state":
            out += [Interval(Integral, 0, 2**32 - 1, closed="both"),
                    _InstanceOf(np.random.RandomState),
                    _Test(lambda v: v is None, "None")]
        elif c == "boolean":
            out += [_InstanceOf(bool), _InstanceOf(np.bool_, "numpy.bool")]
        elif c == "verbose":
            out += [Interval(Integral, 0, None, closed="left"), _InstanceOf(bool),
                    _InstanceOf(np.bool_, "numpy.bool")]
        elif c is callable:
            out.append(_Test(callable, "a callable"))
        elif isinstance(c, type):
            out.append(_InstanceOf(c))
        else:
            out.append(c)
    return out


def validate_params(constraints, params, caller_name):
    """Raise :class:`InvalidParameterError` for the first parameter (in the order of
    ``params``) that meets none of its constraints.

    Parameters
    ----------
    constraints : dict
        Parameter name -> list of constraints: :class:`Interval`,
        :class:`StrOptions`, a type, ``None``, ``callable``, or one of the strings
        'array-like', 'random_state', 'boolean', 'verbose' (scikit-learn's meaning).
    params : dict
        Parameter name -> value (``get_params(deep=False)``).
    caller_name : str
        The estimator's class name, for the message.
    """
    for name, value in params.items():
        if name not in constraints:
            continue
        options = _constraints(constraints[name])
        if any(c.is_satisfied_by(value) for c in options):
            continue
        if len(options) == 1:
            text = str(options[0])
        else:
            text = f"{', '.join(str(c) for c in options[:-1])} or {options[-1]}"
        raise InvalidParameterError(f"The {name!r} parameter of {caller_name} must be "
                                    f"{text}. Got {value!r} instead.")


def check_weights(weights, n_components):
    """``weights_init`` as a float array of shape ``(n_components,)`` in [0, 1]
    summing to one (within 1e-8, 1e-6 in float32).

    Raises
    ------
    ValueError
        Naming what is wrong (scikit-learn's wording).
    """
    weights = check_array(weights, dtype=[np.float64, np.float32], ensure_2d=False)
    check_shape(weights, (n_components,), "weights")
    if any(np.less(weights, 0.0)) or any(np.greater(weights, 1.0)):
        raise ValueError("The parameter 'weights' should be in the range [0, 1], "
                         "but got "
                         f"max value {np.min(weights):.5f}, min value "
                         f"{np.max(weights):.5f}")
    atol = 1e-6 if weights.dtype == np.float32 else 1e-8
    if not np.allclose(float(np.abs(1.0 - np.sum(weights))), 0.0, atol=atol):
        raise ValueError("The parameter 'weights' should be normalized, but got "
                         f"sum(weights) = {np.sum(weights):.5f}")
    return weights


def check_means(means, n_components, n_features):
    """``means_init`` as a float array of shape ``(n_components, n_features)``."""
    means = check_array(means, dtype=[np.float64, np.float32], ensure_2d=False)
    check_shape(means, (n_components, n_features), "means")
    return means


def check_precisions(precisions, covariance_type, n_components, n_features):
    """``precisions_init`` as a float array of the covariance type's shape, positive
    (definite, and symmetric for matrices), by the type's
    :meth:`~emgmm.covariance.CovarianceType.check_precisions`."""
    kind = get_covariance_type(covariance_type)
    ndim = len(kind.covariance_shape(n_components, n_features))
    precisions = check_array(precisions, dtype=[np.float64, np.float32],
                             ensure_2d=False, allow_nd=ndim > 2)
    kind.check_precisions(precisions, n_components, n_features)
    return precisions


def check_variances_fit(model, dtype):
    """Refuse, before the first pass, a starting ``model`` whose variances already
    lie beyond the range of ``dtype`` attributes (float32 data of scale ~1e20: the
    fit would end in :func:`check_attributes_hold`'s error after every iteration
    and a series of overflow warnings).

    Raises
    ------
    ValueError
        With :func:`check_attributes_hold`'s message.
    """
    if np.dtype(dtype) == np.float64:
        return
    variances = model.kind.feature_variances(model.covariances)
    if np.all(variances < np.finfo(dtype).max):
        return
    raise ValueError(_attributes_message(dtype, variances, "starting model"))


def _attributes_message(dtype, variances, which):
    name = np.dtype(dtype).name
    return (
        f"The {which} does not fit in {name} attributes (those of {name} data "
        f"computed in {name}): its variances range from {variances.min():.3g} to "
        f"{variances.max():.3g}, and a covariance or precision would be infinite or "
        "zero. Scale the data, or fit with compute_dtype='float64', which keeps "
        "float64 attributes."
    )


def check_attributes_hold(model, precisions, dtype):
    """Raise ``ValueError`` when float32 attributes (those of float32 data computed
    in float32) cannot hold the fitted ``model``: a covariance beyond float32's range
    (data of scale ~1e20 and more: variances ~1e40), or a variance or precision that
    rounds to zero (scale ~1e-23 and less, or ~1e30 and more). ``precisions`` are
    those of the attributes, in ``dtype``."""
    if np.dtype(dtype) == np.float64:
        return
    covariances = model.covariances.astype(dtype)
    arrays = (covariances, model.precisions_cholesky.astype(dtype), precisions)
    kind = model.kind
    if (all(np.isfinite(a).all() for a in arrays)
            and (kind.feature_variances(covariances) > 0).all()
            and (kind.feature_variances(precisions) > 0).all()):
        return
    variances = kind.feature_variances(model.covariances)
    raise ValueError(_attributes_message(dtype, variances, "fitted model"))
