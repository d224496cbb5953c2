"""GaussianMixture(covariance_type='factor'): the estimator, its sources, schedules,
workers, model files and command line."""

import warnings

import h5py
import numpy as np
import pytest
from helpers import IGNORE_NOT_CONVERGED, cli_usage_error
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.exceptions import ConvergenceWarning

from emgmm import GaussianMixture, load_model, save_model
from emgmm.covariance import _factor_parameters as fparams

K, D, Q = 3, 10, 2


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(K):
        W = rng.normal(size=(D, Q))
        mu = 6.0 * rng.normal(size=D)
        rows.append(mu + rng.normal(size=(300, Q)) @ W.T
                    + 0.5 * rng.normal(size=(300, D)))
    X = np.concatenate(rows)
    return X[rng.permutation(len(X))]


def _fit(X, **kw):
    """Converged (tol=1e-5, 24 iterations), or a fixed number of iterations with
    tol=0 (which warns that it did not converge)."""
    params = {"n_components": K, "covariance_type": "factor", "n_factors": Q,
                  "random_state": 0, "max_iter": 100, "tol": 1e-5}
    params.update(kw)
    gm = GaussianMixture(**params)
    if params["tol"] == 0.0 and params["max_iter"] > 0:
        with pytest.warns(ConvergenceWarning):
            return gm.fit(X)
    return gm.fit(X)


@pytest.fixture(scope="module")
def fitted(data):
    return _fit(data)


def _dense_log_likelihood(gm, X):
    parts = [np.log(w) + multivariate_normal(m, W @ W.T + np.diag(p)).logpdf(X)
             for w, m, W, p in zip(gm.weights_, gm.means_, gm.loadings_,
                                   gm.noise_variance_, strict=False)]
    return logsumexp(np.stack(parts, axis=1), axis=1)


def test_fitted_attributes(fitted):
    assert fitted.loadings_.shape == (K, D, Q)
    assert fitted.noise_variance_.shape == (K, D)
    assert fitted.means_.shape == (K, D)
    np.testing.assert_allclose(fitted.weights_.sum(), 1.0)
    assert np.all(fitted.noise_variance_ >= fitted.reg_covar)
    assert np.all(np.diff(fitted.lower_bounds_) >= -1e-10)


def test_score_samples_equal_the_dense_mixture(fitted, data):
    np.testing.assert_allclose(fitted.score_samples(data),
                               _dense_log_likelihood(fitted, data), rtol=1e-10)
    np.testing.assert_allclose(fitted.lower_bound_, fitted.score(data), rtol=1e-12)


def test_predict_and_proba(fitted, data):
    proba = fitted.predict_proba(data)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(fitted.predict(data), proba.argmax(axis=1))
    labels = GaussianMixture(K, covariance_type="factor", n_factors=Q, random_state=0,
                             max_iter=100, tol=1e-5).fit_predict(data)
    np.testing.assert_array_equal(labels, fitted.predict(data))


def test_bic_aic_count_factor_parameters(fitted, data):
    p = fparams.n_parameters(K, D, Q)
    n = len(data)
    ll = fitted.score(data) * n
    np.testing.assert_allclose(fitted.bic(data), -2 * ll + p * np.log(n))
    np.testing.assert_allclose(fitted.aic(data), -2 * ll + 2 * p)


def test_sample(fitted):
    X, y = fitted.sample(3000)
    assert X.shape == (3000, D)
    counts = np.bincount(y, minlength=K)
    assert counts.sum() == 3000
    k = int(np.argmax(counts))
    np.testing.assert_allclose(X[y == k].mean(axis=0), fitted.means_[k], atol=0.5)


def test_dense_attributes_on_demand(fitted):
    cov = fitted.covariances_
    assert cov.shape == (K, D, D)
    np.testing.assert_allclose(
        cov, fparams.covariances(fitted.loadings_, fitted.noise_variance_))
    np.testing.assert_allclose(np.matmul(fitted.precisions_, cov),
                               np.broadcast_to(np.eye(D), (K, D, D)), atol=1e-8)
    U = fitted.precisions_cholesky_
    np.testing.assert_allclose(np.matmul(U, np.swapaxes(U, 1, 2)), fitted.precisions_,
                               rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", ["memmap", "npy", "h5"])
def test_sources_give_identical_fits(tmp_path, data, fitted, kind):
    if kind == "h5":
        path = tmp_path / "x.h5"
        with h5py.File(path, "w") as f:
            f["x"] = data
        source = f"{path}:/x"
    else:
        path = tmp_path / "x.npy"
        np.save(path, data)
        source = str(path) if kind == "npy" else np.load(path, mmap_mode="r")
    other = _fit(source)
    np.testing.assert_array_equal(other.lower_bounds_, fitted.lower_bounds_)
    np.testing.assert_array_equal(other.loadings_, fitted.loadings_)


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{"block_size": 64}, {"block_size": 7},
                                {"n_jobs": 2}, {"n_jobs": 2, "schedule": "components"},
                                {"n_jobs": 2, "block_size": 100}])
