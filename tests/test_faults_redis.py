"""Redis outages under a real control plane (docs/protocol.md § Error codes: STORE_UNAVAILABLE,
BACKLOG_FULL): the FastAPI app under uvicorn (``harness.uvicorn.LocalServer``) with its own
redis-server, and real signals sent to that server's PID.

- SIGKILL under interventions, then a restart on the same data directory: 503 (never 500)
  meanwhile; under ``--durability strict`` every acknowledged intervention is still consumed;
  under fast the loss is measured and printed.
- SIGSTOP (a hung Redis): 503 within the store timeout, then 200 again after SIGCONT.
- CLIENT KILL of the API's connections during consumes: no 500, nothing consumed twice.
- FLUSHALL (Redis back empty): the API keeps answering, the dispatcher re-creates its consumer
  group instead of looping on NOGROUP, a new job reaches WAITING, and what was lost is reported
  (``<data-dir>/incidents/store-reset-*.json`` naming the jobs the store held).
- Admission control: a slow dispatcher and a small ``max_backlog``: POST /jobs gets 429
  BACKLOG_FULL with Retry-After; interventions and cancels still go through.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from harness.ci import require_binary
from harness.tokens import TOKENS_SPEC, auth
from harness.uvicorn import LocalServer
from hitl_review.archive.db import Archive, archive_url
from hitl_review.archive.schema import LiveMirror
from hitl_review.statecore import keys
from tests.api_util import blank_with_product, get, keep_all, submit, wait_status

pytestmark = pytest.mark.faults

WAITING = {"WAITING_USER_SELECTION"}
STORE_TIMEOUT_S = 1.0


def server(tmp_path: Path, **fields: Any) -> LocalServer:
    require_binary("redis-server")
    fields = {"tokens": TOKENS_SPEC, "store_timeout_s": STORE_TIMEOUT_S, **fields}
    return LocalServer(tmp_path, **fields).start()


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LocalServer, httpx.Client]]:
    fields = getattr(request, "param", {})
    s = server(tmp_path, **fields)
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            yield s, c
    finally:
        pid = s.own_redis.pid if s.own_redis else None
        if pid:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        s.stop()


def redis_pid(s: LocalServer) -> int:
    assert s.own_redis is not None and s.own_redis.pid is not None
    return s.own_redis.pid


def waiting_jobs(c: httpx.Client, n: int, seed: int = 0) -> list[dict[str, Any]]:
    ids = []
    for i in range(n):
        r = submit(c, blank_with_product(seed + i))
        assert r.status_code == 202, r.text
        ids.append(r.json()["job_id"])
    return [wait_status(c, j, WAITING, timeout=60) for j in ids]


def mirror_status_within(data_dir: Path, job_id: str, timeout: float) -> tuple[str, int] | None:
    """The archive's live mirror row of ``job_id`` as (status, version) once it is at WAITING, or the
    last seen when ``timeout`` passes."""
    archive = Archive(archive_url(data_dir))
    seen = None
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with archive.reading() as db:
                row = db.get(LiveMirror, job_id)
                seen = None if row is None else (row.status, row.version)
            if seen is not None and seen[0] in WAITING:
                break
            time.sleep(0.1)
    finally:
        archive.close()
    return seen


def body(snap: dict[str, Any], iid: str) -> dict[str, Any]:
    return {
        "intervention_id": iid,
        "pause_token": snap["active_pause"]["pause_token"],
        "base_version": snap["version"],
        "subjects": keep_all(snap),
    }


def accepted_count(r: redis.Redis, job_id: str) -> int:
    return sum(json.loads(e)["type"] == "INTERVENTION_ACCEPTED" for e in r.lrange(keys.job(job_id).events, 0, -1))


def wait_ok(c: httpx.Client, path: str, timeout: float = 20) -> float:
    t0 = time.monotonic()
    while True:
        try:
            if c.get(path, headers=auth("rev1"), timeout=5).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < timeout, f"{path} did not answer 200 within {timeout}s"
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------- SIGKILL


@pytest.mark.parametrize("durability", ["strict", "fast"])
def test_sigkill_redis_under_interventions_loses_no_acknowledged_one(tmp_path: Path, durability: str):
    s = server(tmp_path, durability=durability)
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            snaps = waiting_jobs(c, 8)
            sent: list[tuple[dict[str, Any], str, int]] = []
            acked = threading.Event()

            def traffic() -> None:
                for snap in snaps:
                    iid = f"iv_{uuid.uuid4().hex[:12]}"
                    r = c.post(
                        f"/api/v1/jobs/{snap['job_id']}/interventions", json=body(snap, iid), headers=auth("rev1")
                    )
                    sent.append((snap, iid, r.status_code))
                    if sum(code == 200 for _, _, code in sent) >= 3:
                        acked.set()
                    time.sleep(0.05)

            t = threading.Thread(target=traffic)
            t.start()
            assert acked.wait(30)
            os.kill(redis_pid(s), signal.SIGKILL)
            t.join(60)
            during = c.get(f"/api/v1/jobs/{snaps[0]['job_id']}", headers=auth("rev1"))
            statuses = [code for _, _, code in sent]
            assert set(statuses) <= {200, 503}, statuses
            assert during.status_code == 503 and during.json()["code"] == "STORE_UNAVAILABLE"
            assert during.headers.get("Retry-After")

            assert s.own_redis is not None
            s.own_redis.restart()  # same port, same data directory: it replays its AOF
            wait_ok(c, "/readyz")
            lost = [
                snap["job_id"] for snap, _, code in sent if code == 200 and get(c, snap["job_id"])["status"] in WAITING
            ]
            print(
                f"\n[faults] durability={durability}: {statuses.count(200)} interventions acknowledged before "
                f"SIGKILL, {len(lost)} lost after the restart; {statuses.count(503)} answered 503"
            )
            if durability == "strict":
                assert lost == []
            # The ones refused while Redis was down go through now, with the same intervention id.
            for snap, iid, code in sent:
                if code == 503:
                    r = c.post(
                        f"/api/v1/jobs/{snap['job_id']}/interventions", json=body(snap, iid), headers=auth("rev1")
                    )
                    assert r.status_code == 200, r.text
            r = submit(c, blank_with_product(99))
            assert r.status_code == 202, r.text
            wait_status(c, r.json()["job_id"], WAITING, timeout=60)
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------- SIGSTOP


def test_hung_redis_answers_503_within_the_store_timeout_then_recovers(served):
    s, c = served
    (snap,) = waiting_jobs(c, 1)
    job = snap["job_id"]
    pid = redis_pid(s)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        timings = {}
        for name, call in {
            "get": lambda: c.get(f"/api/v1/jobs/{job}", headers=auth("rev1")),
            "list": lambda: c.get("/api/v1/jobs", headers=auth("rev1")),
            "intervene": lambda: c.post(
                f"/api/v1/jobs/{job}/interventions", json=body(snap, "iv_hung"), headers=auth("rev1")
            ),
            "create": lambda: submit(c, blank_with_product(7)),
            "readyz": lambda: c.get("/readyz"),
        }.items():
            t0 = time.monotonic()
            r = call()
            timings[name] = time.monotonic() - t0
            assert r.status_code == 503, (name, r.status_code, r.text)
            assert r.headers.get("Retry-After"), name
            if name != "readyz":
                assert r.json()["code"] == "STORE_UNAVAILABLE"
            assert timings[name] < STORE_TIMEOUT_S + 1.5, (name, timings[name])
        print(f"\n[faults] SIGSTOP, store timeout {STORE_TIMEOUT_S}s: time to 503 per route {timings}")
        time.sleep(max(0.0, 4.0 - (time.monotonic() - stopped_at)))
    finally:
        os.kill(pid, signal.SIGCONT)
    recovered = wait_ok(c, f"/api/v1/jobs/{job}", timeout=10)
    print(f"[faults] after SIGCONT the API answered 200 again in {recovered:.2f}s")
    r = c.post(f"/api/v1/jobs/{job}/interventions", json=body(snap, "iv_hung"), headers=auth("rev1"))
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------------------------ CLIENT KILL


def test_client_kill_during_consumes_no_500_nothing_consumed_twice(served):
    s, c = served
    snaps = waiting_jobs(c, 8)
    direct = redis.Redis.from_url(s.redis_url, decode_responses=True)
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        while not stop.is_set():
            kills += int(direct.client_kill_filter(_type="normal", skipme=True) or 0)
            time.sleep(0.005)

    k = threading.Thread(target=killer)
    k.start()
    codes: list[int] = []
    try:
        for snap in snaps:
            iid = f"iv_{uuid.uuid4().hex[:12]}"
            for _ in range(50):  # the same intervention until it is acknowledged, as a client retries it
                r = c.post(f"/api/v1/jobs/{snap['job_id']}/interventions", json=body(snap, iid), headers=auth("rev1"))
                codes.append(r.status_code)
                if r.status_code == 200:
                    break
                time.sleep(0.02)
    finally:
        stop.set()
        k.join()
    print(f"\n[faults] CLIENT KILL: {kills} connections killed; answers {sorted(set(codes))} ({len(codes)} requests)")
    assert set(codes) <= {200, 503}, codes
    assert codes.count(200) == len(snaps)
    for snap in snaps:
        assert accepted_count(direct, snap["job_id"]) == 1
        assert get(c, snap["job_id"])["status"] not in WAITING
    direct.close()


# ---------------------------------------------------------------------------------------- FLUSHALL


@pytest.mark.parametrize("served", [{"inspector_period_s": 0.5}], indirect=True)
def test_redis_back_empty_groups_are_recreated_new_jobs_run_and_the_loss_is_reported(
    served, caplog: pytest.LogCaptureFixture
):
    s, c = served
    (old,) = waiting_jobs(c, 1)
    # The archiver mirrors live jobs asynchronously: wait until its mirror holds the job as it waits
    # (a loaded machine lags; restoring what the mirror last saw, DETECTING, is right then, and not
    # what this test is about), then for the dispatcher's watch, which looks every inspector period.
    mirrored = mirror_status_within(s.data_dir, old["job_id"], timeout=30)
    assert mirrored == ("WAITING_USER_SELECTION", old["version"]), mirrored
    time.sleep(1.5)
    caplog.set_level(logging.INFO, logger="hitl.dispatcher")
    direct = redis.Redis.from_url(s.redis_url)
    direct.flushall()
    direct.close()
    r = c.get(f"/api/v1/jobs/{old['job_id']}", headers=auth("rev1"))
    # The API keeps answering, and the job the mirror had seen is back (restored on this request from
    # the archive's live mirror: docs/protocol.md § Reconcile) with a fresh pause.
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "WAITING_USER_SELECTION"
    assert r.json()["active_pause"]["pause_token"] != old["active_pause"]["pause_token"]
    assert c.get("/api/v1/jobs", headers=auth("rev1")).status_code == 200
    r = submit(c, blank_with_product(3))
    assert r.status_code == 202, r.text
    new_job = r.json()["job_id"]
    wait_status(c, new_job, WAITING, timeout=30)
    time.sleep(2)  # a looping dispatcher would log on every pass
    nogroup = [rec for rec in caplog.records if rec.name == "hitl.dispatcher" and "NOGROUP" in rec.getMessage()]
    print(f"\n[faults] FLUSHALL: {len(nogroup)} NOGROUP log lines from the dispatcher")
    assert 1 <= len(nogroup) <= 3, [rec.getMessage() for rec in nogroup]
    # What was lost is reported: one report in <data-dir>/incidents naming the waiting job.
    reports = sorted((s.data_dir / "incidents").glob("store-reset-*.json"))
    assert len(reports) == 1, reports
    report = json.loads(reports[0].read_text())
    assert report["incident"] == "STORE_RESET" and report["previous_store_id"] != report["store_id"]
    seen = report["last_seen"]
    assert seen["live_jobs"]["waiting"] == [old["job_id"]] and new_job not in json.dumps(report)
    assert seen["jobs_by_status"] == {"WAITING_USER_SELECTION": 1} and report["lost_jobs"] == 1
    print(f"[faults] FLUSHALL: reported {report['lost_jobs']} lost job(s) in {reports[0].name}")


# ----------------------------------------------------------------------------------------- backlog


@pytest.mark.parametrize(
    "served", [{"max_backlog": 1, "detector_delay_ms": 1500, "dispatcher_concurrency": 1}], indirect=True
)
def test_backlog_full_refuses_new_jobs_not_interventions_or_cancels(served):
    _s, c = served
    (snap,) = waiting_jobs(c, 1)
    queued: list[str] = []
    refused = None
    for i in range(20):
        r = submit(c, blank_with_product(10 + i))
        if r.status_code == 429:
            refused = r
            break
        assert r.status_code == 202, r.text
        queued.append(r.json()["job_id"])
        time.sleep(0.3)  # the backlog is measured at most once a second
    assert refused is not None, f"never refused after {len(queued)} jobs"
    assert refused.json()["code"] == "BACKLOG_FULL" and int(refused.headers["Retry-After"]) >= 1
    print(f"\n[faults] backlog: refused after {len(queued)} queued jobs: {refused.json()['message']}")
    r = c.post(f"/api/v1/jobs/{snap['job_id']}/interventions", json=body(snap, "iv_bl"), headers=auth("rev1"))
    assert r.status_code == 200, r.text
    r = c.post(f"/api/v1/jobs/{queued[-1]}/cancel", headers=auth("rev1"))
    assert r.status_code == 200, r.text
