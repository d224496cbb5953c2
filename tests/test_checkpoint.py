"""Checkpoint and resume: atomic writes, exact resume after SIGKILL, refusal of a
checkpoint written for other data or parameters."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
from helpers import (
    IGNORE_NOT_CONVERGED,
    file_fingerprint,
    make_blobs_data,
    not_converging,
)

from emgmm import GaussianMixture
from emgmm._io.checkpoint import read_state
from emgmm._mixture.validation import InvalidParameterError

PARAMS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


class Stop(Exception):
    pass


def stop_at(init, n_iter):
    def callback(record):
        if record["init"] == init and record["n_iter"] == n_iter:
            raise Stop

    return callback


@pytest.fixture
def X():
    return make_blobs_data(600, 3, 3, seed=0)


def kwargs(**extra):
    base = dict(n_components=3, max_iter=8, tol=0.0, random_state=0)
    base.update(extra)
    return base


def fit_quietly(gm, X):
    with not_converging():
        return gm.fit(X)


def assert_same_model(a, b, rtol=1e-12):
    for name in PARAMS:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol,
                                   atol=0, err_msg=name)
    np.testing.assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=rtol, atol=0)
    assert a.n_iter_ == b.n_iter_
    assert a.lower_bound_ == pytest.approx(b.lower_bound_, rel=rtol)


KILLED_FIT = textwrap.dedent("""
    import os, signal, sys, warnings
    import numpy as np
    from emgmm import GaussianMixture

    data, checkpoint, marker, out = sys.argv[1:5]

    def callback(record):
        with open(out + ".iters", "a") as fh:
            fh.write(f"{record['init']} {record['n_iter']}\\n")
        if record["n_iter"] == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    warnings.simplefilter("ignore")
    gm = GaussianMixture(3, max_iter=8, tol=0.0, random_state=0, n_init=2,
                         checkpoint=checkpoint, callback=callback).fit(data)
    np.savez(out, **{name: getattr(gm, name) for name in
                     ("weights_", "means_", "covariances_", "precisions_cholesky_")},
             lower_bounds=np.array(gm.lower_bounds_))
