"""Smoke test of benchmarks/bench_predict.py at its reduced (--quick) size.

Runs the script as a user would (a subprocess per measurement), then checks the JSON
it writes: every kind has its times, its ratio to the fit iteration timed beside it,
and its memory figures. No timing is asserted.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_predict.py"
KINDS = {"fit_iteration", "score", "score_samples", "predict", "predict_out",
         "predict_proba", "predict_proba_out", "cli_predict", "cli_score"}


@pytest.mark.slow
def test_quick_run_writes_every_kind(tmp_path):
    out = tmp_path / "predict.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--n-jobs", "1",
                           "--data-dir", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["quick"] is True
    rows = {r["kind"]: r for r in result["rows"]}
    assert set(rows) == KINDS
    for row in rows.values():
        assert row["n_jobs"] == 1 and len(row["seconds"]) == result["rounds"]
        assert row["median_s"] > 0 and row["ratio_to_fit_iteration"] > 0
        assert row["peak_anon_mb"] > 0 and row["extra_anon_mb"] >= 0
    assert rows["fit_iteration"]["ratio_to_fit_iteration"] == 1.0
    assert rows["predict_proba"]["output_mb"] > rows["predict"]["output_mb"] > 0
    assert rows["predict_out"]["output_mb"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["predict.json"]  # data removed
