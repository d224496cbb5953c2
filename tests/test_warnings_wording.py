"""Issue 29.4: warnings that say which cause occurred and the advice that fits it."""

import pytest

from emgmm.runtime import memory


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_chunk_warning_names_the_limiting_row_count_and_the_init_read(covariance_type):
    n, d, K = 200_000, 50, 4
    per_row = memory.bytes_per_row(d, K, 4)
    budget = int(8 * 2**20 // per_row)
    chunk = 2 * budget
    with pytest.warns(UserWarning) as record:
        rows = memory.block_rows(n, d, K, 4, 8, chunk_rows=chunk,
                                 covariance_type=covariance_type, description="X.h5:/x")
    (warning,) = record
    text = str(warning.message)
    # the count that limits the block, and what sets it
    assert (f"one chunk ({chunk} rows) exceeds the {budget} rows that fit "
            f"working_memory (8 MiB at {per_row} bytes per row)") in text, text
    assert f"blocks of {rows} rows" in text
    # the initialisation's subsample read pays the same
    assert "initialisation" in text and "init_max_samples" in text