""")


@pytest.mark.slow
def test_sigkill_after_third_iteration_then_resume_is_exact(tmp_path, X):
    data = tmp_path / "X.npy"
    np.save(data, X)
    script = tmp_path / "fit.py"
    script.write_text(KILLED_FIT)
    checkpoint = tmp_path / "fit.ckpt"
    marker, out = tmp_path / "killed-once", tmp_path / "result.npz"
    args = [sys.executable, str(script), str(data), str(checkpoint), str(marker),
            str(out)]

    first = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert checkpoint.exists() and not out.exists()
    # the checkpoint, no temporary file next to it; the lock file of the killed fit
    # (its lock went with the process) until the next fit that uses the path ends
    assert sorted(p.name for p in tmp_path.iterdir()
                  if "ckpt" in p.name) == [".fit.ckpt.lock", "fit.ckpt"]

    second = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    # removed when the fit completes
    assert not [p.name for p in tmp_path.iterdir() if "ckpt" in p.name]
    iters = out.with_suffix(".npz.iters").read_text().split("\n")
    # killed right after iteration 3 of the first initialisation, resumed at 4
    assert iters[:4] == ["0 1", "0 2", "0 3", "0 4"]

    ref = GaussianMixture(3, max_iter=8, tol=0.0, random_state=0, n_init=2)
    fit_quietly(ref, X)
    with np.load(out) as got:
        for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
            np.testing.assert_allclose(got[name], getattr(ref, name), rtol=1e-12,
                                       atol=0, err_msg=name)
        np.testing.assert_allclose(got["lower_bounds"], ref.lower_bounds_, rtol=1e-12)


@pytest.mark.parametrize("init,n_iter", [(0, 2), (1, 5), (2, 1)])
def test_resume_in_any_initialisation(tmp_path, X, init, n_iter):
    """The best earlier run and the random state come back from the checkpoint."""
    path = tmp_path / "ck.npz"
    params = kwargs(n_init=3, init_params="random")
    ref = fit_quietly(GaussianMixture(**params), X)
    with pytest.raises(Stop):
        fit_quietly(GaussianMixture(**params, checkpoint=path,
                                    callback=stop_at(init, n_iter)), X)
    assert read_state(path, read_fingerprint(path)).init_index == init
    seen = []
    resumed = GaussianMixture(**params, checkpoint=path,
                              callback=lambda r: seen.append((r["init"], r["n_iter"])))
    with not_converging():
        labels = resumed.fit_predict(X) if init else resumed.fit(X).predict(X)
    assert seen[0] == (init, n_iter + 1)
    assert_same_model(resumed, ref)
    np.testing.assert_array_equal(labels, ref.predict(X))
    assert not path.exists()


def read_fingerprint(path):
    import json

    with np.load(path, allow_pickle=False) as npz:
        return json.loads(str(npz["meta"]))["fingerprint"]


def test_random_state_instance_resumes(tmp_path, X):
    path = tmp_path / "ck.npz"
    params = kwargs(n_init=2, init_params="random")
    ref = fit_quietly(GaussianMixture(**{**params, "random_state":
                                         np.random.RandomState(7)}), X)
    with pytest.raises(Stop):
        GaussianMixture(**{**params, "random_state": np.random.RandomState(7)},
                        checkpoint=path, callback=stop_at(0, 4)).fit(X)
    resumed = fit_quietly(GaussianMixture(**{**params, "random_state":
                                             np.random.RandomState(7)},
                                          checkpoint=path), X)
    assert_same_model(resumed, ref)


def test_checkpoint_is_kept_when_fit_raises_and_state_restored(tmp_path, X):
    path = tmp_path / "ck.npz"
    gm = fit_quietly(GaussianMixture(**kwargs()), X)
    before = {name: getattr(gm, name).copy() for name in PARAMS}
    with pytest.raises(Stop):
        gm.set_params(checkpoint=path, callback=stop_at(0, 2)).fit(X[::-1])
    assert path.exists()
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(gm, name), value)


@pytest.mark.parametrize("change", [
    {"reg_covar": 1e-3}, {"n_components": 4}, {"covariance_type": "diag"},
    {"random_state": 1}, {"init_params": "random"}, {"tol": 1e-4}, {"max_iter": 9},
    {"on_degenerate": "raise"}, {"compute_dtype": "float32"},
    {"means_init": np.zeros((3, 3))},
])
def test_other_parameters_refused(tmp_path, X, change):
    path = tmp_path / "ck.npz"
    with pytest.raises(Stop):
        GaussianMixture(**kwargs(), checkpoint=path, callback=stop_at(0, 2)).fit(X)
    saved = path.read_bytes()
    gm = GaussianMixture(**kwargs(**change), checkpoint=path)
    key = next(iter(change))
    with pytest.raises(ValueError, match=rf"other parameters.*{key}"):
        gm.fit(X)
    assert path.read_bytes() == saved  # left as it was
    assert not hasattr(gm, "weights_")


def _one_value_changed(X):
    """X with one value, in a row between the first and last, off by one ulp."""
    Y = X.copy()
    Y[len(X) // 3 + 1, 1] = np.nextafter(Y[len(X) // 3 + 1, 1], np.inf)
    return Y


@pytest.mark.parametrize("other", ["shifted", "float32", "fewer rows", "one row",
                                   "one value inside"])
def test_other_data_refused(tmp_path, X, other):
    path = tmp_path / "ck.npz"
    with pytest.raises(Stop):
        GaussianMixture(**kwargs(), checkpoint=path, callback=stop_at(0, 2)).fit(X)
    Y = {"shifted": X + 1.0, "float32": X.astype(np.float32), "fewer rows": X[:-1],
         "one row": np.vstack([X[:-1], X[-1:] * 2]),
         "one value inside": _one_value_changed(X)}[other]
    with pytest.raises(ValueError, match="other data"):
        GaussianMixture(**kwargs(), checkpoint=path).fit(Y)


def test_same_data_from_another_source_resumes(tmp_path, X, make_sources):
    path = tmp_path / "ck.npz"
    ref = fit_quietly(GaussianMixture(**kwargs()), X)
    with pytest.raises(Stop):
        GaussianMixture(**kwargs(), checkpoint=path, callback=stop_at(0, 3)).fit(X)
    source = make_sources.one(X, "h5_string")
    assert_same_model(fit_quietly(GaussianMixture(**kwargs(), checkpoint=path),
                                  source.obj), ref)


def test_not_a_checkpoint(tmp_path, X):
    path = tmp_path / "ck.npz"
    path.write_bytes(b"not an npz file")
    with pytest.raises(ValueError, match="not a readable emgmm checkpoint"):
        GaussianMixture(**kwargs(), checkpoint=path).fit(X)
    assert path.read_bytes() == b"not an npz file"
    np.savez(path, meta=np.array("{}"))
    with pytest.raises(ValueError, match="not a readable emgmm checkpoint"):
        GaussianMixture(**kwargs(), checkpoint=path).fit(X)


@pytest.mark.parametrize("kind", ["npy", "memmap", "h5"])
def test_the_data_file_as_checkpoint_is_refused(tmp_path, X, kind):
    """A checkpoint path that is the data file itself is refused as such, and the
    file is left as it was (the error once called it 'not a readable emgmm
    checkpoint' and advised removing it)."""
    npy = tmp_path / "X.npy"
    np.save(npy, X)
    if kind == "npy":
        data, path = str(npy), npy
    elif kind == "memmap":
        data, path = np.load(npy, mmap_mode="r"), npy
    else:
        path = tmp_path / "X.h5"
        with h5py.File(path, "w") as f:
            f["X"] = X
        data = f"{path}:/X"
    before = file_fingerprint(path)
    with pytest.raises(ValueError, match=r"checkpoint .* is the data file .*path of "
                                         r"its own"):
        GaussianMixture(**kwargs(), checkpoint=path).fit(data)
    assert file_fingerprint(path) == before


def test_no_pickle_in_the_file(tmp_path, X):
    path = tmp_path / "ck.npz"
    with pytest.raises(Stop):
        GaussianMixture(**kwargs(n_init=2), checkpoint=path,
                        callback=stop_at(1, 2)).fit(X)
    with np.load(path, allow_pickle=False) as npz:
        for name in npz.files:
            assert npz[name].dtype != object


def checkpointed_iterations(path):
    """A callback recording, after each iteration, the iteration that the checkpoint
    on disk holds (None while there is none)."""
    seen = []

    def record(info):
        if info["event"] != "iteration":
            return
        if not path.exists():
            seen.append(None)
            return
        with np.load(path, allow_pickle=False) as npz:
            seen.append(json.loads(str(npz["meta"]))["run"]["n_iter"])

    return seen, record


def test_interval_limits_writes(tmp_path, X):
    seen, record = checkpointed_iterations(tmp_path / "a.npz")
    fit_quietly(GaussianMixture(**kwargs(), checkpoint=tmp_path / "a.npz",
                                callback=record), X)
    assert seen == list(range(1, 9))
    seen, record = checkpointed_iterations(tmp_path / "b.npz")
    fit_quietly(GaussianMixture(**kwargs(), checkpoint=tmp_path / "b.npz",
                                checkpoint_interval=3600.0, callback=record), X)
    assert seen == [None] * 8
    assert not (tmp_path / "a.npz").exists()


def test_write_is_atomic(tmp_path, X, monkeypatch):
    """A write that fails half-way leaves the previous checkpoint and no temp file."""
    path = tmp_path / "ck.npz"
    calls = []

    def failing_savez(fh, **arrays):
        calls.append(1)
        if len(calls) == 3:
            fh.write(b"partial")
            raise OSError("No space left on device")
        return real_savez(fh, **arrays)

    real_savez = np.savez
    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="No space"):
        GaussianMixture(**kwargs(), checkpoint=path).fit(X)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ck.npz"]
    state = read_state(path, read_fingerprint(path))
    assert state.run.n_iter == 2


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # the resumed fit: tol=0
def test_a_full_disk_names_the_checkpoint_and_keeps_the_last_one(tmp_path, X,
                                                                  monkeypatch):
    """A checkpoint's space is reserved before numpy writes it: on a full disk the
    error names the checkpoint and the MiB it needs (it was a bare 'No space left on
    device'), the previous checkpoint stays and resumes; and the reserve does not stay
    in a checkpoint (cut at the archive's end)."""
    import errno

    path = tmp_path / "ck.npz"
    real = os.posix_fallocate
    calls = []

    def fills_up(fd, offset, length):
        calls.append(length)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fills_up)
    with pytest.raises(OSError, match=rf"Cannot write {path}: No space left on device "
                                      r"\(it needs [\d.]+ MiB"):
        GaussianMixture(**kwargs(), checkpoint=path).fit(X)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ck.npz"]
    assert os.path.getsize(path) < calls[1]  # the archive, not the reserve
    assert read_state(path, read_fingerprint(path)).run.n_iter == 2
    resumed = GaussianMixture(**kwargs(), checkpoint=path).fit(X)
    assert_same_model(resumed, GaussianMixture(**kwargs()).fit(X))


