"""Covariance type 'factor' (mixtures of factor analysers): kernels against
independent oracles (scipy.stats, dense numpy, scikit-learn's FactorAnalysis and
GaussianMixture)."""

import numpy as np
import pytest
from scipy.linalg import subspace_angles
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.decomposition import FactorAnalysis
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as SkGaussianMixture
from threadpoolctl import threadpool_limits

from emgmm.covariance import _factor_log_density as fdensity
from emgmm.covariance import _factor_m_step as fmstep
from emgmm.covariance import _factor_parameters as fparams
from emgmm.covariance import _factor_statistics as fstats


@pytest.fixture(autouse=True)
def _one_blas_thread():
    # the kernels' many small products thrash with BLAS threads on a busy machine
    # (the estimator runs them under its own thread limits)
    with threadpool_limits(1):
        yield


def _random_model(rng, K, d, q, psi_range=(-2.0, 1.0), spread=3.0):
    means = rng.normal(scale=spread, size=(K, d))
    loadings = rng.normal(size=(K, d, q))
    noise = 10.0 ** rng.uniform(*psi_range, size=(K, d))
    weights = rng.dirichlet(np.ones(K))
    return weights, means, loadings, noise


def _dense_cov(W, psi):
    return W @ W.T + np.diag(psi)


def _planted(rng, n_per, means, loadings, noise):
    rows = []
    for mu, W, psi in zip(means, loadings, noise, strict=False):
        z = rng.normal(size=(n_per, W.shape[1]))
        rows.append(mu + z @ W.T + rng.normal(size=(n_per, len(mu))) * np.sqrt(psi))
    return np.concatenate(rows)


def _em(X, weights, means, loadings, noise, n_iter, reg_covar=0.0, tol=None, blocks=1):
    """Plain EM with the kernels; returns the parameters and the mean log-likelihoods
    (of the E step of each iteration, as scikit-learn's lower bound)."""
    bounds = []
    for _ in range(n_iter):
        prec = fparams.factorize(loadings, noise)
        stats = fstats.zero_statistics(*loadings.shape)
        for rows in np.array_split(np.arange(len(X)), blocks):
            log_prob, proj = fdensity.estimate_log_prob(X[rows], means, prec, weights)
            log_prob += np.log(weights)
            norm = logsumexp(log_prob, axis=1)
            resp = np.exp(log_prob - norm[:, None])
            stats += fstats.block_statistics(X[rows], resp, means, prec, proj)
            stats.log_likelihood += norm.sum()
        bounds.append(stats.log_likelihood / len(X))
        weights, means, loadings, noise = fmstep.m_step(stats, means, reg_covar)
        if tol is not None and len(bounds) > 1 and abs(bounds[-1] - bounds[-2]) < tol:
            break
    return (weights, means, loadings, noise), np.array(bounds)


# ---------------------------------------------------------------- log-density


@pytest.mark.parametrize("d, q", [(1, 0), (1, 1), (6, 0), (6, 1), (6, 3), (6, 5),
                                  (50, 0), (50, 1), (50, 3), (50, 5)])
def test_log_density_matches_scipy(d, q):
    """Noise variances over five decades (1e-3 to 1e2)."""
    rng = np.random.default_rng(d * 10 + q)
    K = 3
    weights, means, W, psi = _random_model(rng, K, d, q, psi_range=(-3.0, 2.0))
    X = means[rng.integers(K, size=40)] + rng.normal(scale=2.0, size=(40, d))
    got = fdensity.log_gaussian_prob(X, means, fparams.factorize(W, psi), weights)
    assert got.shape == (40, K)
    for k in range(K):
        ref = multivariate_normal(means[k], _dense_cov(W[k], psi[k])).logpdf(X)
        np.testing.assert_allclose(got[:, k], ref, rtol=1e-10, atol=1e-10)


def test_log_density_far_from_origin_and_shift():
    """A tight component far from the mixture mean (expansion cancels): recomputed."""
    rng = np.random.default_rng(1)
    d, q = 8, 2
    means = np.stack([np.full(d, 1e5), np.zeros(d)])
    W = rng.normal(scale=1e-2, size=(2, d, q))
    psi = np.full((2, d), 1e-4)
    X = np.concatenate([means[0] + rng.normal(scale=1e-2, size=(5, d)),
                        rng.normal(size=(5, d))])
    got = fdensity.log_gaussian_prob(X, means, fparams.factorize(W, psi))
    for k in range(2):
        diff = X - means[k]  # the dense oracle, centred exactly
        cov = _dense_cov(W[k], psi[k])
        ref = -0.5 * (np.einsum("ij,ij->i", diff, np.linalg.solve(cov, diff.T).T)
                      + np.linalg.slogdet(cov)[1] + d * np.log(2 * np.pi))
        np.testing.assert_allclose(got[:, k], ref, rtol=1e-10)


def test_log_density_float32_projection_close():
    rng = np.random.default_rng(2)
    _weights, means, W, psi = _random_model(rng, 2, 20, 3)
    X = means[rng.integers(2, size=30)] + rng.normal(size=(30, 20))
    prec = fparams.factorize(W, psi)
    exact = fdensity.log_gaussian_prob(X, means, prec)
    single = fdensity.estimate_log_prob(X.astype(np.float32), means, prec,
                                      dtype=np.float32)[0]
    assert single.dtype == np.float64
    np.testing.assert_allclose(single, exact, rtol=1e-4)


def _strong_factors_float32():
    """float32 rows of 6 components whose 8 factors explain most of the variance
    (d=300): ``(X, labels, weights, means, factorisation)``."""
    rng = np.random.default_rng(20)
    K, d, q, n = 6, 300, 8, 400
    means = rng.normal(scale=2.0, size=(K, d))
    W = rng.normal(size=(K, d, q))
    psi = rng.uniform(0.2, 1.0, size=(K, d))
    lab = rng.integers(K, size=n)
    X = (means[lab] + np.einsum("ndq,nq->nd", W[lab], rng.normal(size=(n, q)))
         + rng.normal(size=(n, d)) * np.sqrt(psi[lab])).astype(np.float32)
    return X, lab, np.full(K, 1.0 / K), means, fparams.factorize(W, psi)


