"""sample_weight in fit, fit_predict, score, bic and aic, through the public API.

Oracles: the same fit on repeated rows (integer weights) or without the rows of zero
weight; scikit-learn's KMeans / kmeans_plusplus with sample_weight for the
initialisation; scipy.stats for the weighted log-likelihood.
"""

import warnings

import h5py
import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    SKLEARN_COVARIANCE_TYPES,
    accepts_precisions_init,
    covariance_type_params,
    file_fingerprint,
    make_blobs_data,
    type_settings,
)
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.base import clone
from sklearn.cluster import KMeans, kmeans_plusplus
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.utils.validation import check_is_fitted

from emgmm import GaussianMixture, load_model
from emgmm.covariance import REGISTRY

K = 3
ATTRIBUTES = ("weights_", "means_", "covariances_", "precisions_cholesky_")


@pytest.fixture(scope="module")
def X():
    data = make_blobs_data(150, 3, K, seed=11)
    data.setflags(write=False)
    return data


@pytest.fixture(scope="module")
def weights(X):
    w = np.random.default_rng(3).uniform(0.2, 3.0, size=len(X))
    w.setflags(write=False)
    return w


def _inits(X, covariance_type):
    """A fixed starting model: k-means centres, equal weights, unit-ish precisions
    (written in scikit-learn's layouts: none for another type, nor for one that
    refuses precisions_init)."""
    d = X.shape[1]
    means = KMeans(K, n_init=1, random_state=0).fit(X).cluster_centers_
    inits = {"means_init": means, "weights_init": np.full(K, 1.0 / K)}
    if (covariance_type in SKLEARN_COVARIANCE_TYPES
            and accepts_precisions_init(covariance_type)):
        precisions = {"full": np.stack([np.eye(d) * 0.5] * K), "tied": np.eye(d) * 0.5,
                      "diag": np.full((K, d), 0.5), "spherical": np.full(K, 0.5)}
        inits["precisions_init"] = precisions[covariance_type]
    return inits


def _fixed(X, covariance_type, **params):
    """An estimator from the fixed init, tol=0: a fixed number of iterations. A type
    without precisions_init starts warm from one model fitted to ``X`` for one
    iteration from the fixed weights and means (the same for every call), so that
    the initialisation does not read the data of the fit that is tested."""
    base = {"n_components": K, **type_settings(covariance_type, X.shape[1]),
            "tol": 0.0, "max_iter": 12, **_inits(X, covariance_type)}
    if "precisions_init" in base:
        return GaussianMixture(**{**base, **params})
    start = GaussianMixture(**{**base, "max_iter": 1, "random_state": 0,
                               "warm_start": True})
    with pytest.warns(ConvergenceWarning):
        start.fit(X)
    return start.set_params(**{**base, **params})


def _fit(estimator, *args, **kwargs):
    """``fit`` expecting scikit-learn's warning when ``tol=0`` stops it at max_iter."""
    if estimator.tol == 0 and estimator.max_iter > 0:
        with pytest.warns(ConvergenceWarning):
            return estimator.fit(*args, **kwargs)
    return estimator.fit(*args, **kwargs)


def assert_same_model(a, b, rtol=1e-10):
    for name in ATTRIBUTES:
        x, y = getattr(a, name), getattr(b, name)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max(),
                                   err_msg=name)


@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_integer_weights_equal_repeated_rows(X, covariance_type, schedule):
    w = np.random.default_rng(0).integers(1, 4, size=len(X))
    repeated = np.repeat(X, w, axis=0)
    weighted = _fit(_fixed(X, covariance_type, block_size=17, schedule=schedule), X,
                    sample_weight=w)
    plain = _fit(_fixed(X, covariance_type), repeated)
    np.testing.assert_allclose(weighted.lower_bounds_, plain.lower_bounds_, rtol=1e-10)
    np.testing.assert_allclose(weighted.lower_bound_, plain.lower_bound_, rtol=1e-10)
    assert_same_model(weighted, plain)
    np.testing.assert_array_equal(weighted.predict(X), plain.predict(X))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_tol_keeps_its_meaning_on_the_weighted_mean(X, covariance_type):
    w = np.random.default_rng(1).integers(1, 4, size=len(X))
    repeated = np.repeat(X, w, axis=0)
    weighted = _fixed(X, covariance_type, tol=1e-6,
                      max_iter=500).fit(X, sample_weight=w)
    plain = _fixed(X, covariance_type, tol=1e-6, max_iter=500).fit(repeated)
    assert weighted.converged_ and plain.converged_
    assert weighted.n_iter_ == plain.n_iter_
    assert_same_model(weighted, plain, rtol=1e-9)


