"""The archive in the running control plane (docs/protocol.md § Archive), through a real server,
real Redis and the SQLite archive in the data directory:

- a job that ends is copied to the archive within seconds, and only then do its Redis records get
  their retention TTL;
- with the job's Redis keys deleted, ``GET /jobs/{id}``, ``/results`` and ``/events`` answer
  from the archive with the same bodies (``/audit`` too), and a submitter still sees only its own jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from harness.ci import require_binary
from harness.tokens import TOKENS_SPEC, auth
from harness.uvicorn import LocalServer
from hitl_review.statecore import keys
from tests.api_util import blank_with_product, intervene, keep_all, sse_events, submit, wait_status


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, httpx.Client]]:
    require_binary("redis-server")
    s = LocalServer(tmp_path_factory.mktemp("archive"), tokens=TOKENS_SPEC, retention_s=3600).start()
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            yield s, c
    finally:
        s.stop()


def finished_job(c: httpx.Client) -> str:
    r = submit(c, blank_with_product(7))
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    snap = wait_status(c, job_id, {"WAITING_USER_SELECTION"})
    assert intervene(c, job_id, snap, keep_all(snap)).status_code == 200
    assert wait_status(c, job_id)["status"] == "SUCCEEDED"
    return job_id


def test_a_finished_job_is_archived_then_expires_and_reads_come_from_the_archive(served):
    s, c = served
    job_id = finished_job(c)
    direct = redis.Redis.from_url(s.redis_url, decode_responses=True)
    jk = keys.job(job_id)
    t0 = time.monotonic()
    while direct.ttl(jk.meta) < 0:  # the retention starts once the archive acknowledged the copy
        assert time.monotonic() - t0 < 10, "not archived within 10 s"
        time.sleep(0.05)
    print(f"\n[archive] job archived and its retention started {time.monotonic() - t0:.2f}s after SUCCEEDED")
    assert 3500 < direct.ttl(jk.meta) <= 3600 and (s.data_dir / "archive.sqlite3").exists()
    before = {
        "job": c.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1")).json(),
        "results": c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("rev1")).json(),
        "events": sse_events(c, job_id),
        "later": sse_events(c, job_id, last_event_id=3),
        "audit": c.get(f"/api/v1/jobs/{job_id}/audit", headers=auth("rev1")).json(),
    }
    assert [e["action"] for e in before["audit"]["entries"]][:1] == ["SUBMIT"]
    # Redis loses the job: every read answers from the archive, the same bodies.
    assert direct.delete(jk.meta, jk.pauses, jk.events, jk.idem, jk.reports, jk.audit) >= 4
    after = {
        "job": c.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1")).json(),
        "results": c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("rev1")).json(),
        "events": sse_events(c, job_id),
        "later": sse_events(c, job_id, last_event_id=3),
        "audit": c.get(f"/api/v1/jobs/{job_id}/audit", headers=auth("rev1")).json(),
    }
    before["job"]["claim"] = after["job"]["claim"] = None  # a claim is live state, never archived
    assert after == before
    assert [e["type"] for e in after["events"]][-1] == "JOB_FINISHED" and after["later"][0]["id"] == 4
    # The submitter who created it sees it; another submitter gets the 404 a missing job gets.
    assert c.get(f"/api/v1/jobs/{job_id}", headers=auth("sub1")).status_code == 200
    assert c.get(f"/api/v1/jobs/{job_id}", headers=auth("sub2")).status_code == 404
    assert c.get("/api/v1/jobs/job_never_was", headers=auth("rev1")).status_code == 404
    direct.close()
