"""The pairs schedule ('full' beyond the packed estimate's features): rows screen the
pairs, components own their statistics, M step and factor (emgmm/_engine/pair_*.py).

Oracles: the same schedule with the screen switched off (every pair computed, the
same resp_threshold) and the rows schedule, from the same start; the same fit with
other workers, blocks and sources (bitwise); repeated rows for integer weights.
Every test runs with the rows' bounds projected afresh each iteration and carried
across iterations (emgmm/_engine/carried_bounds.py).
"""

import os
import warnings

import numpy as np
import pytest
from helpers import make_blobs_data, not_converging, random_spd, sample_mixture
from numpy.testing import assert_allclose

from emgmm import GaussianMixture
from emgmm._cli.demo import extract_patches, gray_images, remove_dc
from emgmm._engine import carried_bounds, pair_components
from emgmm.covariance import _screen as screen

PARAMS = ("weights_", "means_", "covariances_", "precisions_cholesky_")


def patches(side, n, seed=0):
    """``n`` DC-removed ``side`` x ``side`` patches of the sample images."""
    rng = np.random.default_rng(seed)
    parts = [extract_patches(img[::2, ::2], side) for img in gray_images().values()]
    X = np.concatenate(parts)
    return remove_dc(X[np.sort(rng.choice(len(X), n, replace=False))]) * 255.0


def blobs(d, K, spread, n=1200, seed=0, offset=0.0, cond=30.0):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=spread, size=(K, d)) + offset
    U = np.stack([np.linalg.inv(np.linalg.cholesky(random_spd(rng, d, cond=cond))).T
                  for _ in range(K)])
    return sample_mixture(rng, rng.dirichlet(np.full(K, 5.0)), means, U, n)


DATA = {
    "separated_blobs": lambda: blobs(100, 8, 3.0),
    "overlapping_blobs": lambda: blobs(100, 8, 0.3),
    "far_from_the_origin": lambda: blobs(100, 6, 1e3, offset=1e4),
    "patches14": lambda: patches(14, 1500),
    "patches30": lambda: patches(30, 700),
}


@pytest.fixture(autouse=True, params=["projected", "carried"])
def bounds(request, monkeypatch):
    """Each test with the rows' bounds projected afresh and carried."""
    monkeypatch.setattr(carried_bounds, "CARRY", request.param == "carried")
    return request.param


class Plan:
    """A callback recording the plan and the iterations' pairs per row."""

    wants_plan = True

    def __init__(self):
        self.schedule = None
        self.pairs = []

    def __call__(self, record):
        if record["event"] == "plan":
            self.schedule = record["schedule"]
        elif record["event"] == "iteration":
            self.pairs.append(record.get("pairs_per_row"))


def fit(X, K, w=None, **kw):
    params = dict(n_components=K, covariance_type="full", max_iter=8, tol=0.0,
                  random_state=0, reg_covar=1e-3, init_params="random_from_data")
    params.update(kw)
    with not_converging():
        return GaussianMixture(**params).fit(X, sample_weight=w)


def unscreened(monkeypatch, X, K, **kw):
    """The same schedule computing every pair (the screen switched off: every row
    takes the E step of every pair, exact; the statistics summed as with the
    screen)."""
    with monkeypatch.context() as m:
        m.setattr(screen, "ENABLED", False)
        return fit(X, K, **dict(dict(n_jobs=1), **kw))


def pairs_fit(X, K, **kw):
    plan = Plan()
    gm = fit(X, K, callback=plan, **kw)
    assert plan.schedule == "pairs"
    return gm, plan


def assert_same_fit(a, b, lb_rtol=1e-12, rtol=1e-10):
    assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=lb_rtol)
    assert_allclose(a.weights_, b.weights_, rtol=rtol, atol=1e-14)
    for name in ("means_", "covariances_"):
        scale = np.abs(getattr(b, name)).max()
        assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol,
                        atol=rtol * scale, err_msg=name)


def assert_bitwise(a, b):
    for name in PARAMS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.lower_bounds_ == b.lower_bounds_


@pytest.fixture(scope="module")
def patches14():
    return DATA["patches14"]()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DATA))
