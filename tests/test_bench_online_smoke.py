"""Smoke test of benchmarks/bench_online.py at its reduced (--quick) size.

Runs the script as a user would, then checks the JSON it writes: every ratio is
there and positive, and the weighted fits agree with the fits of the repeated rows
(emgmm's lower bounds, scikit-learn's means). No timing is asserted.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_online.py"


@pytest.mark.slow
def test_quick_run_writes_every_ratio_and_the_fits_agree(tmp_path):
    out = tmp_path / "online.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--repeat", "1",
                           "--out", str(out)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["quick"] is True
    assert set(result["sample_weight"]) == {"full", "tied", "diag", "spherical"}
    for row in result["sample_weight"].values():
        assert set(row["s_per_iter"]) == {"sklearn_repeated", "emgmm_repeated",
                                          "emgmm_weighted", "emgmm_unweighted"}
        for key in ("sklearn_repeated_over_emgmm_weighted",
                    "emgmm_repeated_over_emgmm_weighted",
                    "emgmm_weighted_over_unweighted"):
            assert row[key] > 0, key
        assert row["lower_bound_rel_diff_weighted_vs_repeated"] < 1e-10
        assert row["means_max_rel_diff_to_sklearn_repeated"] < 1e-10
    stream = result["partial_fit"]
    assert stream["n_batches"] == 10
    assert all(s > 0 for s in stream["seconds"].values())
    assert stream["partial_fit_pass_over_emgmm_iteration"] > 0
