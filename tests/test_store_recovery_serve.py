"""Redis comes back empty under a real ``hitl up --durability strict`` (Ray Serve, embedded Redis,
the SQLite archive): recovery without an admin, and a decision is never offered again (issue 19,
finding 7; seed 004).

Three jobs: one whose intervention was answered 200 a moment before the loss (well inside the
mirror's 5 s period: only the strict write of its mirror row before the 200 can have kept the
decision), one waiting for a reviewer, one nobody asks about afterwards. FLUSHALL of the embedded
Redis. Then, with no ``hitl admin reconcile``:

- the decided job answers at once (restored on the request) and goes on from its decision: it is
  never WAITING_USER_SELECTION again, and it ends SUCCEEDED with the boxes the reviewer kept;
- the waiting job answers with a pause again and can be reviewed to its end;
- the job nobody asks about is back in Redis within two mirror periods (the archiver's sweep), and
  the incident report in ``<data-dir>/incidents/`` names it;
- a reviewer account added at run time signs in again with its token (written back from the archive).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import redis

from harness.ci import require_binary
from harness.hitl_up import HitlUp
from harness.tokens import TOKENS_SPEC, auth
from hitl_review.statecore import keys

from .api_util import blank_with_product, intervene, keep_all, submit, wait_done, wait_status

pytestmark = [pytest.mark.faults, pytest.mark.ray, pytest.mark.slow]

WAITING = {"WAITING_USER_SELECTION"}


def created(c: httpx.Client, seed: int) -> str:
    r = submit(c, blank_with_product(seed))
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def test_store_back_empty_under_strict_recovers_without_an_admin_and_never_reoffers(tmp_path: Path):
    require_binary("redis-server")
    up = HitlUp(
        tmp_path / "data", "--durability", "strict", env={"HITL_TOKENS": TOKENS_SPEC}, log_path=tmp_path / "up.log"
    ).start(timeout=300)
    try:
        assert up.redis_url
        direct = redis.Redis.from_url(up.redis_url, decode_responses=True)
        with httpx.Client(base_url=up.api_url, timeout=30) as c:
            decided, waiting, quiet = created(c, 1), created(c, 2), created(c, 3)
            snaps = {j: wait_status(c, j, WAITING, timeout=120) for j in (decided, waiting, quiet)}
            kept = keep_all(snaps[decided])[:1]
            added = c.post("/api/v1/admin/reviewers", json={"name": "gina"}, headers=auth("admin"))
            assert added.status_code == 201, added.text  # an account added at run time
            gina = {"Authorization": f"Bearer {added.json()['token']}"}
            r = intervene(c, decided, snaps[decided], kept)
            assert r.status_code == 200, r.text
            direct.flushall()  # at once: the periodic mirror has not seen the decision
            t0 = time.monotonic()
            who = c.get("/api/v1/whoami", headers=gina)  # her token works again, no admin, no restart
            assert who.status_code == 200 and who.json()["name"] == "gina", who.text

            after = c.get(f"/api/v1/jobs/{decided}", headers=auth("rev1"))
            assert after.status_code == 200, after.text
            seen = [after.json()["status"]]
            back = wait_status(c, waiting, WAITING, timeout=30)
            first_answer = time.monotonic() - t0
            assert back["active_pause"]["pause_token"] != snaps[waiting]["active_pause"]["pause_token"]
            while not direct.exists(keys.job(quiet).meta):
                assert time.monotonic() - t0 < 15, "the job nobody asked about was not restored by the sweep"
                time.sleep(0.1)
            swept = time.monotonic() - t0

            deadline = time.monotonic() + 120
            while seen[-1] not in ("SUCCEEDED", "FAILED", "CANCELLED", "EMPTY_SELECTION", "WAITING_MASK_REVIEW"):
                assert time.monotonic() < deadline, f"decided job stuck: {seen}"
                time.sleep(0.1)
                seen.append(c.get(f"/api/v1/jobs/{decided}", headers=auth("rev1")).json()["status"])
            if seen[-1] == "WAITING_MASK_REVIEW":  # a cut-out the gate failed: a later stage, accepted
                seen.append(wait_done(c, decided, timeout=120)["status"])
            assert "WAITING_USER_SELECTION" not in seen, f"the decided review was offered again: {seen}"
            end = c.get(f"/api/v1/jobs/{decided}/results", headers=auth("rev1"))
            assert seen[-1] == "SUCCEEDED" and end.status_code == 200, (seen, end.text)
            assert [s["box_id"] for s in end.json()["subjects"]] == [k["box_id"] for k in kept]

            assert intervene(c, waiting, back, keep_all(back)).status_code == 200
            assert wait_done(c, waiting, timeout=120)["status"] == "SUCCEEDED"
            reports = list((up.data_dir / "incidents").glob("store-restore-*.json"))
            restored = {j["job_id"] for rep in reports for j in json.loads(rep.read_text())["restored"]}
            assert quiet in restored, reports
        print(
            f"\n[recovery] strict, FLUSHALL: first jobs answering {first_answer:.2f}s after, "
            f"the unrequested job back {swept:.2f}s after; decided job went {' -> '.join(dict.fromkeys(seen))}"
        )
        direct.close()
    finally:
        up.stop()