def test_a_file_system_without_fallocate_still_checkpoints(tmp_path, X, monkeypatch):
    """Where the C library refuses posix_fallocate on the file system (EOPNOTSUPP,
    as musl does without emulation), the space is not reserved but the checkpoint
    is written (and valid) all the same."""
    import errno

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    path = tmp_path / "ck.npz"
    with pytest.raises(Stop):
        GaussianMixture(**kwargs(), checkpoint=path, callback=stop_at(0, 2)).fit(X)
    assert read_state(path, read_fingerprint(path)).run.n_iter == 2


@pytest.mark.parametrize("bad", [{"checkpoint_interval": -1.0},
                                 {"checkpoint_interval": "often"},
                                 {"checkpoint": 3}])
def test_parameter_constraints(X, bad):
    with pytest.raises(InvalidParameterError):
        GaussianMixture(**kwargs(**bad)).fit(X)


def test_warm_start_fingerprint(tmp_path, X):
    """A warm start resumes only from the same starting model."""
    path = tmp_path / "ck.npz"
    gm = fit_quietly(GaussianMixture(**kwargs(warm_start=True)), X)
    ref = GaussianMixture(**kwargs(warm_start=True))
    fit_quietly(ref, X)
    fit_quietly(ref, X)
    with pytest.raises(Stop):
        gm.set_params(checkpoint=path, callback=stop_at(0, 3)).fit(X)
    gm.set_params(callback=None)
    fit_quietly(gm, X)
    assert_same_model(gm, ref)
    # the same parameters warm-started from another model: refused
    with pytest.raises(Stop):
        gm.set_params(checkpoint=path, callback=stop_at(0, 3)).fit(X)
    other = fit_quietly(GaussianMixture(**kwargs(warm_start=True)), X[::2])
    with pytest.raises(ValueError, match="warm_start_from"):
        other.set_params(checkpoint=path).fit(X)