def test_blocks_workers_and_schedules_agree(data, fitted, kw):
    other = _fit(data, **kw)
    np.testing.assert_allclose(other.lower_bounds_, fitted.lower_bounds_, rtol=1e-12)
    np.testing.assert_allclose(other.loadings_, fitted.loadings_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(other.noise_variance_, fitted.noise_variance_, rtol=1e-9)


def test_float32_compute_close_to_float64(data, fitted):
    single = _fit(data, compute_dtype="float32", max_iter=5, tol=0.0)
    double = _fit(data, max_iter=5, tol=0.0)
    np.testing.assert_allclose(single.lower_bounds_, double.lower_bounds_, rtol=1e-6)


def test_model_file_round_trip(tmp_path, data, fitted):
    path = tmp_path / "m.h5"
    save_model(fitted, path)
    loaded = load_model(path)
    assert loaded.covariance_type == "factor" and loaded.n_factors == Q
    np.testing.assert_array_equal(loaded.loadings_, fitted.loadings_)
    np.testing.assert_array_equal(loaded.noise_variance_, fitted.noise_variance_)
    np.testing.assert_array_equal(loaded.score_samples(data),
                                  fitted.score_samples(data))


def test_warm_start_continues(data):
    straight = _fit(data, max_iter=6, tol=0.0)
    gm = _fit(data, max_iter=3, tol=0.0)
    gm.set_params(warm_start=True)
    _fit_again = gm.fit
    with pytest.warns(ConvergenceWarning):
        _fit_again(data)
    np.testing.assert_allclose(gm.lower_bounds_, straight.lower_bounds_[3:], rtol=1e-12)
    np.testing.assert_allclose(gm.loadings_, straight.loadings_, rtol=1e-9, atol=1e-12)


def test_checkpoint_resume_equals_uninterrupted(tmp_path, data):
    path = tmp_path / "ck.npz"
    full = _fit(data, max_iter=6, tol=0.0)

    def stop(record):
        if record["n_iter"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _fit(data, max_iter=6, tol=0.0, checkpoint=path, callback=stop)
    assert path.exists()
    resumed = _fit(data, max_iter=6, tol=0.0, checkpoint=path)
    np.testing.assert_array_equal(resumed.lower_bounds_, full.lower_bounds_)
    np.testing.assert_array_equal(resumed.loadings_, full.loadings_)
    assert not path.exists()


@pytest.mark.parametrize("q, message", [(-1, "n_factors"), (D + 1, "n_factors")])
def test_bad_n_factors(data, q, message):
    with pytest.raises(ValueError, match=message):
        _fit(data, n_factors=q)


def test_precisions_init_refused(data):
    with pytest.raises(ValueError, match="precisions_init"):
        _fit(data, precisions_init=np.ones((K, D)))


def test_q0_fits_like_diag(data):
    """With no factors and no floor (reg_covar=0: 'factor' floors its noise at
    reg_covar, 'diag' adds it) the fits are the same."""
    fa = _fit(data, n_factors=0, max_iter=5, tol=0.0, reg_covar=0.0)
    diag = GaussianMixture(K, covariance_type="diag", random_state=0, max_iter=5,
                           tol=0.0, reg_covar=0.0)
    with pytest.warns(ConvergenceWarning):
        diag.fit(data)
    np.testing.assert_allclose(fa.lower_bounds_, diag.lower_bounds_, rtol=1e-10)
    np.testing.assert_allclose(fa.noise_variance_, diag.covariances_, rtol=1e-8)


def test_cli_fit_info_score(tmp_path, data, capsys):
    from emgmm._cli import main

    npy = tmp_path / "x.npy"
    np.save(npy, data)
    out = tmp_path / "m.h5"
    assert main(["fit", str(npy), "-k", str(K), "--covariance-type", "factor",
                 "--n-factors", str(Q), "--random-state", "0", "-o", str(out),
                 "-q"]) == 0
    model = load_model(out)
    assert model.loadings_.shape == (K, D, Q)
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "factor" in text and str(Q) in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["score", str(out), str(npy)]) == 0


def test_model_file_with_bad_noise_is_refused(tmp_path, fitted):
    from emgmm import ModelFileError

    path = tmp_path / "m.h5"
    save_model(fitted, path)
    with h5py.File(path, "r+") as f:
        f["noise_variance"][1, 4] = 0.0
    with pytest.raises(ModelFileError, match="noise_variance of component 1"):
        load_model(path)


def test_large_dense_attribute_warns(fitted, monkeypatch):
    from emgmm.covariance import _factor as factor_covariance

    monkeypatch.setattr(factor_covariance, "DENSE_WARN_MIB", 0)
    with pytest.warns(UserWarning, match="formed on demand"):
        _ = fitted.precisions_cholesky_


def test_dense_attribute_beyond_memory_is_an_attribute_error(data):
    """At the workload's sizes the dense (K, d, d) attributes cannot be formed:
    reading one raises AttributeError naming the size and the stored attributes
    (hasattr stays usable), not MemoryError."""
    gm = _fit(data)
    gm.loadings_ = np.zeros((2, 200_000, 1))  # dense: 2 x 200k x 200k, 596 GiB
    gm.noise_variance_ = np.ones((2, 200_000))
    with pytest.warns(UserWarning, match="formed on demand"):
        assert not hasattr(gm, "covariances_")
    with pytest.warns(UserWarning), pytest.raises(AttributeError, match="loadings_"):
        _ = gm.precisions_


def test_refit_with_another_type_drops_the_factor_attributes(data):
    gm = _fit(data)
    gm.set_params(covariance_type="diag")
    gm.fit(data)
    assert not hasattr(gm, "loadings_") and gm.covariances_.shape == (K, D)
    gm.set_params(covariance_type="factor")
    gm.fit(data)
    assert "covariances_" not in vars(gm) and gm.loadings_.shape == (K, D, Q)


def test_cli_warm_start_with_other_n_factors_is_refused(tmp_path, data, fitted, capsys):
    npy = tmp_path / "x.npy"
    np.save(npy, data)
    model = tmp_path / "m.h5"
    save_model(fitted, model)
    assert "n_factors=2" in cli_usage_error(
        ["fit", str(npy), "--warm-start", str(model), "--n-factors", "1",
         "-o", str(tmp_path / "out.h5"), "-q"], capsys)


@pytest.fixture(scope="module")
def collapsed():
    """Two blobs and 20 copies of one far row: with reg_covar=0 its k-means cluster
    has zero noise variance."""
    rng = np.random.default_rng(1)
    return np.concatenate([rng.normal(size=(300, 6)), rng.normal(loc=8, size=(300, 6)),
                           np.tile(rng.normal(loc=-50, size=(1, 6)), (20, 1))])


def _fit_recording(X, **params):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gm = GaussianMixture(3, covariance_type="factor", n_factors=2, reg_covar=0.0,
                             random_state=0, max_iter=30, **params).fit(X)
    return gm, [str(w.message) for w in seen]


def _assert_bound_never_drops(gm):
    bounds = np.asarray(gm.lower_bounds_)
    assert np.all(np.diff(bounds) >= -1e-12 * np.abs(bounds[1:])), bounds


def test_collapsed_component_keeps_the_bound(collapsed):
    """The component on 20 copies of one row gets zero noise variances from the M
    step: it keeps the E step's in those features (a generalised M step), the fit
    goes on and its lower bound never decreases."""
    gm, messages = _fit_recording(collapsed)
    assert any("Components [1] had noise variances that are not positive" in m
               and "lower bound does not decrease" in m for m in messages)
    assert not any("re-seeded" in m for m in messages)
    _assert_bound_never_drops(gm)
    assert np.isfinite(gm.noise_variance_).all() and np.isfinite(gm.loadings_).all()
    assert (gm.noise_variance_ > 0).all()
    # the component stays on the copies, with the weight of their rows
    k = int(np.argmin(np.abs(gm.means_[:, 0] - collapsed[-1, 0])))
    np.testing.assert_allclose(gm.means_[k], collapsed[-1], rtol=1e-10)
    np.testing.assert_allclose(gm.weights_[k], 20 / len(collapsed), rtol=1e-6)
    assert np.isfinite(gm.score(collapsed))


def test_reseeded_component_regains_loadings():
    """A component started 1e3 away from every row starves and is re-seeded in
    the first iteration. It starts from the pooled loadings, not ``W = 0`` (a
    fixed point of the factor EM, where it stayed diagonal with a bound of -5.5
    against the -1.3 it reaches by iteration 10)."""
    rng = np.random.default_rng(0)
    W = rng.normal(size=(2, 8, 2))
    X = np.vstack([rng.normal(size=(500, 2)) @ W[k].T
                   + 0.1 * rng.normal(size=(500, 8)) + 10 * k for k in range(2)])
    gm = GaussianMixture(2, covariance_type="factor", n_factors=2, max_iter=10,
                         means_init=[np.zeros(8), np.full(8, 1e3)], random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the re-seed's and max_iter's warnings)
        gm.fit(X)
    assert gm.history_[0]["reseeded"] == [1]
    assert np.abs(gm.loadings_[1]).max() > 0.5
    assert gm.lower_bound_ > -3.0


def test_isolated_point_keeps_the_bound():
    """reg_covar=0 and one isolated row (its k-means cluster has zero variance, and
    a re-seed put a broad component on the worst-explained row, dropping the bound
    below its value before): the lower bound of every iteration is at least the
    one before, and the fit converges."""
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(size=(300, 6)), rng.normal(loc=8, size=(300, 6)),
                        rng.normal(loc=-50, size=(1, 6))])
    gm, messages = _fit_recording(X)
    assert any("had noise variances that are not positive" in m for m in messages)
    _assert_bound_never_drops(gm)
    assert gm.converged_
    assert np.isfinite(gm.score(X)) and gm.lower_bound_ > gm.lower_bounds_[1]