@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_zero_weight_equals_dropping_the_row(X, covariance_type, schedule):
    w = np.ones(len(X))
    w[[0, 5, 17, 60, 61, 149]] = 0.0
    weighted = _fit(_fixed(X, covariance_type, block_size=16, schedule=schedule), X,
                    sample_weight=w)
    dropped = _fit(_fixed(X, covariance_type), X[w > 0])
    np.testing.assert_allclose(weighted.lower_bounds_, dropped.lower_bounds_,
                               rtol=1e-10)
    assert_same_model(weighted, dropped)


@pytest.mark.parametrize("weight", [2.5, 1e-30, 1e30, 1e-310])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_constant_weight_equals_no_weights(X, covariance_type, weight):
    """Of any scale: weights of 1e-30 once drowned in the 10 eps guard of N_k
    (every mean at the origin); fit reads them scaled by a power of two (for
    subnormal ones, beyond the range of ``2.0 ** e``)."""
    weighted = _fit(_fixed(X, covariance_type), X,
                    sample_weight=np.full(len(X), weight))
    plain = _fit(_fixed(X, covariance_type), X)
    np.testing.assert_allclose(weighted.lower_bounds_, plain.lower_bounds_, rtol=1e-12)
    assert_same_model(weighted, plain, rtol=1e-11)


def test_tiny_weights_shared_with_worker_processes_keep_their_scale(X):
    """Weights dumped for process workers are read with fit's scale there too."""
    tiny = np.linspace(1.0, 3.0, len(X)) * 1e-25
    one = _fit(_fixed(X, "diag"), X, sample_weight=tiny)
    two = _fit(_fixed(X, "diag").set_params(n_jobs=2), X, sample_weight=tiny)
    plain = _fit(_fixed(X, "diag"), X, sample_weight=tiny * 1e25)
    np.testing.assert_allclose(two.lower_bounds_, one.lower_bounds_, rtol=1e-12)
    np.testing.assert_allclose(one.lower_bounds_, plain.lower_bounds_, rtol=1e-10)
    assert_same_model(two, one, rtol=1e-10)


def test_all_ones_and_none_agree_bit_for_bit(X):
    a = _fit(_fixed(X, "full"), X, sample_weight=np.ones(len(X)))
    b = _fit(_fixed(X, "full"), X, sample_weight=None)
    for name in ATTRIBUTES:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_scikit_learns_sample_weight_equivalence_check_from_a_fixed_init(
        covariance_type):
    """scikit-learn's own check (weights against repeated and dropped rows, the rows
    shuffled) passes from a fixed init; with the default k-means init it cannot,
    the rows being shuffled (scikit-learn expects the same of KMeans). 'raise'
    keeps starved components: re-seeding one whose weight is below one sample's
    average weight is the policy that weights change (sum(w) / n against 1)."""
    from sklearn.utils.estimator_checks import (
        check_sample_weight_equivalence_on_dense_data,
    )

    d = 30  # the check's data: 15 rows, 30 features
    precisions = {"full": np.stack([np.eye(d) * 10] * 2), "tied": np.eye(d) * 10,
                  "diag": np.full((2, d), 10.0), "spherical": np.full(2, 10.0)}
    est = GaussianMixture(2, covariance_type=covariance_type,
                          means_init=np.random.default_rng(0).uniform(size=(2, d)),
                          weights_init=[0.5, 0.5], on_degenerate="raise",
                          precisions_init=precisions[covariance_type])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check_sample_weight_equivalence_on_dense_data("GaussianMixture", est)


# ------------------------------------------------------------------ initialisation


def _weighted_parameters(X, resp, w, reg_covar=1e-6):
    """scikit-learn's initial parameters from responsibilities, every sum weighted."""
    wr = resp * w[:, None]
    nk = wr.sum(axis=0) + 10 * np.finfo(np.float64).eps
    means = wr.T @ X / nk[:, None]
    cov = np.stack([(wr[:, k, None] * (X - means[k])).T @ (X - means[k]) / nk[k]
                    + reg_covar * np.eye(X.shape[1]) for k in range(len(nk))])
    return nk / w.sum(), means, cov


