"""Bounds carried across iterations (emgmm/covariance/_drift.py,
emgmm/_engine/carried_bounds.py, the pairs schedule's row tasks).

Oracles: Mahalanobis distances in long double of the stored float64 arrays; the
exact E step of every pair in float64 (numpy on the whole array). The fits with
carried bounds are checked against the fit of every pair in
tests/test_pairs_schedule.py, which runs every test both ways.
"""

import numpy as np
import pytest
from helpers import not_converging, random_spd

from emgmm import GaussianMixture
from emgmm._engine import carried_bounds, pair_step
from emgmm._engine.carried_bounds import (
    component_groups,
    group_minima,
    group_terms,
    moved_bounds,
    rounded_down,
    row_norms_up,
    second_bound,
)
from emgmm._engine.model import Model
from emgmm._engine.pair_rows import CarryPlan, screen_task
from emgmm._engine.pair_state import PairState, RowBounds
from emgmm._io.sources import ArraySource
from emgmm.covariance._drift import metric_drift, residual_bound, solved
from emgmm.covariance._screen import ProjectionScreen, component_screen, factor_norms

LD = np.longdouble


def factor(rng, d, cond):
    return np.linalg.inv(np.linalg.cholesky(random_spd(rng, d, cond=cond))).T


def distances(X, mean, U):
    """``||(x - mu) U||`` per row, in long double."""
    y = X.astype(LD) - mean.astype(LD)
    z = y @ U.astype(LD)
    return np.sqrt((z * z).sum(axis=1))


def moves(rng, d):
    """(old factor, new factor, old mean, new mean): small steps, large steps, a
    jump to an unrelated component, a rotation of the metric."""
    U = factor(rng, d, 50.0)
    mu = rng.normal(size=d) * 10.0
    small = U @ (np.eye(d) + 1e-3 * np.triu(rng.normal(size=(d, d))))
    yield U, np.triu(small), mu, mu + 1e-3 * rng.normal(size=d)
    large = U @ (np.eye(d) + 0.1 * np.triu(rng.normal(size=(d, d))))
    yield U, np.triu(large), mu, mu + rng.normal(size=d)
    yield U, factor(rng, d, 1e4), mu, -mu
    R = np.linalg.qr(np.eye(d) + 0.2 * rng.normal(size=(d, d)))[0]
    rotated = R @ U @ U.T @ R.T
    yield U, np.linalg.inv(np.linalg.cholesky(np.linalg.inv(rotated))).T, mu, mu


def adversarial_rows(rng, U_old, U_new, mu, n):
    """Rows around ``mu`` at random, and along the direction that the new metric
    shrinks most (where the bound is tight)."""
    d = mu.size
    A = np.linalg.solve(U_old, U_new)
    v = np.linalg.svd(A)[0][:, -1]  # left singular vector of sigma_min
    tight = mu + np.outer(rng.uniform(-30, 30, n), np.linalg.solve(U_old.T, v))
    return np.concatenate([mu + rng.normal(scale=3.0, size=(n, d)), tight])


@pytest.mark.slow
@pytest.mark.parametrize("d", [5, 40, 300])
def test_moved_distances_are_below_the_exact_ones(d):
    """sqrt(m') >= s sqrt(m) - e ||x|| - shift for every row, against long
    double."""
    rng = np.random.default_rng(d)
    for U_old, U_new, mu_old, mu_new in moves(rng, d):
        drift = metric_drift(U_old, U_new, mu_old, mu_new, factor_norms(U_old)[0],
                             factor_norms(U_new)[0])
        X = adversarial_rows(rng, U_old, U_new, mu_old, 200)
        old, new = distances(X, mu_old, U_old), distances(X, mu_new, U_new)
        x_norm = np.sqrt((X.astype(LD) ** 2).sum(axis=1))
        moved = drift.scale * old - drift.error * x_norm - drift.shift
        assert (moved <= new).all()
        assert 0.0 <= drift.scale <= np.linalg.svd(
            np.linalg.solve(U_old, U_new), compute_uv=False).min() * (1 + 1e-12)