def test_pairs_fit_equals_the_fit_of_every_pair(name, monkeypatch):
    """Same start, same resp_threshold: lower bounds to 1e-12, parameters to 1e-10,
    and the screen left most pairs out where the components separate."""
    X = DATA[name]()
    K = 8 if name != "patches30" else 5
    got, plan = pairs_fit(X, K)
    assert_same_fit(got, unscreened(monkeypatch, X, K))
    if name != "overlapping_blobs":
        assert plan.pairs[-1] < K / 2, plan.pairs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["separated_blobs", "patches14"])
def test_pairs_fit_equals_the_rows_schedule(name):
    """The other schedule's E step, M step and repair, from the same start."""
    X = DATA[name]()
    got, _ = pairs_fit(X, 8)
    assert_same_fit(got, fit(X, 8, schedule="rows"))


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [None, 97])
def test_pairs_fit_is_bitwise_the_same_for_any_workers_and_threads(patches14,
                                                                   block_size):
    """One process (n_jobs=1), its row threads (n_jobs=None) and two worker
    processes (the model shared through files) give the same bits, in one block
    or in many (row tasks and rescreen groups regrouped)."""
    one, _ = pairs_fit(patches14, 8, n_jobs=1, block_size=block_size)
    for n_jobs in (None, 2):
        assert_bitwise(pairs_fit(patches14, 8, n_jobs=n_jobs,
                                 block_size=block_size)[0], one)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [97, 350])
def test_pairs_fit_equals_the_fit_of_every_pair_in_other_blocks(patches14,
                                                                 monkeypatch,
                                                                 block_size):
    got, _ = pairs_fit(patches14, 8, block_size=block_size, n_jobs=2)
    assert_same_fit(got, unscreened(monkeypatch, patches14, 8, block_size=block_size),
                    lb_rtol=2e-12)


@pytest.mark.slow
def test_pairs_fit_of_every_source_is_the_same(make_sources):
    """A gather reads rows by index from every kind of source: the same bits."""
    X = DATA["separated_blobs"]()[:600]
    ref = None
    for source in make_sources(X):
        got, _ = pairs_fit(source.obj, 6, max_iter=4)
        if ref is None:
            ref = got
        else:
            assert_bitwise(got, ref)


@pytest.mark.slow
def test_float32_pairs_fit_equals_the_fit_of_every_pair(patches14, monkeypatch):
    X = patches14.astype(np.float32)
    got, _ = pairs_fit(X, 8, compute_dtype="float32")
    ref = unscreened(monkeypatch, X, 8, compute_dtype="float32")
    assert_same_fit(got, ref, lb_rtol=1e-10, rtol=1e-8)


def test_pairs_fit_with_means_that_jump_between_iterations(monkeypatch):
    """means_init far off the data: the first M step moves every mean across it;
    the screen of each iteration starts from the previous one's directions."""
    X = DATA["separated_blobs"]()
    rng = np.random.default_rng(3)
    means_init = X[rng.choice(len(X), 8, replace=False)] + 40.0
    with pytest.warns(UserWarning, match="re-seeded"):
        got, _ = pairs_fit(X, 8, means_init=means_init)
    with pytest.warns(UserWarning, match="re-seeded"):
        ref = unscreened(monkeypatch, X, 8, means_init=means_init)
    assert_same_fit(got, ref)


@pytest.mark.slow
def test_sample_weights_keep_the_same_pairs_at_any_scale(patches14):
    """The kept pairs are those of r_ik > resp_threshold, whatever the weights'
    scale: w and 1e12 w give the same fit, under both schedules."""
    w = np.random.default_rng(0).uniform(0.0, 3.0, len(patches14))
    for schedule in ("pairs", "rows"):
        small = fit(patches14, 8, schedule=schedule, w=w)
        large = fit(patches14, 8, schedule=schedule, w=1e12 * w)
        assert_same_fit(large, small, lb_rtol=1e-11, rtol=1e-9)


@pytest.mark.slow
def test_integer_weights_fit_as_repeated_rows(patches14, monkeypatch):
    """From the same start (a fitted model), weights 0, 1, 2 fit as the rows
    dropped, kept and repeated."""
    counts = np.random.default_rng(1).integers(0, 3, len(patches14))
    start = fit(patches14, 8, max_iter=1)
    init = dict(weights_init=start.weights_, means_init=start.means_,
                precisions_init=start.precisions_, max_iter=5)
    weighted, _ = pairs_fit(patches14, 8, w=counts.astype(np.float64), **init)
    repeated = unscreened(monkeypatch, np.repeat(patches14, counts, axis=0), 8,
                          **init)
    assert_same_fit(weighted, repeated, lb_rtol=1e-11, rtol=1e-9)


