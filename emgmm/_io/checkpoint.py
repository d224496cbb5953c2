"""Checkpoint and resume of a fit: the EM state in one ``.npz`` file, saved atomically.

The file holds the state after an EM iteration: the index of the current
initialisation, its parameters, iteration count, lower bounds, history and re-seeded
rows, the state of the ``RandomState`` right after that initialisation was drawn, and
the best finished run of the earlier initialisations. It also holds a fingerprint of
the data (shape, dtype and a SHA-256 of every value, read in blocks as the fit reads
them) and of every parameter that changes the result, so that a fit never resumes
from another problem.

Writing goes to a temporary file in the checkpoint's folder, flushed and fsync'ed,
then renamed over the checkpoint (``os.replace``, atomic on POSIX and Windows): a fit
killed at any moment leaves the previous checkpoint or the new one, never half of
one. Only plain arrays and a JSON string are stored; loading never unpickles.
"""

import errno
import hashlib
import json
import os
import time
from dataclasses import dataclass

import numpy as np

from .._engine.model import Model, RunResult
from .._engine.variational import VariationalModel
from .._runtime.executor import process_space
from .._runtime.processes import pid_alive
from .atomic import atomic_output, check_writable, reserved_file
from .weights import weights_fingerprint

FORMAT = "emgmm-checkpoint"
#: 2: the data fingerprint hashes every row (version 1 hashed 16 rows).
VERSION = 2
#: Bytes per block of the data fingerprint's read.
_FINGERPRINT_BLOCK_BYTES = 16 * 2**20
# Bytes reserved per array of a checkpoint beyond its data: its .npy header and zip
# entries (ZIP64 local header and central directory record, ~250 bytes with the name)
_NPZ_SLACK_BYTES = 1024
_MODEL_FIELDS = ("weights", "means", "covariances", "precisions_cholesky")
#: The rest of a variational posterior (:class:`VariationalModel`).
_POSTERIOR_FIELDS = ("weight_concentration", "mean_precision", "degrees_of_freedom",
                     "resp_log_resp")
#: BayesianGaussianMixture's parameters that change the result (fingerprinted when
#: the estimator has them).
_PRIOR_PARAMETERS = ("weight_concentration_prior_type", "weight_concentration_prior",
                     "mean_precision_prior", "mean_prior", "degrees_of_freedom_prior",
                     "covariance_prior")
_ABSENT = object()
#: The field of a checkpoint path replaced by :func:`fingerprint_digest`.
PLACEHOLDER = "{fingerprint}"


