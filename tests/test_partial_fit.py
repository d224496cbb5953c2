"""partial_fit: stepwise online EM through the public API.

The oracle is an independent numpy/scipy implementation of the documented recursion
(``emgmm._engine.online``): ``s_t = (1 - eta_t) s_{t-1} + eta_t sbar_t`` with
``eta_t = (t + learning_offset) ** -learning_decay``, ``sbar_t`` the batch's weighted
statistics divided by its total weight under the parameters before the step, ``s_0``
the statistics the M step maps to the starting model. It keeps *uncentred* moments
(``sum w r``, ``sum w r x``, ``sum w r x x^T``) of full matrices whatever the
covariance type, and scipy.stats log-densities: nothing shared with emgmm.
"""

import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import SKLEARN_ONLINE_COVARIANCE_TYPES, make_blobs_data
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.base import clone
from sklearn.cluster import MiniBatchKMeans
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.utils.validation import check_is_fitted

import emgmm
from emgmm import GaussianMixture, load_model, save_model
from emgmm._engine import online

K = 3
REG = 1e-6
ATTRIBUTES = ("weights_", "means_", "covariances_", "precisions_cholesky_")
REPO_ROOT = Path(emgmm.__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def X():
    data = make_blobs_data(400, 3, K, seed=21)
    data.setflags(write=False)
    return data


def _batches(X, sizes=(60, 45, 80, 30, 50, 70)):
    edges = np.cumsum((0,) + tuple(sizes))
    return [X[a:b] for a, b in itertools.pairwise(edges)]


def _inits(X, covariance_type):
    d = X.shape[1]
    means = X[[3, 10, 20]]
    precisions = {"full": np.stack([np.eye(d) * 0.2] * K), "tied": np.eye(d) * 0.2,
                  "diag": np.full((K, d), 0.2), "spherical": np.full(K, 0.2)}
    return {"means_init": means, "weights_init": np.array([0.5, 0.3, 0.2]),
            "precisions_init": precisions[covariance_type]}


def _full(covariances, covariance_type, d):
    """Covariances of any type as (K, d, d)."""
    if covariance_type == "full":
        return covariances
    if covariance_type == "tied":
        return np.stack([covariances] * K)
    if covariance_type == "diag":
        return np.stack([np.diag(c) for c in covariances])
    return np.stack([np.eye(d) * c for c in covariances])


def _inverse(precisions, covariance_type):
    if covariance_type in ("full", "tied"):
        return np.linalg.inv(precisions)
    return 1.0 / precisions


class Oracle:
    """Stepwise EM on uncentred moments, in numpy and scipy."""

    def __init__(self, covariance_type, weights, means, covariances, decay, offset):
        self.ct, self.decay, self.offset = covariance_type, decay, offset
        self.weights, self.means = np.asarray(weights), np.asarray(means)
        self.covariances = np.asarray(covariances)
        self.t = 0
        d = self.means.shape[1]
        full = _full(self.covariances, covariance_type, d) - REG * np.eye(d)
        outer = np.einsum("kd,ke->kde", self.means, self.means)
        self.A = self.weights.copy()
        self.B = self.weights[:, None] * self.means
        self.C = self.weights[:, None, None] * (full + outer)

    def log_likelihood(self, X):
        d = X.shape[1]
        cov = _full(self.covariances, self.ct, d)
        parts = [np.log(w) + multivariate_normal(m, c).logpdf(X)
                 for w, m, c in zip(self.weights, self.means, cov, strict=False)]
        return np.stack(parts, axis=1)

    def step(self, X, w=None):
        w = np.ones(len(X)) if w is None else np.asarray(w, dtype=np.float64)
        log_p = self.log_likelihood(X)
        resp = np.exp(log_p - logsumexp(log_p, axis=1, keepdims=True))
        wr = resp * w[:, None]
        total = w.sum()
        A = wr.sum(axis=0) / total
        B = wr.T @ X / total
        C = np.einsum("nk,nd,ne->kde", wr, X, X) / total
        self.t += 1
        eta = (self.t + self.offset) ** -self.decay
        self.A = (1 - eta) * self.A + eta * A
        self.B = (1 - eta) * self.B + eta * B
        self.C = (1 - eta) * self.C + eta * C
        self._m_step()

    def _m_step(self):
        A, d = self.A, self.B.shape[1]
        self.weights = A / A.sum()
        self.means = self.B / A[:, None]
        outer = np.einsum("kd,ke->kde", self.means, self.means)
        full = self.C / A[:, None, None] - outer
        if self.ct == "full":
            cov = full + REG * np.eye(d)
        elif self.ct == "tied":
            cov = np.einsum("k,kde->de", A, full) / A.sum() + REG * np.eye(d)
        else:
            cov = np.diagonal(full, axis1=1, axis2=2) + REG
            if self.ct == "spherical":
                cov = cov.mean(axis=1)
        self.covariances = cov


def _oracle_from(estimator, decay, offset):
    return Oracle(estimator.covariance_type, estimator.weights_, estimator.means_,
                  estimator.covariances_, decay, offset)


def _oracle_from_inits(X, ct, decay, offset):
    inits = _inits(X, ct)
    return Oracle(ct, inits["weights_init"], inits["means_init"],
                  _inverse(inits["precisions_init"], ct), decay, offset)


def assert_matches(estimator, oracle, rtol=1e-9):
    for name, want in (("weights_", oracle.weights), ("means_", oracle.means),
                       ("covariances_", oracle.covariances)):
        got = getattr(estimator, name)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(),
                                   err_msg=name)