@pytest.mark.parametrize("d", [5, 40, 300])
def test_the_solves_residual_is_bounded_from_above(d):
    """``error >= ||U' - U Ahat||_2`` of the computed ``Ahat``, in long double."""
    rng = np.random.default_rng(10 + d)
    for U_old, U_new, _, _ in moves(rng, d):
        a_hat = solved(U_old, U_new)
        a_norm = np.linalg.norm(a_hat)
        bound = residual_bound(U_old, U_new, a_hat, factor_norms(U_old)[0], a_norm)
        exact = U_new.astype(LD) - U_old.astype(LD) @ a_hat.astype(LD)
        assert np.sqrt((exact ** 2).sum()) <= bound


def test_a_small_step_keeps_the_bound_tight():
    """A step of 1e-4 in the factor and mean keeps s within 1e-3 of 1 and the
    shift tiny: the bound survives the iteration."""
    rng = np.random.default_rng(0)
    d = 64
    U = factor(rng, d, 50.0)
    U_new = np.triu(U @ (np.eye(d) + 1e-4 * np.triu(rng.normal(size=(d, d)))))
    mu = rng.normal(size=d)
    drift = metric_drift(U, U_new, mu, mu + 1e-4, factor_norms(U)[0],
                         factor_norms(U_new)[0])
    assert drift.scale > 0.99
    assert drift.shift < 1e-2 and drift.error < 1e-9


def test_a_metric_that_collapses_carries_nothing():
    rng = np.random.default_rng(1)
    U = factor(rng, 20, 10.0)
    drift = metric_drift(U, 1e-3 * U, np.zeros(20), np.zeros(20),
                         factor_norms(U)[0], factor_norms(1e-3 * U)[0])
    assert drift.scale == 0.0
    nan = np.full_like(U, np.nan)
    assert metric_drift(U, nan, np.zeros(20), np.zeros(20), 1.0, 1.0).scale == 0.0


def test_rounded_down_and_norms_up_bound_their_float64_values():
    rng = np.random.default_rng(2)
    v = np.concatenate([rng.uniform(0, 1e6, 10000), [0.0, np.inf, 1e-40]])
    assert (rounded_down(v).astype(np.float64) <= v).all()
    assert rounded_down(v).dtype == np.float32
    X = rng.normal(scale=1e3, size=(500, 30))
    X[0] *= 1e-200  # (squares below the smallest float64)
    X[1] *= 1e150  # (squares beyond the largest)
    exact = np.sqrt((X.astype(LD) ** 2).sum(axis=1))
    assert (row_norms_up(X).astype(LD) >= exact).all()


def test_groups_bin_like_offsets_and_keep_the_non_finite_apart():
    rng = np.random.default_rng(9)
    offset = np.concatenate([rng.normal(scale=500, size=40), [-np.inf, -np.inf]])
    groups = component_groups(offset, 8)
    assert groups.max() == 7 and set(groups[-2:]) == {7}
    assert not (groups[:-2] == 7).any()
    spans = [np.ptp(offset[groups == g]) for g in range(7)]
    order = np.sort(offset[:-2])
    assert max(spans) <= np.ptp(order) / 7 * 2  # (far below one group's spread)
    assert (component_groups(offset[:-2], 1) == 0).all()


@pytest.mark.parametrize("n_groups", [3, 12])
def test_moved_group_bounds_bound_every_member(n_groups):
    """The group's moved bound is below each member's own moved distance (one
    member per group: the bound itself); groups without carried members are inf;
    NaN rows prune nothing."""
    rng = np.random.default_rng(3)
    K, n = 12, 50
    groups = np.arange(K, dtype=np.int32) % n_groups
    drift = np.column_stack([rng.uniform(0.5, 1, K), rng.uniform(0, 1e-6, K),
                             rng.uniform(0, 0.5, K)])
    fresh = np.zeros(K, bool)
    fresh[groups == 2] = True
    offset = rng.normal(size=K)
    terms = group_terms(groups, n_groups, drift, fresh, offset)
    old = rng.uniform(0, 20, (n, K))
    x_norm = rng.uniform(0, 100, n)
    top = rng.integers(0, K, n)
    bounds = group_minima(old, groups, n_groups, top)
    moved = moved_bounds(bounds, x_norm, terms)
    for k in np.flatnonzero(~fresh):
        own = drift[k, 0] * old[:, k] - drift[k, 1] * x_norm - drift[k, 2]
        rows = top != k
        assert (moved[rows, groups[k]] <= np.maximum(own[rows], 0.0)).all()
    assert np.isinf(moved[:, 2]).all()
    assert terms.offset[0] == offset[groups == 0].max()
    second = second_bound(moved, terms.offset)
    assert (second >= terms.offset[0] - 0.5 * moved[:, 0] ** 2).all()
    assert np.isnan(second_bound(np.array([[np.nan, 1.0]]), np.zeros(2))).all()