def _init_only(init_params, seed=0):
    return GaussianMixture(K, init_params=init_params, max_iter=0, random_state=seed)


def test_kmeans_init_is_scikit_learns_weighted_kmeans(X, weights):
    labels = KMeans(K, n_init=1, random_state=np.random.RandomState(0)).fit(
        X, sample_weight=weights).labels_
    resp = np.eye(K)[labels]
    want = _weighted_parameters(X, resp, weights)
    got = _init_only("kmeans").fit(X, sample_weight=weights)
    for name, value in zip(("weights_", "means_", "covariances_"), want, strict=False):
        np.testing.assert_allclose(getattr(got, name), value, rtol=1e-10, err_msg=name)
    # the weights changed the init (else this test could not fail)
    plain = _init_only("kmeans").fit(X)
    assert not np.allclose(plain.means_, got.means_, rtol=1e-6)


def test_init_subsample_of_a_file_takes_its_rows_weights(X, weights, tmp_path):
    """init_max_samples < n: the k-means of the subsample, drawn as scikit-learn's
    RandomState draws it, gets the weights of the subsample's rows (read from a
    weight file by blocks)."""
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "w.npy", weights)
    rng = np.random.RandomState(0)
    idx = np.sort(rng.choice(len(X), size=60, replace=False))
    labels = KMeans(K, n_init=1, random_state=rng).fit(
        X[idx], sample_weight=weights[idx]).labels_
    want = _weighted_parameters(X[idx], np.eye(K)[labels], weights[idx])
    got = _init_only("kmeans").set_params(init_max_samples=60, block_size=16).fit(
        str(tmp_path / "X.npy"), sample_weight=str(tmp_path / "w.npy"))
    for name, value in zip(("weights_", "means_", "covariances_"), want, strict=False):
        np.testing.assert_allclose(getattr(got, name), value, rtol=1e-10, err_msg=name)


def test_kmeans_plusplus_init_is_scikit_learns_weighted_seeding(X, weights):
    w = weights.copy()
    w[::2] = 0.0  # rows of zero weight are never a seed
    _, indices = kmeans_plusplus(X, K, sample_weight=w,
                                 random_state=np.random.RandomState(4))
    got = _init_only("k-means++", seed=4).fit(X, sample_weight=w)
    np.testing.assert_allclose(got.means_, X[indices], rtol=1e-12)
    assert (w[indices] > 0).all()


def test_random_from_data_draws_rows_in_proportion_to_weight(X, weights):
    w = weights.copy()
    w[::2] = 0.0
    rng = np.random.RandomState(5)
    indices = rng.choice(len(X), size=K, replace=False, p=w / w.sum())
    got = _init_only("random_from_data", seed=5).fit(X, sample_weight=w)
    np.testing.assert_allclose(got.means_, X[indices], rtol=1e-12)


def test_random_init_weights_the_random_responsibilities(X, weights):
    rng = np.random.RandomState(6)
    resp = rng.uniform(size=(len(X), K))
    resp /= resp.sum(axis=1)[:, None]
    want = _weighted_parameters(X, resp, weights)
    got = _init_only("random", seed=6).fit(X, sample_weight=weights)
    for name, value in zip(("weights_", "means_", "covariances_"), want, strict=False):
        np.testing.assert_allclose(getattr(got, name), value, rtol=1e-10, err_msg=name)


# ---------------------------------------------------------- likelihood, bic, aic


def _log_likelihood(X, weights, means, covariances):
    """Per-row log-likelihood of a 'full' mixture, by scipy.stats."""
    parts = [np.log(w) + multivariate_normal(m, c).logpdf(X)
             for w, m, c in zip(weights, means, covariances, strict=False)]
    return logsumexp(np.stack(parts, axis=1), axis=1)


def test_lower_bounds_are_weighted_mean_log_likelihoods(X, weights):
    inits = _inits(X, "full")
    est = _fit(_fixed(X, "full", max_iter=1), X, sample_weight=weights)
    cov0 = np.linalg.inv(inits["precisions_init"])
    ll0 = _log_likelihood(X, inits["weights_init"], inits["means_init"], cov0)
    np.testing.assert_allclose(est.lower_bounds_[0], np.average(ll0, weights=weights),
                               rtol=1e-12)
    ll = _log_likelihood(X, est.weights_, est.means_, est.covariances_)
    np.testing.assert_allclose(est.lower_bound_, np.average(ll, weights=weights),
                               rtol=1e-12)
    np.testing.assert_allclose(est.score(X, sample_weight=weights), est.lower_bound_,
                               rtol=1e-13)
    np.testing.assert_allclose(est.score_samples(X), ll, rtol=1e-12)


