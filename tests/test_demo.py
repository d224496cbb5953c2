"""``emgmm demo`` at its smallest size, and the pieces it is built from."""

import json
import os
import tempfile

import numpy as np
import pytest
from helpers import cli_usage_error
from PIL import Image

from emgmm._cli import command as cli
from emgmm._cli import demo

SMALL = ["demo", "--n-patches", "800", "--n-test", "300", "-k", "4", "--max-iter", "4",
         "--sklearn-max-iter", "2", "--tol", "0", "--n-jobs", "1", "--quiet"]


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Point tempfile at an empty folder to see what the demo leaves behind."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.slow
def test_demo_smallest_size_matches_sklearn(tmp_path, private_tmp, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert cli.main(SMALL + ["--output-dir", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["n_train"], result["n_test"]) == (800, 300)
    assert result["images"] == ["china.jpg", "flower.jpg"]
    assert result["emgmm"]["n_iter"] == 4
    # same data, same initialisation, tol=0: emgmm and scikit-learn run the same 2 steps
    emgmm_fit, sk_fit = result["emgmm_comparison"], result["sklearn"]
    assert emgmm_fit["n_iter"] == sk_fit["n_iter"] == 2 == result["comparison_max_iter"]
    assert emgmm_fit["heldout_score"] == pytest.approx(sk_fit["heldout_score"],
                                                       rel=1e-7)
    assert emgmm_fit["last_lower_bound"] == pytest.approx(sk_fit["last_lower_bound"],
                                                          rel=1e-9)
    assert result["score_difference"] == pytest.approx(
        abs(emgmm_fit["heldout_score"] - sk_fit["heldout_score"]))
    assert result["score_difference"] < 1e-5
    assert result["speedup"] == pytest.approx(
        sk_fit["fit_seconds"] / emgmm_fit["fit_seconds"])
    # two more iterations of EM do not lower the training lower bound
    assert result["emgmm"]["last_lower_bound"] >= emgmm_fit["last_lower_bound"] - 1e-9
    png = out / "emgmm_demo_components.png"
    assert result["png"] == str(png)
    with Image.open(png) as img:
        assert img.mode == "L"
        # a panel of 4 components over a panel of 2 x 16 patches
        assert img.size[0] >= 4 * 6 * 32 and img.size[1] > 3 * 32
    assert os.listdir(out) == ["emgmm_demo_components.png"]
    assert os.listdir(private_tmp) == []  # temporary HDF5 file removed


def test_demo_table(tmp_path, private_tmp, capsys):
    assert cli.main(SMALL + ["--output-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "800 training patches" in text and "300 held-out patches" in text
    assert "comparison on the same patches, 2 iterations (tol=0):" in text
    main, short, sk = (line.split() for line in text.splitlines()
                       if line.strip().startswith(("emgmm,", "scikit-learn,")))
    assert main[:5] == ["emgmm,", "HDF5", "on", "disk,", "n_jobs=1"] and main[5] == "4"
    assert short[-4] == sk[-4] == "2"
    assert float(short[-3]) == pytest.approx(float(sk[-3]), rel=1e-7)
    difference = float(text.split("held-out score ")[1].split(";")[0])
    assert difference < 1e-5


def test_demo_failure_removes_temporary_files(tmp_path, private_tmp, monkeypatch,
                                              capsys):
    def broken(*args):
        raise RuntimeError("scikit-learn exploded")

    monkeypatch.setattr(demo, "_fit_sklearn", broken)
    assert cli.main(SMALL + ["--output-dir", str(tmp_path)]) == 1
    assert "scikit-learn exploded" in capsys.readouterr().err
    assert os.listdir(private_tmp) == []
    assert [p for p in os.listdir(tmp_path) if p != "tmp"] == []  # no PNG


def test_demo_bad_options(tmp_path, capsys, monkeypatch):
    assert cli.main(SMALL + ["--output-dir", str(tmp_path / "missing")]) == 1
    assert "output directory does not exist" in capsys.readouterr().err
    # a folder it cannot write: refused before any fit (it failed after all of them)
    monkeypatch.setattr(demo, "_run", lambda args: pytest.fail("the demo ran"))
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if os.path.abspath(path) == str(tmp_path) else access(path, mode, **kw)))
    assert cli.main(SMALL + ["--output-dir", str(tmp_path)]) == 1
    assert f"output directory is not writable: {tmp_path}" in capsys.readouterr().err
    monkeypatch.undo()
    assert "--n-components must be at least 1" in cli_usage_error(
        ["demo", "-k", "0", "--output-dir", str(tmp_path)], capsys)
    assert "--n-patches 3 is fewer than the 4 components of -k" in cli_usage_error(
        ["demo", "--n-patches", "3", "-k", "4", "--output-dir", str(tmp_path)], capsys)


def test_gray_images_and_patches():
    images = demo.gray_images()
    assert sorted(images) == ["china.jpg", "flower.jpg"]
    for image in images.values():
        assert image.shape == (427, 640)
        assert 0 <= image.min() and image.max() <= 1
    image = np.arange(5 * 6, dtype=float).reshape(5, 6)
    patches = demo.extract_patches(image, 3)
    assert patches.shape == (3 * 4, 9)
    np.testing.assert_array_equal(patches[5], image[1:4, 1:4].ravel())  # row 1, col 1


def test_train_test_patches_are_disjoint_and_centred():
    # an image whose pixels are unique, so patches identify their position
    image = np.arange(50 * 40, dtype=float).reshape(50, 40)
    train, test = demo.train_test_patches([image], 100, 30, size=4, random_state=0)
    assert train.shape == (100, 16) and test.shape == (30, 16)
    np.testing.assert_allclose(train.mean(axis=1), 0, atol=1e-9)
    np.testing.assert_allclose(test.mean(axis=1), 0, atol=1e-9)
    # with the DC removed, the position is lost; check the split on raw patches instead
    raw_train = demo.extract_patches(image[:40], 4)
    raw_test = demo.extract_patches(image[40:], 4)
    assert raw_train.max() < raw_test.min()
    assert len(raw_test) == 7 * 37


def test_kmeans_init_is_a_valid_start():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(200, 3)), rng.normal(size=(100, 3)) + 20])
    weights, means, precisions = demo.kmeans_init(X, 2, reg_covar=1e-6, random_state=0)
    order = np.argsort(means[:, 0])
    np.testing.assert_allclose(weights[order], [2 / 3, 1 / 3])
    np.testing.assert_allclose(means[order[1]], X[200:].mean(axis=0))
    cov = np.cov(X[200:].T, bias=True) + 1e-6 * np.eye(3)
    np.testing.assert_allclose(precisions[order[1]], np.linalg.inv(cov), rtol=1e-10)
    np.testing.assert_array_equal(precisions, precisions.transpose(0, 2, 1))


