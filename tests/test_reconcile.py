"""Redis loses live jobs; the archive's live mirror gives them back (docs/protocol.md § Reconcile).

A real control plane (uvicorn, a dispatcher, classical models with a slow detector) on a real
Redis, the SQLite archive in its data directory. One job waits for a reviewer, one is in model
work, one has finished. Once the mirror has seen them, FLUSHALL; then ``POST
/api/v1/admin/reconcile`` (``hitl admin reconcile``):

- the waiting job gets a fresh pause: its old token is refused, the new one is consumed and the job
  finishes;
- the job in model work gets its node dispatched again and reaches the review;
- the finished job is not restored (the archive has it, and answers for it);
- a second reconcile restores nothing; the invariant checker finds no breach afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from harness.ci import require_binary
from harness.tokens import TOKENS_SPEC, auth
from harness.uvicorn import LocalServer
from loadtest.check_invariants import check
from statecore.store import Store
from tests.api_util import blank_with_product, intervene, keep_all, submit, wait_status

WAITING = {"WAITING_USER_SELECTION"}


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[LocalServer, httpx.Client]]:
    require_binary("redis-server")
    s = LocalServer(tmp_path, tokens=TOKENS_SPEC, inspector_period_s=0.3, detector_delay_ms=2500).start()
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            yield s, c
    finally:
        s.stop()


def created(c: httpx.Client, seed: int) -> str:
    r = submit(c, blank_with_product(seed))
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def test_reconcile_restores_the_live_jobs_redis_lost(served):
    s, c = served
    done = created(c, 1)
    snap = wait_status(c, done, WAITING)
    assert intervene(c, done, snap, keep_all(snap)).status_code == 200
    wait_status(c, done, {"SUCCEEDED"})
    waiting = created(c, 2)
    old = wait_status(c, waiting, WAITING)
    busy = created(c, 3)
    wait_status(c, busy, {"DETECTING"})
    time.sleep(1.2)  # a few inspector periods: the mirror has seen both live jobs as they are now
    assert wait_status(c, busy, {"DETECTING"})["current_node"]["status"] == "RUNNING"
    direct = redis.Redis.from_url(s.redis_url, decode_responses=True)
    direct.flushall()
    assert c.get(f"/api/v1/jobs/{waiting}", headers=auth("rev1")).status_code == 404

    r = c.post("/api/v1/admin/reconcile", headers=auth("admin"))
    assert r.status_code == 200, r.text
    body = r.json()
    print(f"\n[reconcile] after FLUSHALL: {body['counts']}")
    outcomes = {j["job_id"]: j["outcome"] for j in body["jobs"]}
    assert outcomes == {waiting: "RESTORED", busy: "RESTORED"}, body
    assert c.post("/api/v1/admin/reconcile", headers=auth("rev1")).status_code == 403

    # The waiting job: a fresh pause; the old token is refused, the new one consumed.
    again = wait_status(c, waiting, WAITING)
    assert again["active_pause"]["pause_token"] != old["active_pause"]["pause_token"]
    assert again["version"] > old["version"]
    stale = intervene(c, waiting, {**old, "version": again["version"]}, keep_all(old))
    assert stale.status_code == 409 and stale.json()["code"] == "PAUSE_TOKEN_MISMATCH", stale.text
    assert intervene(c, waiting, again, keep_all(again)).status_code == 200
    assert wait_status(c, waiting, {"SUCCEEDED"})["status"] == "SUCCEEDED"
    # The job in model work: its node runs again and the job reaches the review.
    assert wait_status(c, busy, WAITING, timeout=60)["current_node"]["status"] == "COMPLETED"
    # The finished job was the archive's: not restored, still readable.
    assert c.get(f"/api/v1/jobs/{done}", headers=auth("rev1")).json()["status"] == "SUCCEEDED"

    second = c.post("/api/v1/admin/reconcile", headers=auth("admin")).json()
    assert "RESTORED" not in second["counts"], second

    async def checked():
        store = Store.from_url(s.redis_url)
        try:
            return await check(store, quiet_timeout=30)
        finally:
            await store.close()

    rep = asyncio.run(checked())
    assert rep.ok, rep.details()
    direct.close()