def test_float32_with_margin_exact_where_it_matters():
    """Factors explaining most of the variance: ||p||^2 ~ 1e4 cancels in float32;
    the pairs within the margin of their row's best are recomputed in float64."""
    X, lab, weights, means, prec = _strong_factors_float32()
    n = len(X)
    exact = fdensity.log_gaussian_prob(X.astype(np.float64), means, prec, weights)
    plain = fdensity.estimate_log_prob(X, means, prec, weights, dtype=np.float32)[0]
    refined = fdensity.estimate_log_prob(X, means, prec, weights, dtype=np.float32,
                                       margin=30.0)[0]
    own = (np.arange(n), lab)
    assert np.abs(plain[own] - exact[own]).max() > 1e-6  # the cancellation is real
    np.testing.assert_allclose(refined[own], exact[own], rtol=1e-12)
    weighted = exact + np.log(weights)
    near = weighted >= weighted.max(axis=1, keepdims=True) - 30.0
    np.testing.assert_allclose(refined[near], exact[near], rtol=1e-12)
    np.testing.assert_allclose(refined, exact, rtol=1e-4)


def test_float32_projections_of_a_float64_block_refined_where_it_matters():
    """The margin's refinement follows the projection GEMM's dtype, not the block's:
    a float32 block cast to float64 (the engine's dense path after a screen) with
    float32 projections has the pairs within the margin of their row's best exact
    (as the float32 block has them), the cancellation of the others within bounds."""
    X32, lab, weights, means, prec = _strong_factors_float32()
    X, n = X32.astype(np.float64), len(X32)
    exact = fdensity.log_gaussian_prob(X, means, prec, weights)
    plain = fdensity.estimate_log_prob(X, means, prec, weights, dtype=np.float32)[0]
    refined = fdensity.estimate_log_prob(X, means, prec, weights, dtype=np.float32,
                                         margin=30.0)[0]
    own = (np.arange(n), lab)
    assert np.abs(plain[own] - exact[own]).max() > 1e-6  # the cancellation is real
    weighted = exact + np.log(weights)
    near = weighted >= weighted.max(axis=1, keepdims=True) - 30.0
    np.testing.assert_allclose(refined[near], exact[near], rtol=1e-12)
    same = fdensity.estimate_log_prob(X32, means, prec, weights, dtype=np.float32,
                                      margin=30.0)[0]
    np.testing.assert_array_equal(refined, same)
    np.testing.assert_allclose(refined, exact, rtol=1e-4)


@pytest.mark.parametrize("bad, message", [
    (0.0, "must be positive"), (-1.0, "must be positive"), (np.nan, "not finite")])
def test_factorize_refuses_bad_noise(bad, message):
    psi = np.ones((2, 4))
    psi[1, 2] = bad
    with pytest.raises(ValueError, match=message) as info:
        fparams.factorize(np.zeros((2, 4, 1)), psi)
    assert "component 1" in str(info.value)


def test_factorize_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        fparams.factorize(np.zeros((2, 4, 1)), np.ones((2, 5)))


def test_n_parameters_counts():
    # q = 0 is 'diag': K (2 d) + K - 1, as scikit-learn counts it
    sk = SkGaussianMixture(3, covariance_type="diag").fit(
        np.random.default_rng(0).normal(size=(50, 4)))
    assert fparams.n_parameters(3, 4, 0) == sk._n_parameters()
    # one factor adds d loadings per component; the second d - 1 (a rotation)
    assert fparams.n_parameters(3, 4, 1) - fparams.n_parameters(3, 4, 0) == 3 * 4
    assert fparams.n_parameters(3, 4, 2) - fparams.n_parameters(3, 4, 1) == 3 * 3


# ----------------------------------------------------------------- statistics


def test_block_statistics_match_dense_posterior():
    """Against E[z|x] = W^T Sigma^{-1} (x - mu), Cov = I - W^T Sigma^{-1} W (dense)."""
    rng = np.random.default_rng(3)
    K, d, q, n = 3, 12, 4, 200
    weights, means, W, psi = _random_model(rng, K, d, q)
    X = means[rng.integers(K, size=n)] + rng.normal(scale=2.0, size=(n, d))
    resp = rng.dirichlet(np.ones(K), size=n)
    prec = fparams.factorize(W, psi)
    _, proj = fdensity.estimate_log_prob(X, means, prec, weights)
    got = fstats.block_statistics(X, resp, means, prec, proj)
    for k in range(K):
        r = resp[:, k]
        u = X - means[k]
        beta = np.linalg.solve(_dense_cov(W[k], psi[k]), W[k]).T  # W^T Sigma^-1
        e = u @ beta.T
        cov_z = np.eye(q) - beta @ W[k]
        np.testing.assert_allclose(got.nk[k], r.sum(), rtol=1e-13)
        np.testing.assert_allclose(got.sum_x[k], r @ u, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got.sum_xx[k], r @ u**2, rtol=1e-10)
        np.testing.assert_allclose(got.sum_xz[k], (u * r[:, None]).T @ e,
                                   rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got.sum_z[k], r @ e, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got.sum_zz[k],
                                   (e * r[:, None]).T @ e + r.sum() * cov_z,
                                   rtol=1e-9, atol=1e-9)