class Stop(Exception):
    pass


@pytest.mark.slow
def test_a_checkpointed_pairs_fit_resumes_to_the_same_bits(tmp_path, patches14):
    """The checkpoint holds the screen too: the resumed fit screens as the
    uninterrupted one did."""
    ref, _ = pairs_fit(patches14, 8)
    path = tmp_path / "fit.ckpt.npz"

    def stop(record):
        if record["event"] == "iteration" and record["n_iter"] == 3:
            raise Stop

    with pytest.raises(Stop):
        fit(patches14, 8, checkpoint=path, callback=stop)
    assert path.exists()
    assert_bitwise(fit(patches14, 8, checkpoint=path), ref)


@pytest.mark.slow
def test_warm_start_continues_as_the_fit_of_every_pair(patches14, monkeypatch):
    got, _ = pairs_fit(patches14, 8, max_iter=3)
    with not_converging():
        got.set_params(warm_start=True).fit(patches14)
    with monkeypatch.context() as m:
        m.setattr(screen, "ENABLED", False)
        ref = fit(patches14, 8, n_jobs=1, max_iter=3)
        with not_converging():
            ref.set_params(warm_start=True).fit(patches14)
    assert_same_fit(got, ref)


def test_a_starved_component_is_reseeded_as_under_the_rows_schedule(monkeypatch):
    """A component started on a far point that no row explains: re-seeded on the
    worst-explained row, as the rows schedule does."""
    X = blobs(100, 4, 5.0, n=800)
    rng = np.random.default_rng(2)
    means_init = X[rng.choice(len(X), 5, replace=False)]
    means_init[4] = 1e3
    kw = dict(means_init=means_init, max_iter=6)
    with pytest.warns(UserWarning, match="re-seeded"):
        got, _ = pairs_fit(X, 5, **kw)
    with pytest.warns(UserWarning, match="re-seeded"):
        ref = unscreened(monkeypatch, X, 5, **kw)
    assert [r["reseeded"] for r in got.history_] == [r["reseeded"]
                                                      for r in ref.history_]
    assert_same_fit(got, ref, lb_rtol=1e-11, rtol=1e-9)


def test_a_component_whose_mean_moves_far_is_summed_again_around_it(monkeypatch):
    """Clusters of unit spread 1e7 from the origin whose means_init lie 0.1 off in
    every feature: the shift of the mean (times the mean's 1e7) cancels digits of
    the covariance, and the component sums its rows again around the new mean."""
    X = blobs(100, 3, 1.0, n=900, offset=1e7, cond=4.0)
    labels = GaussianMixture(3, random_state=0, max_iter=5, reg_covar=1e-6)
    with not_converging():
        labels = labels.fit(X).predict(X)
    means_init = np.stack([X[labels == k].mean(axis=0) for k in range(3)]) + 0.1
    calls = []
    original = pair_components._cancelled
    monkeypatch.setattr(pair_components, "_cancelled",
                        lambda *a: calls.append(original(*a)) or calls[-1])
    got, _ = pairs_fit(X, 3, means_init=means_init, max_iter=3, reg_covar=1e-6)
    assert any(calls)
    ref = unscreened(monkeypatch, X, 3, means_init=means_init, max_iter=3,
                     reg_covar=1e-6)
    assert_same_fit(got, ref, lb_rtol=1e-12, rtol=1e-9)


def test_the_pairs_schedule_is_refused_where_it_does_not_apply():
    X = make_blobs_data(300, 10, 3)
    for kw in (dict(), dict(covariance_type="diag"), dict(resp_threshold=0.0)):
        with pytest.raises(ValueError, match="schedule='pairs' needs"):
            GaussianMixture(3, schedule="pairs", **kw).fit(X)


def test_the_auto_schedule_picks_pairs_only_where_it_applies():
    X = blobs(100, 4, 3.0, n=400)
    picks = {}
    for name, kw in {"full": {}, "exact": dict(resp_threshold=0.0),
                     "diag": dict(covariance_type="diag")}.items():
        plan = Plan()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GaussianMixture(4, max_iter=2, callback=plan, **kw).fit(X)
        picks[name] = plan.schedule
    assert picks == {"full": "pairs", "exact": "rows", "diag": "rows"}


