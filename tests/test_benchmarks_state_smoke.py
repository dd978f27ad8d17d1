"""The state-core benchmarks call the Lua scripts with the store's own KEYS and ARGV: when a script's
ARGV changes (the audit's actor, the quorum), they must change with it. A smoke run each, tiny sizes:
a run that exits 0 and writes its figures, not a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.ci import require_binary

ROOT = Path(__file__).parent.parent


def run(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_consume_pause_benchmark_runs(tmp_path: Path) -> None:
    require_binary("redis-server")
    require_binary("redis-benchmark")
    out = tmp_path / "consume_pause.json"
    run(
        "consume_pause.py",
        "--seconds",
        "0.5",
        "--memory-jobs",
        "100",
        "--max-jobs",
        "400",
        "--json",
        str(out),
    )
    data = json.loads(out.read_text())
    assert data["python"]["ops"] > 0 and not data["python"]["errors"], data["python"]


def test_metrics_scrape_benchmark_runs(tmp_path: Path) -> None:
    require_binary("redis-server")
    out = tmp_path / "metrics_scrape.json"
    run("metrics_scrape.py", "--sizes", "20,60", "--reps", "3", "--watched", "5", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["waiting"] for r in rows] == [20, 60] and 50 <= rows[-1]["waiting_unwatched"] <= 55