def test_block_statistics_far_centres_recomputed():
    """Tight clusters at 1e6 from the shift: the centred sums lose no digits."""
    rng = np.random.default_rng(4)
    d, q = 5, 1
    means = np.stack([np.full(d, 1e6), np.full(d, -1e6)])
    W = np.full((2, d, q), 1e-3)
    psi = np.full((2, d), 1e-6)
    X = np.concatenate([m + rng.normal(scale=1e-3, size=(50, d)) for m in means])
    resp = np.repeat(np.eye(2), 50, axis=0)
    prec = fparams.factorize(W, psi)
    _, proj = fdensity.estimate_log_prob(X, means, prec)
    got = fstats.block_statistics(X, resp, means, prec, proj)
    for k in range(2):
        u = X[resp[:, k] > 0] - means[k]
        np.testing.assert_allclose(got.sum_xx[k], (u**2).sum(axis=0), rtol=1e-9)
        np.testing.assert_allclose(got.sum_x[k], u.sum(axis=0), rtol=1e-6, atol=1e-12)


def _numpy_statistics(X, resp, centers, means, prec):
    """The statistics on the whole array with numpy, from ``x - c_k`` and ``x -
    mu_k`` (no shift, no chunks): ``e = (x - mu) G L^{-1}``."""
    out = {name: [] for name in fstats.FactorStatistics._ARRAYS}
    for k in range(len(centers)):
        r = resp[:, k]
        u = X - centers[k]
        e = ((X - means[k]) @ prec.projection[k]) @ prec.cholesky_inv[k]
        cov_z = prec.cholesky_inv[k].T @ prec.cholesky_inv[k]
        for name, value in (("nk", r.sum()), ("sum_x", r @ u), ("sum_xx", r @ u**2),
                            ("sum_xz", (u * r[:, None]).T @ e), ("sum_z", r @ e),
                            ("sum_zz", (e * r[:, None]).T @ e + r.sum() * cov_z)):
            out[name].append(value)
    return {name: np.array(v) for name, v in out.items()}


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 10_000])
def test_chunked_statistics_equal_numpy_on_the_whole_array(monkeypatch, chunk_rows):
    """Row chunks of 1 to all of the block's rows (also a last, shorter chunk):
    every sum equals numpy's on the whole array to 1e-12."""
    monkeypatch.setattr(fstats, "_MIN_PRODUCT_ROWS", chunk_rows)
    monkeypatch.setattr(fstats, "_CHUNK_BYTES", 1)
    rng = np.random.default_rng(30)
    K, d, q, n = 4, 9, 3, 301
    weights, means, W, psi = _random_model(rng, K, d, q)
    X = means[rng.integers(K, size=n)] + rng.normal(size=(n, d))
    resp = rng.dirichlet(np.ones(K), size=n)
    prec = fparams.factorize(W, psi)
    centers = means + rng.normal(scale=0.1, size=means.shape)
    _, proj = fdensity.estimate_log_prob(X, means, prec, weights)
    got = fstats.block_statistics(X, resp, centers, prec, proj)
    ref = _numpy_statistics(X, resp, centers, means, prec)
    for name, value in ref.items():
        scale = np.abs(value).max()
        np.testing.assert_allclose(getattr(got, name), value, rtol=1e-12,
                                   atol=1e-12 * scale, err_msg=name)


def test_far_component_recomputed_by_chunks(monkeypatch):
    """A tight component 1e6 from the shift: its centred sums are recomputed from
    ``x - c`` in chunks of a few rows, equal to numpy's on the whole array."""
    monkeypatch.setattr(fstats, "_CHUNK_BYTES", 8 * 5 * 3)  # 16 rows per chunk
    rng = np.random.default_rng(31)
    d, q = 5, 2
    means = np.stack([np.full(d, 1e6), np.zeros(d)])
    W = rng.normal(scale=1e-3, size=(2, d, q))
    psi = np.full((2, d), 1e-6)
    X = np.concatenate([means[0] + rng.normal(scale=1e-3, size=(70, d)),
                        rng.normal(size=(40, d))])
    resp = np.zeros((110, 2))
    resp[:70, 0] = 1.0
    resp[70:, 1] = 1.0
    prec = fparams.factorize(W, psi)
    _, proj = fdensity.estimate_log_prob(X, means, prec)
    got = fstats.block_statistics(X, resp, means, prec, proj)
    u = X[:70] - means[0]
    # the E step's posterior means, from x - mu (as the recomputed sums take them)
    e = ((X[:70] - means[0]) @ prec.projection[0]) @ prec.cholesky_inv[0]
    for name, value in (("sum_x", u.sum(axis=0)), ("sum_xx", (u**2).sum(axis=0)),
                        ("sum_xz", u.T @ e)):
        np.testing.assert_allclose(getattr(got, name)[0], value, rtol=1e-12,
                                   atol=1e-12 * np.abs(value).max(), err_msg=name)


def test_diag_distances_recompute_only_the_cancelling_pairs(monkeypatch):
    """The expansion around the shift is kept where its rounding bound is within
    the pair's scale and recomputed from ``x - mu_k`` (in chunks) where not: equal
    to the direct sums on every pair to 1e-12, with the far component's own rows
    the only recomputed pairs."""
    monkeypatch.setattr(fdensity, "_CHUNK_BYTES", 8 * 8 * 3)
    rng = np.random.default_rng(32)
    d = 8
    means = np.stack([np.full(d, 1e5), np.zeros(d), np.ones(d)])
    inv_noise = np.stack([np.full(d, 1e4), np.ones(d), np.full(d, 0.5)])
    X = np.concatenate([means[0] + rng.normal(scale=1e-2, size=(20, d)),
                        rng.normal(size=(30, d))])
    shift = np.zeros(d)
    calls = []
    direct = fdensity._direct_distances
    monkeypatch.setattr(fdensity, "_direct_distances",
                        lambda X, mu, inv, redo, out: (calls.append(redo.copy()),
                                                       direct(X, mu, inv, redo, out)))
    prec = fparams.factorize(np.zeros((len(means), d, 0)), 1.0 / inv_noise)  # q = 0
    got = fdensity._distance_terms(X, means, prec, shift, np.float64)[0]
    ref = np.stack([((X - m) ** 2) @ w for m, w in zip(means, inv_noise,
                                                        strict=True)], axis=1)
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    (redo,) = calls
    assert redo[:20, 0].all() and not redo[:, 1:].any() and not redo[20:, 0].any()