def assert_same_model(a, b, rtol=1e-12):
    for name in ATTRIBUTES:
        x, y = getattr(a, name), getattr(b, name)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max(),
                                   err_msg=name)


def _online(X, ct, **params):
    return GaussianMixture(K, covariance_type=ct, **_inits(X, ct), **params)


@pytest.mark.parametrize("covariance_type", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_alpha_one_t0_zero_is_the_plain_average_of_the_batches(X, covariance_type):
    """eta_t = 1/t: s_t is the mean of sbar_1..sbar_t, each under theta_{t-1}."""
    est = _online(X, covariance_type, learning_decay=1.0, learning_offset=0.0,
                  block_size=16)
    oracle = _oracle_from_inits(X, covariance_type, 1.0, 0.0)
    rng = np.random.default_rng(0)
    for t, batch in enumerate(_batches(X), start=1):
        w = rng.uniform(0.5, 2.0, size=len(batch)) if t % 2 == 0 else None
        est.partial_fit(batch, sample_weight=w)
        oracle.step(batch, w)
        assert est.n_steps_ == t
        assert_matches(est, oracle, rtol=1e-11)


@pytest.mark.parametrize("covariance_type", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_default_schedule_starts_from_the_statistics_of_the_initial_model(
        X, covariance_type):
    est = _online(X, covariance_type)
    assert est.get_params()["learning_decay"] == 0.7
    assert est.get_params()["learning_offset"] == 10.0
    oracle = _oracle_from_inits(X, covariance_type, 0.7, 10.0)
    for batch in _batches(X)[:3]:
        est.partial_fit(batch)
        oracle.step(batch)
        assert_matches(est, oracle, rtol=1e-12)


def _pooled(weights, covariances, covariance_type):
    """Every component's covariance replaced by their weighted mean."""
    if covariance_type == "tied":
        return covariances
    pooled = np.tensordot(weights / weights.sum(), covariances, axes=1)
    return np.stack([pooled] * len(weights))


@pytest.mark.parametrize("covariance_type", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_first_call_is_one_em_iteration_from_the_pooled_start_of_its_batch(
        X, covariance_type):
    """The first call's start is the batch's own init (weights, means) with the
    components' covariances pooled, and its step is s_1 = sbar_1 (eta_1 = 1 under
    the default schedule): one EM iteration from that start. (Before issue 36 the
    start kept each component's covariance and s_0 kept 1 - eta_1 of it.)"""
    batch = _batches(X)[2]
    est = GaussianMixture(K, covariance_type=covariance_type,
                          random_state=3).partial_fit(batch)
    init = GaussianMixture(K, covariance_type=covariance_type, random_state=3,
                           max_iter=0).fit(batch)
    start = _pooled(init.weights_, init.covariances_, covariance_type)
    with pytest.warns(ConvergenceWarning):
        ref = GaussianMixture(K, covariance_type=covariance_type, max_iter=1,
                              weights_init=init.weights_, means_init=init.means_,
                              precisions_init=_inverse(start, covariance_type)
                              ).fit(batch)
    assert_same_model(est, ref, rtol=1e-9)
    assert est.history_[0]["eta"] == 1.0
    assert est.n_steps_ == 1 and est.n_features_in_ == X.shape[1]


def test_stationary_stream_reaches_the_batch_fit(tmp_path):
    """Mini-batches of one mixture: the online fit's held-out log-likelihood is
    within 1e-3 relative of the batch fit's."""
    truth = GaussianMixture(K, covariance_type="full", random_state=0)
    truth.fit(make_blobs_data(3000, 2, K, seed=5))
    batch_fit_data, _ = truth.set_params(random_state=1).sample(20000)
    held_out, _ = truth.set_params(random_state=2).sample(20000)
    batch = GaussianMixture(K, random_state=0).fit(batch_fit_data)
    est = GaussianMixture(K, random_state=0)
    for t in range(60):
        rows, _ = truth.set_params(random_state=100 + t).sample(2000)
        est.partial_fit(rows)
    ref = batch.score(held_out)
    assert abs(est.score(held_out) - ref) <= 1e-3 * abs(ref)
    assert est.n_steps_ == 60


def test_fit_after_partial_fit_starts_afresh(X):
    est = GaussianMixture(K, random_state=0)
    est.partial_fit(_batches(X)[0]).partial_fit(_batches(X)[1])
    est.fit(X)
    ref = GaussianMixture(K, random_state=0).fit(X)
    assert_same_model(est, ref, rtol=0)
    assert est.n_steps_ == 0


def _centres(est):
    return est.cluster_centers_ if hasattr(est, "cluster_centers_") else est.means_


@pytest.mark.parametrize("make", [
    lambda: MiniBatchKMeans(K, random_state=0, n_init=1),
    lambda: GaussianMixture(K, random_state=0),
], ids=["MiniBatchKMeans", "emgmm"])
def test_fit_and_partial_fit_interact_as_in_scikit_learn(X, make):
    """The same assertions hold for scikit-learn's MiniBatchKMeans and for emgmm:
    fit after partial_fit is a fresh fit; partial_fit after fit takes one more
    step (n_steps_ + 1) from the fitted model, staying near it (emgmm's step is
    checked against the oracle in the next test)."""
    batch = _batches(X)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        np.testing.assert_array_equal(_centres(make().partial_fit(batch).fit(X)),
                                      _centres(make().fit(X)))
        fitted = make().fit(X)
    start, steps = _centres(fitted).copy(), fitted.n_steps_
    fitted.partial_fit(batch)
    assert fitted.n_steps_ == steps + 1
    assert np.abs(_centres(fitted) - start).max() < 0.05 * X.std()


@pytest.mark.parametrize("covariance_type", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_partial_fit_after_fit_continues_from_the_fitted_model(X, covariance_type):
    est = GaussianMixture(K, covariance_type=covariance_type, random_state=0).fit(X)
    oracle = _oracle_from(est, 0.7, 10.0)
    for batch in _batches(X)[:2]:
        est.partial_fit(batch)
        oracle.step(batch)
        assert_matches(est, oracle, rtol=1e-12)
    assert est.n_steps_ == 2


def _continue_in_subprocess(model_path, batch_path, out_path, env=None):
    script = ("import sys, numpy as np\n"
              "from emgmm import load_model, save_model\n"
              "m = load_model(sys.argv[1])\n"
              "m.partial_fit(np.load(sys.argv[2]))\n"
              "save_model(m, sys.argv[3])\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), **(env or {}))
    subprocess.run([sys.executable, "-c", script, str(model_path), str(batch_path),
                    str(out_path)], check=True, env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("covariance_type", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_model_file_keeps_the_stream_for_another_process(X, tmp_path, covariance_type):
    batches = _batches(X)
    est = GaussianMixture(K, covariance_type=covariance_type, random_state=0)
    for batch in batches[:3]:
        est.partial_fit(batch)
    save_model(est, tmp_path / "m.h5")
    loaded = load_model(tmp_path / "m.h5")
    assert loaded.n_steps_ == 3
    np.save(tmp_path / "b.npy", batches[3])
    _continue_in_subprocess(tmp_path / "m.h5", tmp_path / "b.npy", tmp_path / "m2.h5")
    resumed = load_model(tmp_path / "m2.h5")
    est.partial_fit(batches[3])
    assert resumed.n_steps_ == 4
    assert_same_model(resumed, est, rtol=1e-14)
    # ... and keeps going the same way
    est.partial_fit(batches[4])
    assert_same_model(resumed.partial_fit(batches[4]), est, rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_model_file_of_a_fit_continues_as_the_fit(X, tmp_path, dtype):
    """The file keeps the precision factors, not the covariances: the stream's s_0
    comes from the factors in both."""
    data = X.astype(dtype)
    est = GaussianMixture(K, random_state=0).fit(data)
    save_model(est, tmp_path / "m.h5")
    loaded = load_model(tmp_path / "m.h5")
    batch = _batches(data)[0]
    assert_same_model(loaded.partial_fit(batch), est.partial_fit(batch), rtol=1e-14)
    assert loaded.means_.dtype == est.means_.dtype == dtype


@pytest.mark.slow
def test_checkpoint_resumes_a_stream_in_another_process(X, tmp_path):
    batches = _batches(X)
    for i, batch in enumerate(batches):
        np.save(tmp_path / f"b{i}.npy", batch)
    checkpoint = tmp_path / "stream.npz"
    script = ("import sys, numpy as np\n"
              "from emgmm import GaussianMixture\n"
              "est = GaussianMixture(3, random_state=0, checkpoint=sys.argv[1])\n"
              "for path in sys.argv[2:]:\n"
              "    est.partial_fit(np.load(path))\n"
              "print(est.n_steps_)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))

    def run(*paths):
        out = subprocess.run([sys.executable, "-c", script, str(checkpoint),
                              *map(str, paths)], check=True, env=env, timeout=300,
                             capture_output=True, text=True)
        return int(out.stdout.split()[-1])

    assert run(tmp_path / "b0.npy", tmp_path / "b1.npy") == 2
    assert checkpoint.exists()  # a stream has no end: the checkpoint stays
    est = GaussianMixture(K, random_state=0, checkpoint=checkpoint)
    est.partial_fit(batches[2])  # a new process (this one) resumes at step 3
    assert est.n_steps_ == 3
    ref = GaussianMixture(K, random_state=0)
    for batch in batches[:3]:
        ref.partial_fit(batch)
    assert_same_model(est, ref, rtol=1e-14)


def test_checkpoint_of_other_parameters_is_refused(X, tmp_path):
    checkpoint = tmp_path / "stream.npz"
    GaussianMixture(K, random_state=0, checkpoint=checkpoint).partial_fit(X[:100])
    with pytest.raises(ValueError, match="checkpoint"):
        GaussianMixture(K + 1, random_state=0,
                        checkpoint=checkpoint).partial_fit(X[:100])


def test_a_fingerprint_field_gives_each_stream_its_own_checkpoint(X, tmp_path):
    """checkpoint='stream-{fingerprint}.npz': streams of other parameters write
    files of their own, and a new estimator of the same parameters resumes its
    stream from its file."""
    path = str(tmp_path / "stream-{fingerprint}.npz")
    first = GaussianMixture(K, random_state=0, checkpoint=path).partial_fit(X[:100])
    GaussianMixture(K + 1, random_state=0, checkpoint=path).partial_fit(X[:100])
    assert len(list(tmp_path.glob("stream-*.npz"))) == 2
    resumed = GaussianMixture(K, random_state=0, checkpoint=path).partial_fit(X[:100])
    assert resumed.n_steps_ == first.n_steps_ + 1


def test_a_checkpoint_of_fit_is_not_a_stream(X, tmp_path):
    checkpoint = tmp_path / "fit.npz"

    def interrupt(record):
        if record["n_iter"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        GaussianMixture(K, random_state=0, tol=0, checkpoint=checkpoint,
                        callback=interrupt).fit(X)
    assert checkpoint.exists()  # kept for fit to resume
    with pytest.raises(ValueError, match="not one of a partial_fit stream"):
        GaussianMixture(K, random_state=0, checkpoint=checkpoint).partial_fit(X[:100])


def test_clone_drops_the_online_state(X):
    est = GaussianMixture(K, random_state=0, learning_decay=0.9)
    est.partial_fit(_batches(X)[0]).partial_fit(_batches(X)[1])
    fresh = clone(est)
    assert fresh.get_params()["learning_decay"] == 0.9
    assert not hasattr(fresh, "n_steps_")
    with pytest.raises(NotFittedError):
        check_is_fitted(fresh)
    fresh.partial_fit(_batches(X)[1])
    ref = GaussianMixture(K, random_state=0,
                          learning_decay=0.9).partial_fit(_batches(X)[1])
    assert_same_model(fresh, ref, rtol=0)
    assert fresh.n_steps_ == 1


def test_every_source_kind_per_call(X, make_sources, tmp_path):
    batches = _batches(X)
    kinds = ("ndarray", "memmap", "npy", "npy_path", "h5", "h5_string")
    ref = _online(X, "full", block_size=16)
    est = _online(X, "full", block_size=16)
    w = np.random.default_rng(1).uniform(0.5, 2, size=len(batches[5]))
    wpath = tmp_path / "w.npy"
    np.save(wpath, w)
    for i, (batch, kind) in enumerate(zip(batches, kinds, strict=False)):
        weights = w if i == 5 else None
        ref.partial_fit(batch, sample_weight=weights)
        est.partial_fit(make_sources.one(batch, kind).obj,
                        sample_weight=str(wpath) if i == 5 else None)
        assert_same_model(est, ref, rtol=1e-13)


def test_integer_weights_in_a_batch_equal_repeated_rows(X):
    rng = np.random.default_rng(2)
    a, b = _online(X, "diag", block_size=7), _online(X, "diag")
    for batch in _batches(X)[:4]:
        w = rng.integers(1, 4, size=len(batch))
        a.partial_fit(batch, sample_weight=w)
        b.partial_fit(np.repeat(batch, w, axis=0))
        assert_same_model(a, b, rtol=1e-10)


@pytest.mark.parametrize("covariance_type", [*SKLEARN_ONLINE_COVARIANCE_TYPES,
                                             "factor"])
def test_batch_weights_of_any_scale_equal_no_weights(X, covariance_type):
    """Each batch's weights are read scaled by a power of two to a mean of about
    one (its statistics are normalised by its total weight): constant weights of
    1e-30 and 1e30 give the stream of no weights, started from the first batch's
    k-means. Weights of 1e-30 collapsed every mean onto the batch mean within the
    10 eps guard of N_k."""
    params = {"n_factors": 2} if covariance_type == "factor" else {}
    plain, tiny, huge = (GaussianMixture(K, covariance_type=covariance_type,
                                         random_state=0, **params) for _ in range(3))
    for batch in _batches(X)[:4]:
        plain.partial_fit(batch)
        tiny.partial_fit(batch, sample_weight=np.full(len(batch), 1e-30))
        huge.partial_fit(batch, sample_weight=np.full(len(batch), 1e30))
        assert_same_model(tiny, plain, rtol=1e-10)
        assert_same_model(huge, plain, rtol=1e-10)


@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_process_workers_give_the_serial_stream(X, temp_folder, schedule):
    a = _online(X, "full", block_size=16, n_jobs=1)
    b = _online(X, "full", block_size=16, n_jobs=2, schedule=schedule)
    w = np.random.default_rng(5).uniform(0.5, 2.0, size=len(X))
    for batch, wb in zip(_batches(X)[:3], _batches(w)[:3], strict=False):
        a.partial_fit(batch, sample_weight=wb)
        b.partial_fit(batch, sample_weight=wb)
        assert_same_model(a, b, rtol=1e-12)
    assert not any(temp_folder.iterdir())  # the shared weights were removed


@pytest.mark.parametrize("params, match", [
    ({"learning_decay": 0.5}, "learning_decay"),
    ({"learning_decay": 1.2}, "learning_decay"),
    ({"learning_offset": -1.0}, "learning_offset"),
])
def test_step_parameters_are_validated(X, params, match):
    with pytest.raises(ValueError, match=match):
        GaussianMixture(K, **params).partial_fit(X[:50])


def test_later_calls_check_the_features_and_keep_the_state_on_errors(X):
    est = GaussianMixture(K, random_state=0).partial_fit(X[:100])
    means, steps = est.means_.copy(), est.n_steps_
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(X[:50, :2])
    bad = X[100:150].copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"row 7\b"):
        est.partial_fit(bad)
    with pytest.raises(ValueError, match=r"row 4\b"):
        est.partial_fit(X[100:150], sample_weight=np.r_[np.ones(4), -1.0, np.ones(45)])
    np.testing.assert_array_equal(est.means_, means)
    assert est.n_steps_ == steps
    est.partial_fit(X[100:101])  # one row is a valid later batch
    assert est.n_steps_ == steps + 1


def test_h5_batches_with_h5_weights(X, tmp_path):
    batches = _batches(X)[:3]
    h5 = tmp_path / "stream.h5"
    with h5py.File(h5, "w") as f:
        for i, batch in enumerate(batches):
            f.create_dataset(f"x{i}", data=batch, chunks=(8, batch.shape[1]))
            f.create_dataset(f"w{i}", data=np.arange(1.0, len(batch) + 1))
    a, b = _online(X, "tied", block_size=8), _online(X, "tied")
    for i, batch in enumerate(batches):
        a.partial_fit(f"{h5}:/x{i}", sample_weight=f"{h5}:/w{i}")
        b.partial_fit(batch, sample_weight=np.arange(1.0, len(batch) + 1))
    assert_same_model(a, b, rtol=1e-13)


def test_a_covariance_type_without_online_statistics_is_refused(X, monkeypatch):
    """A registered type that lacks the running statistics refuses partial_fit
    before reading the batch, naming itself and the types that have them; fit
    is unaffected."""
    from emgmm.covariance import REGISTRY
    from emgmm.covariance._diag import DiagCovariance

    class NoStream(DiagCovariance):
        name = "nostream"
        has_online_statistics = False

    monkeypatch.setitem(REGISTRY, "nostream", NoStream())
    est = GaussianMixture(K, covariance_type="nostream", random_state=0)
    with pytest.raises(ValueError, match=r"'nostream'.*full, tied, diag, spherical"):
        est.partial_fit(X[:100])
    assert not hasattr(est, "means_")
    est.fit(X)
    np.testing.assert_allclose(
        est.means_, GaussianMixture(K, covariance_type="diag", random_state=0)
        .fit(X).means_, rtol=1e-12)


@pytest.mark.parametrize("covariance_type", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_running_statistics_stay_accurate_far_from_the_origin(X, covariance_type):
    """The same stream moved by 1e6: centred running statistics keep the
    covariances to 1e-9 (1e-11 measured); uncentred moments (the oracle's, of
    size 1e12) lose them to ~1e-4, so this bound tells the two apart."""
    offset = 1e6
    near = _online(X, covariance_type)
    inits = dict(_inits(X, covariance_type))
    inits["means_init"] = inits["means_init"] + offset
    far = GaussianMixture(K, covariance_type=covariance_type, **inits)
    uncentred = _oracle_from_inits(X + offset, covariance_type, 0.7, 10.0)
    for batch in _batches(X):
        near.partial_fit(batch)
        far.partial_fit(batch + offset)
        uncentred.step(batch + offset)
    scale = np.abs(near.covariances_).max()
    assert np.abs(far.covariances_ - near.covariances_).max() <= 1e-9 * scale
    np.testing.assert_allclose(far.means_ - offset, near.means_, rtol=0,
                               atol=1e-9 * np.abs(near.means_).max())
    np.testing.assert_allclose(far.weights_, near.weights_, rtol=1e-12)
    assert np.abs(uncentred.covariances - near.covariances_).max() > 1e-7 * scale


@pytest.fixture(scope="module")
def patch_stream():
    """Issue 36's stream: natural-image 8x8 patches (each patch's mean removed, x10),
    K=6 'full', 6,000 rows in batches of 200 drawn without replacement, 3 passes
    (90 calls), default parameters; the batch fit of the same rows; both scored on
    2,000 held-out patches."""
    from emgmm._cli.demo import extract_patches, gray_images, remove_dc

    patches = np.concatenate([extract_patches(image)
                              for image in gray_images().values()])
    rng = np.random.default_rng(0)
    rows = remove_dc(patches[rng.choice(len(patches), 8000, replace=False)]) * 10
    train, held_out = rows[:6000], rows[6000:]
    batch = GaussianMixture(6, random_state=0).fit(train)
    est = GaussianMixture(6, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            order = rng.permutation(len(train))
            for start in range(0, len(train), 200):
                est.partial_fit(train[order[start:start + 200]])
    for warning in caught:  # the only warnings: re-seeds of starved components
        assert "re-seeded by splitting" in str(warning.message)
    return est, est.score(held_out), batch.score(held_out)


@pytest.mark.slow
def test_patch_stream_ends_within_one_percent_of_the_batch_fit(patch_stream):
    """Held-out score per sample no more than 1% of |batch score| below the batch
    fit's (measured: 52.2 against 51.2; before issue 36: -53.2)."""
    _, online_score, batch_score = patch_stream
    assert online_score >= batch_score - 0.01 * abs(batch_score)


@pytest.mark.slow
def test_patch_stream_starves_no_component(patch_stream):
    """Every weight ends above the starved floor, a tenth of the mean weight (before
    issue 36 one component ended with 0.999)."""
    est, _, _ = patch_stream
    floor = online.STARVED_FRACTION / est.n_components
    assert est.weights_.min() > floor


# ------------------------------------------------------------------ 'factor'
#
# Mixtures of factor analysers stream their own statistics (_engine/online.py):
# tested against fit's EM iteration, and against a numpy/scipy E step of the dense
# model (E[z | x, k] = W^T Sigma^{-1} (x - mu), Cov[z | x, k] = I - W^T Sigma^{-1} W).

FD, FQ = 8, 2


@pytest.fixture(scope="module")
def factor_data():
    """A planted mixture of three factor analysers (d=8, q=2), 900 rows."""
    return _planted_factor_rows(900, np.random.default_rng(7))


def _planted_factor_rows(n, rng, model_seed=3):
    model = np.random.default_rng(model_seed)
    W = model.normal(size=(K, FD, FQ))
    mu = 5.0 * model.normal(size=(K, FD))
    psi = model.uniform(0.1, 0.5, size=(K, FD))
    labels = rng.integers(K, size=n)
    z = rng.normal(size=(n, FQ))
    noise = rng.normal(size=(n, FD)) * np.sqrt(psi[labels])
    return mu[labels] + np.einsum("ndq,nq->nd", W[labels], z) + noise


def _factor(**params):
    return GaussianMixture(K, covariance_type="factor", n_factors=FQ, random_state=0,
                           **params)


def _fitted_factor(X, max_iter=3):
    with pytest.warns(ConvergenceWarning):
        return _factor(max_iter=max_iter, tol=0.0).fit(X)


def _copy(est, **params):
    import copy

    return copy.deepcopy(est).set_params(**params)


def assert_same_factor_model(a, b, rtol):
    for name in ("weights_", "means_", "loadings_", "noise_variance_"):
        x, y = getattr(a, name), getattr(b, name)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max(),
                                   err_msg=name)


@pytest.mark.parametrize("rows, weighted", [(slice(0, 300), False),
                                            (slice(300, 900), True),
                                            (slice(None), False)])
def test_factor_unit_step_is_one_em_iteration_of_fit(factor_data, rows, weighted):
    """With eta = 1 (learning_decay=1, learning_offset=0, the first step after
    fit) s_1 is the batch's statistics: the step is one EM iteration of fit from
    the same model on the same batch (warm_start, max_iter=1)."""
    start = _fitted_factor(factor_data)
    batch = factor_data[rows]
    w = (np.random.default_rng(1).uniform(0.2, 3.0, size=len(batch)) if weighted
         else None)
    est = _copy(start, learning_decay=1.0, learning_offset=0.0)
    est.partial_fit(batch, sample_weight=w)
    assert est.history_[0]["eta"] == 1.0
    ref = _copy(start, warm_start=True, max_iter=1)
    with pytest.warns(ConvergenceWarning):
        ref.fit(batch, sample_weight=w)
    assert_same_factor_model(est, ref, rtol=1e-10)
    assert est.lower_bound_ == pytest.approx(ref.lower_bounds_[0], rel=1e-12)


def _dense_posteriors(est, X):
    """Responsibilities (scipy), E[z | x, k] (n, K, q), Cov[z | x, k] (K, q, q)."""
    W, psi = est.loadings_.astype(np.float64), est.noise_variance_.astype(np.float64)
    Sigma = np.matmul(W, np.swapaxes(W, 1, 2)) + np.stack([np.diag(p) for p in psi])
    log_p = np.stack([np.log(w) + multivariate_normal(m, S).logpdf(X) for w, m, S in
                      zip(est.weights_, est.means_, Sigma, strict=True)], axis=1)
    resp = np.exp(log_p - logsumexp(log_p, axis=1, keepdims=True))
    beta = np.linalg.solve(Sigma, W)                       # Sigma^{-1} W, (K, d, q)
    e = np.einsum("kdq,nkd->nkq", beta, X[:, None, :] - est.means_[None])
    C = np.eye(W.shape[2]) - np.matmul(np.swapaxes(beta, 1, 2), W)
    return resp, e, C


def test_factor_running_statistics_are_the_batch_statistics_around_the_new_means(
        factor_data):
    """After a unit step the running statistics are the batch's complete-data
    statistics under the model before the step, summed in numpy over the whole
    array around the *new* means (the shift of _engine/online.py undone by an
    independent sum)."""
    start = _fitted_factor(factor_data)
    batch = factor_data[:400]
    resp, e, C = _dense_posteriors(start, batch)
    est = _copy(start, learning_decay=1.0, learning_offset=0.0).partial_fit(batch)
    running = est._online_statistics
    np.testing.assert_array_equal(running.centers, est.means_)
    u = batch[:, None, :] - est.means_[None]
    n = len(batch)
    want = {"nk": resp.sum(axis=0) / n,
            "sum_x": np.einsum("nk,nkd->kd", resp, u) / n,
            "sum_xx": np.einsum("nk,nkd->kd", resp, u**2) / n,
            "sum_xz": np.einsum("nk,nkd,nkq->kdq", resp, u, e) / n,
            "sum_z": np.einsum("nk,nkq->kq", resp, e) / n,
            "sum_zz": (np.einsum("nk,nkq,nkr->kqr", resp, e, e)
                       + resp.sum(axis=0)[:, None, None] * C) / n}
    got = running.arrays()
    assert set(got) == set(want)
    for name, value in want.items():
        scale = np.abs(value).max()
        np.testing.assert_allclose(got[name], value, rtol=1e-9, atol=1e-11 * scale,
                                   err_msg=name)
    # the M step moves means and loadings together: around the new means
    # sum_x = W sum_z (not 0, as for the Gaussian types)
    np.testing.assert_allclose(got["sum_x"],
                               np.einsum("kdq,kq->kd", est.loadings_, got["sum_z"]),
                               rtol=1e-9, atol=1e-12)


def test_factor_integer_weights_in_a_batch_equal_repeated_rows(factor_data):
    rng = np.random.default_rng(2)
    a, b = _factor(block_size=7), _factor()
    for batch in _batches(factor_data, (150, 120, 200, 90)):
        w = rng.integers(1, 4, size=len(batch))
        a.partial_fit(batch, sample_weight=w)
        b.partial_fit(np.repeat(batch, w, axis=0))
        assert_same_factor_model(a, b, rtol=1e-10)
    assert a.n_steps_ == b.n_steps_ == 4


def test_factor_running_statistics_hold_no_d_by_d_array(tmp_path):
    """d=1500, q=3: the stream's state (in memory, in the model file and in the
    checkpoint) is K (1 + 3 d + d q + q + q^2) float64; a (K, d, d) array
    would be 54 MB."""
    d, q = 1500, 3
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, d)) + 4.0 * rng.integers(K, size=240)[:, None]
    est = GaussianMixture(K, covariance_type="factor", n_factors=q, random_state=0,
                          checkpoint=tmp_path / "stream.npz")
    est.partial_fit(X[:120]).partial_fit(X[120:])
    stats = est._online_statistics
    assert stats.nbytes == 8 * K * (1 + 3 * d + d * q + q + q * q)
    save_model(est, tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r") as f:
        stored = {name: f["online"][name].shape for name in f["online"]}
    with np.load(tmp_path / "stream.npz") as f:
        checkpointed = {name: f[name].shape for name in f.files}
    for shape in [*stored.values(), *checkpointed.values(),
                  *(a.shape for a in stats.arrays().values())]:
        assert list(shape).count(d) <= 1, shape
    assert stored["sum_xz"] == (K, d, q) and stored["sum_zz"] == (K, q, q)


def test_factor_stream_continues_from_a_model_file(factor_data, tmp_path):
    batches = _batches(factor_data, (200, 150, 250, 100))
    est = _factor()
    for batch in batches[:3]:
        est.partial_fit(batch)
    save_model(est, tmp_path / "m.h5")
    loaded = load_model(tmp_path / "m.h5")
    assert loaded.n_steps_ == 3
    assert_same_factor_model(loaded.partial_fit(batches[3]),
                             est.partial_fit(batches[3]), rtol=1e-14)


def test_the_refusal_names_every_type_with_online_statistics(X, monkeypatch):
    """'factor' is among the types the refusal names, in the registry's order."""
    from emgmm.covariance import REGISTRY
    from emgmm.covariance._diag import DiagCovariance

    class NoStream(DiagCovariance):
        name = "nostream"
        has_online_statistics = False

    monkeypatch.setitem(REGISTRY, "nostream", NoStream())
    names = [n for n, kind in REGISTRY.items() if kind.has_online_statistics]
    assert "factor" in names and "nostream" not in names
    with pytest.raises(ValueError, match="have: " + ", ".join(names) + r"\.$"):
        GaussianMixture(K, covariance_type="nostream").partial_fit(X[:100])


@pytest.mark.slow
def test_factor_stream_approaches_the_fit_of_its_mixture():
    """150 batches of 500 fresh rows of a planted mixture of factor analysers (d=8,
    q=2, K=3), default schedule: the held-out score ends within 0.1 nat per row of
    fit's lower bound on those 20,000 held-out rows (measured 0.05; the first step
    is 0.9 below, a model stuck at W = 0 5 below).

    Why 0.1: fit's bound is in-sample, optimistic by about p / (2 n) = 119 / 40,000
    = 0.003; the score's sampling error cancels (the same rows); stepwise EM's
    average over ~1 / eta_150 = 33 batches leaves about p / (2 * 16,000) = 0.004 of
    noise; the rest is the memory of the early steps, which halves from step 30 to
    150 (0.12 to 0.05) at alpha = 0.7. The margin is twice the measured gap, an
    eighth of the first step's and a fiftieth of W = 0's, and the gap must also
    have fallen below a third of its value after 10 steps."""
    held_out = _planted_factor_rows(20000, np.random.default_rng(1))
    ref = _factor().fit(held_out).lower_bound_
    est = _factor()
    gaps = {}
    for t in range(1, 151):
        est.partial_fit(_planted_factor_rows(500, np.random.default_rng(100 + t)))
        if t in (1, 10, 150):
            gaps[t] = ref - est.score(held_out)
    assert gaps[1] > 0.3
    assert gaps[150] < 0.1
    assert gaps[150] < gaps[10] / 3


def test_factor_checkpoint_resumes_the_stream(factor_data, tmp_path):
    """The checkpoint keeps weights, means, loadings and noise variances (no
    dense attribute) and the running statistics: a new estimator resumes."""
    checkpoint = tmp_path / "stream.npz"
    batches = _batches(factor_data, (200, 150, 250))
    est = _factor(checkpoint=checkpoint)
    for batch in batches[:2]:
        est.partial_fit(batch)
    with np.load(checkpoint) as f:
        assert {"loadings", "noise_variance", "online_sum_zz"} <= set(f.files)
        assert not {"covariances", "precisions_cholesky"} & set(f.files)
    resumed = _factor(checkpoint=checkpoint).partial_fit(batches[2])
    assert resumed.n_steps_ == 3
    assert_same_factor_model(resumed, est.partial_fit(batches[2]), rtol=1e-14)


def test_partial_fit_of_another_shape_names_partial_fit():
    """partial_fit after set_params of another shape: the error names partial_fit
    and fit (not warm_start, which the user did not set), and keeps the model."""
    X = make_blobs_data(300, 4, 3, seed=1)
    gm = GaussianMixture(3, covariance_type="factor", n_factors=2, random_state=0)
    gm.partial_fit(X)
    before = gm.means_.copy()
    gm.set_params(n_factors=3)
    with pytest.raises(ValueError, match=r"^partial_fit continues the fitted model "
                                         r".*n_factors=3.*Call fit to fit a new model"):
        gm.partial_fit(X)
    np.testing.assert_array_equal(gm.means_, before)