def _sha256(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def fingerprint_digest(fingerprint):
    """16 hex digits of the SHA-256 of ``fingerprint`` (JSON with sorted keys).

    Parameters
    ----------
    fingerprint : dict
        JSON-serialisable.

    Returns
    -------
    str
    """
    text = json.dumps(fingerprint, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def checkpoint_path(path, fingerprint):
    """``path`` with every ``{fingerprint}`` replaced by the digest of
    ``fingerprint``: one file per problem, so that fits of other data or parameters
    that share the ``checkpoint`` parameter (the clones of a ``GridSearchCV``) never
    share a file, and a fit started again finds its own.

    Parameters
    ----------
    path : str or os.PathLike
    fingerprint : dict
        What the checkpoint is matched on.

    Returns
    -------
    str or bytes
        ``os.fspath(path)``, unchanged without the field.
    """
    path = os.fspath(path)
    if isinstance(path, str) and PLACEHOLDER in path:
        path = path.replace(PLACEHOLDER, fingerprint_digest(fingerprint))
    return path


def data_fingerprint(source):
    """Shape, dtype and a SHA-256 of every value, as the blocks of a fit read them.

    One pass over the data (blocks of ``_FINGERPRINT_BLOCK_BYTES``, in the source's
    compute dtype, so the same values from a ``.npy`` file, a memory map, an HDF5
    dataset or an array give the same hash): any changed value tells the data
    apart. It costs one read of the data per fit that checkpoints (hashing runs at
    about 1-2 GB/s), against one read per EM iteration.

    Parameters
    ----------
    source : Source

    Returns
    -------
    dict
        JSON-serialisable.

    Raises
    ------
    ValueError
        If a block holds NaN or infinity (:meth:`Source.read`).
    """
    n, d = source.shape
    digest = hashlib.sha256()
    step = max(1, _FINGERPRINT_BLOCK_BYTES // (8 * max(d, 1)))
    for start in range(0, n, step):
        digest.update(np.ascontiguousarray(source.read(start, min(start + step, n))))
    return {
        "n_samples": int(n),
        "n_features": int(d),
        "dtype": np.dtype(source.dtype).str,
        "values_sha256": digest.hexdigest(),
    }


def _value_fingerprint(value):
    if value is None:
        return None
    return _sha256(np.asarray(value, dtype=np.float64))


def params_fingerprint(estimator, compute_dtype, random_state, warm_model):
    """The parameters that change the result of a fit, as a JSON-serialisable dict.

    ``n_jobs``, ``working_memory``, ``block_size``, ``verbose`` and the callbacks are
    left out: they do not change the result beyond rounding.

    Parameters
    ----------
    estimator : GaussianMixture
    compute_dtype : numpy dtype
    random_state : numpy.random.RandomState
        As the fit starts (before any draw). ``random_state=None`` is recorded as
        ``None``: the global generator cannot be recreated, so any state resumes.
    warm_model : Model or None
        The parameters a warm start continues from.
    """
    if estimator.random_state is None:
        rng = None
    else:
        _, keys, pos, has_gauss, cached = random_state.get_state()
        rng = _sha256(keys, np.array([pos, has_gauss]), np.array([cached]))
    warm = None
    if warm_model is not None:
        warm = _sha256(*(getattr(warm_model, f) for f in _MODEL_FIELDS))
    return {
        "n_components": int(estimator.n_components),
        "covariance_type": estimator.covariance_type,
        # (the parameters that configure the covariance type: 'factor' n_factors)
        **{name: int(getattr(estimator, name))
           for name in estimator._kind().parameters},
        "tol": float(estimator.tol),
        "reg_covar": float(estimator.reg_covar),
        "max_iter": int(estimator.max_iter),
        "n_init": int(estimator.n_init),
        "init_params": estimator.init_params,
        **{name: _value_fingerprint(getattr(estimator, name, None))
           for name in ("weights_init", "means_init", "precisions_init")},
        "random_state": rng,
        "warm_start_from": warm,
        "init_max_samples": int(estimator.init_max_samples),
        "compute_dtype": np.dtype(compute_dtype).name,
        "resp_threshold": float(estimator.resp_threshold),
        "on_degenerate": estimator.on_degenerate,
        **{name: (value if isinstance(value, str) else _value_fingerprint(value))
           for name in _PRIOR_PARAMETERS
           if (value := getattr(estimator, name, _ABSENT)) is not _ABSENT},
    }


@dataclass
class ResumeState:
    """Where a fit stands after an EM iteration.

    Attributes
    ----------
    init_index : int
        The initialisation being run.
    run : RunResult
        Its state after the last finished iteration.
    rng_state : tuple
        ``RandomState.get_state()`` right after this initialisation was drawn.
    best_score : float or None
        Mean log-likelihood of the best finished earlier initialisation.
    best_run : RunResult or None
    """

    init_index: int
    run: RunResult
    rng_state: tuple
    best_score: float | None = None
    best_run: RunResult | None = None


def _run_arrays(prefix, run):
    fields = _MODEL_FIELDS
    if isinstance(run.model, VariationalModel):
        fields += _POSTERIOR_FIELDS  # (the process's Beta parameters as (2, K))
    out = {f"{prefix}{f}": np.asarray(getattr(run.model, f), dtype=np.float64)
           for f in fields}
    for name, value in (run.model.screen or {}).items():  # the pairs schedule's
        out[f"{prefix}screen_{name}"] = np.asarray(value)
    out[f"{prefix}lower_bounds"] = np.asarray(run.lower_bounds, dtype=np.float64)
    return out


def _run_meta(run):
    model = run.model
    return {
        "posterior": (None if not isinstance(model, VariationalModel)
                      else {"stick_breaking": isinstance(model.weight_concentration,
                                                         tuple)}),
        "covariance_type": run.model.covariance_type,
        "n_iter": int(run.n_iter),
        "converged": bool(run.converged),
        "history": run.history,
        "reseed_rows": [int(r) for r in run.reseed_rows],
    }


def _run_from(prefix, arrays, meta):
    parameters = [arrays[f"{prefix}{f}"] for f in _MODEL_FIELDS]
    posterior = meta.get("posterior")
    if posterior is None:
        screen = {key[len(prefix) + 7:]: arrays[key] for key in arrays
                  if key.startswith(f"{prefix}screen_")}
        model = Model(*parameters, meta["covariance_type"], screen=screen or None)
    else:
        extra = {f: arrays[f"{prefix}{f}"] for f in _POSTERIOR_FIELDS}
        if posterior["stick_breaking"]:
            extra["weight_concentration"] = tuple(extra["weight_concentration"])
        for f in ("degrees_of_freedom", "resp_log_resp"):
            if extra[f].ndim == 0:
                extra[f] = float(extra[f])
        model = VariationalModel(*parameters, meta["covariance_type"], **extra)
    for record in meta["history"]:  # (records of checkpoints that did not count them)
        record.setdefault("passes", None)
    return RunResult(model, arrays[f"{prefix}lower_bounds"].tolist(), meta["n_iter"],
                     meta["converged"], meta["history"], meta["reseed_rows"])


def write_state(path, state, fingerprint):
    """Write ``state`` to ``path`` atomically (temporary file, fsync, ``os.replace``).

    Parameters
    ----------
    path : str
    state : ResumeState
    fingerprint : dict

    Raises
    ------
    OSError
        If the folder is not writable or full (the message names ``path`` and the
        MiB it needs); the temporary file is removed.
    """
    _, keys, pos, has_gauss, cached = state.rng_state
    arrays = _run_arrays("run_", state.run)
    arrays["rng_keys"] = np.asarray(keys, dtype=np.uint32)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": fingerprint,
        "init_index": int(state.init_index),
        "rng": [int(pos), int(has_gauss), float(cached)],
        "run": _run_meta(state.run),
        "best_score": state.best_score,
        "best": None if state.best_run is None else _run_meta(state.best_run),
    }
    if state.best_run is not None:
        arrays.update(_run_arrays("best_", state.best_run))
    arrays["meta"] = np.array(json.dumps(meta))
    # the space first, so that a full disk names the checkpoint and the MiB it needs
    nbytes = sum(a.nbytes for a in arrays.values()) + _NPZ_SLACK_BYTES * len(arrays)
    with atomic_output(path) as tmp, reserved_file(tmp, nbytes, path) as fh:
        np.savez(fh, **arrays)


def read_state(path, fingerprint):
    """Load a checkpoint written for the same data and parameters.

    Parameters
    ----------
    path : str
    fingerprint : dict
        The fingerprint of the fit that wants to resume.

    Returns
    -------
    ResumeState

    Raises
    ------
    ValueError
        If the file is not an emgmm checkpoint, or was written for other data or
        parameters (the message lists what differs).
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        meta = json.loads(str(arrays.pop("meta")))
        if meta.get("format") != FORMAT:
            raise KeyError("format")
    except Exception as exc:
        raise ValueError(
            f"{path} is not a readable emgmm checkpoint ({type(exc).__name__}: {exc}). "
            "Remove it or pass another checkpoint path."
        ) from None
    if meta.get("version") != VERSION:
        raise ValueError(
            f"Checkpoint {path} has format version {meta.get('version')}; this emgmm "
            f"reads version {VERSION}. Remove it or pass another checkpoint path."
        )
    saved = meta["fingerprint"]
    differs = []
    for group in ("data", "params"):
        a, b = saved.get(group, {}), fingerprint[group]
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                differs.append(f"{key} ({a.get(key)!r} in the checkpoint, "
                               f"{b.get(key)!r} now)")
    if differs:
        raise ValueError(
            f"Checkpoint {path} was written by a fit on other data or with other "
            f"parameters; it differs in: {'; '.join(differs)}. Fit with the same data "
            "and parameters to resume, or remove the file (or pass another checkpoint "
            "path) to start afresh."
        )
    pos, has_gauss, cached = meta["rng"]
    rng_state = ("MT19937", arrays["rng_keys"], pos, has_gauss, cached)
    best_run = (None if meta["best"] is None
                else _run_from("best_", arrays, meta["best"]))
    return ResumeState(meta["init_index"], _run_from("run_", arrays, meta["run"]),
                       rng_state, meta["best_score"], best_run)


class Checkpointer:
    """Saves the state of one fit at most every ``interval`` seconds.

    Parameters
    ----------
    path : str or os.PathLike
    interval : float
        Seconds between two writes; 0 writes after every iteration.
    fingerprint : dict
        ``{"data": data_fingerprint(...), "params": params_fingerprint(...)}``.

    Attributes
    ----------
    resume : ResumeState or None
        The state read from an existing checkpoint at ``path``.

    Raises
    ------
    RuntimeError
        If another fit running now holds ``path`` (:func:`_acquire_lock`); this one
        holds it from construction until :meth:`release`, :meth:`remove` or the end
        of a ``with`` block.
    """

    def __init__(self, path, interval, fingerprint):
        # absolute once: a chdir during the fit must not move the checkpoint (or the
        # lock it holds) to another folder
        self.path = os.path.abspath(os.fspath(path))
        self.interval = float(interval)
        self.fingerprint = fingerprint
        self._lock = _acquire_lock(self.path)
        try:
            self.resume = (read_state(self.path, fingerprint)
                           if os.path.exists(self.path) else None)
        except BaseException:
            self.release()
            raise
        self._last = time.monotonic()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def release(self):
        """Let other fits use the checkpoint path (idempotent; also on leaving a
        ``with`` block)."""
        if self._lock is not None:
            _release_lock(self._lock, self.path)
            self._lock = None

    def saver(self, init_index, random_state, best):
        """The ``on_iteration`` hook of :func:`emgmm._em.run_em` for one initialisation.

        Parameters
        ----------
        init_index : int
        random_state : numpy.random.RandomState
            Its state is read now (right after the initialisation was drawn).
        best : tuple (score, RunResult, labels) or None
            The best finished earlier initialisation.
        """
        rng_state = random_state.get_state()
        best_score, best_run = (None, None) if best is None else best[:2]

        def on_iteration(run):
            now = time.monotonic()
            if self.interval > 0 and now - self._last < self.interval:
                return
            write_state(self.path, ResumeState(init_index, run, rng_state, best_score,
                                               best_run), self.fingerprint)
            self._last = now

        return on_iteration

    def remove(self):
        """Delete the checkpoint (the fit has finished) and release its path."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            self.release()


def _lock_path(path):
    """``.<name>.lock`` beside checkpoint ``path``."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.lock")


def _acquire_lock(path):
    """Hold the lock file of checkpoint ``path`` (``.<name>.lock`` in its folder, an
    exclusive ``flock``) for one fit; ``None`` where ``fcntl`` is missing (Windows) or
    the file system has no locks.

    Raises
    ------
    RuntimeError
        If another fit holds it (a fit running now, in this or another process on
        this host): the message names its process.
    """
    try:
        import fcntl
    except ImportError:
        return None
    lock = _lock_path(path)
    remove_stale_locks(os.path.dirname(lock))
    while True:
        fd = _open_lock(lock, path)
        if not _lock_exclusively(fcntl, fd, path):
            return None  # a file system without locks: the fit goes on without
        # the holder before us may have removed the file after we opened it: the lock
        # counts only on the file that the name still gives
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            _write_lock_holder(fd, lock, path)
            return fd
        os.close(fd)


def _open_lock(lock, path):
    """A descriptor of the lock file ``lock`` of checkpoint ``path``, created if
    missing; refuse a link at its name."""
    # (not through a link planted at the lock's name: it would truncate the target)
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                       0o644)
    except OSError as exc:
        raise type(exc)(exc.errno, f"Cannot create the lock file {lock} of "
                        f"checkpoint {path}: {exc.strerror} (a link there is "
                        "refused)") from None


def _lock_exclusively(fcntl, fd, path):
    """Take the exclusive ``flock`` of the lock file ``fd`` of checkpoint ``path``:
    true if held, false (``fd`` released) if the file system has no locks.

    Raises
    ------
    RuntimeError
        If another fit holds it (``fd`` closed); the message names its process.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = (os.read(fd, 64).decode(errors="replace").split() or
                  ["unknown"])[0]
        os.close(fd)
        raise RuntimeError(
            f"Checkpoint {path} is in use by another fit running now (process "
            f"{holder}). Fits that run at the same time need a checkpoint path "
            "each (clones share it: GridSearchCV(n_jobs=2) or cross_validate with "
            "n_jobs fit several at once): put {fingerprint} in the path (e.g. "
            "checkpoint='ck-{fingerprint}.npz') to give each fit of other data or "
            "parameters its own file, or use checkpoint=None."
        ) from None
    except OSError as exc:
        _release_lock(fd, path)
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            return False
        raise
    except BaseException:
        os.close(fd)
        raise
    return True


def _write_lock_holder(fd, lock, path):
    """Write this process's id and PID namespace to the held lock file ``fd``
    (``lock``) of checkpoint ``path``; release it if that fails."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {process_space()}".encode())
    except OSError as exc:
        _release_lock(fd, path)
        raise type(exc)(exc.errno, f"Cannot write the lock file {lock} of "
                        f"checkpoint {path}: {exc.strerror}") from None


def remove_stale_locks(directory):
    """Remove the ``.<name>.lock`` files in ``directory`` left by fits that were
    killed (SIGKILL leaves the file; its ``flock`` went with the process): those
    whose process id, written by a process of this host and PID namespace (or
    without that tag, by an earlier version), no longer runs, and that no process
    holds locked. Others are left alone."""
    import fcntl

    try:
        names = [n for n in os.listdir(directory)
                 if n.startswith(".") and n.endswith(".lock")]
    except OSError:
        return
    for name in names:
        _remove_if_stale(fcntl, os.path.join(directory, name))


def _remove_if_stale(fcntl, lock):
    """Remove the lock file ``lock`` if it is stale, as :func:`remove_stale_locks`
    says; leave it on any error (held by a running fit, gone, no locks here)."""
    try:
        fd = os.open(lock, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        if not _holder_gone(os.read(fd, 64).decode(errors="replace").split()):
            return
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(lock)):
            os.unlink(lock)  # (while holding it: no fit holds it meanwhile)
    except OSError:
        return  # held by a running fit, gone meanwhile, or no locks here
    finally:
        os.close(fd)


def _holder_gone(fields):
    """Whether the ``fields`` of a lock file name a process id, written in this
    host and PID namespace (or untagged, by an earlier version), that no longer
    runs."""
    return bool(fields and fields[0].isdigit() and len(fields) <= 2
                and fields[1:] in ([], [process_space()])
                and not pid_alive(int(fields[0])))


def _release_lock(fd, path):
    """Remove the lock file of checkpoint ``path`` (while still holding it), then let
    it go."""
    try:
        os.unlink(_lock_path(path))
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def open_checkpointer(estimator, source, compute_dtype, random_state, warm_model,
                      sample_weights=None):
    """The :class:`Checkpointer` of a fit, or ``None`` without ``checkpoint``.

    Parameters
    ----------
    estimator : GaussianMixture
    source : Source
    compute_dtype : numpy dtype
    random_state : numpy.random.RandomState
        Before any draw of this fit.
    warm_model : Model or None
        The parameters a warm start continues from.
    sample_weights : WeightSource or None, default=None
        The fit's weights: part of the data's fingerprint (SHA-256 of every
        weight), so that a fit with other weights does not resume.

    Raises
    ------
    ValueError
        If ``estimator.checkpoint`` is the data file, or an existing checkpoint
        there was written for other data or parameters, or is not a checkpoint.
    RuntimeError
        If another fit running now uses the same checkpoint path (with
        ``{fingerprint}`` in it, only a fit of the same data and parameters).
    OSError
        If the checkpoint cannot be written there (:func:`check_writable`), before
        any pass.
    """
    if estimator.checkpoint is None:
        return None
    _refuse_data_file(estimator.checkpoint, source)
    check_writable(estimator.checkpoint, "checkpoint")  # (before any pass)
    data = data_fingerprint(source)
    data["sample_weight"] = weights_fingerprint(sample_weights)
    fingerprint = {
        "data": data,
        "params": params_fingerprint(estimator, compute_dtype, random_state,
                                     warm_model),
    }
    path = checkpoint_path(estimator.checkpoint, fingerprint)
    if path != os.fspath(estimator.checkpoint):  # ({fingerprint} replaced)
        _refuse_data_file(path, source)
        check_writable(path, "checkpoint")
    return Checkpointer(path, estimator.checkpoint_interval, fingerprint)


def _refuse_data_file(path, source):
    """Raise ``ValueError`` if checkpoint ``path`` is the file ``source`` reads."""
    data_file = getattr(source, "filename", None)
    if (data_file is not None and os.path.exists(path)
            and os.path.samefile(path, data_file)):
        raise ValueError(f"checkpoint {os.fsdecode(path)} is the data file "
                         f"({source.description}): give the checkpoint a path of "
                         "its own")
