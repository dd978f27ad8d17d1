"""benchmarks/burst.py at its smallest: a smoke run, not a timing. A real ``hitl up`` (dashboard on, so the
replicas come from Serve's status API), six jobs at once with automatic reviewers, the cancel-at-once phase
(the admission phase, a second ``hitl up``, is skipped with ``--max-backlog 0``); the JSON must carry every
figure and every job must have ended SUCCEEDED (with the lifecycle fixed, so must the cancelled ones'
retention). Also, without Ray: the replicas' node counts leave the ``not_started`` calls out of the
executions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ci import require_binary
from harness.serve_status import executed, parse_node_counts

ROOT = Path(__file__).parent.parent
JOBS = 6

PHASE_FIELDS = {
    "jobs_asked",
    "jobs_accepted",
    "drain_s",
    "ideal_s",
    "efficiency",
    "formula",
    "detector",
    "segmenter",
    "statuses",
    "reason_codes",
    "failed",
    "timed_out_jobs",
    "executor_lost",
    "not_terminal",
    "events",
    "model_executions",
    "dead_letters",
    "redis",
    "submit",
    "reviews",
}


SERIES = (
    'ray_hitl_model_node_seconds_{}{{deployment="Detector",node_type="DETECT_SUBJECTS",outcome="{}",replica="{}"}} {}'
)
METRICS = "\n".join(
    ["# TYPE ray_hitl_model_node_seconds histogram"]
    + [SERIES.format("count", o, r, v) for o, r, v in [("ok", "a", 5), ("ok", "b", 3), ("error", "a", 1)]]
    + [SERIES.format("count", "not_started", "b", 4)]
    + [SERIES.format("sum", "ok", "a", 2.5), SERIES.format("sum", "not_started", "b", 0.1)]
)


def test_executions_leave_out_the_calls_not_started() -> None:
    counts = parse_node_counts(METRICS)
    key = ("Detector", "DETECT_SUBJECTS")
    assert counts["count"][(*key, "not_started")] == 4.0 and counts["replicas"] == {"Detector": 2}
    assert executed(counts["count"]) == {(*key, "ok"): 8.0, (*key, "error"): 1.0}
    assert executed(counts["sum"]) == {(*key, "ok"): 2.5}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(720)
def test_burst_benchmark_runs(tmp_path: Path) -> None:
    require_binary("redis-server")
    out = tmp_path / "burst.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/burst.py", "--jobs", str(JOBS)]
        + ["--detector-delay-ms", "50", "--segmenter-delay-ms", "50", "--max-backlog", "0"]
        + ["--reviewers", "3", "--submit-concurrency", "4", "--timeout-s", "180", "--image-size", "240x180"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=700,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    # The admission phase (a second hitl up) is skipped here: refusals under a full backlog are
    # tested in tests/test_faults_redis.py and tests/test_burst_serve.py, on one hitl up each.
    assert "backlog" not in data
    for phase in ("burst",):
        b = data[phase]
        assert PHASE_FIELDS <= set(b), (phase, PHASE_FIELDS - set(b))
        assert b["jobs_accepted"] == JOBS and b["statuses"] == {"SUCCEEDED": JOBS}, (phase, b["statuses"], b)
        assert b["drain_s"] > 0 and b["ideal_s"] > 0 and 0 < b["efficiency"], b
        assert b["detector"]["replicas"] >= 1 and b["detector"]["slots"] >= 1, b["detector"]
        assert b["failed"] == b["timed_out_jobs"] == b["executor_lost"] == b["not_terminal"] == 0, b
        assert b["dead_letters"] == 0, b
        assert b["redis"]["used_memory_peak_sampled"] > 0, b["redis"]
        # One answer per box review, and one per mask review the gate opened (hitl up's default).
        assert b["submit"]["backlog_full_429"] >= 0 and JOBS <= b["reviews"]["interventions"].get("200", 0), b
        assert b["reviews"]["interventions"].get("200", 0) <= 2 * JOBS, b
        assert "DETECT_SUBJECTS" in b["model_executions"], b["model_executions"]
        assert b["model_executions"]["DETECT_SUBJECTS"]["calls_not_started"] >= 0, b["model_executions"]
    cancel = data["cancel"]
    assert cancel["waiting_before_cancel"] == JOBS and cancel["cancel_answers"] == {"200": JOBS}, cancel
    assert cancel["retention_started_share"] is not None, cancel
    assert {t["name"] for t in data["targets"]} >= {"burst: efficiency (ideal / drain)", "burst: dead letters"}
    assert "efficiency = ideal / drain" in proc.stdout and "target" in proc.stdout
    assert data["args"]["image_size"] == data["model_time"]["image_size"] == "240x180", data["model_time"]
    assert "model time = simulated delay" in proc.stdout and "50 / 50 ms on 240x180 images" in proc.stdout
