"""Smoke test of benchmarks/bench_factor.py at its reduced (--quick) size: the JSON
has every figure the README quotes, finite. No timing is asserted."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_factor.py"


@pytest.mark.slow
def test_quick_run_writes_every_figure(tmp_path):
    out = tmp_path / "factor.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["rates"]["dgemm"] > 0 and result["flops_per_iteration"] > 0
    for dtype in ("float64", "float32"):
        rec = result["fits"][dtype]
        assert len(rec["iteration_seconds"]) == result["config"]["iters"]
        assert rec["peak_mb"] >= rec["baseline_mb"] > 0 and rec["block_rows"] > 0
        for key in ("gflops", "flop_time_at_dgemm", "time_over_flop_time"):
            assert math.isfinite(rec[key]) and rec[key] > 0
    paper = result["paper"]
    assert paper["model_gib"] < paper["full_model_gib"]
    assert paper["seconds_per_iteration_at_dgemm"] > 0
    assert "benchmark took" in proc.stdout
