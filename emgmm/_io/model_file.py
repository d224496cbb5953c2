"""Save and load fitted mixtures as HDF5 model files (no pickle).

File layout (format ``"emgmm.GaussianMixture"``, version 1)::

    /                        attributes: format, format_version, emgmm_version,
                             covariance_type, n_components, n_features_in,
                             attributes_dtype (float64 or float32: the dtype
                             of the fitted attributes; the arrays are float64),
                             params (JSON of the constructor parameters),
                             params_dropped (JSON list of names)
    /weights                 (n_components,)
    /means                   (n_components, n_features)
    /precisions_cholesky     sklearn's shape for the covariance type (not 'factor')
    /loadings                'factor': (n_components, n_features, n_factors)
    /noise_variance          'factor': (n_components, n_features)
    /feature_names_in        variable-length UTF-8 strings (only if fitted on them)
    /params/<name>           array-valued constructor parameters
                             (weights_init, means_init, precisions_init)
    /fit                     attributes: n_iter, converged, lower_bound;
                             dataset lower_bounds (n_iter,)
    /online                  attribute n_steps (partial_fit steps, 0 after fit);
                             after a step, the running statistics nk, sum_x,
                             sum_xx, centers (float64; emgmm._engine.online)

A ``BayesianGaussianMixture`` (format ``"emgmm.BayesianGaussianMixture"``, version 1)
has the same layout (``weights`` are its ``weights_``) plus::

    /params/<name>           also mean_prior and covariance_prior when given
    /variational             attributes: weight_concentration_prior_type,
                             weight_concentration_prior, mean_precision_prior,
                             degrees_of_freedom_prior;
                             datasets weight_concentration ((K,), or (2, K) for
                             the Dirichlet process), mean_precision (K,),
                             degrees_of_freedom ((K,), or () for 'tied'),
                             mean_prior (d,), covariance_prior (sklearn's shape)

Constructor parameters that cannot be written without pickle (a ``callback``
function, a ``numpy.random.RandomState`` as ``random_state``) are stored as
``None``; their names are listed in the ``params_dropped`` attribute. The
``checkpoint`` path and the ``temp_folder`` belong to the fit that wrote the model,
not to the model: they are stored as ``None`` (a warm start from the file
checkpoints only where asked, in the folders of the machine it runs on).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

from .._engine import online
from .._runtime.disk import reserve
from ..covariance import REGISTRY
from ..covariance._base import not_upper_triangular_message
from ..covariance._cholesky import (
    covariances_from_cholesky,
    factor_limit,
    precisions_from_cholesky,
)
from ..covariance._protocols import ModelFileLayout
from .atomic import atomic_output
from .sources import hdf5_error, opens_without_locking

FORMAT_NAME = "emgmm.GaussianMixture"
BAYESIAN_FORMAT_NAME = "emgmm.BayesianGaussianMixture"
FORMAT_VERSION = 1
COVARIANCE_TYPES = REGISTRY  # (the registered names, as they are when asked)

_ARRAY_PARAMS = ("weights_init", "means_init", "precisions_init", "mean_prior",
                 "covariance_prior")
#: The variational posterior's arrays and the priors' scalars (``/variational``).
_VARIATIONAL_ARRAYS = ("mean_precision", "degrees_of_freedom", "mean_prior",
                       "covariance_prior")
_PRIOR_SCALARS = ("weight_concentration_prior", "mean_precision_prior",
                  "degrees_of_freedom_prior")


class ModelFileError(ValueError):
    """A file is not an emgmm model file, or has an incompatible format."""


def package_version():
    from .. import __version__

    return __version__


def _split_params(params):
    """Split constructor parameters into JSON-able values, arrays and dropped names."""
    plain, arrays, dropped = {}, {}, []
    for name, value in sorted(params.items()):
        if name in _ARRAY_PARAMS and value is not None:
            arrays[name] = np.asarray(value, dtype=np.float64)
            plain[name] = None
        elif isinstance(value, os.PathLike):
            plain[name] = os.fspath(value)
        elif isinstance(value, np.integer):
            plain[name] = int(value)
        elif isinstance(value, np.floating):
            plain[name] = float(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            plain[name] = value
        else:
            plain[name] = None
            dropped.append(name)
    return plain, arrays, dropped


def save_model(estimator: Any, path: str | os.PathLike[str]) -> None:
    """Write a fitted Gaussian mixture to an HDF5 model file.

    The file is written under a temporary name in the same directory and
    renamed to ``path`` only when complete; an existing file at ``path`` is
    replaced.

    Parameters
    ----------
    estimator : emgmm.GaussianMixture or sklearn.mixture.GaussianMixture
        A fitted mixture (``weights_``, ``means_``, ``precisions_cholesky_``,
        ``n_features_in_`` and the fit metadata ``n_iter_``, ``converged_``,
        ``lower_bound_`` must be set; ``lower_bounds_`` and
        ``feature_names_in_`` are stored when present).
    path : str or os.PathLike
        Output file name.

    Raises
    ------
    ValueError
        If ``estimator`` is not fitted or has an unknown covariance type.
    """
    try:
        weights = np.asarray(estimator.weights_, dtype=np.float64)
        means = np.asarray(estimator.means_, dtype=np.float64)
        components = _component_arrays(estimator)
        n_features = int(estimator.n_features_in_)
        n_iter, converged = int(estimator.n_iter_), bool(estimator.converged_)
        # (scikit-learn's 'tied' BayesianGaussianMixture: arrays of shape (1,))
        lower_bound = float(np.ravel(estimator.lower_bound_)[0])
        lower_bounds = np.ravel(np.asarray(getattr(estimator, "lower_bounds_", []),
                                           dtype=np.float64))
        bayesian = hasattr(estimator, "weight_concentration_")
    except AttributeError as exc:
        raise ValueError(f"cannot save an unfitted estimator ({exc})") from None
    if estimator.covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"unknown covariance_type {estimator.covariance_type!r}")
    params = estimator.get_params(deep=False)
    # the fit's, not the model's (see the module docstring)
    params["checkpoint"] = params["temp_folder"] = None
    plain, arrays, dropped = _split_params(params)
    nbytes = _reserved_bytes(estimator, (weights, means, *components.values(),
                                         *arrays.values(), lower_bounds), bayesian)
    with atomic_output(path) as tmp_path:
        # Space first: HDF5 meeting a full file system mid-write crashed the process
        # (SIGSEGV) instead of raising. A file reserved beyond its end is cut back to
        # its data when HDF5 closes it.
        h5py.File(tmp_path, "w").close()
        with open(tmp_path, "rb+") as fh:
            reserve(fh.fileno(), nbytes, path)
        with h5py.File(tmp_path, "r+") as f:
            f.attrs["format"] = BAYESIAN_FORMAT_NAME if bayesian else FORMAT_NAME
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["emgmm_version"] = package_version()
            f.attrs["covariance_type"] = estimator.covariance_type
            f.attrs["n_components"] = weights.shape[0]
            f.attrs["n_features_in"] = n_features
            # the arrays are stored in float64; the attributes get their dtype back
            f.attrs["attributes_dtype"] = np.dtype(estimator.means_.dtype).name
            f.attrs["params"] = json.dumps(plain, sort_keys=True)
            f.attrs["params_dropped"] = json.dumps(dropped)
            f["weights"] = weights
            f["means"] = means
            for name, value in components.items():
                f[name] = value
            if hasattr(estimator, "feature_names_in_"):
                names = [str(n) for n in estimator.feature_names_in_]
                f.create_dataset(
                    "feature_names_in", data=names, dtype=h5py.string_dtype("utf-8")
                )
            group = f.create_group("params")
            for name, value in arrays.items():
                group[name] = value
            fit = f.create_group("fit")
            fit.attrs["n_iter"] = n_iter
            fit.attrs["converged"] = converged
            fit.attrs["lower_bound"] = lower_bound
            fit["lower_bounds"] = lower_bounds
            if bayesian:
                _write_variational(f.create_group("variational"), estimator)
            if hasattr(estimator, "n_steps_"):
                _write_online(f.create_group("online"), estimator)


def _reserved_bytes(estimator, stored, bayesian):
    """Bytes to reserve for a model file: ``_RESERVE_SLACK_BYTES`` and twice the
    bytes of what it stores (the ``stored`` arrays, the feature names, the
    posterior of a variational fit, the running statistics of a stream)."""
    sizes = [np.asarray(a).nbytes for a in stored]
    sizes += [len(str(name).encode()) + 16
              for name in getattr(estimator, "feature_names_in_", [])]
    if bayesian:
        sizes += [np.asarray(getattr(estimator, name + "_")).nbytes
                  for name in _VARIATIONAL_ARRAYS + ("weight_concentration",)]
    stats = getattr(estimator, "_online_statistics", None)
    if stats is not None:
        sizes += [a.nbytes for a in online.to_arrays(stats).values()]
    return _RESERVE_SLACK_BYTES + 2 * sum(sizes)


def _write_variational(group, estimator):
    """The posterior's and the priors' values of a BayesianGaussianMixture."""
    group.attrs["weight_concentration_prior_type"] = (
        estimator.weight_concentration_prior_type)
    for name in _PRIOR_SCALARS:
        group.attrs[name] = float(getattr(estimator, name + "_"))
    group["weight_concentration"] = np.asarray(estimator.weight_concentration_,
                                               dtype=np.float64)
    for name in _VARIATIONAL_ARRAYS:
        group[name] = np.asarray(getattr(estimator, name + "_"), dtype=np.float64)


def _component_arrays(estimator):
    """The fitted arrays that hold the covariances (float64), by dataset name."""
    kind = REGISTRY[estimator.covariance_type].for_params(estimator.get_params())
    return {name: np.asarray(getattr(estimator, name + "_"), dtype=np.float64)
            for name in kind.stored_shapes(1, 1)}


def _stored_kind(header):
    """The covariance type of a model file, configured by its parameters."""
    covariance_type = header["covariance_type"]
    try:
        return REGISTRY[covariance_type].for_params(header["params"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _Damage(f"attribute 'params' does not configure covariance_type "
                      f"{covariance_type!r} ({type(exc).__name__}: {exc})") from None


def _write_online(group, estimator):
    """A stream's state: its step count and, after a step, the running statistics."""
    group.attrs["n_steps"] = int(estimator.n_steps_)
    stats = getattr(estimator, "_online_statistics", None)
    if stats is not None:
        for name, value in online.to_arrays(stats, prefix="").items():
            group[name] = value