def test_tile_scaling():
    vector = np.linspace(-1, 3, 16)
    pixels = demo.tile(vector, 4, scale=2)
    assert pixels.shape == (8, 8) and pixels.dtype == np.uint8
    assert (pixels.min(), pixels.max()) == (0, 255)
    symmetric = demo.tile(vector, 4, scale=1, symmetric=True)
    assert symmetric.max() == 255 and symmetric.min() == round(255 * (0.5 - 0.5 / 3))


def test_picture_sorted_labelled_with_weights_variances_and_samples(monkeypatch):
    """29.7: components in decreasing weight, at most max_components of them, each
    with its weight and its eigenvectors' variances written, columns labelled, and a
    panel of samples beside real patches."""
    from PIL import ImageDraw

    drawn = []
    text = ImageDraw.ImageDraw.text

    def recording_text(self, xy, string, *args, **kwargs):
        drawn.append((xy, string))
        return text(self, xy, string, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", recording_text)
    rng = np.random.default_rng(0)
    k, d = 7, 64
    weights = rng.dirichlet(np.ones(k))
    means = rng.normal(size=(k, d))
    factors = rng.normal(size=(k, d, d))
    covariances = factors @ factors.transpose(0, 2, 1) / d + 1e-3 * np.eye(d)
    image = demo.components_image(weights, means, covariances, max_components=5,
                                  samples=rng.normal(size=(32, d)),
                                  real=rng.normal(size=(32, d)))
    strings = [string for _, string in drawn]
    order = np.argsort(weights)[::-1][:5]
    shown = [string for string in strings if string in {f"{w:.3f}" for w in weights}]
    assert shown == [f"{w:.3f}" for w in weights[order]]
    assert strings[0].startswith(f"5 of {k} components by weight (the other 2 hold ")
    for label in ("weight", "mean", "ev1", "ev5", "samples from the model",
                  "real held-out patches"):
        assert label in strings, label
    for j in order:
        variances = np.linalg.eigvalsh(covariances[j])[::-1][:5]
        expected = [demo._short(v) for v in variances]
        at = strings.index(f"{weights[j]:.3f}")
        assert strings[at + 1:at + 6] == expected
    assert image.mode == "L"
