"""Issues 29.5 and 28.6 (command line): --version, help texts, flag names in
messages, one progress stream with --verbose, output suffixes."""

import argparse
import re

import numpy as np
import pytest

import emgmm
from emgmm import cli


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


def test_sample_n_0_names_the_flag(model, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["sample", model, "-n", "0", "-o", str(tmp_path / "s.npy")])
    assert "argument -n/--n-samples: must be at least 1, got 0" in capsys.readouterr().err


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
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "writes .npy files" in err and name in err
    assert list(tmp_path.glob(name)) == []


def test_fit_refuses_a_model_named_like_another_format(npy, tmp_path, capsys):
    for name in ("out.npy", "out.npz", "out.txt"):
        assert cli.main(["fit", npy, "-k", "2", "-q", "-o", str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert "model files are HDF5" in err and name in err
        assert not (tmp_path / name).exists()
    for name in ("out.h5", "out.hdf5", "model"):
        assert cli.main(["fit", npy, "-k", "2", "-q", "-o", str(tmp_path / name)]) == 0