def _read_online(f, estimator, path):
    """Set ``n_steps_`` (0 in a file without a stream: a fit) and the statistics."""
    try:
        group = f.get("online")
        estimator.n_steps_ = 0 if group is None else int(group.attrs["n_steps"])
        estimator._online_statistics = None
        if group is not None and "nk" in group:
            estimator._online_statistics = online.from_arrays(
                {name: group[name][()] for name in group}, estimator.covariance_type,
                prefix="")
    except (KeyError, ValueError, TypeError, OSError, RuntimeError, AttributeError) \
            as exc:  # (h5py's errors on damaged bytes among them)
        raise ModelFileError(f"{os.fspath(path)} has damaged online statistics "
                             f"({type(exc).__name__}: {exc})") from None


#: Bytes reserved for a model file beyond twice its contents (HDF5's metadata).
_RESERVE_SLACK_BYTES = 2**20


class _Damage(Exception):
    """What is wrong inside a model file (turned into :class:`ModelFileError`)."""


def _open(path):
    """Open ``path`` read-only and check that it is a compatible model file.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ModelFileError
        If it is not HDF5, is damaged or truncated, or has no compatible ``format``
        and ``format_version``.
    OSError
        If HDF5 refuses it for a lock or its permissions (it opens with locking off,
        or ``PermissionError``: no damage).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        if not h5py.is_hdf5(path):
            raise ModelFileError(f"{path} is not an emgmm model file (not HDF5)") \
                from None
        error = hdf5_error(path, exc)
        if isinstance(exc, PermissionError) or opens_without_locking(path):
            raise error from None
        raise ModelFileError(f"{path} is a damaged emgmm model file: {error}") \
            from None
    try:
        _check_format(f, path)
    except BaseException:
        f.close()
        raise
    return f


#: What h5py raises reading damaged internal structures or undecodable bytes.
_HDF5_READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


def _check_format(f, path):
    try:
        _check_format_attributes(f, path)
    except _HDF5_READ_ERRORS as exc:
        if isinstance(exc, ModelFileError):
            raise
        raise ModelFileError(f"{path} is a damaged emgmm model file: HDF5 cannot "
                             f"read its attributes ({type(exc).__name__}: {exc})") \
            from None


def _check_format_attributes(f, path):
    try:
        fmt = _text(f.attrs.get("format"), "format")
    except _Damage:
        fmt = None
    if fmt not in (FORMAT_NAME, BAYESIAN_FORMAT_NAME):
        raise ModelFileError(
            f"{path} is not an emgmm model file (no 'format' attribute "
            f"{FORMAT_NAME!r} or {BAYESIAN_FORMAT_NAME!r})"
        )
    version = f.attrs.get("format_version")
    if not (isinstance(version, (int, np.integer)) and version == FORMAT_VERSION):
        writer = f.attrs.get("emgmm_version", "unknown")
        if not isinstance(version, (int, np.integer)):
            version = _kind(version)
        raise ModelFileError(
            f"{path} has model format version {version} (written by emgmm "
            f"{writer}); this emgmm ({package_version()}) reads version "
            f"{FORMAT_VERSION} only"
        )


def _read(path, arrays):
    """The header of the model file at ``path`` (see :func:`read_header`) and, with
    ``arrays``, its parameter arrays in float64 (``weights``, ``means``,
    ``precisions_cholesky`` and the array-valued constructor parameters).

    Every value is checked for its kind (text, integer, flag, number, JSON, a
    numeric dataset); what HDF5 itself cannot read (damaged bytes) is reported as
    such. Both raise :class:`ModelFileError` naming the file and what is wrong.
    """
    path = os.fspath(path)
    with _open(path) as f:
        try:
            header = _header(f)
            values = _arrays(f, header) if arrays else None
        except _Damage as exc:
            raise ModelFileError(f"{path} is a damaged emgmm model file: {exc}") \
                from None
        except _HDF5_READ_ERRORS as exc:
            # h5py's errors reading damaged internal structures (object headers,
            # B-trees, heaps) or undecodable bytes
            raise ModelFileError(
                f"{path} is a damaged emgmm model file: HDF5 cannot read it "
                f"({type(exc).__name__}: {exc})"
            ) from None
    return header, values


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read the metadata of a model file without building an estimator.

    Parameters
    ----------
    path : str or os.PathLike
        Model file written by :func:`save_model`.

    Returns
    -------
    header : dict
        Keys ``format``, ``format_version``, ``emgmm_version``,
        ``covariance_type``, ``n_components``, ``n_features_in``,
        ``attributes_dtype``, ``params`` (dict), ``params_dropped`` (list),
        ``feature_names_in`` (list or None), ``n_iter``, ``converged``,
        ``lower_bound``, ``lower_bounds`` (list).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ModelFileError
        If the file is not an emgmm model file, has another format version, or
        is damaged: truncated, bytes HDF5 cannot read, a value missing or of the
        wrong kind (the message names the file and the value).
    OSError
        If HDF5 refuses the file for a lock or its permissions.
    """
    return _read(path, arrays=False)[0]


