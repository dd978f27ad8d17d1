"""The examples in ``examples/`` run, as a user would run them, against a real control plane (the
``api_server`` fixture: uvicorn, a real redis-server, the classical models in threads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from harness.tokens import TOKENS
from hitl_review.serve_app.ops.samples import product_composite

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.timeout(60)
def test_client_quickstart_submits_watches_approves_and_downloads(api_server, tmp_path: Path):
    image = tmp_path / "shoe.png"
    image.write_bytes(product_composite(seed=4321, width=160, height=120, n=2)[0])
    out = tmp_path / "cutouts"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HITL_")}
    argv = [sys.executable, str(EXAMPLES / "client_quickstart.py"), str(image), "--approve", "--out", str(out)]
    argv += ["--api-url", api_server.url, "--token", TOKENS["admin"]]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=45, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("submitted shoe.png: job_"), run.stdout
    job_id = lines[0].split(": ", 1)[1].split()[0]
    events = [line.split()[2] for line in lines if line.startswith("  event ")]
    assert events[0] == "JOB_CREATED" and "PAUSE_OPENED" in events and events[-1] == "JOB_FINISHED", run.stdout
    assert f"{job_id} ended SUCCEEDED" in run.stdout, run.stdout
    cutouts = sorted(out.glob("cutout_*.png"))
    assert cutouts and len(cutouts) == len(list(out.glob("mask_*.png"))), run.stdout
    with Image.open(cutouts[0]) as im:
        assert im.mode == "RGBA"

    # A rerun is the same job (its idempotency key), already finished: the same results, no new job.
    again = subprocess.run(argv, capture_output=True, text=True, timeout=45, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0] == f"submitted shoe.png: {job_id} (replayed)", again.stdout
