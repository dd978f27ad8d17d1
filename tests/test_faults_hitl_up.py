"""The embedded Redis is supervised: SIGKILL the ``redis-server`` child of a real
``hitl up --no-ui`` and ``hitl up`` restarts it on the same data directory and port; a job
created before is still there, the API answers again and a new job runs. One ``hitl up`` (it
takes ~30-60 s to start on a small machine)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from harness.ci import require_binary
from harness.hitl_up import HitlUp
from hitl_review.serve_app.ops.samples import product_composite

pytestmark = [pytest.mark.faults, pytest.mark.ray, pytest.mark.slow]


def redis_children(up: HitlUp) -> list[psutil.Process]:
    assert up.child.proc is not None
    root = psutil.Process(up.child.proc.pid)
    return [p for p in root.children(recursive=True) if p.name().startswith("redis-server")]


def test_hitl_up_restarts_its_embedded_redis_after_sigkill(tmp_path: Path):
    require_binary("redis-server")
    up = HitlUp(tmp_path / "data", "--store-timeout-s", "1", log_path=tmp_path / "hitl-up.log").start(timeout=300)
    try:
        # Serve's controller loops every 0.5 s on a cluster hitl up starts (serving.ray_runtime.CONTROL_LOOP_ENV).
        (controller,) = [p for p in up.child.tree() if " ".join(p.cmdline()).startswith("ray::ServeController")]
        assert controller.environ().get("RAY_SERVE_CONTROL_LOOP_INTERVAL_S") == "0.5"
        headers = {"Authorization": f"Bearer {up.token}"}
        with httpx.Client(base_url=up.api_url, headers=headers, timeout=30) as c:
            data, _ = product_composite(seed=5, n=1)
            r = c.post("/api/v1/jobs", files={"image": ("a.png", data, "image/png")})
            assert r.status_code == 202, r.text
            job = r.json()["job_id"]
            (before,) = redis_children(up)
            os.kill(before.pid, signal.SIGKILL)
            t0 = time.monotonic()
            codes = []
            while True:  # 503 (never 500) until the supervisor has restarted it
                resp = c.get(f"/api/v1/jobs/{job}")
                codes.append(resp.status_code)
                if resp.status_code == 200:
                    break
                assert resp.status_code == 503, resp.text
                assert time.monotonic() - t0 < 30, f"no 200 within 30 s: {codes[-5:]}"
                time.sleep(0.2)
            recovered = time.monotonic() - t0
            (after,) = redis_children(up)
            assert after.pid != before.pid
            print(f"\n[faults] hitl up: redis SIGKILLed; 200 again after {recovered:.1f}s ({codes.count(503)} x 503)")
            assert any("restarting it" in line for line in up.lines)
            data, _ = product_composite(seed=6, n=1)
            r = c.post("/api/v1/jobs", files={"image": ("b.png", data, "image/png")})
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 60
            while c.get(f"/api/v1/jobs/{r.json()['job_id']}").json()["status"] != "WAITING_USER_SELECTION":
                assert time.monotonic() < deadline, "the new job did not reach WAITING after the restart"
                time.sleep(0.3)
    finally:
        assert up.stop() == 0