def test_score_without_weights_is_unchanged(X, weights):
    est = _fit(_fixed(X, "full"), X, sample_weight=weights)
    np.testing.assert_allclose(est.score(X), est.score_samples(X).mean(), rtol=1e-14)


def _n_parameters(estimator, d):
    """Free parameters: the covariances' counted here for scikit-learn's types, the
    type's own count (tested with the type) for the others."""
    counts = {"full": K * d * (d + 1) / 2, "tied": d * (d + 1) / 2, "diag": K * d,
              "spherical": K}
    ct = estimator.covariance_type
    cov = counts[ct] if ct in counts else REGISTRY[ct].for_params(
        estimator.get_params()).n_parameters(K, d)
    return cov + K * d + K - 1


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_bic_aic_use_weighted_log_likelihood_and_total_weight(X, weights,
                                                               covariance_type):
    est = _fit(_fixed(X, covariance_type), X, sample_weight=weights)
    log_l = float(np.sum(weights * est.score_samples(X)))
    p = _n_parameters(est, X.shape[1])
    np.testing.assert_allclose(est.bic(X, sample_weight=weights),
                               -2 * log_l + p * np.log(weights.sum()), rtol=1e-12)
    np.testing.assert_allclose(est.aic(X, sample_weight=weights), -2 * log_l + 2 * p,
                               rtol=1e-12)
    w = np.random.default_rng(2).integers(0, 4, size=len(X))
    repeated = np.repeat(X, w, axis=0)
    np.testing.assert_allclose(est.bic(X, sample_weight=w), est.bic(repeated),
                               rtol=1e-12)
    np.testing.assert_allclose(est.aic(X, sample_weight=w), est.aic(repeated),
                               rtol=1e-12)


def test_fit_predict_with_weights_equals_fit_then_predict(X, weights):
    a = _fixed(X, "diag", tol=1e-3, max_iter=100)
    labels = a.fit_predict(X, sample_weight=weights)
    b = clone(a).fit(X, sample_weight=weights)
    np.testing.assert_array_equal(labels, b.predict(X))
    assert_same_model(a, b, rtol=0)


# ------------------------------------------------------------------------ sources


def _weight_sources(w, tmp_path):
    """The weights as each kind of source: (kind, object)."""
    npy = tmp_path / "w.npy"
    np.save(npy, w)
    dat = tmp_path / "w.dat"
    mm = np.memmap(dat, dtype=w.dtype, mode="w+", shape=w.shape)
    mm[:] = w
    mm.flush()
    del mm
    h5 = tmp_path / "w.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("group/weights", data=w, chunks=(16,))
    return [("list", list(w)), ("memmap", np.memmap(dat, dtype=w.dtype, mode="r",
                                                    shape=w.shape)),
            ("npy", str(npy)), ("npy_path", npy), ("h5_string", f"{h5}:/group/weights")]


def test_every_weight_source_gives_the_same_fit(X, weights, tmp_path):
    ref = _fit(_fixed(X, "full", block_size=20), X, sample_weight=weights)
    for _kind, w in _weight_sources(weights, tmp_path):
        est = _fit(_fixed(X, "full", block_size=20), X, sample_weight=w)
        assert_same_model(est, ref, rtol=1e-13)
        np.testing.assert_allclose(est.score(X, sample_weight=w),
                                   ref.score(X, sample_weight=weights), rtol=1e-13)


def test_weight_files_are_read_only_and_untouched(X, weights, tmp_path):
    sources = _weight_sources(weights, tmp_path)
    before = {kind: file_fingerprint(w) for kind, w in sources
              if kind.startswith("npy")}
    for _, w in sources:
        _fit(_fixed(X, "full"), X, sample_weight=w)
    after = {kind: file_fingerprint(w) for kind, w in sources if kind.startswith("npy")}
    assert before == after


def test_h5py_dataset_weights(X, weights, tmp_path):
    h5 = tmp_path / "w.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("weights", data=weights)
    ref = _fit(_fixed(X, "tied"), X, sample_weight=weights)
    with h5py.File(h5, "r") as f:
        est = _fit(_fixed(X, "tied"), X, sample_weight=f["weights"])
    assert_same_model(est, ref, rtol=1e-13)


