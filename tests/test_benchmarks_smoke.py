"""The GPU benchmark must keep running on CPU (tiny model): a smoke test, not a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_gpu_sam_benchmark_runs_on_cpu(tmp_path: Path):
    out = tmp_path / "gpu_sam.json"
    proc = subprocess.run(
        # One batch size and a 10 s budget: every kind of row once (the default CPU budget, 50 s, measured more).
        [sys.executable, "benchmarks/gpu_sam.py", "--device", "cpu", "--tiny", "--batches", "1", "--budget-s", "10"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data, "the benchmark wrote no results"
    assert "encoder" in proc.stdout.lower()


@pytest.mark.browser
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("reviewers", "quorum"), [("2", 2)])
def test_reviewer_benchmark_runs(tmp_path: Path, reviewers: str, quorum: int):
    """benchmarks/reviewer.py at its smallest: a real hitl up with the UI, one job, two reviewers and a
    quorum of two: the job answered by both (a vote, then the decision). (One reviewer alone is the
    browser suites' everyday path; a second parameter cost CI ~40 s.)"""
    from tests.browser_util import require_chromium

    require_chromium()
    out = tmp_path / "reviewer.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/reviewer.py", "--jobs", "1", "--reviewers", reviewers, "--warmup", "0"]
        + ["--quorum", str(quorum), "--timeout-s", "90", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == set(reviewers.split(","))
    for r in results.values():
        said = json.dumps(r, indent=1)  # in full: pytest shortens a dict's repr
        assert r["jobs_decided"] == 1 and r["quorum"] == quorum, said
        assert r["confirmed"] == r["submissions"] == quorum and r["conflicts_409"] == 0, said
        assert r["server_refusals"] == [] and r["odd"] == [], said  # read from the job's audit trail
        assert 0 < r["pause_to_interactive_p50_ms"] < 60_000 and 0 < r["submit_to_banner_p50_ms"] < 60_000, said
        assert 0 < r["pause_to_decided_p50_ms"] < 120_000, said
    assert "pause → interactive" in proc.stdout