def _text(value, name):
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise _Damage(f"attribute {name!r} is not UTF-8 text") from None
    if not isinstance(value, str):
        raise _Damage(f"attribute {name!r} is {_kind(value)}, not text")
    return value


def _kind(value):
    if value is None:
        return "missing"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    return f"a {type(value).__name__} ({value!r})"


def _integer(value, name, minimum):
    if (isinstance(value, (bool, np.bool_))
            or not isinstance(value, (int, np.integer)) or value < minimum):
        raise _Damage(f"attribute {name!r} is {_kind(value)}, not an integer >= "
                      f"{minimum}")
    return int(value)


def _flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise _Damage(f"attribute {name!r} is {_kind(value)}, not true or false")
    return bool(value)


def _finite(value, name):
    if (isinstance(value, (bool, np.bool_))
            or not isinstance(value, (int, float, np.integer, np.floating))
            or not np.isfinite(value)):
        raise _Damage(f"attribute {name!r} is {_kind(value)}, not a finite number")
    return float(value)


def _json(value, name, kind):
    text = _text(value, name)
    try:
        parsed = json.loads(text)
    except ValueError:
        raise _Damage(f"attribute {name!r} is not valid JSON") from None
    if not isinstance(parsed, kind):
        raise _Damage(f"attribute {name!r} holds {type(parsed).__name__} JSON, not "
                      f"{kind.__name__}")
    return parsed


