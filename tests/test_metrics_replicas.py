"""Two Api replicas behind Serve's proxy (``hitl up --api-replicas 2``): every scrape of
``/metrics`` reads the deployment's totals, whichever replica answers (issue 20: per-process counters
behind a load-balanced ``/metrics`` made each scrape a random replica's and ``rate()`` noise)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.ci import require_binary
from harness.hitl_up import HitlUp
from harness.tokens import TOKENS_SPEC, auth

from .api_util import blank_with_product, intervene, keep_all, submit, wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def figures(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "hitl_jobs_created_total":
                out["created"] = s.value
            elif s.name == "hitl_interventions_total":
                out[f"interventions:{s.labels['outcome']}"] = s.value
    return out


def test_two_api_replicas_serve_the_same_totals(tmp_path: Path):
    require_binary("redis-server")
    up = HitlUp(
        tmp_path / "data", "--api-replicas", "2", env={"HITL_TOKENS": TOKENS_SPEC}, log_path=tmp_path / "up.log"
    ).start(timeout=300)
    try:
        with httpx.Client(base_url=up.api_url, timeout=30) as c:
            jobs = []
            for seed in range(4):
                r = submit(c, blank_with_product(seed))
                assert r.status_code == 202, r.text
                jobs.append(r.json()["job_id"])
            for j in jobs:
                snap = wait_status(c, j, {"WAITING_USER_SELECTION"}, timeout=120)
                assert intervene(c, j, snap, keep_all(snap)).status_code == 200
                stale = intervene(c, j, snap, keep_all(snap))  # another intervention on the consumed pause
                assert stale.status_code == 409
            time.sleep(2.5)  # each replica's increments reach Redis within a second
            scrapes = [figures(c.get("/metrics", headers=auth("admin")).text) for _ in range(8)]
        print(f"\n[metrics] 8 scrapes through the proxy: {scrapes[0]}")
        assert all(s == scrapes[0] for s in scrapes), scrapes
        assert scrapes[0]["created"] == 4 and scrapes[0]["interventions:OK"] == 4, scrapes[0]
        assert sum(v for k, v in scrapes[0].items() if k.startswith("interventions:") and k != "interventions:OK") == 4
    finally:
        up.stop()