def test_collapsed_component_raises_with_raise_policy(collapsed):
    gm = GaussianMixture(3, covariance_type="factor", n_factors=2, reg_covar=0.0,
                         random_state=0, on_degenerate="raise")
    with pytest.raises(ValueError, match="component 1"):
        gm.fit(collapsed)
    assert not hasattr(gm, "loadings_")


def test_float32_data_lower_bound_is_the_score(data):
    single = data.astype(np.float32)
    gm = _fit(single)
    assert gm.loadings_.dtype == np.float32 and gm.noise_variance_.dtype == np.float32
    assert gm.lower_bound_ == gm.score(single)


@pytest.mark.filterwarnings(IGNORE_NOT_CONVERGED)
def test_integer_sample_weights_equal_repeated_rows(data):
    """'factor' with sample_weight: integer weights fit as the rows repeated (the
    initialisation's k-means and PPCA, the statistics and the lower bound)."""
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 3, size=len(data))
    means = data[[0, 1, 2]]
    weighted = GaussianMixture(K, covariance_type="factor", n_factors=Q,
                               means_init=means, random_state=0, max_iter=20, tol=1e-8)
    weighted.fit(data, sample_weight=counts.astype(float))
    repeated = GaussianMixture(K, covariance_type="factor", n_factors=Q,
                               means_init=means, random_state=0, max_iter=20, tol=1e-8)
    repeated.fit(np.repeat(data, counts, axis=0))
    np.testing.assert_allclose(weighted.lower_bounds_, repeated.lower_bounds_,
                               rtol=1e-10)
    np.testing.assert_allclose(weighted.means_, repeated.means_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(weighted.noise_variance_, repeated.noise_variance_,
                               rtol=1e-8)


@pytest.mark.parametrize("n, d, K, q, working_memory", [
    (50_000, 10_000, 20, 16, 1024), (50_000, 2500, 50, 16, 1024),
    (50_000, 10_000, 20, 16, 64)])
def test_blocks_within_the_chunked_working_set(n, d, K, q, working_memory):
    """'factor' blocks stay within CHUNKED_BLOCK_MIB and working_memory (by the
    type's bytes per row), whole blocks of equal size in a multiple of 8."""
    from emgmm._runtime import memory
    from emgmm.covariance._factor import FactorCovariance

    kind = FactorCovariance(q)
    rows = memory.block_rows(n, d, K, 8, working_memory, covariance_type=kind)
    budget = min(working_memory, memory.CHUNKED_BLOCK_MIB) * 2**20
    assert rows * kind.bytes_per_row(d, K, 8) <= budget
    assert 2 * rows * kind.bytes_per_row(d, K, 8) > budget  # not needlessly small
    assert -(-n // rows) % memory.BLOCK_MULTIPLE == 0


@pytest.mark.parametrize("n_components", [1, 2])
def test_case_c09_flat_cluster_bound_never_decreases(n_components):
    """A cluster of 20 points on a 2-D plane in 30-D (CASES C09b), with the default
    reg_covar: the noise floored at reg_covar (not raised by it) keeps EM's lower
    bound from decreasing; adding reg_covar made it fall at every iteration."""
    rng = np.random.default_rng(0)
    flat = rng.normal(size=(20, 2)) @ rng.normal(size=(2, 30)) + 10
    X = flat if n_components == 1 else np.vstack([rng.normal(size=(300, 30)), flat])
    gm = GaussianMixture(n_components, covariance_type="factor", n_factors=2,
                         random_state=0, tol=0.0, max_iter=8)
    with pytest.warns(ConvergenceWarning):
        gm.fit(X)
    bounds = np.array(gm.lower_bounds_)
    assert np.all(np.diff(bounds) >= -1e-9 * np.abs(bounds[1:])), bounds
    assert np.all(gm.noise_variance_ >= gm.reg_covar)