def _member(f, name, kind):
    """The group or dataset ``name`` of ``f`` (``None`` when missing), refused
    when it is another kind of object."""
    obj = f.get(name)
    if obj is not None and not isinstance(obj, kind):
        what = "group" if kind is h5py.Group else "dataset"
        raise _Damage(f"{name!r} is a {type(obj).__name__}, not a {what}")
    return obj


def _numbers(f, name, ndim=None):
    """Dataset ``name`` of real numbers as a float64 array (required)."""
    ds = _member(f, name, h5py.Dataset)
    if ds is None:
        raise _Damage(f"no dataset {name!r}")
    if ds.dtype.kind not in "fiu":
        raise _Damage(f"dataset {name!r} holds {ds.dtype}, not real numbers")
    if ndim is not None and ds.ndim != ndim:
        raise _Damage(f"dataset {name!r} has shape {ds.shape}, not {ndim}-D")
    return np.asarray(ds[()], dtype=np.float64)


def _feature_names(f, n_features):
    ds = _member(f, "feature_names_in", h5py.Dataset)
    if ds is None:
        return None
    if h5py.check_string_dtype(ds.dtype) is None or ds.shape != (n_features,):
        raise _Damage(f"dataset 'feature_names_in' has dtype {ds.dtype} and shape "
                      f"{ds.shape}, not {n_features} strings")
    return list(ds.asstr()[()])


