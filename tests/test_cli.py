"""The ``emgmm`` command line, run in-process (and once as ``python -m emgmm``): its
commands and outputs, --version and the help texts, flag names in messages, one
progress stream with --verbose, output suffixes, interrupts and checkpoint locks."""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    IGNORE_NOT_CONVERGED,
    cli_usage_error,
    file_fingerprint,
    make_blobs_data,
)

import emgmm
from emgmm._cli import command as cli
from emgmm._io.model_file import save_model
from emgmm._mixture.loading import load_model

REPO_ROOT = Path(emgmm.__file__).resolve().parent.parent


@pytest.fixture
def data(tmp_path):
    """300 x 3 blobs as a .npy file and as an HDF5 dataset; returns (X, npy, h5
    spec)."""
    X = make_blobs_data(300, 3, 3, seed=2)
    npy = tmp_path / "X.npy"
    np.save(npy, X)
    h5 = tmp_path / "X.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("group/X", data=X, chunks=(32, 3))
    return X, str(npy), f"{h5}:/group/X"


@pytest.fixture
def model_path(tmp_path, data):
    path = tmp_path / "model.h5"
    assert cli.main(["fit", data[1], "-k", "3", "--random-state", "0",
                     "-o", str(path), "--quiet"]) == 0
    return str(path)


def _reference(X, **params):
    return emgmm.GaussianMixture(**params).fit(X)


def test_fit_writes_a_model_equal_to_the_estimator(tmp_path, data, capsys):
    X, npy, _ = data
    out = tmp_path / "m.h5"
    before = file_fingerprint(npy)
    assert cli.main(["fit", npy, "-k", "3", "--covariance-type", "diag",
                     "--random-state", "0", "-o", str(out)]) == 0
    model = load_model(out)
    ref = _reference(X, n_components=3, covariance_type="diag", random_state=0)
    np.testing.assert_allclose(model.means_, ref.means_, rtol=1e-12)
    np.testing.assert_array_equal(model.predict(X), ref.predict(X))
    assert file_fingerprint(npy) == before  # the input file is untouched

    err = capsys.readouterr().err.splitlines()
    iteration_lines = [line for line in err if line.startswith("iter ")]
    assert len(iteration_lines) == model.n_iter_
    assert "lower bound" in iteration_lines[-1] and "s/iter" in iteration_lines[-1]
    assert "left" in iteration_lines[0]
    assert f"after {model.n_iter_} iterations" in err[-1]
    assert str(out) in err[-1]


# (shown, not raised: the CLI keeps the caller's filters, and pytest's are "error")
@pytest.mark.filterwarnings(
    "always:Best performing initialization:sklearn.exceptions.ConvergenceWarning")
