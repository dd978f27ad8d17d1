"""A crashed ``hitl up`` starts again at once on its own port (issue 19, finding 1; SPEC §1: every
process can restart and opening the same job shows the same pause).

What systemd's ``Restart=`` or a container restart does: SIGKILL of the whole ``hitl up`` tree after
traffic (an SSE stream and keep-alive connections open, so the dead Api replica leaves its port's
connections behind in TIME_WAIT/FIN_WAIT), then ``hitl up`` again on the same data directory and the
same ``--api-port``, three times in a row. Each time: READY on that port, the waiting job shows the
same pause (token, version, boxes), and after the last restart the pause is consumed once and the
job goes on to its end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from harness.ci import require_binary
from harness.hitl_up import HitlUp
from harness.tokens import TOKENS_SPEC, auth
from hitl_review.serve_app.ops.samples import product_composite

from .api_util import intervene, keep_all, wait_done, wait_status

pytestmark = [pytest.mark.faults, pytest.mark.ray, pytest.mark.slow]

RESTARTS = 3
ENV = {"HITL_TOKENS": TOKENS_SPEC}


def traffic(c: httpx.Client, job: str) -> threading.Thread:
    """Keep an SSE stream of ``job`` open (it is cut by the kill) and poll a few reads."""

    def follow() -> None:
        try:
            with c.stream("GET", f"/api/v1/jobs/{job}/events", timeout=None) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError:
            pass  # the server died under it: that is the point

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    for _ in range(5):
        assert c.get(f"/api/v1/jobs/{job}").status_code == 200
    return t


def test_hitl_up_sigkilled_after_traffic_restarts_on_the_same_port_three_times(tmp_path: Path):
    require_binary("redis-server")
    data = tmp_path / "data"
    up = HitlUp(data, env=ENV, log_path=tmp_path / "hitl-up-0.log").start(timeout=300)
    port = up.api_port
    headers = auth("admin")
    image, _ = product_composite(seed=21, n=1)
    try:
        with httpx.Client(base_url=up.api_url, headers=headers, timeout=30) as c:
            r = c.post("/api/v1/jobs", files={"image": ("a.png", image, "image/png")})
            assert r.status_code == 202, r.text
            job = r.json()["job_id"]
            first = wait_status(c, job, {"WAITING_USER_SELECTION"}, timeout=120, who="admin")
            traffic(c, job)
            time.sleep(0.5)
            up.kill()
        took = []
        for i in range(1, RESTARTS + 1):
            t0 = time.monotonic()
            up = HitlUp(data, env=ENV, api_port=port, log_path=tmp_path / f"hitl-up-{i}.log").start(timeout=300)
            took.append(time.monotonic() - t0)
            assert up.api_url == f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=up.api_url, headers=headers, timeout=30) as c:
                snap = wait_status(c, job, {"WAITING_USER_SELECTION"}, timeout=60, who="admin")
                assert snap["active_pause"]["pause_token"] == first["active_pause"]["pause_token"]
                assert snap["version"] == first["version"] and snap["box_list"] == first["box_list"]
                if i < RESTARTS:
                    traffic(c, job)
                    time.sleep(0.5)
                    up.kill()
                    continue
                r = intervene(c, job, snap, keep_all(snap), who="rev1")
                assert r.status_code == 200, r.text
                again = intervene(c, job, snap, keep_all(snap), who="rev1", iid=r.json()["intervention_id"])
                assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
                end = wait_done(c, job, timeout=120)
                assert end["status"] == "SUCCEEDED", end
        print(f"\n[restart] same port {port}: READY after SIGKILL in " + ", ".join(f"{t:.1f}s" for t in took))
    finally:
        up.kill()
