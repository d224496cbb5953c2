"""Issues 29.5 and 28.6 (command line): --version, help texts, flag names in
messages, one progress stream with --verbose, output suffixes."""

import argparse
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import IGNORE_NOT_CONVERGED, cli_usage_error

import emgmm
from emgmm.cli import command as cli


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


# ------------------------------------------------ 28.6: interrupts, stale locks

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
    from emgmm.runtime.executor import process_space

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
        from emgmm.io.checkpoint import remove_stale_locks
        remove_stale_locks(str(tmp_path))
        assert held.exists()
    finally:
        os.close(fd)


# ---------------------------------------------------------- issue 36.9: what happens


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