@pytest.mark.parametrize("covariance_type",
                         covariance_type_params(slow_beyond_sklearn=True))
def test_every_data_source_with_weights(X, weights, make_sources, covariance_type):
    ref = _fit(_fixed(X, covariance_type, block_size=32), X, sample_weight=weights)
    for source in make_sources(X):
        est = _fit(_fixed(X, covariance_type, block_size=32), source.obj,
                   sample_weight=weights)
        assert_same_model(est, ref, rtol=1e-13)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rows", "components"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_weights_with_process_workers(X, weights, tmp_path, covariance_type, schedule,
                                      temp_folder):
    npy = tmp_path / "w.npy"
    np.save(npy, weights)
    ref = _fit(_fixed(X, covariance_type, block_size=25, n_jobs=1), X,
               sample_weight=weights)
    for w in (weights, str(npy)):
        est = _fit(_fixed(X, covariance_type, block_size=25, n_jobs=2,
                          schedule=schedule), X, sample_weight=w)
        assert_same_model(est, ref, rtol=1e-12)
    assert not any(temp_folder.iterdir())  # the shared copies were removed


def _task_arguments(monkeypatch):
    """Record the arguments of every task sent to joblib's workers."""
    import joblib

    from emgmm._runtime import executor

    sent = []

    class Recording(joblib.Parallel):
        def __call__(self, iterable):
            calls = list(iterable)
            sent.extend(args for _, args, _ in calls)
            return super().__call__(calls)

    monkeypatch.setattr(executor, "Parallel", Recording)
    return sent


@pytest.mark.parametrize("schedule", ["rows", "components"])
def test_process_workers_get_the_weights_by_reference(tmp_path, schedule, temp_folder,
                                                      monkeypatch):
    """No worker receives the n weights: every task's weights pickle to a few
    hundred bytes (a file name), for in-memory and file-backed weights alike, in
    fit and in partial_fit."""
    import pickle

    from emgmm._io.weights import WeightSource

    n = 40_000  # 320 kB of weights
    data = make_blobs_data(n, 2, 2, seed=3)
    w = np.random.default_rng(4).uniform(0.5, 2.0, size=n)
    npy = tmp_path / "w.npy"
    np.save(npy, w)
    sent = _task_arguments(monkeypatch)
    for weights in (w, str(npy)):
        sent.clear()
        _fit(GaussianMixture(2, random_state=0, max_iter=2, tol=0.0, n_jobs=2,
                             block_size=5000, schedule=schedule),
             data, sample_weight=weights)
        shared = [a for args in sent for a in args if isinstance(a, WeightSource)]
        assert len(shared) >= 8  # every pass's tasks carry the weights
        assert max(len(pickle.dumps(a)) for a in shared) < 2000
        sent.clear()  # and a partial_fit batch's
        GaussianMixture(2, random_state=0, n_jobs=2, block_size=5000,
                        schedule=schedule).partial_fit(data, sample_weight=weights)
        shared = [a for args in sent for a in args if isinstance(a, WeightSource)]
        assert len(shared) >= 2
        assert max(len(pickle.dumps(a)) for a in shared) < 2000


def test_integer_and_float32_weights(X):
    w = np.random.default_rng(7).integers(1, 4, size=len(X))
    a = _fit(_fixed(X, "diag"), X, sample_weight=w)
    b = _fit(_fixed(X, "diag"), X, sample_weight=w.astype(np.float32))
    c = _fit(_fixed(X, "diag"), X, sample_weight=w.astype(np.float64))
    assert_same_model(a, c, rtol=0)
    assert_same_model(b, c, rtol=0)


def test_checkpoint_of_a_weighted_fit_resumes_only_with_the_same_weights(X, weights,
                                                                         tmp_path):
    checkpoint = tmp_path / "fit.npz"

    def interrupt(record):
        if record["n_iter"] == 3:
            raise KeyboardInterrupt

    est = _fixed(X, "full", checkpoint=checkpoint, callback=interrupt)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, sample_weight=weights)
    assert checkpoint.exists()
    for other in (None, weights[::-1].copy()):
        with pytest.raises(ValueError, match="sample_weight"):
            _fixed(X, "full", checkpoint=checkpoint).fit(X, sample_weight=other)
    resumed = _fit(_fixed(X, "full", checkpoint=checkpoint), X, sample_weight=weights)
    ref = _fit(_fixed(X, "full"), X, sample_weight=weights)
    assert_same_model(resumed, ref, rtol=0)
    np.testing.assert_array_equal(resumed.lower_bounds_, ref.lower_bounds_)


