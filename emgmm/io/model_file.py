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
    /precisions_cholesky     sklearn's shape for the covariance type
    /feature_names_in        variable-length UTF-8 strings (only if fitted on them)
    /params/<name>           array-valued constructor parameters
                             (weights_init, means_init, precisions_init)
    /fit                     attributes: n_iter, converged, lower_bound;
                             dataset lower_bounds (n_iter,)
    /online                  attribute n_steps (partial_fit steps, 0 after fit);
                             after a step, the running statistics nk, sum_x,
                             sum_xx, centers (float64; emgmm.engine.online)

Constructor parameters that cannot be written without pickle (a ``callback``
function, a ``numpy.random.RandomState`` as ``random_state``) are stored as
``None``; their names are listed in the ``params_dropped`` attribute. The
``checkpoint`` path belongs to the fit that wrote the model, not to the model: it is
stored as ``None`` (a warm start from the file checkpoints only where asked).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Union

import h5py
import numpy as np

from .atomic import atomic_output, reserve
from ..covariance import REGISTRY
from ..engine import online
from ..covariance.cholesky import (
    covariances_from_cholesky,
    factor_limit,
    not_upper_triangular_message,
    precisions_from_cholesky,
)

FORMAT_NAME = "emgmm.GaussianMixture"
FORMAT_VERSION = 1
COVARIANCE_TYPES = REGISTRY  # (the registered names, as they are when asked)
if TYPE_CHECKING:
    from ..mixture.gaussian_mixture import GaussianMixture

_ARRAY_PARAMS = ("weights_init", "means_init", "precisions_init")


class ModelFileError(ValueError):
    """A file is not an emgmm model file, or has an incompatible format."""


def _package_version():
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


def save_model(estimator: Any, path: Union[str, os.PathLike[str]]) -> None:
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
        prec_chol = np.asarray(estimator.precisions_cholesky_, dtype=np.float64)
        n_features = int(estimator.n_features_in_)
        n_iter, converged = int(estimator.n_iter_), bool(estimator.converged_)
        lower_bound = float(estimator.lower_bound_)
    except AttributeError as exc:
        raise ValueError(f"cannot save an unfitted estimator ({exc})") from None
    if estimator.covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"unknown covariance_type {estimator.covariance_type!r}")
    params = estimator.get_params(deep=False)
    params["checkpoint"] = None  # the fit's, not the model's (see the module docstring)
    plain, arrays, dropped = _split_params(params)
    sizes = [np.asarray(a).nbytes for a in (weights, means, prec_chol, *arrays.values())]
    sizes += [len(str(name).encode()) + 16
              for name in getattr(estimator, "feature_names_in_", [])]
    sizes.append(8 * len(getattr(estimator, "lower_bounds_", [])))
    stats = getattr(estimator, "_online_statistics", None)
    if stats is not None:
        sizes += [a.nbytes for a in online.to_arrays(stats).values()]
    nbytes = _RESERVE_SLACK_BYTES + 2 * sum(sizes)
    with atomic_output(path) as tmp_path:
        # Space first: HDF5 meeting a full file system mid-write crashed the process
        # (SIGSEGV) instead of raising. A file reserved beyond its end is cut back to
        # its data when HDF5 closes it.
        h5py.File(tmp_path, "w").close()
        with open(tmp_path, "rb+") as fh:
            reserve(fh.fileno(), nbytes, path)
        with h5py.File(tmp_path, "r+") as f:
            f.attrs["format"] = FORMAT_NAME
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["emgmm_version"] = _package_version()
            f.attrs["covariance_type"] = estimator.covariance_type
            f.attrs["n_components"] = weights.shape[0]
            f.attrs["n_features_in"] = n_features
            # the arrays are stored in float64; the attributes get their dtype back
            f.attrs["attributes_dtype"] = np.dtype(estimator.means_.dtype).name
            f.attrs["params"] = json.dumps(plain, sort_keys=True)
            f.attrs["params_dropped"] = json.dumps(dropped)
            f["weights"] = weights
            f["means"] = means
            f["precisions_cholesky"] = prec_chol
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
            lower_bounds = getattr(estimator, "lower_bounds_", [])
            fit["lower_bounds"] = np.asarray(lower_bounds, dtype=np.float64)
            if hasattr(estimator, "n_steps_"):
                _write_online(f.create_group("online"), estimator)


def _write_online(group, estimator):
    """A stream's state: its step count and, after a step, the running statistics."""
    group.attrs["n_steps"] = int(estimator.n_steps_)
    stats = getattr(estimator, "_online_statistics", None)
    if stats is not None:
        for name, value in online.to_arrays(stats, prefix="").items():
            group[name] = value


def _read_online(f, estimator, path):
    """Set ``n_steps_`` (0 in a file without a stream: a fit) and the statistics."""
    group = f.get("online")
    estimator.n_steps_ = 0 if group is None else int(group.attrs["n_steps"])
    estimator._online_statistics = None
    if group is not None and "nk" in group:
        try:
            estimator._online_statistics = online.from_arrays(
                {name: group[name][()] for name in group}, estimator.covariance_type,
                prefix="")
        except (KeyError, ValueError) as exc:
            raise ModelFileError(f"{os.fspath(path)} has damaged online statistics "
                                 f"({exc})") from None


#: Bytes reserved for a model file beyond twice its contents (HDF5's metadata).
_RESERVE_SLACK_BYTES = 2**20