@pytest.mark.parametrize("case", ["empty", "device"])
def test_checkpoint_that_is_no_file_path_is_refused(X, case):
    """An empty path, or a device, is refused as such before the first pass (both
    were called 'not a readable emgmm checkpoint', with the advice to remove them:
    the working directory, /dev/null)."""
    path = {"empty": "", "device": os.devnull}[case]
    message = {"empty": "checkpoint path is empty",
               "device": "checkpoint path /dev/null is not a regular file"}[case]
    passes = []
    est = GaussianMixture(3, random_state=0, checkpoint=path, callback=passes.append)
    with pytest.raises(ValueError, match=message):
        est.fit(X)
    assert not passes and not hasattr(est, "means_")
    assert os.path.exists(os.devnull) and not os.path.isfile(os.devnull)


@pytest.mark.parametrize("case", ["missing", "read_only"])
def test_checkpoint_folder_checked_before_any_pass(tmp_path, X, monkeypatch, case):
    """A checkpoint that cannot be written is refused before the first pass (not
    after it, with the errno of a temporary file), naming the folder."""
    folder = tmp_path / "no" if case == "missing" else tmp_path
    if case == "read_only":
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
            False if os.path.abspath(path) == str(tmp_path) else access(path, mode,
                                                                        **kw)))
    passes = []
    est = GaussianMixture(3, random_state=0, checkpoint=str(folder / "c.npz"),
                          callback=passes.append)
    error, message = {"missing": (FileNotFoundError,
                                  "checkpoint directory does not exist"),
                      "read_only": (PermissionError,
                                    "checkpoint directory is not writable")}[case]
    with pytest.raises(error, match=message) as info:
        est.fit(X)
    assert str(folder) in str(info.value)
    assert not passes and not hasattr(est, "means_")


