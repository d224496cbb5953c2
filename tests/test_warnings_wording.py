"""Issue 29.4: warnings that say which cause occurred and the advice that fits it."""

import warnings

import numpy as np
import pytest

from emgmm import GaussianMixture
from emgmm.covariance import REGISTRY as KINDS
from emgmm.engine import degenerate
from emgmm.runtime import memory


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_chunk_warning_names_the_limiting_row_count_and_the_init_read(covariance_type):
    n, d, K = 200_000, 50, 4
    per_row = KINDS["full"].bytes_per_row(d, K, 4)
    budget = int(8 * 2**20 // per_row)
    chunk = 2 * budget
    with pytest.warns(UserWarning) as record:
        rows = memory.block_rows(n, d, K, 4, 8, chunk_rows=chunk,
                                 covariance_type=KINDS[covariance_type],
                                 description="X.h5:/x")
    (warning,) = record
    text = str(warning.message)
    # the count that limits the block, and what sets it
    assert (f"one chunk ({chunk} rows) exceeds the {budget} rows that fit "
            f"working_memory (8 MiB at {per_row} bytes per row)") in text, text
    assert f"blocks of {rows} rows" in text
    # the initialisation's subsample read pays the same
    assert "initialisation" in text and "init_max_samples" in text


# ---------------------------------------------- 29.4 re-seed warning, 28.6 streaks





def _reseed_warnings(fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    return [str(w.message) for w in caught if "re-seeded" in str(w.message)]


def test_reseed_warning_for_a_starved_component_does_not_advise_reg_covar():
    rng = np.random.default_rng(0)
    centers = [(-5, 0), (0, 5), (5, 0)]
    batch1 = np.vstack([rng.normal(c, 0.5, size=(200, 2)) for c in centers])
    batch2 = np.vstack([rng.normal(c, 0.5, size=(200, 2)) for c in centers[:2]])
    gm = GaussianMixture(3, warm_start=True, random_state=0, max_iter=200).fit(batch1)
    (message,) = _reseed_warnings(lambda: gm.fit(batch2))
    assert "weight below a thousandth of one sample" in message
    assert "reg_covar" not in message
    assert "fewer components" in message


def test_reseed_warning_for_a_collapsed_covariance_advises_reg_covar():
    rng = np.random.default_rng(0)
    clusters = [rng.normal(c, 0.3, size=(50, 2))
                for c in ((0, 0), (6, 0), (0, 6), (6, 6))]
    X = np.vstack(clusters + [np.array([[30.0, 30.0]])])
    messages = _reseed_warnings(lambda: GaussianMixture(
        5, reg_covar=0.0, random_state=0, max_iter=50).fit(X))
    collapsed = [m for m in messages if "not positive definite" in m]
    assert collapsed and all("increase reg_covar" in m for m in collapsed), messages
    assert not any("weight below a thousandth" in m for m in collapsed)


def _history(reseeds):
    """Iteration records re-seeding component 0 at the given iterations."""
    last = max(reseeds)
    return [{"n_iter": i, "reseeded": [0] if i in reseeds else []}
            for i in range(1, last + 1)]


def test_reseed_streaks_count_consecutive_collapses_only():
    # every other iteration: one streak of 5
    assert degenerate.reseed_streaks(_history([2, 4, 6, 8, 10]), 11)[0] == 5
    # ten re-seeds, each after the component had settled: never more than 1
    spaced = list(range(3, 60, 6))
    assert len(spaced) == 10
    assert degenerate.reseed_streaks(_history(spaced), spaced[-1] + 1)[0] == 1
    # a streak ends when the component settles for longer than the gap
    assert degenerate.reseed_streaks(_history([2, 4, 6]), 12)[0] == 0


# ---------------------------------------------- 29.4 data beyond range, up front



@pytest.mark.parametrize("dtype,scale,match", [
    (np.float32, 1e20, "does not fit in float32 attributes"),
    (np.float64, 1e160, "not finite: the data's variances overflow float64")])
def test_data_beyond_the_dtypes_range_is_refused_before_the_first_pass(dtype, scale,
                                                                     match):
    rng = np.random.default_rng(0)
    X = (np.vstack([rng.normal(c, 1.0, (300, 3)) for c in (0, 6, 12)]) * scale)
    X = X.astype(dtype)
    iterations = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one numpy RuntimeWarning on the way
        with pytest.raises(ValueError, match=match):
            GaussianMixture(3, random_state=0,
                            callback=lambda record: iterations.append(record)).fit(X)
    assert iterations == []


def test_clusters_far_apart_but_tight_are_not_refused():
    """The check is on the components' variances, not the data's spread: float32
    clusters at -1e20 and +1e20 with unit spread fit float32 attributes."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, (300, 2)) for c in (-1e20, 1e20)]).astype(
        np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            GaussianMixture(2, random_state=0, max_iter=3).fit(X)
        except ValueError as exc:
            assert "does not fit in float32 attributes" not in str(exc)
