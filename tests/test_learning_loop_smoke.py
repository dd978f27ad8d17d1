"""benchmarks/learning_loop.py at its smallest: one `hitl up`, twenty jobs reviewed from the ground truth
through the API, the archive read back by `hitl learn dataset`, and `hitl learn box-policy` run on it
(twenty jobs bound nothing: it refuses and says why). A smoke test of the loop's plumbing, not a figure;
the automatic approval through `hitl up` is tests/test_auto_approve_serve.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_learning_loop_benchmark_runs(tmp_path: Path):
    out = tmp_path / "loop.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/learning_loop.py", "--checkpoints", "20", "--promises", "0.05"]
        + ["--fresh", "0", "--drift-max", "0", "--concurrency", "4", "--data-dir", str(tmp_path / "d")]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (point,) = data["checkpoints"]
    assert point["dataset_rows"] >= 20 and data["learning_stream"]["jobs"] >= 20
    (fit,) = point["fits"]
    assert fit["rc"] == 1 and fit["written"] is None and "refused" in fit["said"], fit
    assert 0 < data["learning_stream"]["unchanged_share_truth"] <= 1
    # The classical Detector's evidence reached every archived row (report, job, archive, hitl learn
    # dataset), and the ablation without it ran through the same CLI.
    assert point["rows_with_evidence"] == 1.0, point
    [blind] = point["fits_without_evidence"]
    assert blind["rc"] == 1 and blind["written"] is None, blind
    assert "| reviewed jobs |" in proc.stdout