def test_a_path_used_by_a_running_fit_is_refused(tmp_path, X):
    """A second fit with the checkpoint path of a fit running now (clones under
    GridSearchCV(n_jobs=2) share it) is refused with a message naming the running
    fit's process; it neither reads nor deletes the running fit's checkpoint, which
    finishes as it would alone. The path is free again afterwards."""
    path = tmp_path / "ck.npz"
    refused = []

    def start_another(record):
        if record["n_iter"] == 2 and not refused:
            other = GaussianMixture(**kwargs(n_components=4), checkpoint=path)
            with pytest.raises(RuntimeError, match="in use by another fit") as info:
                fit_quietly(other, X)
            refused.append(str(info.value))
            assert path.exists()  # the running fit's checkpoint of iteration 1

    got = fit_quietly(GaussianMixture(**kwargs(), checkpoint=path,
                                      checkpoint_interval=0, callback=start_another), X)
    assert refused and f"process {os.getpid()}" in refused[0]
    assert_same_model(got, fit_quietly(GaussianMixture(**kwargs()), X))
    assert os.listdir(tmp_path) == []  # the checkpoint and its lock file removed
    fit_quietly(GaussianMixture(**kwargs(n_components=4), checkpoint=path), X)


def test_a_fingerprint_field_gives_each_running_fit_its_own_file(tmp_path, X):
    """checkpoint='ck-{fingerprint}.npz' set once for fits of other parameters
    running at the same time (the clones of GridSearchCV(n_jobs=2)): each writes
    a file of its own, none is refused, each ends with the model of a fit without a
    checkpoint, and nothing is left. A fit stopped and started again resumes from
    its own file."""
    path = str(tmp_path / "ck-{fingerprint}.npz")
    inner = []

    def start_another(record):
        if record["n_iter"] == 2 and not inner:
            inner.append(fit_quietly(GaussianMixture(
                **kwargs(n_components=4), checkpoint=path, callback=stop_files), X))

    files = []

    def stop_files(record):
        files.append(sorted(p.name for p in tmp_path.glob("ck-*.npz")))

    got = fit_quietly(GaussianMixture(**kwargs(), checkpoint=path,
                                      callback=start_another), X)
    assert inner and len(files[-1]) == 2  # the outer fit's and the inner one's
    assert all(len(name) == len("ck-.npz") + 16 for name in files[-1])
    assert_same_model(got, fit_quietly(GaussianMixture(**kwargs()), X))
    assert_same_model(inner[0], fit_quietly(GaussianMixture(**kwargs(n_components=4)),
                                            X))
    assert os.listdir(tmp_path) == []
    with pytest.raises(Stop):
        GaussianMixture(**kwargs(), checkpoint=path, callback=stop_at(0, 3)).fit(X)
    (written,) = tmp_path.glob("ck-*.npz")
    assert read_state(written, json.loads(
        str(np.load(written)["meta"]))["fingerprint"]).run.n_iter == 3
    resumed = []
    fit_quietly(GaussianMixture(**kwargs(), checkpoint=path,
                                callback=resumed.append), X)
    assert [r["n_iter"] for r in resumed] == [4, 5, 6, 7, 8]


@pytest.mark.parametrize("locks", [True, False])
def test_a_failed_fit_frees_the_path(tmp_path, X, monkeypatch, locks):
    """A fit that raises keeps its checkpoint for a resume and frees the path: the
    same fit, run again at once, resumes from it. Also where flock is not supported
    (ENOLCK, as on some network file systems): the fit checkpoints and resumes
    without the lock, and leaves no lock file."""
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    if not locks:
        monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / "ck.npz"
    with pytest.raises(Stop):
        fit_quietly(GaussianMixture(**kwargs(), checkpoint=path,
                                    callback=stop_at(0, 3)), X)
    assert os.listdir(tmp_path) == ["ck.npz"]
    resumed = fit_quietly(GaussianMixture(**kwargs(), checkpoint=path), X)
    assert_same_model(resumed, fit_quietly(GaussianMixture(**kwargs()), X))
    assert os.listdir(tmp_path) == []