def _header(f):
    fit = _member(f, "fit", h5py.Group)
    if fit is None:
        raise _Damage("no group 'fit'")
    attrs = f.attrs
    covariance_type = _text(attrs.get("covariance_type"), "covariance_type")
    if covariance_type not in COVARIANCE_TYPES:
        raise _Damage(f"attribute 'covariance_type' is {covariance_type!r}, not one "
                      f"of {', '.join(map(repr, COVARIANCE_TYPES))}")
    # (files written before it was stored hold float64 attributes)
    attributes_dtype = _text(attrs.get("attributes_dtype", "float64"),
                             "attributes_dtype")
    if attributes_dtype not in ("float32", "float64"):
        raise _Damage(f"attribute 'attributes_dtype' is {attributes_dtype!r}, not "
                      "'float32' or 'float64'")
    dropped = _json(attrs.get("params_dropped"), "params_dropped", list)
    if not all(isinstance(name, str) for name in dropped):
        raise _Damage("attribute 'params_dropped' is not a list of names")
    n_features = _integer(attrs.get("n_features_in"), "n_features_in", 1)
    fmt = _text(attrs.get("format"), "format")
    return {
        "format": fmt,
        "format_version": FORMAT_VERSION,
        "emgmm_version": _text(attrs.get("emgmm_version"), "emgmm_version"),
        "covariance_type": covariance_type,
        "n_components": _integer(attrs.get("n_components"), "n_components", 1),
        "n_features_in": n_features,
        "attributes_dtype": attributes_dtype,
        "params": _json(attrs.get("params"), "params", dict),
        "params_dropped": dropped,
        "feature_names_in": _feature_names(f, n_features),
        "n_iter": _integer(fit.attrs.get("n_iter"), "fit/n_iter", 0),
        "converged": _flag(fit.attrs.get("converged"), "fit/converged"),
        "lower_bound": _finite(fit.attrs.get("lower_bound"), "fit/lower_bound"),
        "lower_bounds": _numbers(f, "fit/lower_bounds", ndim=1).tolist(),
    }


def _arrays(f, header):
    """The parameter arrays (float64), their shapes checked against ``header``."""
    k, d = header["n_components"], header["n_features_in"]
    expected = {"weights": (k,), "means": (k, d),
                **_stored_kind(header).stored_shapes(k, d)}
    values = {}
    for name, shape in expected.items():
        values[name] = _numbers(f, name)
        if values[name].shape != shape:
            raise _Damage(f"dataset {name!r} has shape {values[name].shape}, not "
                          f"{shape} (inconsistent model arrays)")
    group = _member(f, "params", h5py.Group)
    params = {}
    for name in ([] if group is None else group):
        if name in _ARRAY_PARAMS:
            params[name] = _numbers(group, name)
    if header["format"] == BAYESIAN_FORMAT_NAME:
        if _member(f, "variational", h5py.Group) is None:
            raise _Damage("no group 'variational'")
        values["variational"] = _read_variational(f["variational"])
    return dict(values, params=params)


def _per_component(array, covariance_type):
    """``array`` with one component per entry of its first axis ('tied': one)."""
    return REGISTRY[covariance_type].per_component(array)


def _factor_name(index, covariance_type):
    """How messages name the precision Cholesky factor of component ``index``."""
    return REGISTRY[covariance_type].factor_name(index)


