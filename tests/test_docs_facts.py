"""The documentation says what the code does: numbers quoted once,
the model file's layout complete, public pages linked, dtype differences listed."""

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

import emgmm

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_benchmark_ratios_agree_with_the_readme_table():
    """docs/benchmarks.rst quoted speed-ups (21.1x, 8.9x) of another run than the
    README table it pointed to (17.1x, 7.1x): every ratio it quotes is in it."""
    readme = (ROOT / "README.md").read_text()
    page = (DOCS / "benchmarks.rst").read_text()
    assert "README.md" in page
    for ratio in re.findall(r"\b\d+(?:\.\d+)?x\b", page):
        assert ratio in readme, ratio


def test_the_model_file_page_lists_every_group_and_dataset(tmp_path):
    """docs/model_file.rst, the specification of format 1, names every group,
    dataset and attribute that save_model writes, with the stream's /online."""
    X = np.random.default_rng(0).standard_normal((200, 3))
    path = tmp_path / "m.h5"
    emgmm.save_model(emgmm.GaussianMixture(2, random_state=0).partial_fit(X), path)
    page = (DOCS / "model_file.rst").read_text()
    names = []
    with h5py.File(path) as f:
        f.visit(names.append)
        attrs = [a for name in names for a in f[name].attrs] + list(f.attrs)
    assert "online/nk" in names
    for name in names:
        assert f"/{name.split('/')[0]}" in page, name
        assert name.split("/")[-1] in page, name
    for attribute in attrs:
        assert attribute in page, attribute


@pytest.mark.parametrize("name", sorted(n for n in emgmm.__all__
                                        if n != "__version__"))
def test_public_docstrings_link_no_internal_module(name):
    """The API pages link public pages, not modules outside the API reference
    (GaussianMixture linked emgmm.covariance._factor_parameters)."""
    doc = getattr(emgmm, name).__doc__ or ""
    assert not re.search(r":mod:`~?emgmm\.", doc), name


def test_float64_inits_on_float32_data_give_float32_as_listed():
    """float32 X with float64 *_init: every attribute float32 (scikit-learn 1.9.1
    returns float64 weights_ and means_ with all three), listed as a difference."""
    X = np.random.default_rng(0).standard_normal((300, 2)).astype(np.float32)
    est = emgmm.GaussianMixture(
        2, random_state=0, weights_init=np.array([0.5, 0.5]),
        means_init=np.array([[0.0, 0.0], [1.0, 1.0]]),
        precisions_init=np.array([np.eye(2)] * 2)).fit(X)
    assert {getattr(est, a).dtype for a in ("weights_", "means_", "covariances_",
                                            "precisions_")} == {np.dtype(np.float32)}
    page = (DOCS / "differences.rst").read_text()
    assert "float32 data with float64 ``*_init`` give float32 attributes" in page


def test_the_costs_users_meet_are_written_down():
    """GaussianMixtureIC's memory (the candidates held together) and the suite's
    duration were nowhere."""
    assert "2.43 GB" in (DOCS / "model_selection.rst").read_text()
    assert "11.5 minutes" in (ROOT / "CONTRIBUTING.md").read_text()
