"""The GPU benchmark must keep running on CPU (tiny model): a smoke test, not a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_gpu_sam_benchmark_runs_on_cpu(tmp_path: Path):
    out = tmp_path / "gpu_sam.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_sam.py", "--device", "cpu", "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data, "the benchmark wrote no results"
    assert "encoder" in proc.stdout.lower()