def _invalid_parameters(weights, means, precisions_cholesky, covariance_type):
    """What makes these parameters no mixture (``None`` if nothing): weights not
    finite, negative or not summing to one; means not finite; a component's factor
    not finite, without a positive diagonal, not upper triangular ('full', 'tied';
    ``U @ U.T == precisions_``, scikit-learn's convention), or with an entry so large
    that its precisions overflow float64 (:func:`~emgmm._cholesky.factor_limit`)."""
    if not (np.isfinite(weights).all() and (weights >= 0).all()
            and abs(float(np.sum(weights, dtype=np.float64)) - 1.0) <= 1e-5):
        return "weights must be finite, nonnegative and sum to 1"
    if not np.isfinite(means).all():
        return "means must be finite"
    # stored otherwise: see CovarianceType.stored_problem
    if precisions_cholesky is None:
        return None
    stack = _per_component(precisions_cholesky, covariance_type)
    diagonal = REGISTRY[covariance_type].factor_diagonals(stack)
    flat = stack.reshape(len(stack), -1)
    ok = np.isfinite(flat).all(axis=1)
    ok &= (diagonal.reshape(len(stack), -1) > 0).all(axis=1)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        return (f"{_factor_name(k, covariance_type)} must be finite with a "
                "positive diagonal")
    below = REGISTRY[covariance_type].first_below_diagonal(stack)
    if below is not None:
        k, i, j = below
        return not_upper_triangular_message(_factor_name(k, covariance_type), (i, j),
                                            stack[k, i, j])
    limit = factor_limit(covariance_type, means.shape[1], np.float64)
    big = np.abs(flat).max(axis=1) >= limit
    if big.any():
        k = int(np.flatnonzero(big)[0])
        return (f"{_factor_name(k, covariance_type)} has an entry of magnitude "
                f"{np.abs(flat[k]).max():.3g}: its precisions overflow float64 "
                f"(entries must stay below {limit:.3g})")
    return None


def _singular_factor(covariances, precisions_cholesky, covariance_type):
    """The message for the first component whose covariance (the inverse of its
    precisions) is not finite in float64, a factor too close to singular (``None``
    if there is none)."""
    stack = _per_component(covariances, covariance_type)
    finite = np.isfinite(stack.reshape(len(stack), -1)).all(axis=1)
    if finite.all():
        return None
    k = int(np.flatnonzero(~finite)[0])
    u = _per_component(precisions_cholesky, covariance_type)[k:k + 1]
    diagonal = REGISTRY[covariance_type].factor_diagonals(u)
    return (f"{_factor_name(k, covariance_type)} is too close to singular: its "
            "covariance (the inverse of its precisions) overflows float64 (smallest "
            f"diagonal entry {np.min(diagonal):.3g})")


def read_model(path: str | os.PathLike[str],
               estimator_for: Callable[[bool], Any]) -> Any:
    """Read and check a model file, and set the fitted estimator it holds.

    The estimator classes live above this module (:mod:`emgmm._mixture`): the
    caller (:func:`emgmm.load_model`) says which class to make.

    Parameters
    ----------
    path : str or os.PathLike
    estimator_for : callable
        ``estimator_for(bayesian)``: a new, unfitted estimator, a
        ``BayesianGaussianMixture`` for a file of that format (``bayesian`` true),
        else a ``GaussianMixture``.

    Returns
    -------
    estimator
        ``estimator_for``'s estimator, fitted as :func:`emgmm.load_model` says.

    Raises
    ------
    FileNotFoundError, ModelFileError
        As :func:`emgmm.load_model`.
    """
    header, values = _read(path, arrays=True)
    kind = REGISTRY[header["covariance_type"]].for_params(header["params"])
    problem, covariances, precisions = _model_problem(header, values, kind)
    if problem is not None:
        raise ModelFileError(f"{os.fspath(path)} holds no valid mixture: {problem}")
    estimator = estimator_for(values.get("variational") is not None)
    _set_stored_params(estimator, header, values["params"])
    _set_fitted_attributes(estimator, header, values, kind, covariances, precisions)
    with _open(path) as f:
        _read_online(f, estimator, path)
    return estimator