def _open(path):
    """Open ``path`` read-only and check that it is a compatible model file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError:
        raise ModelFileError(f"{path} is not an emgmm model file (not HDF5)") from None
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if fmt != FORMAT_NAME:
        f.close()
        raise ModelFileError(
            f"{path} is not an emgmm model file (no 'format' attribute "
            f"{FORMAT_NAME!r})"
        )
    version = f.attrs.get("format_version")
    if version != FORMAT_VERSION:
        writer = f.attrs.get("emgmm_version", "unknown")
        f.close()
        raise ModelFileError(
            f"{path} has model format version {version} (written by emgmm "
            f"{writer}); this emgmm ({_package_version()}) reads version "
            f"{FORMAT_VERSION} only"
        )
    return f


def read_header(path: Union[str, os.PathLike[str]]) -> dict[str, Any]:
    """Read the metadata of a model file without building an estimator.

    Parameters
    ----------
    path : str or os.PathLike
        Model file written by :func:`save_model`.

    Returns
    -------
    header : dict
        Keys ``format``, ``format_version``, ``emgmm_version``,
        ``covariance_type``, ``n_components``, ``n_features_in``, ``params``
        (dict), ``params_dropped`` (list), ``feature_names_in`` (list or None),
        ``n_iter``, ``converged``, ``lower_bound``, ``lower_bounds`` (list).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ModelFileError
        If the file is not an emgmm model file or has another format version.
    """
    with _open(path) as f:
        try:
            return _header(f)
        except (KeyError, ValueError) as exc:
            raise ModelFileError(
                f"{os.fspath(path)} is a damaged emgmm model file ({exc})"
            ) from None


def _header(f):
    fit = f["fit"]
    names = f.get("feature_names_in")
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "emgmm_version": str(f.attrs["emgmm_version"]),
        "covariance_type": str(f.attrs["covariance_type"]),
        "n_components": int(f.attrs["n_components"]),
        "n_features_in": int(f.attrs["n_features_in"]),
        # (files written before it was stored hold float64 attributes)
        "attributes_dtype": str(f.attrs.get("attributes_dtype", "float64")),
        "params": json.loads(f.attrs["params"]),
        "params_dropped": json.loads(f.attrs["params_dropped"]),
        "feature_names_in": None if names is None else list(names.asstr()[()]),
        "n_iter": int(fit.attrs["n_iter"]),
        "converged": bool(fit.attrs["converged"]),
        "lower_bound": float(fit.attrs["lower_bound"]),
        "lower_bounds": fit["lower_bounds"][()].tolist(),
    }


def _expected_chol_shape(covariance_type, n_components, n_features):
    return REGISTRY[covariance_type].covariance_shape(n_components, n_features)


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


def load_model(path: Union[str, os.PathLike[str]]) -> GaussianMixture:
    """Load a fitted :class:`emgmm.GaussianMixture` from an HDF5 model file.

    Parameters
    ----------
    path : str or os.PathLike
        Model file written by :func:`save_model`.

    Returns
    -------
    estimator : emgmm.GaussianMixture
        Fitted estimator with ``weights_``, ``means_``,
        ``precisions_cholesky_`` as stored (in float64), ``covariances_`` and
        ``precisions_`` recomputed from ``precisions_cholesky_`` (in float64), all
        five in the dtype the fitted model had (float32 for a model fitted in
        float32: covariances and precisions then within a float32 ulp of what the
        fit left), the fit
        metadata (``n_iter_``, ``converged_``, ``lower_bound_``,
        ``lower_bounds_``), ``n_features_in_``, the state of a ``partial_fit``
        stream (``n_steps_``, 0 for a fit, and the running statistics) and, when
        stored, ``feature_names_in_``. Constructor parameters listed in the file's
        ``params_dropped`` attribute are left at their defaults.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ModelFileError
        If the file is not an emgmm model file, has another format version,
        or its arrays have inconsistent shapes or hold no valid mixture (the
        message names the array and, for the precision Cholesky factors, the
        component: not finite, no positive diagonal, not upper triangular, or
        precisions or covariances that overflow float64).
    """
    from .. import GaussianMixture

    header = read_header(path)
    with _open(path) as f:
        try:
            weights = f["weights"][()]
            means = f["means"][()]
            prec_chol = f["precisions_cholesky"][()]
            arrays = {name: value[()] for name, value in f["params"].items()}
        except KeyError as exc:
            raise ModelFileError(
                f"{os.fspath(path)} is a damaged emgmm model file ({exc})"
            ) from None
    cov_type = header["covariance_type"]
    k, d = header["n_components"], header["n_features_in"]
    if (
        cov_type not in COVARIANCE_TYPES
        or weights.shape != (k,)
        or means.shape != (k, d)
        or prec_chol.shape != _expected_chol_shape(cov_type, k, d)
    ):
        raise ModelFileError(f"{os.fspath(path)} has inconsistent model arrays")
    problem = _invalid_parameters(weights, means, prec_chol, cov_type)
    if problem is None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            # a factor close to singular: found just below, by component
            covariances = covariances_from_cholesky(prec_chol, cov_type)
            precisions = precisions_from_cholesky(prec_chol, cov_type)
        problem = _singular_factor(covariances, prec_chol, cov_type)
    if problem is not None:
        raise ModelFileError(f"{os.fspath(path)} holds no valid mixture: {problem}")
    # (files written before checkpoint was stored as null still carry the path)
    params = dict(header["params"], **arrays, checkpoint=None)
    for name in header["params_dropped"]:
        params.pop(name, None)
    estimator = GaussianMixture()
    known = estimator.get_params(deep=False)
    estimator.set_params(**{n: v for n, v in params.items() if n in known})
    # float32 for a model fitted in float32, as fit left them (checked in float64)
    dtype = np.float32 if header["attributes_dtype"] == "float32" else np.float64
    estimator.weights_ = weights.astype(dtype, copy=False)
    estimator.means_ = means.astype(dtype, copy=False)
    estimator.precisions_cholesky_ = prec_chol.astype(dtype, copy=False)
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
    with _open(path) as f:
        _read_online(f, estimator, path)
    return estimator