def test_root_bounds_lie_below_the_distances():
    rng = np.random.default_rng(4)
    K, d = 6, 30
    means = rng.normal(scale=5.0, size=(K, d))
    U = np.stack([factor(rng, d, 100.0) for _ in range(K)])
    screen = ProjectionScreen.build(np.full(K, 1 / K), means, U)
    X = np.concatenate([means[k] + rng.normal(size=(100, d)) for k in range(K)])
    roots = screen.root_bounds(X, np.empty((len(X), K), order="F"))
    exact = np.column_stack([distances(X, means[k], U[k]) for k in range(K)])
    assert (roots <= exact).all()
    assert (roots > 0.3 * exact).mean() > 0.3  # (a bound that prunes, not zero)
    sub = screen.subset([4, 1])
    part = sub.root_bounds(X, np.empty((len(X), 2), order="F"))
    assert np.array_equal(part, roots[:, [4, 1]])
    # the screened E step hands out the same bounds from its own projections
    alongside = np.full((len(X), K), np.nan, order="F")
    weighted = screen.weighted_refined(X, 40.0, roots=alongside)
    assert np.array_equal(alongside, roots)
    assert np.array_equal(weighted, screen.weighted_refined(X, 40.0))


def separated(rng, K=6, d=30, n=600):
    means = rng.normal(scale=4.0, size=(K, d))
    U = np.stack([factor(rng, d, 20.0) for _ in range(K)])
    labels = rng.integers(0, K, n)
    z = rng.normal(size=(n, d))
    X = means[labels] + np.einsum("nj,njk->nk", z, np.linalg.inv(U[labels]))
    return X, means, U


def state_of(X, means, U, weights):
    covariances = np.linalg.inv(np.einsum("kij,klj->kil", U, U))
    screen = ProjectionScreen.build(weights, means, U)
    model = Model(weights, means, covariances, U, "full",
                  screen={name: getattr(screen, name) if name not in ("B", "c")
                          else getattr(screen, name).reshape(shape)
                          for name, shape in ProjectionScreen.shapes(
                              *means.shape).items()})
    return PairState.allocate(model, adopt=False)


def test_carried_rows_bound_every_other_pair_of_the_next_model():
    """Bounds built on one model and moved to a perturbed one: every group bound
    stays below the exact distances of its members (long double), and every other
    pair's weighted log-density below the row's carried second bound."""
    rng = np.random.default_rng(5)
    X, means, U = separated(rng)
    K = means.shape[0]
    weights = np.full(K, 1.0 / K)
    state = state_of(X, means, U, weights)
    groups = (np.arange(K) % 2).astype(np.int32)
    rows = RowBounds.allocate(len(X), 2)
    source = ArraySource(X)

    def plan(fresh_comps=()):
        state.fresh[:] = False
        state.fresh[list(fresh_comps)] = True
        screen = state.screen()
        terms = group_terms(groups, 2, np.array(state.drift), np.array(state.fresh),
                            np.array(screen.offset))
        fresh = np.flatnonzero(state.fresh)
        return CarryPlan(rows, groups, 2, terms, fresh,
                         screen.subset(fresh) if fresh.size else None)

    state.drift[:] = (1.0, 0.0, 0.0)
    first = screen_task(source, 0, len(X), 256, state, np.float64, None,
                        plan(range(K)), blas_threads=1)
    assert first.carried == 0 and (rows.top[:] >= 0).all()
    # the next model: each component moved a little, component 3 re-seeded
    new_means = means + 0.05 * rng.normal(size=means.shape)
    new_U = np.stack([np.triu(U[k] @ (np.eye(30) + 0.01 * np.triu(rng.normal(
        size=(30, 30))))) for k in range(K)])
    new_means[3] = X[0]
    for k in range(K):
        d = metric_drift(U[k], new_U[k], means[k], new_means[k],
                         factor_norms(U[k])[0], factor_norms(new_U[k])[0])
        state.drift[k] = (d.scale, d.error, d.shift)
    state.means[:], state.factors[:] = new_means, new_U
    screen = state.screen()
    for k in range(K):
        screen.set_component(k, component_screen(new_U[k], new_means, new_means[k],
                                                 screen.g))
    screen.set_offsets(weights)
    second = screen_task(source, 0, len(X), 256, state, np.float64, None,
                         plan([3]), blas_threads=1)
    assert second.carried > len(X) // 2
    exact = np.column_stack([distances(X, new_means[k], new_U[k]) for k in range(K)])
    top = np.array(rows.top)
    for g in range(2):
        members = np.flatnonzero(groups == g)
        masked = exact[:, members].copy()
        masked[top[:, None] == members[None, :]] = np.inf
        assert (rows.bounds[:, g].astype(LD) <= masked.min(axis=1)).all()
    value = np.array(screen.offset).astype(LD)[None, :] - exact ** 2 / 2
    value[np.arange(len(X)), top] = -np.inf
    assert (value.max(axis=1) <= second.second.astype(LD)).all()


