"""Smoke test of benchmarks/bench_em.py at its reduced (--quick) size.

Runs the script as a user would (a subprocess per fit), then checks the JSON it writes:
every field the README table needs is there and finite, and for the exact float64 modes
emgmm's lower bounds agree with scikit-learn's (both fitted from the same
initialisation, tol=0, a fixed number of iterations). No timing is asserted.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_em.py"

ROW_FIELDS = (
    "config", "n", "d", "K", "covariance_type", "iterations", "mode",
    "sklearn_s_per_iter", "emgmm_s_per_iter", "speedup", "useful_gflops",
    "sklearn_mean_s_per_iter", "emgmm_mean_s_per_iter",
    "lower_bound_max_rel_diff", "lower_bounds_agree",
    "sklearn_peak_mb", "emgmm_peak_mb", "sklearn_extra_mb", "emgmm_extra_mb",
)


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--configs", "A,C", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_quick_run_writes_every_field(quick_result):
    result, stdout = quick_result
    assert result["quick"] is True
    for key in ("dgemm", "sgemm"):
        assert result["gemm_gflops"][key] > 0
    assert result["machine"]["blas"], "threadpoolctl saw no BLAS"
    rows = result["rows"]
    assert {(r["config"], r["mode"]) for r in rows} == {
        ("A", "float64"), ("A", "float32"), ("A", "wm64"), ("A", "exact"),
        ("C", "float64")}
    for r in rows:
        for field in ROW_FIELDS:
            assert field in r, field
        for side in ("sklearn", "emgmm"):
            rec = r[side]
            assert len(rec["iteration_seconds"]) == r["iterations"]
            assert len(rec["lower_bounds"]) == r["iterations"]
            assert rec["peak_mb"] >= rec["baseline_mb"] > 0
        assert r["sklearn_s_per_iter"] > 0 and r["emgmm_s_per_iter"] > 0
        assert math.isclose(r["speedup"],
                            r["sklearn_s_per_iter"] / r["emgmm_s_per_iter"])
        for side in ("sklearn", "emgmm"):
            assert math.isclose(r[f"{side}_mean_s_per_iter"],
                                sum(r[side]["iteration_seconds"]) / r["iterations"])
        if r["covariance_type"] == "full":
            assert r["useful_gflops"] > 0
        else:
            assert r["useful_gflops"] is None
    # the table the README shows is printed
    assert "| config | mode | sklearn s/iter" in stdout


@pytest.mark.slow
def test_quick_run_lower_bounds_agree_with_sklearn(quick_result):
    result, _ = quick_result
    for r in result["rows"]:
        sk = r["sklearn"]["lower_bounds"]
        em = r["emgmm"]["lower_bounds"]
        rel = max(abs(a - b) / abs(b) for a, b in zip(em, sk, strict=False))
        assert rel == pytest.approx(r["lower_bound_max_rel_diff"])
        if r["mode"] in ("float64", "wm64", "exact"):
            assert r["lower_bounds_agree"] is True
            assert rel <= 1e-6
        else:
            # float32 compute: float64 accumulation keeps the bound close
            assert rel <= 1e-4