# --------------------------------------------------------------------- validation


def _bad(n, row, value):
    w = np.ones(n)
    w[row] = value
    return w


@pytest.mark.parametrize("w, match", [
    (lambda n: _bad(n, 7, -1.0), r"negative.*row 7\b|row 7\b.*negative"),
    (lambda n: _bad(n, 3, np.nan), r"NaN.*row 3\b|row 3\b.*NaN"),
    (lambda n: _bad(n, 5, np.inf), r"infinit.*row 5\b|row 5\b.*infinit"),
    (lambda n: np.ones(n - 1), r"sample_weight.*149.*150|sample_weight.*150.*149"),
    (lambda n: np.zeros(n), r"sample_weight.*zero"),
    (lambda n: np.ones((n, 2)), r"sample_weight.*1-D|sample_weight.*one-dimensional"),
])
def test_invalid_weights_raise_naming_the_problem(X, w, match):
    est = GaussianMixture(K, random_state=0)
    with pytest.raises(ValueError, match=match):
        est.fit(X, sample_weight=w(len(X)))
    with pytest.raises(NotFittedError):
        check_is_fitted(est)  # nothing half-fitted


def test_invalid_weight_in_a_file_names_row_and_file(X, tmp_path):
    npy = tmp_path / "bad_weights.npy"
    np.save(npy, _bad(len(X), 133, -0.5))
    with pytest.raises(ValueError, match=r"row 133\b") as info:
        GaussianMixture(K, random_state=0, block_size=20).fit(X, sample_weight=str(npy))
    assert "bad_weights.npy" in str(info.value)
    h5 = tmp_path / "bad.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("w", data=_bad(len(X), 41, np.nan))
    with pytest.raises(ValueError, match=r"row 41\b") as info:
        GaussianMixture(K, random_state=0).fit(X, sample_weight=f"{h5}:/w")
    assert "bad.h5" in str(info.value)


def test_invalid_weights_in_score_and_bic(X, weights):
    est = GaussianMixture(K, random_state=0).fit(X)
    for method in (est.score, est.bic, est.aic):
        with pytest.raises(ValueError, match=r"row 9\b"):
            method(X, sample_weight=_bad(len(X), 9, -2.0))
        with pytest.raises(ValueError, match="sample_weight"):
            method(X, sample_weight=weights[:-3])


def test_previous_model_kept_when_weights_are_invalid(X, weights):
    est = GaussianMixture(K, random_state=0).fit(X, sample_weight=weights)
    means = est.means_.copy()
    with pytest.raises(ValueError):
        est.fit(X, sample_weight=_bad(len(X), 2, -1.0))
    np.testing.assert_array_equal(est.means_, means)


# --------------------------------------------------------------------------- CLI


def test_cli_fit_sample_weight(X, weights, tmp_path):
    from emgmm._cli import command as cli

    npy = tmp_path / "X.npy"
    np.save(npy, X)
    wnpy = tmp_path / "w.npy"
    np.save(wnpy, weights)
    h5 = tmp_path / "w.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("w", data=weights)
    ref = GaussianMixture(K, covariance_type="diag", random_state=0).fit(
        X, sample_weight=weights)
    for spec in (str(wnpy), f"{h5}:/w"):
        out = tmp_path / "m.h5"
        assert cli.main(["fit", str(npy), "-k", str(K), "--covariance-type", "diag",
                         "--random-state", "0", "--sample-weight", spec,
                         "-o", str(out), "--quiet"]) == 0
        model = load_model(out)
        assert_same_model(model, ref, rtol=1e-12)
        np.testing.assert_allclose(model.lower_bound_, ref.lower_bound_, rtol=1e-12)


def test_cli_fit_bad_sample_weight_names_the_row(X, tmp_path, capsys):
    from emgmm._cli import command as cli

    npy = tmp_path / "X.npy"
    np.save(npy, X)
    wnpy = tmp_path / "w.npy"
    np.save(wnpy, _bad(len(X), 12, -1.0))
    code = cli.main(["fit", str(npy), "-k", str(K), "--sample-weight", str(wnpy),
                     "-o", str(tmp_path / "m.h5"), "--quiet"])
    assert code != 0
    err = capsys.readouterr().err
    assert "row 12" in err and "w.npy" in err
    assert not (tmp_path / "m.h5").exists()
