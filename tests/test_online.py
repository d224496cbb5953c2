"""The stepwise online EM kernels (emgmm._engine.online) against numpy oracles.

The oracle sums the weighted statistics over the whole array directly (einsum over
every row, component and feature), around whichever centres are asked for; the
kernels only ever see the summed statistics.
"""

import numpy as np
import pytest
from helpers import SKLEARN_ONLINE_COVARIANCE_TYPES

from emgmm._engine import online


def _problem(seed, n=50, K=3, d=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * 3.0 + 10.0
    resp = rng.dirichlet(np.ones(K), size=n)
    w = rng.uniform(0.1, 3.0, size=n)
    centers = rng.normal(size=(K, d)) + 10.0
    return X, resp, w, centers


def _oracle(X, resp, w, centers, ct, normalise=True):
    """(N, s, S) around ``centers``, summed over every row (divided by sum w)."""
    diff = X[:, None, :] - centers[None, :, :]
    wr = w[:, None] * resp
    N = wr.sum(axis=0)
    s = np.einsum("nk,nkd->kd", wr, diff)
    if ct in ("full", "tied"):
        S = np.einsum("nk,nkd,nke->kde", wr, diff, diff)
        if ct == "tied":
            S = S.sum(axis=0)
    else:
        S = np.einsum("nk,nkd->kd", wr, diff**2)
    total = w.sum() if normalise else 1.0
    return N / total, s / total, S / total


def _oracle_m_step(N, s, S, centers, reg, ct):
    """Weights, means, covariances from statistics (no 10 eps guard)."""
    delta = s / N[:, None]
    means = centers + delta
    d = centers.shape[1]
    if ct == "full":
        cov = (S / N[:, None, None] - np.einsum("kd,ke->kde", delta, delta)
               + reg * np.eye(d))
    elif ct == "tied":
        cov = (S - (delta.T * N) @ delta) / N.sum() + reg * np.eye(d)
    else:
        cov = S / N[:, None] - delta**2 + reg
        if ct == "spherical":
            cov = cov.mean(axis=1)
    return N / N.sum(), means, cov


def _stats(X, resp, w, centers, ct):
    N, s, S = _oracle(X, resp, w, centers, ct, normalise=False)
    return online.normalised(N, s, S, centers, w.sum(), ct)


def _assert_stats(stats, expected, rtol=1e-12, atol=1e-12):
    for got, want in zip((stats.nk, stats.sum_x, stats.sum_xx), expected, strict=False):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("ct", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_normalised_divides_by_the_total_weight(ct):
    X, resp, w, c = _problem(0)
    stats = _stats(X, resp, w, c, ct)
    _assert_stats(stats, _oracle(X, resp, w, c, ct))
    np.testing.assert_allclose(stats.nk.sum(), 1.0, rtol=1e-14)


@pytest.mark.parametrize("ct", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_shift_centres_equals_the_statistics_summed_around_the_new_centres(ct):
    X, resp, w, c = _problem(1)
    new = c + np.random.default_rng(5).normal(size=c.shape)
    shifted = online.shift_centres(_stats(X, resp, w, c, ct), new)
    np.testing.assert_array_equal(shifted.centers, new)
    _assert_stats(shifted, _oracle(X, resp, w, new, ct), rtol=1e-10, atol=1e-10)


def test_shift_centres_upper_triangle_depends_only_on_upper_triangles():
    X, resp, w, c = _problem(2)
    stats = _stats(X, resp, w, c, "full")
    garbage = online.OnlineStatistics(stats.nk, stats.sum_x, stats.sum_xx.copy(),
                                      stats.centers, "full")
    lower = np.tril(np.ones(stats.sum_xx.shape[1:], dtype=bool), -1)
    garbage.sum_xx[:, lower] = 1e30
    new = c + 1.0
    want, got = online.shift_centres(stats, new), online.shift_centres(garbage, new)
    upper = ~lower
    np.testing.assert_array_equal(got.sum_xx[:, upper], want.sum_xx[:, upper])


def test_shift_centres_does_not_modify_its_input():
    X, resp, w, c = _problem(3)
    stats = _stats(X, resp, w, c, "full")
    before = [a.copy() for a in (stats.nk, stats.sum_x, stats.sum_xx, stats.centers)]
    online.shift_centres(stats, c + 2.0)
    for a, b in zip((stats.nk, stats.sum_x, stats.sum_xx, stats.centers), before,
                    strict=False):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ct", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_stepwise_update_is_the_convex_combination_around_the_running_centres(ct):
    XA, rA, wA, cA = _problem(4)
    XB, rB, wB, cB = _problem(5)  # summed around other centres
    eta = 0.3
    got = online.stepwise_update(_stats(XA, rA, wA, cA, ct), _stats(XB, rB, wB, cB, ct),
                                 eta)
    A, B = _oracle(XA, rA, wA, cA, ct), _oracle(XB, rB, wB, cA, ct)
    np.testing.assert_array_equal(got.centers, cA)
    _assert_stats(got, [(1 - eta) * a + eta * b for a, b in zip(A, B, strict=False)],
                  rtol=1e-10, atol=1e-10)


def test_step_size_formula_and_defaults():
    assert online.step_size(1) == (1 + 10.0) ** -0.7
    assert online.step_size(7, 0.6, 2.5) == (7 + 2.5) ** -0.6
    assert ([online.step_size(t, 1.0, 0.0) for t in (1, 2, 3, 10)]
            == [1.0, 0.5, 1 / 3, 0.1])
    assert (online.DEFAULT_LEARNING_DECAY == 0.7
            and online.DEFAULT_LEARNING_OFFSET == 10.0)


@pytest.mark.parametrize("kwargs, match", [
    ({"step": 1, "learning_decay": 0.5}, "learning_decay must be in"),
    ({"step": 1, "learning_decay": 1.01}, "learning_decay must be in"),
    ({"step": 1, "learning_decay": float("nan")}, "learning_decay must be in"),
    ({"step": 1, "learning_offset": -1.0}, "learning_offset must be"),
    ({"step": 1, "learning_offset": float("inf")}, "learning_offset must be"),
    ({"step": 0}, "step must be an integer >= 1"),
    ({"step": 1.5}, "step must be an integer >= 1"),
])
def test_step_size_refuses_out_of_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        online.step_size(**kwargs)


@pytest.mark.parametrize("ct", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_alpha_one_t0_zero_gives_the_plain_average_of_the_batches(ct):
    """s_t = s_{t-1} + (1/t)(sbar_t - s_{t-1}) from any s_0: the mean of sbar_1..t,
    whatever centres each batch was summed around."""
    X0, r0, w0, c0 = _problem(10)
    running = _stats(X0, r0, w0, c0, ct)  # s_0, discarded by eta_1 = 1
    batches = [_problem(20 + t) for t in range(6)]
    for t, (X, r, w, c) in enumerate(batches, start=1):
        running = online.stepwise_update(running, _stats(X, r, w, c, ct),
                                         online.step_size(t, 1.0, 0.0))
    parts = [_oracle(X, r, w, c0, ct) for X, r, w, _ in batches]
    _assert_stats(running, [np.mean(p, axis=0) for p in zip(*parts, strict=False)],
                  rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("ct", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_implied_statistics_invert_the_m_step(ct):
    X, resp, w, c = _problem(6)
    reg = 1e-3
    weights, means, cov = _oracle_m_step(*_oracle(X, resp, w, c, ct), c, reg, ct)
    implied = online.implied_statistics(weights, means, cov, reg, ct)
    np.testing.assert_array_equal(implied.centers, means)
    np.testing.assert_array_equal(implied.sum_x, 0.0)
    back = _oracle_m_step(implied.nk, implied.sum_x, implied.sum_xx, implied.centers,
                          reg, ct)
    for got, want in zip(back, (weights, means, cov), strict=False):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    if ct != "spherical":  # (spherical keeps only the features' mean)
        recentred = _oracle(X, resp, w, means, ct)
        _assert_stats(implied, (recentred[0], np.zeros_like(means), recentred[2]),
                      rtol=1e-10, atol=1e-10)


def test_float64_deterministic_and_arrays_round_trip():
    X, resp, w, c = _problem(7)
    N, s, S = (a.astype(np.float32) for a in _oracle(X, resp, w, c, "full", False))
    one = online.normalised(N, s, S, c.astype(np.float32), w.sum(), "full")
    two = online.normalised(N, s, S, c.astype(np.float32), w.sum(), "full")
    for a, b in zip(online.to_arrays(one).values(), online.to_arrays(two).values(),
                    strict=False):
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, b)
    back = online.from_arrays(online.to_arrays(one), "full")
    for a, b in zip(online.to_arrays(back).values(), online.to_arrays(one).values(),
                    strict=False):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(online_nk=np.ones(5)), "nk has shape"),
    (lambda a: a.update(online_sum_xx=np.ones((3, 4))), "sum_xx has shape"),
])
def test_from_arrays_checks_shapes(change, match):
    X, resp, w, c = _problem(8)
    arrays = online.to_arrays(_stats(X, resp, w, c, "full"))
    change(arrays)
    with pytest.raises(ValueError, match=match):
        online.from_arrays(arrays, "full")


@pytest.mark.parametrize("eta", [-0.1, 1.5, float("nan")])
def test_stepwise_update_refuses_eta_outside_unit_interval(eta):
    X, resp, w, c = _problem(9)
    stats = _stats(X, resp, w, c, "diag")
    with pytest.raises(ValueError, match="eta must be in"):
        online.stepwise_update(stats, stats, eta)


def test_normalised_refuses_zero_total_weight():
    X, resp, w, c = _problem(9)
    N, s, S = _oracle(X, resp, w, c, "diag", False)
    with pytest.raises(ValueError, match="total_weight"):
        online.normalised(N, s, S, c, 0.0, "diag")


def test_normalised_full_statistics_are_symmetrised_from_the_upper_triangles():
    X, resp, w, c = _problem(11)
    N, s, S = _oracle(X, resp, w, c, "full", normalise=False)
    upper_only = np.triu(S)  # the engine's gathered statistics fill only these
    stats = online.normalised(N, s, upper_only, c, w.sum(), "full")
    np.testing.assert_allclose(stats.sum_xx, S / w.sum(), rtol=1e-13)
    np.testing.assert_array_equal(stats.sum_xx, np.swapaxes(stats.sum_xx, 1, 2))


@pytest.mark.parametrize("ct", SKLEARN_ONLINE_COVARIANCE_TYPES)
def test_split_starved_halves_the_heaviest_and_keeps_the_others(ct):
    """A component below a tenth of the mean weight takes half of the heaviest
    one's weight and its covariance, the two means half a standard deviation either
    side of its mean; the third component's mean and covariance are kept."""
    K, d, reg = 3, 4, 1e-6
    rng = np.random.default_rng(0)
    weights = np.array([0.01, 0.7, 0.29])
    means = rng.normal(size=(K, d))
    a = rng.normal(size=(K, d, d))
    full = a @ np.swapaxes(a, 1, 2) + np.eye(d)
    cov = {"full": full, "tied": full[1], "diag": np.diagonal(full, axis1=1, axis2=2),
           "spherical": np.diagonal(full, axis1=1, axis2=2).mean(axis=1)}[ct]
    stats = online.implied_statistics(weights, means, cov, reg, ct)
    new, splits = online.split_starved(stats, cov, reg)
    assert splits == [(0, 1)]
    w, mu, c = _oracle_m_step(new.nk, new.sum_x, new.sum_xx, new.centers, reg, ct)
    np.testing.assert_allclose(w, [0.35, 0.35, 0.29] / np.float64(0.99), rtol=1e-12)
    np.testing.assert_allclose(mu[2], means[2], rtol=1e-12)
    np.testing.assert_allclose(mu[0] + mu[1], 2 * means[1], rtol=1e-12, atol=1e-12)
    gap = mu[0] - mu[1]
    covariance = cov if ct == "tied" else cov[1]
    dense = covariance if ct in ("full", "tied") else np.diag(
        np.broadcast_to(covariance, (d,)))
    assert gap @ np.linalg.solve(dense, gap) == pytest.approx(1.0, rel=1e-9)
    np.testing.assert_allclose(c, cov if ct == "tied" else cov[[1, 1, 2]],
                               rtol=1e-10)


def test_split_starved_leaves_healthy_statistics_alone():
    stats = online.implied_statistics([0.2, 0.3, 0.5], np.zeros((3, 2)),
                                      np.stack([np.eye(2)] * 3), 1e-6, "full")
    new, splits = online.split_starved(stats, np.stack([np.eye(2)] * 3), 1e-6)
    assert splits == [] and new is stats


# ------------------------------------------------------------------ 'factor'
#
# The oracle sums the complete-data statistics of a mixture of factor analysers
# over the whole array with einsum, from posterior moments given to it (e (n, K, q)
# for E[z | x, k], C (K, q, q) for Cov[z | x, k]): the statistics are linear in
# them, whatever model they came from.

Q = 2


def _factor_problem(seed, n=50, K=3, d=4, q=Q):
    X, resp, w, centers = _problem(seed, n, K, d)
    rng = np.random.default_rng(seed + 1000)
    e = rng.normal(size=(n, K, q))
    a = rng.normal(size=(K, q, q))
    C = a @ np.swapaxes(a, 1, 2) / q + 0.1 * np.eye(q)
    return X, resp, w, centers, e, C


def _factor_oracle(X, resp, w, centers, e, C, normalise=True):
    """nk, sum_x, sum_xx (diagonals), sum_xz, sum_z, sum_zz around ``centers``."""
    u = X[:, None, :] - centers[None, :, :]
    wr = w[:, None] * resp
    out = {"nk": wr.sum(axis=0), "sum_x": np.einsum("nk,nkd->kd", wr, u),
           "sum_xx": np.einsum("nk,nkd->kd", wr, u**2),
           "sum_xz": np.einsum("nk,nkd,nkq->kdq", wr, u, e),
           "sum_z": np.einsum("nk,nkq->kq", wr, e),
           "sum_zz": (np.einsum("nk,nkq,nkr->kqr", wr, e, e)
                      + wr.sum(axis=0)[:, None, None] * C)}
    total = w.sum() if normalise else 1.0
    return {name: a / total for name, a in out.items()}


def _factor_stats(X, resp, w, centers, e, C):
    sums = _factor_oracle(X, resp, w, centers, e, C, normalise=False)
    return online.normalised(centers=centers, total_weight=w.sum(),
                             covariance_type="factor", **sums)


def _assert_factor(stats, expected, rtol=1e-12, atol=1e-12):
    got = stats.arrays()
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert got[name].dtype == np.float64
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol, err_msg=name)


def test_factor_normalised_divides_every_statistic_by_the_total_weight():
    X, resp, w, c, e, C = _factor_problem(0)
    stats = _factor_stats(X, resp, w, c, e, C)
    _assert_factor(stats, _factor_oracle(X, resp, w, c, e, C))
    assert stats.covariance_type == "factor"


def test_factor_shift_centres_equals_the_statistics_summed_around_the_new_centres():
    """sum_xx' = sum_xx - 2 delta sum_x + N delta^2, sum_x' = sum_x - N delta,
    sum_xz' = sum_xz - delta sum_z^T, the rest unchanged: against the sums taken
    again around the new centres over the whole array."""
    X, resp, w, c, e, C = _factor_problem(1)
    new = c + np.random.default_rng(5).normal(size=c.shape) * 3.0
    stats = _factor_stats(X, resp, w, c, e, C)
    before = {name: a.copy() for name, a in stats.arrays().items()}
    shifted = online.shift_centres(stats, new)
    np.testing.assert_array_equal(shifted.centers, new)
    _assert_factor(shifted, _factor_oracle(X, resp, w, new, e, C), rtol=1e-10,
                   atol=1e-10)
    for name, a in stats.arrays().items():  # the input is kept
        np.testing.assert_array_equal(a, before[name])


def test_factor_stepwise_update_is_the_convex_combination_around_running_centres():
    A = _factor_problem(4)
    B = _factor_problem(5)  # summed around other centres
    eta = 0.3
    got = online.stepwise_update(_factor_stats(*A), _factor_stats(*B), eta)
    cA = A[3]
    want_a = _factor_oracle(*A)
    want_b = _factor_oracle(*B[:3], cA, *B[4:])
    np.testing.assert_array_equal(got.centers, cA)
    _assert_factor(got, {name: (1 - eta) * want_a[name] + eta * want_b[name]
                         for name in want_a}, rtol=1e-10, atol=1e-10)


def _numpy_factor_m_step(s, centers, reg):
    """Ghahramani & Hinton's M step in numpy, per component (no 10 eps guards), the
    noise floored at ``reg``."""
    K, d, q = s["sum_xz"].shape
    weights = s["nk"] / s["nk"].sum()
    means, W, psi = np.empty((K, d)), np.empty((K, d, q)), np.empty((K, d))
    for k in range(K):
        omega = np.block([[s["sum_zz"][k], s["sum_z"][k][:, None]],
                          [s["sum_z"][k][None, :], np.array([[s["nk"][k]]])]])
        rhs = np.hstack([s["sum_xz"][k], s["sum_x"][k][:, None]])
        aug = np.linalg.solve(omega, rhs.T).T
        W[k], means[k] = aug[:, :q], centers[k] + aug[:, q]
        psi[k] = np.maximum((s["sum_xx"][k] - np.sum(aug * rhs, axis=1)) / s["nk"][k],
                            reg)
    return weights, means, W, psi


def test_factor_m_step_of_running_statistics_is_ghahramani_hinton():
    X, resp, w, c, e, C = _factor_problem(12, n=400)
    stats = _factor_stats(X, resp, w, c, e, C)
    weights, means, packed = online.m_step(stats, 1e-3)
    want = _numpy_factor_m_step(_factor_oracle(X, resp, w, c, e, C), c, 1e-3)
    got = (weights, means, packed[:, :4, :Q], packed[:, :4, Q])
    for g, x in zip(got, want, strict=True):
        np.testing.assert_allclose(g, x, rtol=1e-10, atol=1e-12)


def test_factor_implied_statistics_invert_the_m_step():
    rng = np.random.default_rng(6)
    K, d, reg = 3, 5, 1e-3
    weights = np.array([0.2, 0.5, 0.3])
    means = rng.normal(size=(K, d))
    W = rng.normal(size=(K, d, Q))
    psi = rng.uniform(0.5, 2.0, size=(K, d))
    packed = np.zeros((K, d + Q, Q + 1))
    packed[:, :d, :Q], packed[:, :d, Q] = W, psi
    implied = online.implied_statistics(weights, means, packed, reg, "factor")
    np.testing.assert_array_equal(implied.sum_x, 0.0)
    np.testing.assert_array_equal(implied.extra["sum_z"], 0.0)
    np.testing.assert_allclose(implied.extra["sum_zz"],
                               weights[:, None, None] * np.eye(Q), rtol=0)
    back = _numpy_factor_m_step(implied.arrays(), implied.centers, reg)
    for got, want in zip(back, (weights, means, W, psi), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    w2, mu2, packed2 = online.m_step(implied, reg)  # the engine's, with its guards
    np.testing.assert_allclose(packed2, packed, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("K, d, q", [(3, 500, 4), (2, 2000, 1)])
def test_factor_running_statistics_are_O_K_d_q(K, d, q):
    """The running statistics of 'factor' hold K (1 + 3 d + d q + q + q^2) float64
    (centres included): no array has two axes of length d."""
    stats = online.zero_statistics(np.zeros((K, d)), "factor", n_factors=q)
    shapes = {name: a.shape for name, a in stats.arrays().items()}
    assert shapes == {"nk": (K,), "sum_x": (K, d), "sum_xx": (K, d),
                      "sum_xz": (K, d, q), "sum_z": (K, q), "sum_zz": (K, q, q)}
    assert stats.nbytes == 8 * K * (1 + 3 * d + d * q + q + q * q)
    for a in [*stats.arrays().values(), stats.centers]:
        assert list(a.shape).count(d) <= 1


def test_factor_arrays_round_trip_and_are_checked():
    X, resp, w, c, e, C = _factor_problem(7)
    stats = _factor_stats(X, resp, w, c, e, C)
    arrays = online.to_arrays(stats)
    assert sorted(arrays) == sorted(f"online_{n}" for n in (
        "nk", "sum_x", "sum_xx", "sum_xz", "sum_z", "sum_zz", "centers"))
    back = online.from_arrays(dict(arrays, weights=np.ones(3)), "factor")
    for name, a in online.to_arrays(back).items():
        np.testing.assert_array_equal(a, arrays[name])
    missing = {k: v for k, v in arrays.items() if k != "online_sum_zz"}
    with pytest.raises(ValueError, match="sum_xz, sum_z, sum_zz"):
        online.from_arrays(missing, "factor")
    with pytest.raises(ValueError, match="sum_xz has shape"):
        online.from_arrays(dict(arrays, online_sum_xz=np.ones((3, 4, 3))), "factor")


def test_factor_split_starved_halves_the_heaviest_and_keeps_the_others():
    """As for the Gaussian types: the starved component and the heaviest one share
    its weight and (dense) covariance, their means one standard deviation apart
    along its widest axis (Mahalanobis distance 1); the third is kept."""
    K, d, reg = 3, 6, 1e-6
    rng = np.random.default_rng(0)
    weights = np.array([0.01, 0.7, 0.29])
    means = rng.normal(size=(K, d))
    packed = np.zeros((K, d + Q, Q + 1))
    packed[:, :d, :Q] = rng.normal(size=(K, d, Q))
    packed[:, :d, Q] = rng.uniform(0.5, 2.0, size=(K, d))
    stats = online.implied_statistics(weights, means, packed, reg, "factor")
    new, splits = online.split_starved(stats, packed, reg)
    assert splits == [(0, 1)]
    w, mu, W, psi = _numpy_factor_m_step(new.arrays(), new.centers, reg)
    np.testing.assert_allclose(w, [0.35, 0.35, 0.29] / np.float64(0.99), rtol=1e-12)
    np.testing.assert_allclose(mu[2], means[2], rtol=1e-12)
    np.testing.assert_allclose(mu[0] + mu[1], 2 * means[1], rtol=1e-12, atol=1e-12)
    dense = packed[1, :d, :Q] @ packed[1, :d, :Q].T + np.diag(packed[1, :d, Q])
    gap = mu[0] - mu[1]
    assert gap @ np.linalg.solve(dense, gap) == pytest.approx(1.0, rel=1e-9)
    values, vectors = np.linalg.eigh(dense)  # along the leading eigenvector
    assert abs(gap @ vectors[:, -1]) == pytest.approx(np.linalg.norm(gap), rel=1e-9)
    for k, h in ((0, 1), (1, 1), (2, 2)):
        np.testing.assert_allclose(W[k] @ W[k].T + np.diag(psi[k]),
                                   packed[h, :d, :Q] @ packed[h, :d, :Q].T
                                   + np.diag(packed[h, :d, Q]), rtol=1e-10)


def test_factor_widest_axis_by_lanczos_equals_the_dense_one(monkeypatch):
    """Above _DENSE_AXIS_FEATURES the axis comes from Lanczos on W W^T + Psi."""
    from emgmm.covariance import REGISTRY
    from emgmm.covariance import _factor as factor_module

    rng = np.random.default_rng(3)
    d = 40
    packed = np.zeros((d + Q, Q + 1))
    packed[:d, :Q] = rng.normal(size=(d, Q))
    packed[:d, Q] = rng.uniform(0.5, 2.0, size=d)
    dense = REGISTRY["factor"].widest_axis(packed, d)
    monkeypatch.setattr(factor_module, "_DENSE_AXIS_FEATURES", 0)
    lanczos = REGISTRY["factor"].widest_axis(packed, d)
    np.testing.assert_allclose(lanczos * np.sign(lanczos @ dense), dense, rtol=1e-8,
                               atol=1e-10)