@pytest.mark.parametrize("dense", [False, True])
def test_statistics_of_an_every_pair_block_by_their_nonzero_pairs(monkeypatch, dense):
    """After an E step of every pair, a block whose responsibilities are mostly 0
    (separated components) is summed over its nonzero pairs (gathered, unnormalised
    rows as sample weights make them), one whose pairs mostly hold some by the
    dense chunks: either way equal to numpy's sums
    on the whole array to 1e-12."""
    from emgmm.covariance import _factor_pairs as fpairs
    from emgmm.covariance._factor import FactorCovariance

    rng = np.random.default_rng(33)
    K, d, q, n = 8, 12, 3, 200
    weights, means, W, psi = _random_model(rng, K, d, q)
    X = means[rng.integers(K, size=n)] + rng.normal(size=(n, d))
    resp = rng.dirichlet(np.ones(K), size=n)
    if not dense:  # one pair in 8 holds a responsibility (each row's largest)
        resp[resp < resp.max(axis=1, keepdims=True)] = 0.0
    prec = fparams.factorize(W, psi)
    _, proj = fdensity.estimate_log_prob(X, means, prec, weights)
    assert proj.computed and fstats.dense_pays(resp) == dense
    from emgmm.covariance import _factor

    gathered = []
    monkeypatch.setattr(_factor, "pair_statistics", lambda *a, **k: gathered.append(1)
                        or fpairs.pair_statistics(*a, **k))
    got = FactorCovariance(q).block_statistics(X, resp, means, products=proj)
    assert len(gathered) == (not dense)
    ref = _numpy_statistics(X, resp, means, means, prec)
    for name, value in ref.items():
        np.testing.assert_allclose(getattr(got, name), value, rtol=1e-12,
                                   atol=1e-12 * np.abs(value).max(), err_msg=name)


def test_resp_threshold_leaves_out_pairs():
    rng = np.random.default_rng(5)
    _weights, means, W, psi = _random_model(rng, 2, 6, 2)
    X = rng.normal(size=(30, 6))
    resp = rng.dirichlet(np.ones(2), size=30)
    prec = fparams.factorize(W, psi)
    _, proj = fdensity.estimate_log_prob(X, means, prec)
    cut = fstats.block_statistics(X, resp, means, prec, proj, resp_threshold=0.3)
    kept = np.where(resp > 0.3, resp, 0.0)
    ref = fstats.block_statistics(X, kept, means, prec, proj)
    for name in fstats.FactorStatistics._ARRAYS:
        np.testing.assert_array_equal(getattr(cut, name), getattr(ref, name))
    assert cut.nk[0] < resp[:, 0].sum()


# ------------------------------------------------------------------- M step


def _statistics_problem(seed, K, d, q, n):
    """Rows around a random model's means, Dirichlet responsibilities and their
    dense statistics: ``(X, resp, means, W, psi, stats)``."""
    rng = np.random.default_rng(seed)
    _weights, means, W, psi = _random_model(rng, K, d, q)
    X = means[rng.integers(K, size=n)] + rng.normal(scale=2.0, size=(n, d))
    resp = rng.dirichlet(np.ones(K), size=n)
    prec = fparams.factorize(W, psi)
    _, proj = fdensity.estimate_log_prob(X, means, prec)
    return X, resp, means, W, psi, fstats.block_statistics(X, resp, means, prec, proj)