def test_fit_warnings_are_one_line(tmp_path, data, capsys):
    assert cli.main(["fit", data[1], "-k", "3", "--max-iter", "1",
                     "--random-state", "0", "-o", str(tmp_path / "m.h5"), "-q"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("emgmm fit: ConvergenceWarning: ")
    assert err.count("\n") == 1


def test_fit_quiet_and_json(tmp_path, data, capsys):
    X, _, spec = data
    out = tmp_path / "m.h5"
    assert cli.main(["fit", spec, "-k", "2", "--random-state", "1", "-o", str(out),
                     "--quiet", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    summary = json.loads(captured.out)
    ref = _reference(X, n_components=2, random_state=1)
    assert summary["n_iter"] == ref.n_iter_
    assert summary["converged"] == ref.converged_
    assert summary["lower_bound"] == pytest.approx(ref.lower_bound_, rel=1e-12)
    assert summary["model"] == str(out) and summary["data"] == spec
    assert summary["n_features"] == 3 and summary["covariance_type"] == "full"


def test_every_estimator_parameter_has_a_flag():
    params = set(emgmm.GaussianMixture().get_params())
    flagged = {name for _, name, _ in cli._ESTIMATOR_FLAGS}
    # warm_start is --warm-start MODEL, callback is the progress reporter; the
    # step sizes are partial_fit's, which the command line does not run
    partial_fit_only = {"learning_decay", "learning_offset"}
    assert flagged == params - {"warm_start", "callback"} - partial_fit_only
    parser = cli.build_parser()
    fit_parser = parser._subparsers._group_actions[0].choices["fit"]
    dests = {action.dest for action in fit_parser._actions}
    assert params - {"callback"} - partial_fit_only <= dests


def test_every_schedule_of_the_estimator_is_a_choice_of_the_flag():
    """--schedule offers what GaussianMixture's schedule takes ('pairs' was
    missing)."""
    constraint = emgmm.GaussianMixture._parameter_constraints["schedule"][0]
    flag = next(kw for names, name, kw in cli._ESTIMATOR_FLAGS if name == "schedule")
    assert set(flag["choices"]) == set(constraint.options)


def test_fit_flags_reach_the_estimator(tmp_path, data, monkeypatch):
    X, npy, _ = data
    fitted = []
    save = cli.save_model
    def recording_save(est, path):
        fitted.append(est.get_params())
        return save(est, path)

    monkeypatch.setattr(cli, "save_model", recording_save)
    means_init = tmp_path / "means.npy"
    np.save(means_init, X[[0, 100, 200]])
    out = tmp_path / "m.h5"
    argv = ["fit", npy, "-o", str(out), "-q", "-k", "3", "--covariance-type", "tied",
            "--tol", "1e-4", "--reg-covar", "1e-5", "--max-iter", "50", "--n-init", "1",
            "--init-params", "random_from_data", "--means-init", str(means_init),
            "--random-state", "3", "--verbose-interval", "5", "--n-jobs", "1",
            "--working-memory", "64", "--block-size", "50",
            "--init-max-samples", "1000",
            "--compute-dtype", "float64", "--memory-limit", "4096",
            "--resp-threshold", "1e-12", "--schedule", "rows",
            "--on-degenerate", "raise",
            "--checkpoint", str(tmp_path / "ckpt.npz"), "--checkpoint-interval", "0"]
    assert cli.main(argv) == 0
    model = load_model(out)
    expected = dict(n_components=3, covariance_type="tied", tol=1e-4, reg_covar=1e-5,
                    max_iter=50, init_params="random_from_data", random_state=3,
                    verbose_interval=5, n_jobs=1, working_memory=64.0, block_size=50,
                    init_max_samples=1000, compute_dtype="float64", memory_limit=4096.0,
                    resp_threshold=1e-12, schedule="rows", on_degenerate="raise",
                    checkpoint=str(tmp_path / "ckpt.npz"), checkpoint_interval=0.0)
    params = fitted[0]
    assert {k: params[k] for k in expected} == expected
    # the model file keeps them all but the fit's checkpoint path
    stored = model.get_params()
    np.testing.assert_array_equal(stored.pop("means_init"), params.pop("means_init"))
    assert stored == dict(params, checkpoint=None)
    assert not (tmp_path / "ckpt.npz").exists()  # removed when the fit completes
    ref = _reference(X, **dict(expected, checkpoint=None), means_init=X[[0, 100, 200]])
    np.testing.assert_allclose(model.means_, ref.means_, rtol=1e-12)


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # the reference: 2 iterations
def test_fit_warm_start_continues_from_a_model(tmp_path, data, model_path):
    X, npy, _ = data
    out = tmp_path / "continued.h5"
    assert cli.main(["fit", npy, "--warm-start", model_path, "--max-iter", "2",
                     "--tol", "0", "-o", str(out), "-q"]) == 0
    first, continued = load_model(model_path), load_model(out)
    ref = load_model(model_path).set_params(warm_start=True, max_iter=2, tol=0).fit(X)
    assert continued.n_components == 3 and continued.n_iter_ == 2
    assert continued.lower_bound_ >= first.lower_bound_ - 1e-12
    np.testing.assert_allclose(continued.means_, ref.means_, rtol=1e-12)


def test_score(data, model_path, capsys):
    X, npy, spec = data
    model = load_model(model_path)
    for source in (npy, spec):
        assert cli.main(["score", model_path, source]) == 0
        assert float(capsys.readouterr().out) == pytest.approx(model.score(X),
                                                               rel=1e-12)
    assert cli.main(["score", model_path, spec, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_samples"] == 300
    assert result["score"] == pytest.approx(model.score(X), rel=1e-12)


@pytest.mark.parametrize("block_size", [None, 7])
def test_predict_labels_and_proba(tmp_path, data, model_path, block_size):
    X, npy, spec = data
    model = load_model(model_path)
    extra = [] if block_size is None else ["--block-size", str(block_size)]
    labels, proba = tmp_path / "labels.npy", tmp_path / "proba.npy"
    assert cli.main(["predict", model_path, spec, "-o", str(labels)] + extra) == 0
    assert cli.main(["predict", model_path, npy, "-o", str(proba),
                     "--proba"] + extra) == 0
    got = np.load(labels)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, model.predict(X))
    np.testing.assert_allclose(np.load(proba), model.predict_proba(X), rtol=1e-12,
                               atol=1e-15)
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["X.npy", "X.h5", "model.h5", "labels.npy", "proba.npy"])


def test_sample(tmp_path, model_path):
    model = load_model(model_path)
    out, labels = tmp_path / "s.npy", tmp_path / "y.npy"
    assert cli.main(["sample", model_path, "-n", "500", "-o", str(out),
                     "--labels", str(labels), "--random-state", "4"]) == 0
    samples, y = np.load(out), np.load(labels)
    assert samples.shape == (500, 3) and y.shape == (500,)
    expected = model.set_params(random_state=4).sample(500)
    np.testing.assert_array_equal(samples, expected[0])
    np.testing.assert_array_equal(y, expected[1])


def test_info(model_path, capsys):
    model = load_model(model_path)
    assert cli.main(["info", model_path]) == 0
    text = capsys.readouterr().out
    assert "covariance type  full" in text
    assert "components       3" in text
    assert f"after {model.n_iter_} iterations" in text
    assert f"emgmm {emgmm.__version__}" in text
    assert "n_factors" not in text  # a parameter of 'factor' only
    assert cli.main(["info", model_path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_components"] == 3 and info["n_features_in"] == 3
    np.testing.assert_allclose(info["weights"], model.weights_)


@pytest.mark.slow
def test_python_m_emgmm_subprocess(tmp_path, data):
    _, _, spec = data
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = tmp_path / "sub.h5"
    run = subprocess.run(
        [sys.executable, "-m", "emgmm", "fit", spec, "-k", "2", "--random-state", "0",
         "-o", str(out), "--json", "--quiet"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["n_iter"] == load_model(out).n_iter_
    bad = subprocess.run([sys.executable, "-m", "emgmm", "info",
                          str(tmp_path / "no.h5")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and "model file not found" in bad.stderr


# ---------------------------------------------------------------- bad input


def _bad_inputs(tmp_path, data, model_path):
    X, npy, spec = data
    h5 = spec.split(":/")[0]
    with h5py.File(tmp_path / "odd.h5", "w") as f:
        f["one_d"] = np.arange(10.0)
        f["text"] = np.array([b"a", b"b", b"c", b"d"]).reshape(2, 2)
    np.save(tmp_path / "wide.npy", np.zeros((20, 5)))
    odd = tmp_path / "odd.h5"
    return {
        "missing data": (["score", model_path, str(tmp_path / "none.npy")], "none.npy"),
        "missing hdf5": (["fit", f"{tmp_path}/none.h5:/X", "-o", "m.h5"], "none.h5"),
        "no dataset": (["fit", f"{h5}:/nothing", "-o", "m.h5"], "nothing"),
        "1-D dataset": (["fit", f"{odd}:/one_d", "-o", "m.h5"], "2D"),
        "non-numeric": (["fit", f"{odd}:/text", "-o", "m.h5"], "dtype"),
        "not a model": (["predict", h5, npy, "-o", "out.npy"], "not an emgmm model"),
        "npy as model": (["info", npy], "not an emgmm model"),
        "features": (["predict", model_path, str(tmp_path / "wide.npy"),
                      "-o", "out.npy"], "5 features but the model was fitted on 3"),
    }


@pytest.mark.parametrize("case", ["missing data", "missing hdf5", "no dataset",
                                  "1-D dataset", "non-numeric", "not a model",
                                  "npy as model", "features"])
def test_bad_input_one_line_error(tmp_path, data, model_path, capsys, monkeypatch,
                                  case):
    monkeypatch.chdir(tmp_path)
    argv, needle = _bad_inputs(tmp_path, data, model_path)[case]
    listing = sorted(os.listdir(tmp_path))
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"emgmm {argv[0]}: error: ")
    assert needle in captured.err
    assert "Traceback" not in captured.err
    assert sorted(os.listdir(tmp_path)) == listing  # no output, no temp file
    with pytest.raises(Exception):  # noqa: B017 (any error, with its traceback)
        cli.main(argv + ["--debug"])


def test_failure_mid_stream_leaves_no_partial_output(tmp_path, model_path, capsys):
    X = make_blobs_data(300, 3, 3, seed=2)
    X[250, 1] = np.nan  # found only when the last block is read
    np.save(tmp_path / "nan.npy", X)
    listing = sorted(os.listdir(tmp_path))
    assert cli.main(["predict", model_path, str(tmp_path / "nan.npy"), "-o",
                     str(tmp_path / "labels.npy"), "--block-size", "100"]) == 1
    assert "row 250" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == listing


def test_fit_to_missing_directory_fails_before_fitting(tmp_path, data, capsys):
    assert cli.main(["fit", data[1], "-o", str(tmp_path / "no" / "m.h5"), "-q"]) == 1
    assert "output directory does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["output_is_a_directory", "missing_checkpoint_dir",
                                  "read_only_output_dir", "read_only_checkpoint_dir"])
def test_fit_output_paths_checked_before_fitting(tmp_path, data, capsys, monkeypatch,
                                                 case):
    from emgmm import GaussianMixture

    monkeypatch.setattr(GaussianMixture, "fit", lambda *a, **k: pytest.fail("fitted"))
    read_only = tmp_path / "ro"
    read_only.mkdir()
    access = os.access
    # (a read-only file system, which os.access reports for any user, root too)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if os.path.abspath(path) == str(read_only) else access(path, mode, **kw)))
    argv = ["fit", data[1], "-q"]
    if case == "output_is_a_directory":
        argv += ["-o", str(tmp_path)]
        expected = "output path is a directory"
    elif case == "missing_checkpoint_dir":
        argv += ["-o", str(tmp_path / "m.h5"), "--checkpoint",
                 str(tmp_path / "no" / "c.npz")]
        expected = "checkpoint directory does not exist"
    elif case == "read_only_output_dir":
        argv += ["-o", str(read_only / "m.h5")]
        expected = f"output directory is not writable: {read_only}"
    else:
        argv += ["-o", str(tmp_path / "m.h5"), "--checkpoint", str(read_only / "c.npz")]
        expected = f"checkpoint directory is not writable: {read_only}"
    assert cli.main(argv) == 1
    assert expected in capsys.readouterr().err


def _clashes(tmp_path, data, model_path):
    """argv whose output is an input (or another output), with the two paths the
    message must name."""
    _, npy, spec = data
    h5 = spec.split(":/")[0]
    np.save(tmp_path / "means.npy", data[0][:3])
    link = tmp_path / "link.npy"
    os.symlink(npy, link)
    means, out = str(tmp_path / "means.npy"), str(tmp_path / "new.h5")
    ckpt = str(tmp_path / "new.npz")
    return {
        "predict over DATA": (["predict", model_path, npy, "-o", npy], npy, npy),
        "predict over DATA by a link": (["predict", model_path, npy, "-o", str(link)],
                                        str(link), npy),
        "predict over the HDF5 file": (["predict", model_path, spec, "-o", h5], h5,
                                       spec),
        "predict over MODEL": (["predict", model_path, npy, "-o", model_path],
                               model_path, model_path),
        "fit over the HDF5 file": (["fit", spec, "-k", "2", "-o", h5], h5, spec),
        "fit over DATA": (["fit", npy, "-k", "2", "-o", npy], npy, npy),
        "checkpoint over the warm-start model": (
            ["fit", npy, "--warm-start", model_path, "-o", out, "--checkpoint",
             model_path], model_path, model_path),
        "fit over --means-init": (["fit", npy, "-k", "3", "--means-init", means, "-o",
                                   means], means, means),
        "checkpoint over DATA": (["fit", spec, "-k", "2", "-o", out,
                                  "--checkpoint", h5], h5, spec),
        "checkpoint is the output": (["fit", npy, "-k", "2", "-o", out, "--checkpoint",
                                      out], out, out),
        "sample over MODEL": (["sample", model_path, "-n", "5", "-o", model_path],
                              model_path, model_path),
        "labels over MODEL": (["sample", model_path, "-n", "5", "-o", ckpt, "--labels",
                               model_path], model_path, model_path),
        "labels are the output": (["sample", model_path, "-n", "5", "-o", ckpt,
                                   "--labels", ckpt], ckpt, ckpt),
    }


@pytest.mark.parametrize("case", [
    "predict over DATA", "predict over DATA by a link", "predict over the HDF5 file",
    "predict over MODEL", "fit over the HDF5 file", "fit over DATA",
    "checkpoint over the warm-start model", "fit over --means-init",
    "checkpoint over DATA",
    "checkpoint is the output", "sample over MODEL", "labels over MODEL",
    "labels are the output"])
def test_output_that_is_an_input_is_refused_before_any_work(
        tmp_path, data, model_path, capsys, monkeypatch, case):
    """An output path naming an input file (by any name: a link, the file of
    'file.h5:/dataset') or another output would overwrite it: refused up front."""
    from emgmm import GaussianMixture

    argv, output, other = _clashes(tmp_path, data, model_path)[case]
    before = {name: file_fingerprint(tmp_path / name) for name in os.listdir(tmp_path)}
    for name, target in ((cli, "load_model"), (cli, "as_source"),
                         (GaussianMixture, "fit")):
        monkeypatch.setattr(name, target, lambda *a, **k: pytest.fail("work done"))
    err = cli_usage_error(argv + ["-q"] * (argv[0] == "fit"), capsys)
    assert "is the same file as" in err, err
    assert f" {output} " in err and f" {other}:" in err
    assert {name: file_fingerprint(tmp_path / name)
            for name in os.listdir(tmp_path)} == before


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # the reference: 2 iterations
def test_fit_updates_its_warm_start_model_in_place(tmp_path, data, model_path):
    """The --warm-start model is read whole before the fit and replaced only by the
    complete output: it may be the output."""
    X, npy, _ = data
    ref = load_model(model_path).set_params(warm_start=True, max_iter=2, tol=0).fit(X)
    assert cli.main(["fit", npy, "--warm-start", model_path, "--max-iter", "2",
                     "--tol", "0", "-o", model_path, "-q"]) == 0
    got = load_model(model_path)
    assert got.n_iter_ == 2
    for name in ("weights_", "means_", "precisions_cholesky_"):
        np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-12)


def test_output_next_to_a_missing_input_is_no_clash(tmp_path, data, model_path, capsys):
    """A path that does not exist is no file an output could overwrite: the missing
    input is what gets reported."""
    missing = str(tmp_path / "none.npy")
    assert cli.main(["predict", model_path, missing, "-o", missing]) == 1
    err = capsys.readouterr().err
    assert "No such file" in err and "same file" not in err


def test_sample_writes_both_outputs_or_neither(tmp_path, model_path, capsys):
    listing = sorted(os.listdir(tmp_path))
    assert cli.main(["sample", model_path, "-n", "5", "-o", str(tmp_path / "s.npy"),
                     "--labels", str(tmp_path / "no" / "l.npy")]) == 1
    assert "labels directory does not exist" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == listing


def test_predict_to_a_directory_is_refused(tmp_path, data, model_path, capsys):
    assert cli.main(["predict", model_path, data[1], "-o", str(tmp_path)]) == 1
    assert "output path is a directory" in capsys.readouterr().err


def test_fit_json_stdout_holds_only_the_json_with_verbose(tmp_path, data, capsys):
    assert cli.main(["fit", data[1], "-k", "2", "-o", str(tmp_path / "m.h5"), "--json",
                     "--verbose", "2", "--max-iter", "3"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["model"] == str(tmp_path / "m.h5")
    assert "Initialization" in err or "Iteration" in err  # the verbose lines


# (shown, not raised: the CLI keeps the caller's filters, and pytest's are "error")
@pytest.mark.filterwarnings("always:X does not have valid feature names:UserWarning")
def test_predict_shows_no_warning_per_block(tmp_path, data, capsys):
    """A model fitted on a DataFrame predicts a file in one pass: scikit-learn's
    warning about feature names, which the blocks of the command once raised each,
    is shown at most once."""
    pd = pytest.importorskip("pandas")
    X = data[0]
    gm = emgmm.GaussianMixture(3, random_state=0)
    gm.fit(pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])]))
    model = tmp_path / "named.h5"
    save_model(gm, model)
    assert cli.main(["predict", str(model), data[1], "-o", str(tmp_path / "l.npy"),
                     "--block-size", "50"]) == 0
    assert capsys.readouterr().err.count("valid feature names") <= 1


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["fit", "x.npy", "-o", "m.h5", "--covariance-type", "bogus"])
    assert exc.value.code == 2


def _state_and_parent(pid):
    """``(state, parent pid)`` of a process (Linux /proc), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def _own_lines(stderr):
    """The lines of ``stderr`` that emgmm wrote: without the warnings of loky's
    resource tracker, a process of its own sharing the terminal, which now and then
    reports at its exit a folder it was asked to remove and emgmm's cleanup already
    had (``resource_tracker: <path>: FileNotFoundError``, and the ``warnings.warn``
    source line after it)."""
    lines = stderr.rstrip().splitlines()
    return [line for line in lines if "resource_tracker" not in line
            and not line.startswith(" ")]


def _children(pid):
    """PIDs of the live (not zombie) processes whose parent is ``pid``."""
    return [int(e) for e in os.listdir("/proc")
            if e.isdigit() and (_state_and_parent(e) or ("Z", 0))[0] != "Z"
            and _state_and_parent(e)[1] == pid]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_a_fit_like_an_interrupt(tmp_path):
    """``kill PID`` (SIGTERM) of ``emgmm fit --n-jobs 2``: by default it ended the
    process at once, and its loky workers went on running for minutes. Now it is
    taken as an interrupt: exit status 143, no output, no temporary files, and the
    worker processes end with it."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100_000, 16)) + rng.integers(0, 5, (100_000, 1)) * 2.0
    np.save(tmp_path / "X.npy", X)
    temp = tmp_path / "joblib"
    temp.mkdir()
    err = tmp_path / "err.txt"
    env = dict(os.environ, JOBLIB_TEMP_FOLDER=str(temp))
    with open(err, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "emgmm", "fit", str(tmp_path / "X.npy"), "-k", "20",
             "--tol", "0", "--max-iter", "10000", "--n-jobs", "2", "-o",
             str(tmp_path / "m.h5")], stdout=subprocess.DEVNULL, stderr=fh, env=env)
    workers = []

    def running():
        return [pid for pid in workers if (_state_and_parent(pid) or ("Z",))[0] != "Z"]

    try:
        deadline = time.monotonic() + 120
        while not re.search(r"iter +2/", err.read_text()) and proc.poll() is None:
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.2)
        # the workers and their resource tracker
        workers += _children(proc.pid)
        assert workers, "the fit runs in worker processes"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, err.read_text()
        assert _own_lines(err.read_text())[-1:] == ["emgmm: terminated"], \
            err.read_text()
        deadline = time.monotonic() + 30
        while running():
            assert time.monotonic() < deadline, "worker processes left running"
            time.sleep(0.5)
    finally:  # nothing left behind when the test fails
        for pid in [proc.pid] * (proc.poll() is None) + running():
            os.kill(pid, signal.SIGKILL)
    assert not (tmp_path / "m.h5").exists()
    assert not [name for name in os.listdir(temp) if name.startswith("emgmm-")]
    assert sorted(os.listdir(tmp_path)) == ["X.npy", "err.txt", "joblib"]


@pytest.mark.slow
def test_a_closed_stdout_ends_the_command_quietly(tmp_path, model_path):
    """``emgmm info --json | head -c 20``: the reader goes away; the command stops
    without an error message (status 1, as Python's SIGPIPE notes do it)."""
    script = ("import os, sys\n"
              "from emgmm._cli import main\n"
              "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
              f"sys.exit(main(['info', {model_path!r}, '--json']))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and out.stderr == "", out.stderr


@pytest.mark.slow
def test_a_closed_stdout_with_buffered_output_ends_quietly(tmp_path, model_path):
    """The same with block-buffered stdout (no PYTHONUNBUFFERED): the output reaches
    the closed pipe only when flushed, which the command does before it returns."""
    script = ("import os, sys\n"
              "from emgmm._cli import main\n"
              "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
              f"sys.exit(main(['info', {model_path!r}, '--json']))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 1 and out.stderr == "", out.stderr


def test_a_broken_pipe_elsewhere_is_an_error(tmp_path, model_path, monkeypatch, capsys):
    """A BrokenPipeError that is not stdout's (a socket, another pipe) is reported
    like any other error, not swallowed."""
    def fail(args):
        raise BrokenPipeError(32, "Broken pipe (a socket)")

    monkeypatch.setattr(cli, "_cmd_info", fail)
    assert cli.main(["info", model_path]) == 1
    assert "error: [Errno 32] Broken pipe (a socket)" in capsys.readouterr().err


def _full_file_system(monkeypatch, fail_on=1):
    """Make the ``fail_on``-th reservation of output space (and later ones) fail as
    on a full file system."""
    import errno

    calls = []
    real = os.posix_fallocate

    def fallocate(fd, offset, length):
        calls.append(length)
        if len(calls) >= fail_on:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return calls


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate")
def test_predict_onto_a_full_file_system_fails_cleanly(tmp_path, data, model_path,
                                                       capsys, monkeypatch):
    """The mapped output is reserved before it is written: a full file system gives
    an error that names the output (through a mapping of a sparse file it killed
    the process with SIGBUS), and leaves nothing behind."""
    listing = sorted(os.listdir(tmp_path))
    calls = _full_file_system(monkeypatch)
    out = tmp_path / "p.npy"
    assert cli.main(["predict", model_path, data[1], "--proba", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"Cannot write {out}: No space left on device" in err
    n_components = load_model(model_path).n_components
    assert calls and calls[0] >= len(data[0]) * n_components * 8  # (n, K) float64
    assert sorted(os.listdir(tmp_path)) == listing


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate")
def test_failed_sample_keeps_the_existing_outputs(tmp_path, model_path, capsys,
                                                  monkeypatch):
    """When the labels cannot be written, the samples' earlier file stays as it was
    (it was replaced, then deleted), and no temporary file is left."""
    out, labels = tmp_path / "s.npy", tmp_path / "l.npy"
    np.save(out, np.arange(5.0))
    np.save(labels, np.arange(3))
    listing = sorted(os.listdir(tmp_path))
    _full_file_system(monkeypatch, fail_on=2)
    assert cli.main(["sample", model_path, "-n", "50", "-o", str(out),
                     "--labels", str(labels)]) == 1
    assert f"Cannot write {labels}: No space left on device" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(out), np.arange(5.0))
    np.testing.assert_array_equal(np.load(labels), np.arange(3))
    assert sorted(os.listdir(tmp_path)) == listing


def test_sample_outputs_hold_exactly_the_arrays(tmp_path, model_path):
    """The reserved space beyond the array is cut off: the files are plain .npy
    files of the samples and labels."""
    out, labels = tmp_path / "s.npy", tmp_path / "l.npy"
    assert cli.main(["sample", model_path, "-n", "7", "-o", str(out), "--labels",
                     str(labels), "--random-state", "3"]) == 0
    model = load_model(model_path)
    model.random_state = 3
    X, y = model.sample(7)
    for path, expected in ((out, X), (labels, y)):
        with open(path, "rb") as fh:
            np.lib.format.read_magic(fh)
            np.lib.format.read_array_header_1_0(fh)
            assert os.path.getsize(path) == fh.tell() + expected.nbytes
        np.testing.assert_array_equal(np.load(path), expected)


@pytest.mark.parametrize("flags", [["-k", "7"], ["--covariance-type", "diag"]])
def test_warm_start_with_another_shape_names_the_flags(tmp_path, data, model_path,
                                                       capsys, flags):
    """--warm-start MODEL with -k or --covariance-type that MODEL does not have: the
    error speaks of the flags (it said 'Set warm_start=False', which the CLI has
    not), before any work."""
    out = tmp_path / "m.h5"
    err = cli_usage_error(["fit", data[1], "--warm-start", model_path, "-o", str(out),
                           "-q"] + flags, capsys)
    assert f"--warm-start {model_path} continues a model with" in err
    assert f"drop {flags[0]} to continue it, or --warm-start to fit a new model" in err
    assert "warm_start=False" not in err and not out.exists()


@pytest.mark.parametrize("content", ["text", "hdf5", "object", "missing"])
def test_init_flag_with_a_file_that_is_not_an_array(tmp_path, data, capsys, content):
    """--means-init with a text file, an HDF5 file, an object array or no file: a
    one-line error naming the flag (numpy's message spoke of pickled data and of
    loading it unsafely; a missing file gave a bare '[Errno 2]')."""
    path = tmp_path / "means.txt"
    if content == "missing":
        path = tmp_path / "none.npy"
    elif content == "text":
        np.savetxt(path, np.zeros((3, 3)))
    elif content == "hdf5":
        with h5py.File(path, "w") as f:
            f["m"] = np.zeros((3, 3))
    else:
        np.save(tmp_path / "means.npy", np.array([None] * 3), allow_pickle=True)
        path = tmp_path / "means.npy"
    assert cli.main(["fit", data[1], "-k", "3", "-o", str(tmp_path / "m.h5"),
                     "--means-init", str(path)]) == 1
    err = capsys.readouterr().err
    assert "--means-init" in err and str(path) in err
    assert "unsafe" not in err and "allow_pickle=" not in err
    assert not (tmp_path / "m.h5").exists()


def test_fit_refuses_to_replace_a_file_that_is_not_a_model(tmp_path, data, capsys):
    """``fit -o`` replaces an emgmm model (its warm start, an earlier fit), never
    another file: an HDF5 file of data there is left as it was."""
    other = tmp_path / "data.h5"
    with h5py.File(other, "w") as f:
        f["X"] = np.ones((10, 3))
    before = file_fingerprint(other)
    assert cli.main(["fit", data[1], "-k", "2", "-o", str(other), "-q"]) == 1
    assert "is not an emgmm model file" in capsys.readouterr().err
    assert file_fingerprint(other) == before
    model = tmp_path / "m.h5"
    for _ in range(2):  # a model is replaced
        assert cli.main(["fit", data[1], "-k", "2", "-o", str(model), "-q"]) == 0


def test_fit_refuses_a_parameter_of_another_covariance_type(tmp_path, data, capsys):
    out = str(tmp_path / "m.h5")
    assert "--n-factors is a parameter of --covariance-type factor" in \
        cli_usage_error(["fit", data[1], "-k", "2", "--n-factors", "2", "-o", out,
                         "-q"], capsys)
    assert cli.main(["fit", data[1], "-k", "2", "--covariance-type", "factor",
                     "--n-factors", "2", "-o", out, "-q"]) == 0
    capsys.readouterr()
    assert cli.main(["info", out]) == 0
    text = capsys.readouterr().out
    assert "covariance type  factor, n_factors=2" in text
    assert text.count("n_factors") == 1  # on that line only


# ------------------------------------------------------------- exit statuses


def _usage_errors(tmp_path, data, model_path):
    """argv of each option combination the commands refuse (after argparse's own
    checks), with a piece of the message."""
    _, npy, _ = data
    out = str(tmp_path / "m.h5")
    return {
        "a parameter of another covariance type": (
            ["fit", npy, "-k", "3", "--n-factors", "2", "-o", out],
            "--n-factors is a parameter of --covariance-type factor, not full"),
        "a prior without --bayesian": (
            ["fit", npy, "--mean-precision-prior", "2", "-o", out],
            "--mean-precision-prior is a prior of BayesianGaussianMixture"),
        "a GaussianMixture flag with --bayesian": (
            ["fit", npy, "--bayesian", "--on-degenerate", "raise", "-o", out],
            "--on-degenerate is a GaussianMixture parameter"),
        "--bayesian continuing a GaussianMixture": (
            ["fit", npy, "--bayesian", "--warm-start", model_path, "-o", out],
            "is a GaussianMixture model: drop --bayesian"),
        "-k other than the warm-start model's": (
            ["fit", npy, "-k", "5", "--warm-start", model_path, "-o", out],
            "continues a model with n_components=3, not 5"),
        "a model named .npy": (["fit", npy, "-o", str(tmp_path / "m.npy")],
                               "model files are HDF5"),
        "labels named .txt": (["predict", model_path, npy, "-o",
                               str(tmp_path / "l.txt")], "writes .npy files"),
        "an output over an input": (["predict", model_path, npy, "-o", npy],
                                    "is the same file as DATA"),
        "two outputs on one file": (
            ["sample", model_path, "-n", "5", "-o", str(tmp_path / "s.npy"),
             "--labels", str(tmp_path / "s.npy")], "each output needs a file"),
        "a demo size of 0": (["demo", "--n-test", "0"],
                             "--n-test must be at least 1"),
    }


@pytest.mark.parametrize("case", [
    "a parameter of another covariance type", "a prior without --bayesian",
    "a GaussianMixture flag with --bayesian",
    "--bayesian continuing a GaussianMixture", "-k other than the warm-start model's",
    "a model named .npy", "labels named .txt", "an output over an input",
    "two outputs on one file", "a demo size of 0"])
def test_refused_option_combinations_exit_2_like_argparse(tmp_path, data, model_path,
                                                          capsys, case):
    """A combination of options that emgmm refuses is a usage error as argparse's
    own are: the usage, the message, status 2 (it was status 1), and no traceback
    with --debug either."""
    argv, needle = _usage_errors(tmp_path, data, model_path)[case]
    for extra in ([], ["--debug"]):
        assert needle in cli_usage_error(argv + extra, capsys)
    assert not (tmp_path / "m.h5").exists()


def test_failure_while_running_exits_1_without_usage(tmp_path, data, capsys):
    """A missing input is a failure while running: one line, status 1, no usage."""
    missing = str(tmp_path / "none.npy")
    assert cli.main(["fit", missing, "-k", "3", "-o", str(tmp_path / "m.h5")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("emgmm fit: error: ") and missing in err
    assert err.count("\n") == 1 and "usage:" not in err


@pytest.mark.parametrize("argv", [[], ["fit"], ["score"], ["predict"], ["sample"],
                                  ["info"], ["demo"]])
def test_help_lists_the_exit_statuses(capsys, argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv + ["-h"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    out = " ".join(text.split())
    assert "Exit status: 0 success, 1 failure while running, 2 usage error" in out
    epilog = text[text.index("Exit status"):]
    assert max(len(line) for line in epilog.splitlines()) <= 79  # (wrapped)


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="no sysfs")
def test_an_output_folder_that_refuses_files_is_refused_before_the_fit(tmp_path):
    """os.access says yes to root on sysfs, where no file can be created: the
    output is tried before any work, not found unwritable after the fit."""
    from emgmm._io.atomic import check_writable

    with pytest.raises(PermissionError, match="directory is not writable: /sys"):
        check_writable("/sys/m.h5")
    check_writable(tmp_path / "m.h5")  # (a folder that takes files passes)


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "X.npy"
    np.save(path, np.random.default_rng(0).standard_normal((300, 2)))
    return str(path)


@pytest.fixture
def model(tmp_path, npy):
    path = tmp_path / "model.h5"
    assert cli.main(["fit", npy, "-k", "2", "--random-state", "0", "-q",
                     "-o", str(path)]) == 0
    return str(path)


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"emgmm {emgmm.__version__}"


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    raise AssertionError("no subcommands")


@pytest.mark.parametrize("command", ["fit", "score", "predict", "sample", "info",
                                     "demo"])
def test_every_command_has_a_description_and_every_argument_help(command):
    sub = _subparsers(cli.build_parser())[command]
    assert sub.description and len(sub.description) > 20
    for action in sub._actions:
        assert action.help, (command, action.option_strings or action.dest)


@pytest.mark.parametrize("argv_tail,flag", [
    (["-k", "0"], "-k/--n-components"),
    (["--max-iter", "-1"], "--max-iter"),
    (["--n-init", "0"], "--n-init"),
    (["--tol", "-1"], "--tol"),
    (["--reg-covar", "-0.5"], "--reg-covar"),
    (["--n-jobs", "0"], "--n-jobs"),
    (["--working-memory", "0"], "--working-memory"),
    (["--resp-threshold", "1"], "--resp-threshold"),
    (["--block-size", "0"], "--block-size"),
    (["--random-state", "-1"], "--random-state"),
    (["--random-state", str(2**32)], "--random-state"),
])
def test_fit_bad_values_are_answered_with_the_flag(npy, tmp_path, capsys,
                                                   argv_tail, flag):
    with pytest.raises(SystemExit) as info:
        cli.main(["fit", npy, "-o", str(tmp_path / "m.h5"), *argv_tail])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err
    assert not re.search(r"\b(n_components|max_iter|block_size)\b", err), err


def test_block_size_0_is_answered_the_same_in_fit_and_predict(npy, model, tmp_path,
                                                              capsys):
    answers = []
    for argv in (["fit", npy, "-o", str(tmp_path / "m2.h5")],
                 ["predict", model, npy, "-o", str(tmp_path / "l.npy")]):
        with pytest.raises(SystemExit):
            cli.main([*argv, "--block-size", "0"])
        answers.append(capsys.readouterr().err.strip().splitlines()[-1])
    assert answers[0].split(": ", 1)[1] == answers[1].split(": ", 1)[1]
    assert "argument --block-size: must be at least 1, got 0" in answers[0]


def test_sample_bad_seed_names_the_flag(model, tmp_path, capsys):
    """``--random-state -1``: a usage error (status 2) naming the flag, as for every
    other bad value, not numpy's seed message with status 1."""
    with pytest.raises(SystemExit) as info:
        cli.main(["sample", model, "-n", "3", "-o", str(tmp_path / "s.npy"),
                  "--random-state", "-1"])
    assert info.value.code == 2
    assert "argument --random-state: must be at least 0" in capsys.readouterr().err


def test_sample_n_0_names_the_flag(model, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["sample", model, "-n", "0", "-o", str(tmp_path / "s.npy")])
    err = capsys.readouterr().err
    assert "argument -n/--n-samples: must be at least 1, got 0" in err


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)  # 5 iterations, tol=0
def test_fit_verbose_prints_progress_once(npy, tmp_path, capsys):
    assert cli.main(["fit", npy, "-k", "2", "--random-state", "0", "--verbose", "2",
                     "--verbose-interval", "1", "--max-iter", "5", "--tol", "0",
                     "-o", str(tmp_path / "m.h5")]) == 0
    err = capsys.readouterr().err
    # each iteration is reported once: by the estimator's verbose lines
    assert len(re.findall(r"^  Iteration 3\b", err, re.M)) == 1, err
    assert not re.search(r"^iter +3/5", err, re.M), err
    assert "model written to" in err  # the summary stays


@pytest.mark.parametrize("command,name", [("predict", "labels.txt"),
                                          ("predict", "labels.csv"),
                                          ("sample", "x.txt"),
                                          ("sample-labels", "l.txt")])
def test_npy_outputs_refuse_other_suffixes(npy, model, tmp_path, capsys, command,
                                           name):
    out = str(tmp_path / name)
    argv = {"predict": ["predict", model, npy, "-o", out],
            "sample": ["sample", model, "-n", "5", "-o", out],
            "sample-labels": ["sample", model, "-n", "5", "-o",
                              str(tmp_path / "s.npy"), "--labels", out]}[command]
    err = cli_usage_error(argv, capsys)
    assert "writes .npy files" in err and name in err
    assert list(tmp_path.glob(name)) == []


def test_fit_refuses_a_model_named_like_another_format(npy, tmp_path, capsys):
    for name in ("out.npy", "out.npz", "out.txt"):
        err = cli_usage_error(["fit", npy, "-k", "2", "-q", "-o", str(tmp_path / name)],
                              capsys)
        assert "model files are HDF5" in err and name in err
        assert not (tmp_path / name).exists()
    for name in ("out.h5", "out.hdf5", "model"):
        assert cli.main(["fit", npy, "-k", "2", "-q", "-o", str(tmp_path / name)]) == 0


# Ctrl-C while the imports run, raised where the first import of scikit-learn
# starts (a SIGINT sent to the process lands wherever the interpreter next checks
# for signals, which under load was inside a library's own import guard)
_INTERRUPT_IMPORT = textwrap.dedent("""
    import builtins, os
    _import = builtins.__import__
    def interrupting_import(name, *args, **kwargs):
        if name == "sklearn" and not os.environ.get("_EMGMM_INTERRUPTED"):
            os.environ["_EMGMM_INTERRUPTED"] = "1"
            raise KeyboardInterrupt
        return _import(name, *args, **kwargs)
    builtins.__import__ = interrupting_import
""")


def test_sigint_during_the_imports_exits_130_without_traceback(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_INTERRUPT_IMPORT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    out = subprocess.run([sys.executable, "-m", "emgmm", "info", "nothing.h5"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 130, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip() == "emgmm: interrupted"


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_lock_of_a_killed_fit_is_removed_by_the_next_fit_there(tmp_path):
    from emgmm._runtime.executor import process_space

    X = np.random.default_rng(0).standard_normal((200, 2))
    stale = tmp_path / ".killed.npz.lock"
    stale.write_text(f"{_dead_pid()} {process_space()}")
    old_format = tmp_path / ".older.npz.lock"
    old_format.write_text(str(_dead_pid()))
    other_host = tmp_path / ".elsewhere.npz.lock"
    other_host.write_text(f"{_dead_pid()} 0badc0de")
    alive = tmp_path / ".running.npz.lock"
    alive.write_text(f"{os.getpid()} {process_space()}")
    emgmm.GaussianMixture(2, max_iter=3, tol=1e3, random_state=0,
                          checkpoint=tmp_path / "mine.npz").fit(X)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".elsewhere.npz.lock", ".running.npz.lock"]


def test_a_lock_held_by_a_live_fit_is_kept(tmp_path):
    import fcntl

    held = tmp_path / ".held.npz.lock"
    held.write_text(f"{_dead_pid()}")  # (a pid reused: the flock decides)
    fd = os.open(held, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        from emgmm._io.checkpoint import remove_stale_locks
        remove_stale_locks(str(tmp_path))
        assert held.exists()
    finally:
        os.close(fd)


class _Stop(Exception):
    pass


def _stop_after(n_iter):
    def callback(record):
        if record["n_iter"] == n_iter:
            raise _Stop

    return callback


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)
def test_a_resumed_fit_says_where_it_resumes_from(npy, tmp_path, capsys):
    """The command line (on stderr) and the estimator with verbose > 0 (on stdout)
    name the checkpoint and the iterations it holds; the first iteration reported
    after it is the next one."""
    checkpoint = str(tmp_path / "ck.npz")
    params = dict(n_components=2, random_state=0, max_iter=6, tol=0.0,
                  checkpoint=checkpoint)
    with pytest.raises(_Stop):
        emgmm.GaussianMixture(**params, callback=_stop_after(4)).fit(npy)
    capsys.readouterr()
    assert cli.main(["fit", npy, "-k", "2", "--random-state", "0", "--max-iter", "6",
                     "--tol", "0", "--checkpoint", checkpoint,
                     "-o", str(tmp_path / "m.h5")]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"resuming from {checkpoint} after 4 iterations ...\n"), err
    assert re.search(r"^iter 5/6", err, re.M) and not re.search(r"^iter 4/6", err,
                                                                  re.M), err
    with pytest.raises(_Stop):
        emgmm.GaussianMixture(**params, callback=_stop_after(1)).fit(npy)
    emgmm.GaussianMixture(**params, verbose=1).fit(npy)
    out = capsys.readouterr().out
    assert (f"Resuming from {checkpoint} after 1 iteration of initialization 0."
            in out.splitlines()), out


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)
def test_fit_announces_its_start_before_the_initialisation(npy, tmp_path, capsys):
    """Without a terminal (capsys), the first line on stderr says what the fit
    starts with, before the initialisation and the first iteration."""
    assert cli.main(["fit", npy, "-k", "2", "--random-state", "0", "--max-iter", "2",
                     "-o", str(tmp_path / "m.h5")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "initialising 2 components (k-means on 300 rows) ...", lines
    assert lines[1].startswith("iter 1/2"), lines


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)
def test_the_summary_says_1_iteration(npy, tmp_path, capsys):
    assert cli.main(["fit", npy, "-k", "2", "--random-state", "0", "--max-iter", "1",
                     "--tol", "0", "-o", str(tmp_path / "m.h5")]) == 0
    err = capsys.readouterr().err
    assert "did not converge after 1 iteration;" in err, err
    assert "1 iterations" not in err


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)
def test_the_bayesian_summary_counts_the_components_that_carry_weight(npy, tmp_path,
                                                                      capsys):
    """--bayesian's summary (and its JSON) counts the components whose weight is
    above 1/(100 K), as its help says."""
    output = str(tmp_path / "m.h5")
    assert cli.main(["fit", npy, "-k", "6", "--bayesian", "--random-state", "0",
                     "--max-iter", "20", "--json", "-o", output]) == 0
    captured = capsys.readouterr()
    import json

    summary = json.loads(captured.out)
    weights = emgmm.load_model(output).weights_
    expected = int((weights > 1 / (100 * 6)).sum())
    assert summary["n_weighted_components"] == expected
    assert f"6 full components ({expected} of 6 carry weight > 1/(100 K))" in (
        captured.err), captured.err
    assert "1/(100 K)" in _subparsers(cli.build_parser())["fit"].format_help()


def test_fit_has_no_flags_of_partial_fit(npy, tmp_path, capsys):
    """--learning-decay and --learning-offset only change partial_fit, which the
    command line does not run: fit neither lists nor takes them."""
    text = _subparsers(cli.build_parser())["fit"].format_help()
    assert "--learning" not in text
    with pytest.raises(SystemExit) as info:
        cli.main(["fit", npy, "--learning-decay", "0.7", "-o", str(tmp_path / "m.h5")])
    assert info.value.code == 2
    assert "unrecognized arguments: --learning-decay" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["fit", "score", "predict", "sample", "info",
                                     "demo"])
def test_help_texts_are_plain_text(command):
    """No reStructuredText markup (``literal``, :role:`target`) in a command's -h."""
    text = _subparsers(cli.build_parser())[command].format_help()
    assert "``" not in text and not re.search(r":[a-z]+:`", text), text
