"""Checkpoints of a ``partial_fit`` stream: its online state in one ``.npz`` file.

A stream has no end: after every ``partial_fit`` call the state it leaves (the
parameters, the running sufficient statistics, the step count) replaces the file
atomically (:func:`.atomic.atomic_output`: a temporary file in the same folder,
fsync'ed, then ``os.replace``), so that another process resumes the stream at the
next step. The file records the parameters that change the stream
(:func:`stream_fingerprint`); one written with other parameters, or a checkpoint of
``fit``, is refused with a message saying what differs. Only plain arrays and a
JSON string are stored; loading never unpickles.
"""

import hashlib
import json
import zipfile

import numpy as np

from .atomic import atomic_output, reserved_file

FORMAT = "emgmm-stream-checkpoint"
VERSION = 1
_NPZ_SLACK_BYTES = 1024
#: Constructor parameters that change the result of a stream (others, such as
#: n_jobs or block_size, change it only by rounding; tol, max_iter and n_init are
#: fit's).
_STREAM_PARAMS = ("n_components", "covariance_type", "reg_covar", "init_params",
                  "random_state", "init_max_samples", "compute_dtype",
                  "resp_threshold", "on_degenerate", "learning_decay",
                  "learning_offset")
_ARRAY_PARAMS = ("weights_init", "means_init", "precisions_init")


def _plain(value):
    """``value`` as JSON: numbers and strings as they are, others by their type."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return f"<{type(value).__name__}>"  # a RandomState instance: not comparable


def stream_fingerprint(params):
    """The parameters of ``params`` (``get_params()``) that change a stream, as JSON.

    Array parameters are recorded by the SHA-256 of their float64 values.
    """
    out = {name: _plain(params[name]) for name in _STREAM_PARAMS}
    for name in _ARRAY_PARAMS:
        value = params[name]
        out[name] = (None if value is None else hashlib.sha256(
            np.ascontiguousarray(value, dtype=np.float64).tobytes()).hexdigest())
    return out


def write_stream(path, arrays, meta, fingerprint):
    """Write a stream's state to ``path`` atomically.

    Parameters
    ----------
    path : str or os.PathLike
    arrays : dict of str to ndarray
        The model and online statistics (float64).
    meta : dict
        JSON-serialisable: step count, attribute dtype, features, lower bound.
    fingerprint : dict
        :func:`stream_fingerprint` of the estimator.

    Raises
    ------
    OSError
        If the folder is not writable or full (names ``path``); nothing is left.
    """
    arrays = dict(arrays)
    arrays["meta"] = np.array(json.dumps({"format": FORMAT, "version": VERSION,
                                          "fingerprint": fingerprint, **meta}))
    nbytes = sum(a.nbytes for a in arrays.values()) + _NPZ_SLACK_BYTES * len(arrays)
    with atomic_output(path) as tmp, reserved_file(tmp, nbytes, path) as fh:
        np.savez(fh, **arrays)


def read_stream(path, fingerprint):
    """The state of a stream written for the same parameters.

    Returns
    -------
    arrays : dict of str to ndarray
    meta : dict

    Raises
    ------
    ValueError
        Not an emgmm stream checkpoint (a checkpoint of ``fit``, another file), or
        written with other parameters (the message lists them).
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a readable emgmm checkpoint "
                         f"({type(exc).__name__}: {exc}). Remove it or pass another "
                         "checkpoint path.") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"Checkpoint {path} is not one of a partial_fit stream "
                         f"(format {meta.get('format')!r}, "
                         f"version {meta.get('version')!r}; "
                         "a checkpoint of fit resumes only fit). Remove it or pass "
                         "another checkpoint path.")
    saved = meta.pop("fingerprint")
    differs = [f"{key} ({saved.get(key)!r} in the checkpoint, {fingerprint.get(key)!r} "
               "now)" for key in sorted(set(saved) | set(fingerprint))
               if saved.get(key) != fingerprint.get(key)]
    if differs:
        raise ValueError(f"Checkpoint {path} was written by a stream with other "
                         f"parameters; it differs in: {'; '.join(differs)}. Use the "
                         "same parameters to resume, or remove the file (or pass "
                         "another checkpoint path) to start a new stream.")
    return arrays, meta