@pytest.mark.slow
def test_worker_processes_leave_a_model_in_memory_and_no_folder(patches14):
    """With worker processes the state is memory-mapped in a folder of its own: each
    run copies its model out and removes the folder before the next run starts."""
    from emgmm._runtime.executor import shared_memory_folder

    parent = shared_memory_folder(0)

    def ours():
        return {f for f in os.listdir(parent) if f.startswith(f"emgmm-{os.getpid()}")}

    before, seen = ours(), []

    def callback(record):
        if record["event"] == "iteration":
            seen.append((record["init"], ours() - before))

    gm = fit(patches14, 8, n_jobs=2, n_init=2, max_iter=2, callback=callback)
    assert not any(isinstance(getattr(gm, name), np.memmap) for name in PARAMS)
    by_init = {init: set().union(*(f for i, f in seen if i == init)) for init in (0, 1)}
    # (the executor's own folder for X, if any, is in both; each run's state in one)
    assert by_init[0] - by_init[1] and by_init[1] - by_init[0]
    assert not ours() - before
    ref = fit(patches14, 8, n_jobs=1, n_init=2, max_iter=2)
    assert_bitwise(gm, ref)
    # the workers, still alive for the next fit, map none of the removed files
    psutil = pytest.importorskip("psutil")
    workers = psutil.Process().children(recursive=True)
    assert workers
    held = [m.path for w in workers for m in w.memory_maps()
            if f"emgmm-{os.getpid()}" in m.path]
    assert not held, held


@pytest.mark.parametrize("n_jobs", [1, None])
def test_a_warm_start_leaves_the_previous_attributes_as_they_were(patches14, n_jobs):
    gm = fit(patches14, 8, n_jobs=n_jobs, max_iter=2)
    old = {name: getattr(gm, name) for name in PARAMS}
    kept = {name: value.copy() for name, value in old.items()}
    gm.set_params(warm_start=True)
    with not_converging():
        gm.fit(patches14)
    for name in PARAMS:
        assert np.array_equal(old[name], kept[name]), name
    assert not np.array_equal(gm.covariances_, kept["covariances_"])


def test_iteration_records_carry_the_pairs_and_the_phase_seconds(patches14):
    gm, plan = pairs_fit(patches14, 8, max_iter=3)
    for record in gm.history_:
        phases = record["phase_seconds"]
        assert set(phases) == {"screen", "top_pairs", "rescreen", "statistics",
                               "repair"}
        assert 0 < sum(phases.values()) <= record["seconds"]
        assert 1 <= record["pairs_per_row"] <= 8
        assert record["passes"] is None  # (its phases read rows their own way)
    assert plan.pairs == [r["pairs_per_row"] for r in gm.history_]


@pytest.mark.parametrize("parts", [1, 3, 8, 500])
def test_component_ranges_cover_every_component_with_balanced_work(parts):
    """Tasks by work, not by component count: contiguous, non-empty, covering;
    no range above its share by more than one component's cost."""
    from emgmm._engine.pair_step import balanced_ranges

    rng = np.random.default_rng(0)
    costs = np.concatenate([[5000], rng.integers(1, 50, size=199)])
    ranges = balanced_ranges(costs, parts)
    assert ranges[0][0] == 0 and ranges[-1][1] == costs.size
    assert all(a < b for a, b in ranges)
    assert all(b == c for (_, b), (c, _) in zip(ranges[:-1], ranges[1:], strict=True))
    assert len(ranges) <= parts
    share = costs.sum() / min(parts, costs.size)
    assert max(costs[a:b].sum() for a, b in ranges) <= share + costs.max()
    if parts > 1:
        assert ranges[0] == (0, 1)  # the heavy component alone


def test_the_final_pass_scores_with_the_runs_screen(patches14, monkeypatch):
    """The pass that scores a run's final parameters takes the screen the run kept
    for them (building one costs K d^2 p (steps + 1) flops); its score is score(X),
    which builds its own screen, to rounding."""
    built = []
    original = screen.ProjectionScreen.build.__func__

    def counted(cls, *args, **kwargs):
        built.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(screen.ProjectionScreen, "build", classmethod(counted))
    gm, _ = pairs_fit(patches14, 8, max_iter=3)
    assert not built
    assert_allclose(gm.lower_bound_, gm.score(patches14), rtol=1e-14)
    assert built
