"""Redis loses live jobs; the archive's live mirror gives them back (docs/protocol.md § Reconcile).

A real control plane (uvicorn, a dispatcher, classical models with a slow detector) on a real
Redis, the SQLite archive in its data directory. One job waits for a reviewer, one is in model
work, one has finished. Once the mirror has seen them, FLUSHALL; with no admin, the job nobody asks
for is restored by the archiver's next mirror pass (an incident report names it) and the one asked
for answers at once; ``POST /api/v1/admin/reconcile`` (``hitl admin reconcile``) then finds nothing
left to restore:

- the waiting job gets a fresh pause: its old token is refused, the new one is consumed and the job
  finishes;
- the job in model work gets its node dispatched again and reaches the review;
- the finished job is not restored (the archive has it, and answers for it);
- a second reconcile restores nothing; the invariant checker finds no breach afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio
import redis

from harness.ci import require_binary
from harness.tokens import TOKENS_SPEC, auth
from harness.uvicorn import LocalServer
from hitl_review.archive import migrate
from hitl_review.archive.archiver import archive_job
from hitl_review.archive.db import Archive
from hitl_review.archive.mirror import Mirror, mirror_now, reconcile, write_live
from hitl_review.archive.schema import LiveMirror
from hitl_review.serve_app.recovery.recovery import Recovery
from hitl_review.statecore import errors, keys
from hitl_review.statecore.store import Store
from loadtest.check_invariants import check
from tests.api_util import blank_with_product, intervene, keep_all, submit, wait_status
from tests.helpers import iv, waiting_job

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
    t0 = time.monotonic()
    # No admin: the job nobody asks for comes back with the archiver's next mirror pass (the sweep) ...
    while not direct.exists(keys.job(busy).meta):
        assert time.monotonic() - t0 < 10, "the job in model work was not restored by the sweep"
        time.sleep(0.05)
    swept = time.monotonic() - t0
    # ... and one asked for is there (restored on the request, or by the sweep just before).
    assert c.get(f"/api/v1/jobs/{waiting}", headers=auth("rev1")).status_code == 200
    print(f"\n[recovery] after FLUSHALL: the unrequested job restored by the sweep in {swept:.2f}s")
    reports = list((s.data_dir / "incidents").glob("store-restore-*.json"))
    assert reports and busy in reports[0].read_text(), reports

    r = c.post("/api/v1/admin/reconcile", headers=auth("admin"))
    assert r.status_code == 200, r.text
    body = r.json()
    outcomes = {j["job_id"]: j["outcome"] for j in body["jobs"]}
    # The finished job's row left once the archive took its copy; until then it says the job ended.
    assert outcomes.pop(done, "ARCHIVED") in ("ARCHIVED", "TERMINAL"), body
    assert outcomes == {waiting: "PRESENT", busy: "PRESENT"}, body  # nothing left for an admin
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


# ------------------------------------------------------------------ a job that ended unseen (issue 19)


@pytest_asyncio.fixture
async def mirror_archive(tmp_path) -> AsyncIterator[Archive]:
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    await asyncio.to_thread(migrate.upgrade, url)
    archive = Archive(url)
    yield archive
    archive.close()


async def drop_from_redis(store: Store, job_id: str) -> None:
    """Redis loses the job: every key of it, and its place in the live indexes."""
    jk = keys.job(job_id)
    await store.r.delete(jk.meta, jk.pauses, jk.events, jk.idem, jk.reports, jk.executor, jk.claim, jk.audit)
    for index in (jk.waiting, jk.queued, jk.running, jk.heartbeats, jk.jobs):
        await store.r.zrem(index, job_id)


def mirror_row(archive: Archive, job_id: str) -> LiveMirror | None:
    with archive.reading() as s:
        row = s.get(LiveMirror, job_id)
        if row is not None:
            s.expunge(row)
        return row


async def test_reconcile_never_revives_a_job_that_ended_after_a_restart(store: Store, image, mirror_archive):
    """The mirror wrote the job while it waited; the job was cancelled and the archiver restarted
    (a new Mirror, which never wrote it) before the archive had its copy; then Redis lost it.
    A cancelled job never moves again: reconcile reports it TERMINAL and restores nothing."""
    archive = mirror_archive
    parts = range(keys.PARTITIONS)
    job = await waiting_job(store, image)
    assert (await Mirror(store, archive).sync(parts))["mirrored"] == 1
    assert mirror_row(archive, job).status == "WAITING_USER_SELECTION"
    await store.cancel(job, "rev1")
    await Mirror(store, archive).sync(parts)  # the restarted archiver: its memory is empty
    row = mirror_row(archive, job)
    assert row is not None and row.status == "CANCELLED" and row.meta["terminal"] == "1"
    await drop_from_redis(store, job)

    done = await reconcile(store, archive)
    assert {j["job_id"]: j["outcome"] for j in done["jobs"]} == {job: "TERMINAL"}, done
    assert not await store.r.exists(keys.job(job).meta)  # not revived: no fresh pause, no WAITING


async def test_reconcile_refuses_a_stale_row_of_a_job_the_archive_holds(store: Store, image, mirror_archive):
    """The mirror never saw the job end (its row still says waiting) but the archive holds its
    copy: that copy proves it finished, and the next mirror pass drops the obsolete row."""
    archive = mirror_archive
    job = await waiting_job(store, image)
    await mirror_now(store, archive, job)
    await store.cancel(job, "rev1")
    await archive_job(store, archive, job)
    assert mirror_row(archive, job).status == "WAITING_USER_SELECTION"
    await drop_from_redis(store, job)
    assert (await reconcile(store, archive))["counts"] == {"ARCHIVED": 1}
    assert not await store.r.exists(keys.job(job).meta)
    await Mirror(store, archive).sync(range(keys.PARTITIONS))
    assert mirror_row(archive, job) is None


async def test_mirror_now_writes_at_once_and_never_goes_back_a_version(store: Store, image, mirror_archive):
    """``mirror_now`` (the strict durability path) writes the job's row from Redis at once; a row
    written from an older meta never replaces a newer one."""
    archive = mirror_archive
    job = await waiting_job(store, image)
    old = await store.r.hgetall(keys.job(job).meta)
    old_pauses = await store.r.hgetall(keys.job(job).pauses)
    await store.cancel(job, "rev1")
    await mirror_now(store, archive, job)
    row = mirror_row(archive, job)
    assert row is not None and row.status == "CANCELLED" and row.version == int(old["version"]) + 1
    await asyncio.to_thread(write_live, archive, job, old, old_pauses)  # a late writer with the older meta
    assert mirror_row(archive, job).status == "CANCELLED"


# ------------------------------------------------------------------ automatic recovery (issue 19, finding 7)


async def test_a_lost_job_asked_for_many_times_at_once_is_restored_once(store: Store, image, mirror_archive):
    """Read-through: the store finds the job missing and asks the recovery, which restores it from
    its mirror row; twenty requests at once make one restore (one RESTORE audit entry, one
    JOB_RESTORED event), and each of them reads the job."""
    archive = mirror_archive
    job = await waiting_job(store, image)
    await mirror_now(store, archive, job)
    await drop_from_redis(store, job)
    store.on_missing = Recovery(store, archive).restore_missing
    states = await asyncio.gather(*(store.get(job) for _ in range(20)))
    assert {s.status.value for s in states} == {"WAITING_USER_SELECTION"}
    events = [e.type for e in await store.events_after(job)]
    assert events.count("JOB_RESTORED") == 1, events
    entries = (await store.audit(job))["entries"]
    assert [e["action"] for e in entries] == ["RESTORE"], entries


async def test_read_through_never_restores_an_ended_job_or_an_unknown_id(store: Store, image, mirror_archive):
    archive = mirror_archive
    job = await waiting_job(store, image)
    await store.cancel(job, "rev1")
    await mirror_now(store, archive, job)  # its row says it ended
    await drop_from_redis(store, job)
    store.on_missing = Recovery(store, archive).restore_missing
    for missing in (job, "job_00000000000000000000", "../../etc"):
        with pytest.raises(errors.JobNotFound):
            await store.get(missing)
    assert not await store.r.exists(keys.job(job).meta)


async def test_the_checker_accepts_a_restored_job_whose_pause_was_consumed_before_the_loss(
    store: Store, image, mirror_archive
):
    """The restored log starts at JOB_RESTORED; the pause consumed before the loss is CONSUMED in the
    pause history without its INTERVENTION_ACCEPTED (gone with Redis): not a breach."""
    archive = mirror_archive
    job = await waiting_job(store, image)
    state = await store.get(job)
    subjects = [{"box_id": b.box_id, "bbox": b.bbox} for b in state.box_list]
    assert (await store.intervene(job, iv(state, subjects), "rev1")).status_code == 200
    await mirror_now(store, archive, job)
    await drop_from_redis(store, job)
    assert (await reconcile(store, archive))["counts"] == {"RESTORED": 1}
    rep = await check(store, quiet_timeout=1)
    assert "pause_consumed_once" not in rep.breached(), rep.details()
    assert rep.inv["pause_consumed_once"].checked == 1  # the consumed pause was looked at