def test_the_path_is_freed_when_the_workers_refuse_to_start(tmp_path, X):
    """An HDF5 dataset of a file open for writing is refused for worker processes
    before any pass; the checkpoint path is free for the retry with n_jobs=1 that the
    message suggests (the lock was taken before the executor started)."""
    import h5py

    path = tmp_path / "ck.npz"
    with h5py.File(tmp_path / "x.h5", "w") as f:
        ds = f.create_dataset("X", data=X)
        with pytest.raises(ValueError, match="open for writing"):
            fit_quietly(GaussianMixture(**kwargs(), n_jobs=2, checkpoint=path), ds)
        assert sorted(os.listdir(tmp_path)) == ["x.h5"]
        fit_quietly(GaussianMixture(**kwargs(), n_jobs=1, checkpoint=path), ds)


def test_a_relative_path_stays_where_the_fit_started(tmp_path, X, monkeypatch):
    """A relative checkpoint path names the folder of the fit's start: a chdir during
    the fit moves neither the checkpoint nor its lock (they would overwrite, then
    delete, another fit's files in the new folder)."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    (other / "ck.npz").write_bytes(b"another fit's checkpoint")
    monkeypatch.chdir(first)
    seen = []

    def move(record):
        os.chdir(other)
        seen.append(sorted(os.listdir(first)))

    fit_quietly(GaussianMixture(**kwargs(max_iter=3), checkpoint="ck.npz",
                                checkpoint_interval=0, callback=move), X)
    assert seen[-1] == [".ck.npz.lock", "ck.npz"]
    assert os.listdir(first) == []
    assert os.listdir(other) == ["ck.npz"]
    assert (other / "ck.npz").read_bytes() == b"another fit's checkpoint"


def test_a_link_at_the_lock_name_is_refused(tmp_path, X):
    """A symbolic link planted at the lock file's name is not followed (the fit would
    truncate its target and write its process id there)."""
    target = tmp_path / "results.csv"
    target.write_text("a,b\n1,2\n")
    os.symlink(target, tmp_path / ".ck.npz.lock")
    with pytest.raises(OSError, match="lock file .*ck.npz.lock.*link"):
        fit_quietly(GaussianMixture(**kwargs(), checkpoint=tmp_path / "ck.npz"), X)
    assert target.read_text() == "a,b\n1,2\n"


def test_a_lock_file_that_cannot_be_written_frees_the_path(tmp_path, X, monkeypatch):
    """Writing the process id into the lock file fails (a full file system): the error
    names the lock file, and the lock is let go (a retry runs)."""
    import errno

    path = tmp_path / "ck.npz"
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    with pytest.raises(OSError, match=r"lock file .*\.ck\.npz\.lock"):
        fit_quietly(GaussianMixture(**kwargs(), checkpoint=path), X)
    monkeypatch.setattr(os, "write", real)
    assert os.listdir(tmp_path) == []
    fit_quietly(GaussianMixture(**kwargs(), checkpoint=path), X)


def test_resume_from_records_without_passes_gives_every_record_the_key(tmp_path, X):
    """A checkpoint whose iteration records predate ``passes`` resumes with
    ``passes=None`` in those records and counted passes in the new ones."""
    path = tmp_path / "ck.npz"
    with pytest.raises(Stop):
        GaussianMixture(**kwargs(), checkpoint=path, callback=stop_at(0, 3)).fit(X)
    with np.load(path) as npz:
        arrays = {name: npz[name] for name in npz.files}
    meta = json.loads(str(arrays["meta"]))
    for record in meta["run"]["history"]:
        del record["passes"]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    got = fit_quietly(GaussianMixture(**kwargs(), checkpoint=path), X)
    passes = [r["passes"] for r in got.history_]
    assert passes[:3] == [None] * 3 and passes[3:] and set(passes[3:]) == {1}
