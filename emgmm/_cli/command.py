"""The ``emgmm`` command line: fit, score, predict, sample, info, demo.

Data arguments (``DATA``) are a ``.npy`` file or an HDF5 dataset written as
``file.h5:/path/to/dataset``; they are read in blocks and never modified.
Every output is written under a temporary name in the destination directory
and renamed when complete, so a failed run leaves no partial file; an output that
names an input file (but for ``fit``'s ``--warm-start`` model, which it may update in
place), or another output, is refused before any work. Errors are
reported as one line on stderr with exit status 1 (the traceback only with
``--debug``), usage errors (options that contradict each other, see
:mod:`.errors`) by argparse with exit status 2; warnings are shown as one line each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import sys
import textwrap
import threading
import warnings
from collections.abc import Sequence

import numpy as np
from numpy.lib.format import open_memmap

from .._io.atomic import atomic_output, atomic_outputs, check_writable, reserved_file
from .._io.model_file import ModelFileError, package_version, read_header, save_model
from .._io.sources import _HDF5_SUFFIXES, as_source, is_npy, split_hdf5_spec
from .._mixture.loading import load_model
from .._runtime.disk import reserve
from ..covariance import REGISTRY
from . import demo
from .errors import CommandError, UsageError
from .progress import ProgressReporter, format_summary, plural


#: (flag, estimator parameter, argparse keywords) for every parameter of
#: ``emgmm.GaussianMixture`` settable from ``emgmm fit``. ``warm_start`` is
#: ``--warm-start MODEL`` and ``callback`` is the progress reporter.
def at_least(kind, minimum, *, above=False, below=None):
    """An argparse ``type`` for a number of ``kind`` at least ``minimum`` (above it
    with ``above``; below ``below`` when given), so that a bad value is answered
    with the flag's name, as argparse does for every other usage error.

    Parameters
    ----------
    kind : {int, float}
    minimum : int or float
    above : bool, default=False
    below : int or float or None, default=None

    Returns
    -------
    callable
        ``parse(text) -> kind``; raises ``argparse.ArgumentTypeError``.
    """
    def parse(text):
        value = kind(text)  # (ValueError: argparse's "invalid int value")
        if value < minimum or (above and value == minimum):
            word = "above" if above else "at least"
            raise argparse.ArgumentTypeError(f"must be {word} {minimum}, got {text}")
        if below is not None and value >= below:
            raise argparse.ArgumentTypeError(f"must be below {below}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


#: ``--random-state``: a seed of numpy's RandomState, as scikit-learn accepts
SEED = at_least(int, 0, below=2**32)


def n_jobs_value(text):
    """An argparse ``type`` for ``--n-jobs``: a nonzero integer (joblib's meaning)."""
    value = int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(
            "must be a positive number of workers or negative (-1: all cores), got 0")
    return value


n_jobs_value.__name__ = "int"

#: Rows per block (fit and predict share the flag and its check).
_BLOCK_SIZE = dict(type=at_least(int, 1), metavar="ROWS")

_ESTIMATOR_FLAGS = [
    (("-k", "--n-components"), "n_components", dict(type=at_least(int, 1))),
    (
        ("--covariance-type",),
        "covariance_type",
        dict(choices=list(REGISTRY)),
    ),
    (("--n-factors",), "n_factors", dict(type=at_least(int, 0), metavar="Q")),
    (("--tol",), "tol", dict(type=at_least(float, 0.0))),
    (("--reg-covar",), "reg_covar", dict(type=at_least(float, 0.0))),
    (("--max-iter",), "max_iter", dict(type=at_least(int, 0))),
    (("--n-init",), "n_init", dict(type=at_least(int, 1))),
    (
        ("--init-params",),
        "init_params",
        dict(choices=["kmeans", "k-means++", "random", "random_from_data"]),
    ),
    (("--weights-init",), "weights_init", dict(metavar="NPY")),
    (("--means-init",), "means_init", dict(metavar="NPY")),
    (("--precisions-init",), "precisions_init", dict(metavar="NPY")),
    (("--random-state",), "random_state", dict(type=SEED)),
    (("--verbose",), "verbose", dict(type=at_least(int, 0))),
    (("--verbose-interval",), "verbose_interval", dict(type=at_least(int, 1))),
    (("--n-jobs",), "n_jobs", dict(type=n_jobs_value)),
    (("--temp-folder",), "temp_folder", dict(metavar="FOLDER")),
    (("--working-memory",), "working_memory",
     dict(type=at_least(float, 0, above=True), metavar="MIB")),
    (("--block-size",), "block_size", _BLOCK_SIZE),
    (("--memory-limit",), "memory_limit",
     dict(type=at_least(float, 0, above=True), metavar="MIB")),
    (("--init-max-samples",), "init_max_samples", dict(type=at_least(int, 1))),
    (("--compute-dtype",), "compute_dtype", dict(choices=["float32", "float64"])),
    (("--resp-threshold",), "resp_threshold",
     dict(type=at_least(float, 0.0, below=1.0))),
    (("--schedule",), "schedule",
     dict(choices=["auto", "rows", "components", "pairs"])),
    (("--on-degenerate",), "on_degenerate", dict(choices=["reinit", "raise"])),
    (("--checkpoint",), "checkpoint", dict(metavar="NPZ")),
    (("--checkpoint-interval",), "checkpoint_interval",
     dict(type=at_least(float, 0.0), metavar="SECONDS")),
]
_INIT_ARRAYS = ("weights_init", "means_init", "precisions_init")
#: Flags of ``emgmm fit --bayesian`` only: the priors of ``BayesianGaussianMixture``
#: (``--mean-prior`` a .npy file, ``--covariance-prior`` a .npy file or a number).
_BAYESIAN_FLAGS = [
    (("--weight-concentration-prior-type",), "weight_concentration_prior_type",
     {"choices": ["dirichlet_process", "dirichlet_distribution"]}),
    (("--weight-concentration-prior",), "weight_concentration_prior", {"type": float}),
    (("--mean-precision-prior",), "mean_precision_prior", {"type": float}),
    (("--mean-prior",), "mean_prior", {"metavar": "NPY"}),
    (("--degrees-of-freedom-prior",), "degrees_of_freedom_prior", {"type": float}),
    (("--covariance-prior",), "covariance_prior", {"metavar": "NPY|FLOAT"}),
]
#: GaussianMixture's parameters that BayesianGaussianMixture has not.
_GAUSSIAN_ONLY = _INIT_ARRAYS + ("on_degenerate", "n_factors")


def _data_shape(spec, n_features=None):
    """Open ``spec`` (checked 2-D and numeric by ``as_source``); return its shape.

    Raises
    ------
    CommandError
        If ``n_features`` is given and the dataset has another number of columns.
    """
    with as_source(spec) as source:
        shape = tuple(source.shape)
    if n_features is not None and shape[1] != n_features:
        raise CommandError(
            f"DATA {spec} has {shape[1]} features but the model was fitted "
            f"on {n_features}"
        )
    return shape


def _same_file(a, b):
    """Whether the paths ``a`` and ``b`` name one existing file (``os.path.samefile``:
    the same device and inode, whatever links or relative names lead there). A path
    that does not exist is no existing file."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _same_output(a, b):
    """Whether two output paths name the same file: one existing file, or, when
    neither exists yet, the same name in the same directory."""
    if os.path.exists(a) or os.path.exists(b):
        return _same_file(a, b)
    a, b = os.path.abspath(a), os.path.abspath(b)
    return (os.path.basename(a) == os.path.basename(b)
            and _same_file(os.path.dirname(a), os.path.dirname(b)))


def _input_file(spec):
    """The file an input argument names: ``file.h5`` of ``file.h5:/dataset``."""
    hdf5 = split_hdf5_spec(spec)
    return spec if hdf5 is None else hdf5[0]


def _check_output(path, what="output", inputs=(), outputs=()):
    """Refuse, before any work, an output path that cannot be written (its directory
    missing or not writable, the path itself a directory: :func:`check_writable`),
    the same file as an input (which it would overwrite), or the same file as
    another output.

    Parameters
    ----------
    path : str
        The output path.
    what : str, default="output"
        How messages name the output.
    inputs : iterable of (str, str or None)
        ``(name, path)`` of the files the command reads; an HDF5 dataset
        ``file.h5:/dataset`` stands for its file, and ``None`` for no file.
    outputs : iterable of (str, str or None)
        ``(name, path)`` of the command's other outputs.

    Raises
    ------
    CommandError
        If the output cannot be written.
    UsageError
        If it clashes with an input or another output, naming both paths.
    """
    try:
        check_writable(path, what)
    except OSError as exc:
        raise CommandError(str(exc)) from None
    for name, other in inputs:
        if other is not None and _same_file(path, _input_file(other)):
            raise UsageError(
                f"{what} {path} is the same file as {name} {other}: writing it would "
                "overwrite the input; choose another output path"
            )
    for name, other in outputs:
        if other is not None and _same_output(path, other):
            raise UsageError(
                f"{what} {path} is the same file as {name} {other}: each output "
                "needs a file of its own"
            )


#: Suffixes of formats other than the one an output is written in.
_FORMAT_SUFFIXES = {
    **{suffix: "HDF5" for suffix in _HDF5_SUFFIXES},
    ".npy": "NumPy .npy", ".npz": "NumPy .npz", ".txt": "text", ".csv": "text",
    ".tsv": "text", ".json": "JSON", ".pkl": "pickle", ".pickle": "pickle",
    ".joblib": "joblib", ".mat": "MATLAB", ".parquet": "Parquet",
}


def _check_suffix(path, what, writes, suffix):
    """Refuse an output path whose suffix names another format than the one it is
    written in (``writes``: "HDF5" or "NumPy .npy"); ``suffix`` is the one to use.
    Names without a suffix, or with one of no known format, are taken as given.

    Raises
    ------
    UsageError
    """
    found = os.path.splitext(path)[1].lower()
    kind = _FORMAT_SUFFIXES.get(found)
    if kind is not None and kind != writes:
        if writes == "HDF5":
            raise UsageError(
                f"{what} {path}: model files are HDF5, not {kind}: name it with "
                f"{suffix} (or no suffix)")
        raise UsageError(
            f"{what} {path}: emgmm writes .npy files (numpy.save), not {kind}: name "
            f"it with {suffix}; for text, convert it afterwards "
            "(numpy.savetxt(name, numpy.load(output)))")


def _load_init_array(path, flag):
    """The array of the .npy file ``path`` given to ``flag``; :class:`CommandError`
    for anything else (numpy's own message for a text or HDF5 file speaks of pickled
    data and unsafe loading)."""
    if not os.path.exists(path):
        raise CommandError(f"{flag} {path}: no such file")
    if os.path.isfile(path) and not is_npy(path):
        raise CommandError(f"{flag} takes a .npy file (numpy.save); {path} is not one")
    if _npy_holds_objects(path):
        raise CommandError(f"{flag} {path}: it holds Python objects, not numbers")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:  # a damaged header or data
        raise CommandError(f"{flag} {path}: {exc}") from None


def _npy_holds_objects(path):
    """Whether the .npy header of ``path`` declares a dtype with Python objects
    (read with numpy.lib.format; a header that cannot be read: ``False``, left to
    ``np.load`` to report)."""
    from numpy.lib import format as npy_format

    try:
        with open(path, "rb") as f:
            version = npy_format.read_magic(f)
            read_array_header = (npy_format.read_array_header_1_0
                                 if version == (1, 0)
                                 else npy_format.read_array_header_2_0)
            _, _, dtype = read_array_header(f, max_header_size=2**20)
    except (OSError, ValueError):
        return False
    return dtype.hasobject


def _flag(name):
    return "--" + name.replace("_", "-")


def _bayesian_params(args, params):
    """``params`` checked for the estimator ``emgmm fit`` builds, with the Bayesian
    priors added (their files loaded); whether it is ``BayesianGaussianMixture``
    (``--bayesian``, or a ``--warm-start`` model of that type)."""
    priors = {p: getattr(args, p) for _, p, _ in _BAYESIAN_FLAGS if hasattr(args, p)}
    bayesian = args.bayesian or (
        args.warm_start is not None and os.path.exists(args.warm_start)
        and read_header(args.warm_start)["format"] == "emgmm.BayesianGaussianMixture")
    if not bayesian:
        if priors:
            raise UsageError(f"{_flag(next(iter(priors)))} is a prior of "
                               "BayesianGaussianMixture: add --bayesian")
        return params, False
    given = [name for name in _GAUSSIAN_ONLY if name in params]
    if args.sample_weight is not None:
        given.append("sample_weight")
    if given:
        raise UsageError(f"{_flag(given[0])} is a GaussianMixture parameter that "
                           "BayesianGaussianMixture has not: drop it, or drop "
                           "--bayesian")
    if "mean_prior" in priors:
        priors["mean_prior"] = _load_init_array(priors["mean_prior"], "--mean-prior")
    if "covariance_prior" in priors:
        value = priors["covariance_prior"]
        try:
            priors["covariance_prior"] = float(value)
        except ValueError:
            priors["covariance_prior"] = _load_init_array(value, "--covariance-prior")
    return dict(params, **priors), True


def _check_type_parameters(params):
    """Refuse a parameter of another covariance type than the one asked for (e.g.
    ``--n-factors`` without ``--covariance-type factor``): it would be ignored."""
    covariance_type = params.get("covariance_type", "full")
    kind = REGISTRY[covariance_type]
    for name in sorted({p for k in REGISTRY.values() for p in k.parameters}):
        if name in params and name not in kind.parameters:
            owners = [n for n, k in REGISTRY.items() if name in k.parameters]
            raise UsageError(
                f"{_flag(name)} is a parameter of --covariance-type "
                f"{' or '.join(owners)}, not {covariance_type}: drop it, or give "
                "that covariance type")


def _check_replaces_a_model(path):
    """Refuse an output path that holds a file other than an emgmm model: ``fit -o``
    replaces a model (e.g. the one it warm-starts from), never the user's data."""
    if not os.path.isfile(path):
        return
    try:
        read_header(path)
    except (ModelFileError, OSError):
        raise CommandError(
            f"output {path} exists and is not an emgmm model file: emgmm fit replaces "
            "only models. Remove it or choose another name.") from None


def _fit_inputs(args, params):
    """The ``(flag, path)`` pairs of the files ``emgmm fit`` reads, which its
    outputs must not replace."""
    inputs = [("DATA", args.data), ("--sample-weight", args.sample_weight)]
    inputs += [(_flag(name), params.get(name)) for name in _INIT_ARRAYS]
    inputs += [(_flag(name), getattr(args, name)) for name in ("mean_prior",
                                                                "covariance_prior")
               if hasattr(args, name)]
    return inputs


def _check_fit_outputs(args, params, inputs):
    """Refuse an output or checkpoint path of ``emgmm fit`` that would replace one
    of its ``inputs``, the other output, or a file that is not a model."""
    checkpoint = params.get("checkpoint")
    # (the output may be the --warm-start model: it is read whole before the fit, and
    # the output replaces it only when complete, so a model can be updated in place)
    _check_output(args.output, inputs=inputs, outputs=[("checkpoint", checkpoint)])
    if checkpoint is not None:
        _check_output(checkpoint, "checkpoint",
                      inputs=inputs + [("--warm-start", args.warm_start)])
    _check_suffix(args.output, "output", "HDF5", ".h5")
    _check_replaces_a_model(args.output)


def _load_init_arrays(params):
    """Replace the paths of the ``--*-init`` arrays in ``params`` by the arrays."""
    for name in _INIT_ARRAYS:
        if name in params:
            params[name] = _load_init_array(params[name], "--" + name.replace("_", "-"))


def _warm_start_estimator(args, params, bayesian):
    """The ``--warm-start`` model, set to continue with ``params``; refuse a
    parameter that contradicts it, or data of another number of features."""
    from .. import BayesianGaussianMixture

    estimator = load_model(args.warm_start)
    if bayesian != isinstance(estimator, BayesianGaussianMixture):
        raise UsageError(f"--warm-start {args.warm_start} is a GaussianMixture "
                           "model: drop --bayesian to continue it")
    for name, flag in (("n_components", "-k"),
                       ("covariance_type", "--covariance-type"),
                       ("n_factors", "--n-factors")):
        if name in params and params[name] != getattr(estimator, name):
            raise UsageError(
                f"--warm-start {args.warm_start} continues a model with "
                f"{name}={getattr(estimator, name)!r}, not {params[name]!r}: "
                f"drop {flag} to continue it, or --warm-start to fit a new model")
    estimator.set_params(warm_start=True, **params)
    _data_shape(args.data, estimator.n_features_in_)
    return estimator


def _fit_estimator(args, params, bayesian, estimator_class):
    """The estimator ``emgmm fit`` fits: the ``--warm-start`` model continued, or a
    new ``estimator_class`` built from ``params``."""
    if args.warm_start is None:  # (a warm start checks them against its model)
        _check_type_parameters(params)
    _load_init_arrays(params)
    if args.warm_start is not None:
        return _warm_start_estimator(args, params, bayesian)
    estimator = estimator_class(**params)
    _data_shape(args.data)
    return estimator


def _fit_reporting(estimator, args):
    """Fit ``estimator`` to ``args.data`` with progress reports on stderr; the
    reporter, which holds the fit's summary."""
    # one report per iteration: --verbose asks for the estimator's own lines
    # (scikit-learn's), which then replace the reporter's
    reporter = ProgressReporter(estimator.max_iter, estimator.n_init,
                                quiet=args.quiet or bool(estimator.verbose))
    estimator.set_params(callback=reporter)
    # stdout carries the result only (--json): the estimator's verbose lines go to
    # stderr with the progress reports
    with contextlib.redirect_stdout(sys.stderr):
        # (BayesianGaussianMixture takes no sample_weight: refused with --bayesian)
        weights = ({} if args.sample_weight is None
                   else {"sample_weight": args.sample_weight})
        estimator.fit(args.data, **weights)
    estimator.set_params(callback=None)
    return reporter


def _cmd_fit(args):
    from .. import BayesianGaussianMixture, GaussianMixture

    params = {p: getattr(args, p) for _, p, _ in _ESTIMATOR_FLAGS if hasattr(args, p)}
    params, bayesian = _bayesian_params(args, params)
    _check_fit_outputs(args, params, _fit_inputs(args, params))
    estimator = _fit_estimator(
        args, params, bayesian,
        BayesianGaussianMixture if bayesian else GaussianMixture)
    reporter = _fit_reporting(estimator, args)
    save_model(estimator, args.output)
    summary = dict(reporter.summary(estimator), data=args.data, model=args.output)
    if not args.quiet:
        print(f"{format_summary(summary)}; model written to {args.output}",
              file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0


def _cmd_score(args):
    model = load_model(args.model)
    n_samples, _ = _data_shape(args.data, model.n_features_in_)
    score = float(model.score(args.data))
    if args.json:
        print(json.dumps({"score": score, "n_samples": n_samples}))
    else:
        print(repr(score))
    return 0


def _cmd_predict(args):
    _check_output(args.output, inputs=[("MODEL", args.model), ("DATA", args.data)])
    _check_suffix(args.output, "output", "NumPy .npy", ".npy")
    model = load_model(args.model)
    n_samples, _ = _data_shape(args.data, model.n_features_in_)
    if args.block_size is not None:
        model.set_params(block_size=args.block_size)
    if args.proba:
        shape, dtype = (n_samples, model.n_components), np.float64
        method = model.predict_proba
    else:
        shape, dtype, method = (n_samples,), np.int64, model.predict
    with atomic_output(args.output) as tmp_path:
        out = open_memmap(tmp_path, mode="w+", dtype=dtype, shape=shape)
        with open(tmp_path, "rb+") as fh:  # (sparse until then)
            reserve(fh.fileno(), os.fstat(fh.fileno()).st_size, args.output)
        # one pass of the estimator's (its workers, its blocks) over the file,
        # into the memory-mapped output
        method(args.data, out=out)
        out.flush()
        del out
    return 0


def _write_npy(tmp_path, array, path):
    """``array`` as a .npy file at ``tmp_path``, its space reserved first (so a full
    file system gives an error that names ``path``, not numpy's byte counts)."""
    with reserved_file(tmp_path, array.nbytes + _NPY_HEADER_BYTES, path) as f:
        np.save(f, array, allow_pickle=False)


# more than a .npy header of a 1-d or 2-d array takes (format versions 1.0-3.0)
_NPY_HEADER_BYTES = 4096


def _cmd_sample(args):
    inputs = [("MODEL", args.model)]
    _check_output(args.output, inputs=inputs, outputs=[("labels", args.labels)])
    if args.labels is not None:
        _check_output(args.labels, "labels", inputs=inputs)
    for what, path in (("output", args.output), ("labels", args.labels)):
        if path is not None:
            _check_suffix(path, what, "NumPy .npy", ".npy")
    model = load_model(args.model)
    model.random_state = args.random_state
    samples, labels = model.sample(args.n_samples)
    outputs = [(args.output, samples)]
    if args.labels is not None:
        outputs.append((args.labels, labels))
    # both files or neither; an earlier file at either path stays until both are written
    with atomic_outputs([path for path, _ in outputs]) as tmp_paths:
        for tmp_path, (path, array) in zip(tmp_paths, outputs, strict=False):
            _write_npy(tmp_path, array, path)
    return 0


def _cmd_info(args):
    header = read_header(args.model)
    model = load_model(args.model)
    if args.json:
        print(json.dumps(dict(header, weights=model.weights_.tolist())))
        return 0
    state = "converged" if header["converged"] else "not converged"
    # the covariance types' own parameters: this model's on its covariance line,
    # the other types' mean nothing for it
    typed = {name for kind in REGISTRY.values() for name in kind.parameters}
    params = ", ".join(
        f"{k}={v!r}" for k, v in sorted(header["params"].items())
        if v is not None and k not in typed
    )
    lines = [
        ("model file", args.model),
        ("format", f"{header['format']} v{header['format_version']} "
                   f"(written by emgmm {header['emgmm_version']})"),
        ("covariance type", header["covariance_type"] + "".join(
            f", {name}={header['params'].get(name)}"
            for name in REGISTRY[header["covariance_type"]].parameters)),
        ("components", header["n_components"]),
        ("features", header["n_features_in"]),
        ("fit", f"{state} after {plural(header['n_iter'], 'iteration')}, "
                f"lower bound {header['lower_bound']:.6g}"),
        ("weights", f"min {model.weights_.min():.4g}, max {model.weights_.max():.4g}"),
        ("parameters", params),
    ]
    if header["feature_names_in"] is not None:
        lines.append(("feature names", ", ".join(header["feature_names_in"])))
    for label, value in lines:
        print(f"{label:<16} {value}")
    return 0


#: The exit statuses of every command, as its help lists them.
EXIT_STATUS = ("Exit status: 0 success, 1 failure while running, 2 usage error; "
               "130 interrupted (Ctrl-C), 143 terminated (SIGTERM).")


#: The help of a DATA argument.
_DATA_HELP = "a .npy file or an HDF5 dataset as file.h5:/path/to/dataset"

#: The help of a MODEL argument that is read.
_MODEL_HELP = "model file written by emgmm fit (HDF5)"


def _add_fit_parser(sub, common, estimator_class, bayesian_class):
    """Add the ``fit`` command to the subparsers ``sub``, its estimator flags with
    the defaults of ``estimator_class`` and ``bayesian_class`` in their help."""
    defaults = estimator_class().get_params()
    fit = sub.add_parser("fit", parents=[common], help="fit a mixture to DATA",
                         description="Fit a Gaussian mixture to DATA and save it.")
    fit.add_argument("data", metavar="DATA", help=_DATA_HELP)
    fit.add_argument("-o", "--output", required=True, metavar="MODEL",
                     help="model file to write (HDF5: .h5, .hdf5 or no suffix)")
    notes = {"verbose": "; above 0 its lines replace the progress lines"}
    for flags, name, kwargs in _ESTIMATOR_FLAGS:
        fit.add_argument(*flags, dest=name, default=argparse.SUPPRESS,
                         help=f"GaussianMixture({name}=...); default "
                              f"{defaults[name]!r}{notes.get(name, '')}", **kwargs)
    fit.add_argument("--bayesian", action="store_true",
                     help="fit a BayesianGaussianMixture (variational; the number "
                          "of components used is inferred up to -k; the summary "
                          "counts those whose weight is above 1/(100 K))")
    bayesian_defaults = bayesian_class().get_params()
    for flags, name, kwargs in _BAYESIAN_FLAGS:
        fit.add_argument(*flags, dest=name, default=argparse.SUPPRESS,
                         help=f"with --bayesian: BayesianGaussianMixture({name}=...); "
                              f"default {bayesian_defaults[name]!r}", **kwargs)
    fit.add_argument("--sample-weight", metavar="W", default=None,
                     help="weights of the rows of DATA: a .npy file or "
                          "file.h5:/path/to/dataset (1-D, finite, >= 0)")
    fit.add_argument("--warm-start", metavar="MODEL", default=None,
                     help="start from the parameters of a saved model "
                          "(warm_start=True)")
    fit.add_argument("-q", "--quiet", action="store_true",
                     help="no progress or summary on stderr")
    fit.add_argument("--json", action="store_true",
                     help="print the summary as JSON on stdout")
    fit.set_defaults(func=_cmd_fit)


def _add_score_parser(sub, common):
    """Add the ``score`` command to the subparsers ``sub``."""
    score = sub.add_parser(
        "score", parents=[common], help="mean log-likelihood per sample of DATA",
        description="Print the mean log-likelihood per sample of DATA under MODEL "
                    "(GaussianMixture.score), read in blocks.")
    score.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    score.add_argument("data", metavar="DATA", help=_DATA_HELP)
    score.add_argument("--json", action="store_true", help="print JSON")
    score.set_defaults(func=_cmd_score)


def _add_predict_parser(sub, common):
    """Add the ``predict`` command to the subparsers ``sub``."""
    predict = sub.add_parser(
        "predict", parents=[common],
        help="component labels (or responsibilities) of DATA",
        description="Write the most likely component of each row of DATA (or, with "
                    "--proba, the responsibilities) to a .npy file, block by block.")
    predict.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    predict.add_argument("data", metavar="DATA", help=_DATA_HELP)
    predict.add_argument("-o", "--output", required=True, metavar="NPY",
                         help="output .npy file: int64 labels (n_samples,)")
    predict.add_argument("--proba", action="store_true",
                         help="write float64 responsibilities "
                              "(n_samples, n_components) instead")
    predict.add_argument("--block-size", default=None, **_BLOCK_SIZE,
                         help="rows read per block (default: the model's "
                              "block_size, else from sklearn's working_memory)")
    predict.set_defaults(func=_cmd_predict)


def _add_sample_parser(sub, common):
    """Add the ``sample`` command to the subparsers ``sub``."""
    sample = sub.add_parser(
        "sample", parents=[common], help="draw samples from a model",
        description="Draw samples from MODEL (GaussianMixture.sample) and write "
                    "them, and optionally their components, to .npy files.")
    sample.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    sample.add_argument("-n", "--n-samples", type=at_least(int, 1), required=True,
                        help="number of samples to draw")
    sample.add_argument("-o", "--output", required=True, metavar="NPY",
                        help="output .npy file (n_samples, n_features)")
    sample.add_argument("--labels", metavar="NPY", default=None,
                        help="also write the component of each sample")
    sample.add_argument("--random-state", type=SEED, default=None,
                        help="seed of the draw (default: a different draw each run)")
    sample.set_defaults(func=_cmd_sample)


def _add_info_parser(sub, common):
    """Add the ``info`` command to the subparsers ``sub``."""
    info = sub.add_parser(
        "info", parents=[common], help="describe a model file",
        description="Print what MODEL holds: covariance type, components, features, "
                    "how the fit ended, the weights and the fit's parameters.")
    info.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_cmd_info)


def build_parser():
    """Build the argument parser of the ``emgmm`` command.

    Returns
    -------
    parser : argparse.ArgumentParser
    """
    from .. import BayesianGaussianMixture, GaussianMixture

    parser = argparse.ArgumentParser(
        prog="emgmm",
        description="Exact out-of-core, parallel EM for Gaussian mixtures.",
        epilog=EXIT_STATUS,
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback on errors")
    parser.add_argument("--version", action="version",
                        version=f"emgmm {package_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_fit_parser(sub, common, GaussianMixture, BayesianGaussianMixture)
    _add_score_parser(sub, common)
    _add_predict_parser(sub, common)
    _add_sample_parser(sub, common)
    _add_info_parser(sub, common)
    demo_parser = sub.add_parser("demo", parents=[common],
                                 help=demo.SUMMARY, description=demo.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.run)
    for command in sub.choices.values():
        # (the command's parser reports its usage errors: _run)
        command.set_defaults(parser=command)
        # (filled: the demo's raw-text formatter prints it as it is)
        command.epilog = textwrap.fill(EXIT_STATUS, width=79)
    return parser


def _one_line(exc):
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc)
    text = " ".join(text.split())
    return text or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``emgmm`` command.

    Parameters
    ----------
    argv : list of str, default=None
        Arguments without the program name; ``None`` means ``sys.argv[1:]``.

    Returns
    -------
    status : int
        0 on success, 1 on a failure while running (reported as one line on
        stderr, or re-raised with ``--debug``) or when the reader of stdout went
        away (a pipe into ``head``: quietly), 130 when interrupted (SIGINT), 143
        when terminated (SIGTERM, taken as an interrupt: the workers, the temporary
        files and a partial output are cleaned up as after Ctrl-C).

    Raises
    ------
    SystemExit
        With status 2 on a usage error: argparse's own, and the option
        combinations the commands refuse (:class:`.errors.UsageError`), both
        reported by argparse (the command's usage, then the message).
    """
    try:
        args = build_parser().parse_args(argv)  # (imports the estimator)
    except KeyboardInterrupt:
        print("emgmm: interrupted", file=sys.stderr)
        return 130
    with _sigterm_as_interrupt():
        return _run(args)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as an interrupt."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While the command runs, SIGTERM (``kill PID``, a job manager) raises
    :class:`_Terminated`: by default it would end the process at once, leaving the
    loky worker processes running and the temporary files in place."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def terminate(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stdout_reader_gone():
    """Whether stdout is a pipe whose reader has closed it (``poll`` reports an error
    on its write end), as opposed to another pipe or socket failing."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):
        return False  # no descriptor, or no poll (Windows): an error like any other
    poller.register(fd, select.POLLOUT)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def _run(args):
    """:func:`main` after parsing: run the command, report errors in one line."""

    def show_warning(message, category, *_args, **_kwargs):
        print(f"emgmm {args.command}: {category.__name__}: {_one_line(message)}",
              file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show_warning
            status = args.func(args)
        # a pipe's buffered output goes now, where a closed reader is caught below,
        # not at the interpreter's exit
        sys.stdout.flush()
        return status
    except UsageError as exc:
        # (argparse's report and status 2, as for its own usage errors; no
        # traceback with --debug either: the command line is at fault, not emgmm)
        args.parser.error(str(exc))
    except _Terminated:
        print("emgmm: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("emgmm: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if (isinstance(exc, BrokenPipeError) and not args.debug
                and _stdout_reader_gone()):
            # the reader of stdout went away (| head): no more output, and none at
            # exit either (Python's idiom, the signal module's notes on SIGPIPE)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        if args.debug:
            raise
        print(f"emgmm {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