def _model_problem(header, values, kind: ModelFileLayout):
    """What makes the mixture read from a model file invalid (``None`` if
    nothing), with its covariances and precisions (``None`` if the file stores no
    precisions, or the check stopped before them)."""
    weights, means = values["weights"], values["means"]
    prec_chol = values.get("precisions_cholesky")
    variational = values.get("variational")
    k, d = header["n_components"], header["n_features_in"]
    cov_type = header["covariance_type"]
    covariances = precisions = None
    problem = (_invalid_parameters(weights, means, prec_chol, cov_type)
               or kind.stored_problem(values))
    if problem is None and prec_chol is not None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            # a factor close to singular: found just below, by component
            covariances = covariances_from_cholesky(prec_chol, cov_type)
            precisions = precisions_from_cholesky(prec_chol, cov_type)
        problem = _singular_factor(covariances, prec_chol, cov_type)
    if problem is None and variational is not None:
        problem = _invalid_variational(variational, cov_type, k, d)
    return problem, covariances, precisions


def _set_stored_params(estimator, header, arrays):
    """Set the parameters a model file stores (its ``arrays`` among them) that
    ``estimator`` knows, with no checkpoint."""
    # (files written before checkpoint was stored as null still carry the path)
    params = dict(header["params"], **arrays, checkpoint=None)
    for name in header["params_dropped"]:
        params.pop(name, None)
    known = estimator.get_params(deep=False)
    estimator.set_params(**{n: v for n, v in params.items() if n in known})


def _set_fitted_attributes(estimator, header, values, kind: ModelFileLayout,
                           covariances, precisions):
    """Set the fitted attributes of ``estimator`` from a checked model file."""
    k, d = header["n_components"], header["n_features_in"]
    # float32 for a model fitted in float32, as fit left them (checked in float64)
    dtype = np.float32 if header["attributes_dtype"] == "float32" else np.float64
    estimator.weights_ = values["weights"].astype(dtype, copy=False)
    estimator.means_ = values["means"].astype(dtype, copy=False)
    for name in kind.stored_shapes(k, d):
        setattr(estimator, name + "_", values[name].astype(dtype, copy=False))
    if values.get("precisions_cholesky") is not None:
        estimator.covariances_ = covariances.astype(dtype, copy=False)
        estimator.precisions_ = precisions.astype(dtype, copy=False)
    estimator.n_features_in_ = d
    if header["feature_names_in"] is not None:
        estimator.feature_names_in_ = np.asarray(
            header["feature_names_in"], dtype=object
        )
    estimator.n_iter_ = header["n_iter"]
    estimator.converged_ = header["converged"]
    estimator.lower_bound_ = header["lower_bound"]
    estimator.lower_bounds_ = header["lower_bounds"]
    for name, value in (values.get("variational") or {}).items():
        if name != "weight_concentration_prior_type":
            setattr(estimator, name + "_", value)


def _read_variational(group):
    """The ``/variational`` group as ``{attribute name without '_': value}``."""
    values = {name: float(group.attrs[name]) for name in _PRIOR_SCALARS}
    values["weight_concentration_prior_type"] = str(
        group.attrs["weight_concentration_prior_type"])
    for name in _VARIATIONAL_ARRAYS + ("weight_concentration",):
        values[name] = group[name][()]
    if values["weight_concentration_prior_type"] == "dirichlet_process":
        a, b = values["weight_concentration"]
        values["weight_concentration"] = (a, b)
    for name in ("degrees_of_freedom", "covariance_prior"):
        if np.ndim(values[name]) == 0:
            values[name] = float(values[name])
    return values


def _invalid_variational(values, covariance_type, n_components, n_features):
    """What makes a stored posterior inconsistent with its mixture (``None`` if
    nothing): a shape, or a value not finite and positive where it must be."""
    K, d = n_components, n_features
    kind = REGISTRY[covariance_type]
    expected = {
        "weight_concentration": (2, K) if isinstance(values["weight_concentration"],
                                                     tuple) else (K,),
        "mean_precision": (K,),
        "degrees_of_freedom": () if kind.shared else (K,),
        "mean_prior": (d,),
        "covariance_prior": kind.covariance_prior_shape(d),
    }
    for name, shape in expected.items():
        value = np.asarray(values[name])
        if value.shape != shape:
            return f"variational/{name} has shape {value.shape}, not {shape}"
        if not np.isfinite(value).all():
            return f"variational/{name} must be finite"
    for name in ("weight_concentration", "mean_precision", "degrees_of_freedom"):
        if not (np.asarray(values[name]) > 0).all():
            return f"variational/{name} must be positive"
    return None