def test_a_long_fit_screens_most_rows_by_their_carried_bounds(monkeypatch):
    """Once the components have formed, most rows are screened without touching
    them; the records say which share."""
    monkeypatch.setattr(carried_bounds, "CARRY", True)
    rng = np.random.default_rng(6)
    means = rng.normal(scale=3.0, size=(6, 100))
    X = np.concatenate([m + rng.normal(size=(300, 100)) for m in means])
    records = []
    with not_converging():
        GaussianMixture(6, schedule="pairs", max_iter=8, tol=0.0, random_state=0,
                        callback=records.append).fit(X)
    carried = [r["rows_carried"] for r in records]
    assert carried[0] == 0.0 and carried[-1] > 0.9, carried


def test_carried_bounds_pay_only_where_they_save_work(monkeypatch):
    monkeypatch.setattr(carried_bounds, "CARRY", None)
    assert carried_bounds.carry_pays(4_000_000, 900, 4)
    assert not carried_bounds.carry_pays(1_000_000, 900, 4)
    assert carried_bounds.carry_pays(200_000, 196, 4)
    assert not carried_bounds.carry_pays(50_000, 196, 4)


class Stop(Exception):
    pass


def test_large_row_bounds_live_in_a_file_that_goes_with_the_fit(tmp_path,
                                                                 monkeypatch):
    """Rows' bounds beyond ROWS_IN_MEMORY_BYTES (here 0) go to a file of the
    temporary folder: the fit is the same bits as in memory, and the folder is
    removed after it, also when the fit is interrupted."""
    monkeypatch.setattr(carried_bounds, "CARRY", True)
    rng = np.random.default_rng(7)
    means = rng.normal(scale=3.0, size=(5, 100))
    X = np.concatenate([m + rng.normal(size=(200, 100)) for m in means])
    kw = dict(n_components=5, schedule="pairs", max_iter=5, tol=0.0, random_state=0)
    with not_converging():
        in_memory = GaussianMixture(**kw).fit(X)
    monkeypatch.setattr(pair_step, "ROWS_IN_MEMORY_BYTES", 0)
    seen = []

    def watch(record):
        if record["event"] == "iteration":
            seen.append([p.name for p in tmp_path.iterdir()])

    with not_converging():
        in_file = GaussianMixture(**kw, temp_folder=tmp_path, callback=watch).fit(X)
    assert seen and all(len(names) == 1 for names in seen), seen
    assert not list(tmp_path.iterdir())
    assert np.array_equal(in_file.means_, in_memory.means_)
    assert in_file.lower_bounds_ == in_memory.lower_bounds_

    def stop(record):
        if record["event"] == "iteration" and record["n_iter"] == 2:
            raise Stop

    with pytest.raises(Stop):
        GaussianMixture(**kw, temp_folder=tmp_path, callback=stop).fit(X)
    assert not list(tmp_path.iterdir())