def test_m_step_equals_uncentred_augmented_formula():
    """Ghahramani & Hinton's update written with uncentred x and z~ = [z; 1]."""
    X, resp, means, W, psi, stats = _statistics_problem(6, 2, 7, 3, 300)
    K, q, n = 2, 3, 300
    _, new_means, new_W, new_psi = fmstep.m_step(stats, means, 0.0)
    for k in range(K):
        r = resp[:, k]
        beta = np.linalg.solve(_dense_cov(W[k], psi[k]), W[k]).T
        e = (X - means[k]) @ beta.T
        ez = np.hstack([e, np.ones((n, 1))])
        ezz = (ez * r[:, None]).T @ ez
        ezz[:q, :q] += r.sum() * (np.eye(q) - beta @ W[k])
        aug = ((X * r[:, None]).T @ ez) @ np.linalg.inv(ezz)
        ref_psi = np.diag((X * r[:, None]).T @ X
                          - aug @ ((ez * r[:, None]).T @ X)) / r.sum()
        np.testing.assert_allclose(new_W[k], aug[:, :q], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(new_means[k], aug[:, q], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(new_psi[k], ref_psi, rtol=1e-7)


def test_m_step_floor_and_empty_component():
    stats = fstats.zero_statistics(2, 3, 2)
    stats.nk[0] = 4.0
    stats.sum_zz[0] = 4.0 * np.eye(2)
    stats.sum_xx[0] = 1e-30  # rounding below the explained part
    stats.sum_xz[0] = 1e-10
    _weights, means, W, psi = fmstep.m_step(stats, np.ones((2, 3)), 1e-6)
    assert np.all(np.isfinite(W)) and np.all(np.isfinite(psi))
    assert np.all(psi >= 1e-6)
    np.testing.assert_array_equal(W[1], 0.0)
    np.testing.assert_array_equal(means[1], 1.0)


@pytest.mark.parametrize("threads", [2, 5])
def test_m_step_and_factorisation_in_threads_equal_one_thread(threads):
    """Components in ranges of threads give bitwise the M step and factors of one."""
    _, _, means, _, _, stats = _statistics_problem(16, 7, 9, 3, 400)
    one = fmstep.m_step(stats, means, 1e-6)
    many = fmstep.m_step(stats, means, 1e-6, threads=threads)
    for a, b in zip(many, one, strict=True):
        np.testing.assert_array_equal(a, b)
    one = fparams.factorize(one[2], one[3])
    many = fparams.factorize(many[2], many[3], threads=threads)
    for name in ("inv_noise", "projection", "cholesky_inv", "log_det"):
        np.testing.assert_array_equal(getattr(many, name), getattr(one, name))


# ---------------------------------------------------------------------- EM


def test_q0_equals_sklearn_diag():
    """No factors and no floor (reg_covar=0: 'factor' floors its noise at reg_covar,
    scikit-learn's 'diag' adds it): scikit-learn's fit."""
    rng = np.random.default_rng(7)
    K, d, n = 3, 5, 600
    X = np.concatenate([rng.normal(loc=4 * k, size=(n // K, d)) for k in range(K)])
    w0 = np.full(K, 1.0 / K)
    mu0 = X[[0, n // 2, n - 1]] + 0.1
    var0 = np.ones((K, d))
    sk = SkGaussianMixture(K, covariance_type="diag", weights_init=w0, means_init=mu0,
                           precisions_init=1.0 / var0, max_iter=15, tol=0,
                           reg_covar=0.0)
    with pytest.warns(ConvergenceWarning):
        sk.fit(X)
    (w, mu, _W, psi), bounds = _em(X, w0, mu0, np.zeros((K, d, 0)), var0, 15,
                                  reg_covar=0.0)
    # scikit-learn's lower_bound_ is the mean log-likelihood of its last E step
    np.testing.assert_allclose(bounds[-1], sk.lower_bound_, rtol=1e-10)
    np.testing.assert_allclose(mu, sk.means_, rtol=1e-8)
    np.testing.assert_allclose(psi, sk.covariances_, rtol=1e-8)
    np.testing.assert_allclose(w, sk.weights_, rtol=1e-8)


def test_single_component_reaches_factor_analysis():
    rng = np.random.default_rng(8)
    d, q, n = 10, 2, 2000
    W_true = rng.normal(size=(1, d, q))
    psi_true = rng.uniform(0.2, 1.0, size=(1, d))
    X = _planted(rng, n, rng.normal(size=(1, d)), W_true, psi_true)
    fa = FactorAnalysis(n_components=q, tol=1e-12, max_iter=10000,
                        svd_method="lapack").fit(X)
    start = fmstep.initial_parameters(X, np.ones((n, 1)), q, 0.0)
    (_w, _mu, W, psi), bounds = _em(X, *start, 20000, tol=1e-13)
    assert abs(bounds[-1] - bounds[-2]) < 1e-13
    np.testing.assert_allclose(bounds[-1], fa.score(X), rtol=1e-6)
    # and the same covariance (W is only defined up to a rotation)
    np.testing.assert_allclose(_dense_cov(W[0], psi[0]), fa.get_covariance(),
                               rtol=1e-3, atol=1e-3)


def test_lower_bound_never_decreases():
    rng = np.random.default_rng(9)
    K, d, q = 4, 8, 2
    _, means, W, psi = _random_model(rng, K, d, q, psi_range=(-1.0, 0.0))
    X = _planted(rng, 150, means, W, psi)
    resp = rng.dirichlet(np.ones(K), size=len(X))
    start = fmstep.initial_parameters(X, resp, q, 0.0)
    _, bounds = _em(X, *start, 60, blocks=3)
    assert np.all(np.diff(bounds) >= -1e-12 * np.abs(bounds[1:]))
    assert bounds[-1] > bounds[0] + 0.1


def test_blocks_sum_to_the_whole():
    rng = np.random.default_rng(10)
    _, means, W, psi = _random_model(rng, 3, 9, 2)
    X = _planted(rng, 100, means, W, psi)
    start = fmstep.initial_parameters(X, rng.dirichlet(np.ones(3), size=300), 2, 1e-6)
    one, b1 = _em(X, *start, 5)
    many, b7 = _em(X, *start, 5, blocks=7)
    np.testing.assert_allclose(b1, b7, rtol=1e-12)
    for a, b in zip(one, many, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_planted_factor_model_recovered():
    rng = np.random.default_rng(11)
    K, d, q = 3, 20, 2
    means = 12.0 * np.eye(K, d)
    W_true = rng.normal(size=(K, d, q))
    psi_true = rng.uniform(0.05, 0.2, size=(K, d))
    n_per = 3000
    X = _planted(rng, n_per, means, W_true, psi_true)
    labels = np.repeat(np.arange(K), n_per)
    resp = np.eye(K)[(labels + 1) % K]  # a relabelled, exact partition
    start = fmstep.initial_parameters(X, resp, q, 1e-6)
    (w, mu, W, psi), _ = _em(X, *start, 300, reg_covar=1e-6, tol=1e-10)
    for k in range(K):
        j = np.argmin(np.linalg.norm(mu - means[k], axis=1))
        assert np.max(subspace_angles(W[j], W_true[k])) < 0.05
        np.testing.assert_allclose(psi[j], psi_true[k], rtol=0.15)
        np.testing.assert_allclose(w[j], 1.0 / K, rtol=1e-3)


@pytest.mark.slow
def test_many_factors_approach_full():
    """q = d - 1 spans any 3 x 3 covariance: from a start with 10% of the labels
    wrong, EM reaches scikit-learn's 'full' maximum; fewer factors fall short."""
    rng = np.random.default_rng(12)
    d, K, n = 3, 2, 4000
    covs = [np.array([[2.0, 1.2, 0.3], [1.2, 1.5, -0.4], [0.3, -0.4, 1.0]]),
            np.array([[1.0, -0.5, 0.2], [-0.5, 0.8, 0.1], [0.2, 0.1, 0.5]])]
    X = np.concatenate([rng.multivariate_normal(m, c, size=n // K)
                        for m, c in zip([np.zeros(d), np.full(d, 8.0)], covs,
                                        strict=False)])
    full = SkGaussianMixture(K, covariance_type="full", tol=1e-12, max_iter=1000,
                             reg_covar=0.0, means_init=[X[:n // 2].mean(0),
                                                        X[n // 2:].mean(0)]).fit(X)
    best = full.score(X)
    labels = np.repeat(np.arange(K), n // K)
    flip = rng.random(n) < 0.1
    labels[flip] = 1 - labels[flip]
    scores = []
    for q in (0, 1, 2):
        start = fmstep.initial_parameters(X, np.eye(K)[labels], q, 0.0)
        params, _bounds = _em(X, *start, 400, tol=1e-10)
        prec = fparams.factorize(params[2], params[3])
        log_prob = fdensity.log_gaussian_prob(X, params[1], prec) + np.log(params[0])
        scores.append(logsumexp(log_prob, axis=1).mean())
    assert scores[0] < scores[1] < scores[2] <= best + 1e-12
    assert best - scores[2] < 1e-8
    assert best - scores[1] > 1e-2


# ------------------------------------------------------------ initialisation


def test_initial_parameters_are_ppca_of_each_component():
    rng = np.random.default_rng(13)
    d, q, n = 15, 3, 400
    X = _planted(rng, n, rng.normal(size=(1, d)), rng.normal(size=(1, d, q)),
                 np.full((1, d), 0.3))
    _w, mu, W, psi = fmstep.initial_parameters(X, np.ones((n, 1)), q, 1e-6)
    cov = np.cov(X.T, bias=True)
    lam, V = np.linalg.eigh(cov)
    sigma2 = lam[:-q].mean()
    np.testing.assert_allclose(mu[0], X.mean(axis=0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.linalg.svd(W[0], compute_uv=False) ** 2,
                               lam[::-1][:q] - sigma2, rtol=1e-8)
    assert np.max(subspace_angles(W[0], V[:, -q:])) < 1e-6
    np.testing.assert_allclose(np.diag(_dense_cov(W[0], psi[0])),
                               np.diag(cov) + 1e-6, rtol=1e-10)


def test_initial_parameters_randomized_svd_for_large_components():
    rng = np.random.default_rng(14)
    d, q, n = 700, 2, 800
    X = _planted(rng, n, np.zeros((1, d)), 3.0 * rng.normal(size=(1, d, q)),
                 np.full((1, d), 0.5))
    _, _, W, psi = fmstep.initial_parameters(X, np.ones((n, 1)), q, 1e-6,
                                             random_state=0)
    cov_top = np.linalg.svd(X - X.mean(0), full_matrices=False)[2][:q].T
    assert np.max(subspace_angles(W[0], cov_top)) < 1e-3
    assert np.all(psi >= 1e-6)


# ------------------------------------------------- dense forms, sampling, re-seeds


def test_dense_forms_match_numpy():
    rng = np.random.default_rng(15)
    _, _, W, psi = _random_model(rng, 3, 7, 2)
    cov = fparams.covariances(W, psi)
    prec = fparams.precisions(fparams.factorize(W, psi))
    U = fparams.precisions_cholesky(W, psi)
    for k in range(3):
        dense = _dense_cov(W[k], psi[k])
        np.testing.assert_allclose(cov[k], dense, rtol=1e-14)
        np.testing.assert_allclose(prec[k], np.linalg.inv(dense), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(U[k] @ U[k].T, np.linalg.inv(dense), rtol=1e-9,
                                   atol=1e-12)
        np.testing.assert_array_equal(np.tril(U[k], -1), 0.0)


def test_sample_moments():
    rng = np.random.default_rng(16)
    _, means, W, psi = _random_model(rng, 2, 4, 2)
    X = fparams.sample(np.random.default_rng(0), means, W, psi, [40_000, 10])
    assert X.shape == (40_010, 4)
    top = X[:40_000]
    np.testing.assert_allclose(top.mean(axis=0), means[0],
                               atol=5 * np.sqrt(np.diag(_dense_cov(W[0], psi[0])).max()
                                                / 40_000))
    np.testing.assert_allclose(np.cov(top.T), _dense_cov(W[0], psi[0]), rtol=0.05,
                               atol=0.05)


def test_reseed_pools_the_healthy_components_as_one_factor_analyser():
    """A re-seeded component gets the healthy components' pooled covariance ``sum_k
    w_k (W_k W_k^T + Psi_k)`` as one factor analyser (FactorCovariance.
    pooled_covariance): loadings spanning its top ``q`` eigenvalues of the pooled
    ``W W^T`` (not ``W = 0``, a fixed point of the factor EM), and the pooled
    marginal variances where the noise is not floored, against dense numpy."""
    from emgmm.covariance._factor import (
        FactorCovariance,
        pack_parameters,
        unpack_parameters,
    )

    rng = np.random.default_rng(17)
    weights, _, W, psi = _random_model(rng, 3, 5, 2)
    pooled = FactorCovariance(2).pooled_covariance(weights, pack_parameters(W, psi),
                                                   [0, 2])
    W1, psi1 = unpack_parameters(pooled[None])
    w = weights[[0, 2]] / weights[[0, 2]].sum()
    loadings = sum(wi * W[k] @ W[k].T for wi, k in zip(w, [0, 2], strict=True))
    values, vectors = np.linalg.eigh(loadings)
    top = (vectors[:, -2:] * values[-2:]) @ vectors[:, -2:].T
    np.testing.assert_allclose(W1[0] @ W1[0].T, top, atol=1e-12)
    marginal = sum(wi * np.diag(_dense_cov(W[k], psi[k]))
                   for wi, k in zip(w, [0, 2], strict=True))
    floor = psi[[0, 2]].min(axis=0)
    got = np.diag(_dense_cov(W1[0], psi1[0]))
    free = psi1[0] > floor
    assert free.any()
    np.testing.assert_allclose(got[free], marginal[free], rtol=1e-12)
    assert (got >= marginal * (1 - 1e-12)).all() and (psi1[0] >= floor).all()


def test_bad_components_and_recentring():
    psi = np.ones((3, 4))
    psi[2, 1] = 0.0
    psi[0, 3] = np.nan
    np.testing.assert_array_equal(fparams.bad_components(psi), [0, 2])
    # the engine's re-centring rule, on the statistics of 'factor'
    from emgmm.covariance._factor import FactorCovariance, pack_parameters
    from emgmm.covariance._m_step import needs_recentring

    kind = FactorCovariance(1)
    stats = fstats.zero_statistics(2, 3, 1)
    stats.nk[:] = [10.0, 0.0]
    stats.sum_x[0] = 10.0 * 1e4  # the mean moved 1e4 from its centre
    stats.sum_abs_x[0] = np.abs(stats.sum_x[0])
    tight = pack_parameters(np.zeros((2, 3, 1)), np.full((2, 3), 1e-2))
    flagged = needs_recentring(stats, np.zeros((2, 3)), tight, kind)
    np.testing.assert_array_equal(flagged, [True, False])
    stats.sum_x[0] = stats.sum_abs_x[0] = 10.0 * 1e-3
    broad = pack_parameters(np.zeros((2, 3, 1)), np.ones((2, 3)))
    assert not needs_recentring(stats, np.zeros((2, 3)), broad, kind).any()


def _far_tight_problem(rng, move):
    """A broad component at the origin and a tight one at 1e4 whose rows' mean
    moved by ``move`` from the E step's mean: ``(X, resp, weights, means, prec)``,
    responsibilities hard."""
    d, q, n = 4, 1, 200
    means = np.stack([np.zeros(d), np.full(d, 1e4)])
    W = np.stack([np.ones((d, q)), np.full((d, q), 1e-4)])
    psi = np.stack([np.ones(d), np.full(d, 1e-6)])
    X = np.concatenate([rng.normal(size=(n, d)),
                        means[1] + move + rng.normal(scale=1e-3, size=(n, d))])
    resp = np.repeat(np.eye(2), n, axis=0)
    return X, resp, np.full(2, 0.5), means, fparams.factorize(W, psi)


def _blended_problem(rng, K=3, d=6, q=2, n=300):
    """Rows of a random model, blended responsibilities and centres off its means:
    ``(X, resp, weights, means, centers, precision)``."""
    weights, means, W, psi = _random_model(rng, K, d, q)
    X = means[rng.integers(K, size=n)] + rng.normal(size=(n, d))
    resp = rng.dirichlet(np.full(K, 0.3), size=n)
    centers = means + rng.normal(scale=0.5, size=means.shape)
    return X, resp, weights, means, centers, fparams.factorize(W, psi)


def test_sum_abs_x_is_the_size_of_the_terms_that_sum_x_is_summed_from():
    """Gathered pairs: exactly ``sum r |x - mu| + N |c - mu|``; a dense block: at
    least its terms (``sum r |x - shift|`` and ``N |c - shift|``), and for a far
    component summed again centred, between ``sum r |x - c|`` and its
    Cauchy-Schwarz bound."""
    from emgmm.covariance._factor_pairs import pair_statistics

    rng = np.random.default_rng(21)
    X, resp, weights, means, centers, prec = _blended_problem(rng)
    K = resp.shape[1]
    pairs = pair_statistics(X, resp, centers, means, prec)
    for k in range(K):
        r = resp[:, k]
        np.testing.assert_allclose(
            pairs.sum_abs_x[k],
            r @ np.abs(X - means[k]) + r.sum() * np.abs(centers[k] - means[k]),
            rtol=1e-12)
    _, proj = fdensity.estimate_log_prob(X, means, prec, weights)
    dense = fstats.block_statistics(X, resp, centers, prec, proj)
    terms = resp.T @ np.abs(X - proj.shift) + resp.sum(axis=0)[:, None] * np.abs(
        centers - proj.shift)
    assert (dense.sum_abs_x >= terms * (1 - 1e-12)).all()
    Xf, rf, wf, mf, pf = _far_tight_problem(rng, 0.0)
    far = fstats.block_statistics(Xf, rf, mf, pf,
                                  fdensity.estimate_log_prob(Xf, mf, pf, wf)[1])
    u = Xf[rf[:, 1] > 0] - mf[1]  # (recomputed centred: m = 5e3 >> its spread)
    assert (far.sum_abs_x[1] >= np.abs(u).sum(axis=0) * (1 - 1e-12)).all()
    assert (far.sum_abs_x[1]
            <= np.sqrt(len(u) * (u**2).sum(axis=0)) * (1 + 1e-12)).all()
    assert (far.sum_abs_x[1] < 1.0).all()


def test_sum_abs_x_joins_as_the_sums_do():
    """``+``, ``+=``, ``out=`` and joins along the components carry ``sum_abs_x``;
    ``None`` (running statistics) wins any join."""
    from emgmm.covariance._factor_pairs import pair_statistics

    X, resp, _, means, centers, prec = _blended_problem(np.random.default_rng(22))
    K, n = resp.shape[1], len(X)
    pairs = pair_statistics(X, resp, centers, means, prec)
    dense = fstats.block_statistics(X, resp, centers, prec)
    halves = [pair_statistics(X[rows], resp[rows], centers, means, prec)
              for rows in (slice(0, 100), slice(100, n))]
    expected = halves[0].sum_abs_x + halves[1].sum_abs_x
    np.testing.assert_array_equal((halves[0] + halves[1]).sum_abs_x, expected)
    running = pair_statistics(X[:100], resp[:100], centers, means, prec)
    pair_statistics(X[100:], resp[100:], centers, means, prec, out=running)
    np.testing.assert_allclose(running.sum_abs_x, pairs.sum_abs_x, rtol=1e-12)
    joined = fstats.concatenate_statistics([pairs, dense])
    np.testing.assert_array_equal(joined.sum_abs_x[K:], dense.sum_abs_x)
    halves[1].sum_abs_x = None
    assert (halves[0] + halves[1]).sum_abs_x is None
    assert fstats.concatenate_statistics(halves).sum_abs_x is None
    pair_statistics(X[:10], resp[:10], centers, means, prec, out=halves[1])
    halves[0] += halves[1]
    assert halves[0].sum_abs_x is None and halves[1].sum_abs_x is None


@pytest.mark.parametrize("path", ["dense", "pairs"])
@pytest.mark.parametrize("move, flagged", [(1e3, True), (1e-3, False)])
def test_recentring_flags_a_tight_component_that_moved_far(path, move, flagged):
    """Statistics of a tight component at 1e4 (noise 1e-6) whose rows moved by
    ``move``: by 1e3 the M step loses every digit of its noise and a pass around
    the new means is taken; by 1e-3 the centred sums lose none (``|mu|`` as the
    sums' scale flagged it)."""
    from emgmm.covariance._factor import FactorCovariance
    from emgmm.covariance._factor_pairs import pair_statistics
    from emgmm.covariance._m_step import needs_recentring

    X, resp, weights, means, prec = _far_tight_problem(np.random.default_rng(8), move)
    if path == "dense":
        proj = fdensity.estimate_log_prob(X, means, prec, weights)[1]
        stats = fstats.block_statistics(X, resp, means, prec, proj)
    else:
        stats = pair_statistics(X, resp, means, means, prec)
    kind = FactorCovariance(1)
    _, new_means, packed = kind.m_step(stats, means, 0.0)
    got = needs_recentring(stats, new_means, packed, kind)
    np.testing.assert_array_equal(got, [False, flagged])


def test_recentring_weighs_the_centred_sums_and_the_loadings():
    """'factor' sums are centred, so the scale of ``sum_x``'s rounding is its own
    ``sum_abs_x``, not ``|mu|``; and a move that the loadings' variance dwarfs
    gains no digit from a second pass."""
    from emgmm.covariance._factor import FactorCovariance, pack_parameters
    from emgmm.covariance._m_step import needs_recentring

    kind = FactorCovariance(1)
    stats = fstats.zero_statistics(1, 2, 1)
    stats.nk[:] = 10.0
    stats.sum_x[:] = 10.0 * 1.0            # moved by 1 from its centre,
    stats.sum_abs_x[:] = 10.0 * 2.0        # over terms of size 2
    means = np.full((1, 2), 1e4)           # far from the origin
    psi = np.full((1, 2), 1e-6)
    loaded = pack_parameters(np.ones((1, 2, 1)), psi)   # ||W_j||^2 = 1
    bare = pack_parameters(np.zeros((1, 2, 1)), psi)
    # moved = 1 (1 + 2 * 2) = 5: above 1e6 psi, but under 9 times the loadings'
    assert not needs_recentring(stats, means, loaded, kind).any()
    assert needs_recentring(stats, means, bare, kind).all()
    stats.sum_abs_x = None                 # (running statistics): |mu| it is
    assert needs_recentring(stats, means, loaded, kind).all()


def test_statistics_around_other_centres_give_the_same_m_step():
    """The re-centring pass: sums around the new means, e of the E step."""
    rng = np.random.default_rng(18)
    K, d, q, n = 2, 6, 2, 400
    weights, means, W, psi = _random_model(rng, K, d, q)
    X = means[rng.integers(K, size=n)] + rng.normal(size=(n, d))
    resp = rng.dirichlet(np.ones(K), size=n)
    prec = fparams.factorize(W, psi)
    _, proj = fdensity.estimate_log_prob(X, means, prec, weights)
    stats = fstats.block_statistics(X, resp, means, prec, proj)
    again = fstats.block_statistics(X, resp, means, prec)  # projections built here
    for name in fstats.FactorStatistics._ARRAYS:
        np.testing.assert_allclose(getattr(again, name), getattr(stats, name),
                                   rtol=1e-12, atol=1e-12)
    first = fmstep.m_step(stats, means, 1e-6)
    moved = fstats.block_statistics(X, resp, first[1], prec, means=means)
    second = fmstep.m_step(moved, first[1], 1e-6)
    for a, b in zip(first, second, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_component_slices_join_to_the_whole():
    rng = np.random.default_rng(19)
    K, d, q, n = 5, 8, 3, 100
    _weights, means, W, psi = _random_model(rng, K, d, q)
    X = rng.normal(scale=3.0, size=(n, d))
    prec = fparams.factorize(W, psi)
    whole = fdensity.log_gaussian_prob(X, means, prec)
    resp = rng.dirichlet(np.ones(K), size=n)
    parts = []
    for k0, k1 in [(0, 2), (2, 5)]:
        sub = prec.take(k0, k1)
        np.testing.assert_allclose(fdensity.log_gaussian_prob(X, means[k0:k1], sub),
                                   whole[:, k0:k1], rtol=1e-12)
        parts.append(fstats.block_statistics(X, resp[:, k0:k1], means[k0:k1], sub))
    joined = fstats.concatenate_statistics(parts)
    ref = fstats.block_statistics(X, resp, means, prec)
    for name in fstats.FactorStatistics._ARRAYS:
        np.testing.assert_allclose(getattr(joined, name), getattr(ref, name),
                                   rtol=1e-11, atol=1e-11)
