"""Predicting is one E step whose memory does not grow with the rows.

``score``, ``score_samples``, ``predict``, ``predict_proba`` and the command line's
``predict``/``score`` over a ``.npy`` of ``n`` and of ``4 n`` rows: the peak of the
memory they allocate (tracemalloc, which sees numpy's allocations and not the page
cache of the file) is the same within a small margin, once the output the caller
asked for (an n-vector, or none with ``out=`` a memmap) is taken out. The passes run
in this process (``n_jobs=1``, and row threads with ``n_jobs=None``) so that
tracemalloc sees all of them.
"""

import tracemalloc
import warnings

import numpy as np
import pytest
from numpy.lib.format import open_memmap

import emgmm
from emgmm._cli import command

N, D, K, BLOCK = 40_000, 16, 4, 2000
#: Allowed growth of the peak from n to 4n rows (bytes): noise of small allocations;
#: a vector of the rows' log-likelihoods alone would take 24 n bytes more (0.96 MB).
MARGIN = 160 * 2**10


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict-memory")
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(K, D))
    X = centres[rng.integers(K, size=4 * N)] + rng.normal(size=(4 * N, D))
    paths = {}
    for n in (N, 4 * N):
        paths[n] = str(tmp / f"X{n}.npy")
        np.save(paths[n], X[:n])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = emgmm.GaussianMixture(K, max_iter=5, random_state=0).fit(X[:5000])
    models = {}
    for n_jobs in (1, None):
        gm.set_params(n_jobs=n_jobs, block_size=BLOCK)
        models[n_jobs] = str(tmp / f"model-{n_jobs}.h5")
        emgmm.save_model(gm, models[n_jobs])
    return tmp, paths, models


def _peak(call):
    """Peak of the memory traced during ``call()`` above what was traced before,
    less the bytes of what it returns (the output the caller asked for)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    asked = 0 if isinstance(result, np.memmap) else getattr(result, "nbytes", 0)
    return peak - before - asked


def _run(kind, files, n, n_jobs):
    tmp, paths, models = files
    model = emgmm.load_model(models[n_jobs])
    data = paths[n]
    if kind == "cli_predict":
        argv = ["predict", models[n_jobs], data, "-o", str(tmp / f"labels{n}.npy")]
        return lambda: command.main(argv)
    if kind == "cli_score":
        return lambda: command.main(["score", models[n_jobs], data])
    if kind == "predict_out":
        out = open_memmap(tmp / f"out{n}.npy", mode="w+", dtype=np.int64, shape=(n,))
        return lambda: model.predict(data, out=out)
    return lambda: getattr(model, kind)(data)


@pytest.mark.parametrize("n_jobs", [1, None])
@pytest.mark.parametrize("kind", ["score", "score_samples", "predict", "predict_out",
                                  "predict_proba", "cli_predict", "cli_score"])
def test_prediction_memory_does_not_grow_with_the_rows(files, kind, n_jobs, capsys,
                                                       monkeypatch):
    """The tasks' outputs are capped at one block here (``OUTPUT_TASK_BYTES``, 4 MiB
    by default, is reached only beyond ~30M rows at this block size): what the
    parent holds of them is then the same for n and 4n rows."""
    from emgmm._mixture import base

    monkeypatch.setattr(base, "OUTPUT_TASK_BYTES", BLOCK * 8, raising=False)
    peaks = []
    for n in (N, 4 * N):
        call = _run(kind, files, n, n_jobs)
        call()  # (once before: imports and first-call caches are not the pass's)
        peaks.append(_peak(call))
    capsys.readouterr()
    assert peaks[1] - peaks[0] < MARGIN, peaks


@pytest.mark.slow
def test_score_of_the_training_data_is_the_lower_bound(files):
    """score runs the fit's last pass (its tasks, its sums): the same number, also
    with several tasks, worker processes and sample weights."""
    _, paths, _ = files
    X = np.load(paths[4 * N])
    weights = np.random.default_rng(1).uniform(0.5, 2.0, X.shape[0])
    for n_jobs in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm = emgmm.GaussianMixture(K, max_iter=2, random_state=0, n_jobs=n_jobs,
                                       block_size=BLOCK)
            assert gm.fit(paths[4 * N]).lower_bound_ == gm.score(paths[4 * N])
            gm.fit(X, sample_weight=weights)
        assert gm.lower_bound_ == gm.score(X, sample_weight=weights)


def test_per_row_outputs_do_not_depend_on_n_jobs(files):
    """The same blocks and one BLAS thread per task: bit for bit the same outputs
    with n_jobs=1, row threads and worker processes."""
    _, paths, models = files
    results = []
    for n_jobs in (1, None, 2):
        model = emgmm.load_model(models[1]).set_params(n_jobs=n_jobs)
        results.append([model.score_samples(paths[N]), model.predict(paths[N]),
                        model.predict_proba(paths[N])])
    for other in results[1:]:
        for got, expected in zip(other, results[0], strict=True):
            np.testing.assert_array_equal(got, expected)
