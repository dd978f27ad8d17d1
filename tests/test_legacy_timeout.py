"""Seed 000's legacy ``timeout_at`` check against a real redis-server and the SQLite archive (issue
35, item 13): a waiting job's pause carrying ``timeout_at`` and ``auto_submit_on_timeout: true`` in
the past, as an older build would have written it, planted directly in Redis, goes through every
sweep the system runs: the inspector's pass and housekeeping, the archiver's pass (copies, the lost
copies' sweep, the live mirror), and the restore after Redis lost the job (the mirror pass finds it
gone and restores it). No pause has a timeout (SPEC §3, §9): the pause stays ``WAITING`` (after the
restore, a fresh ``WAITING`` one), nothing is consumed or submitted, no sweep moves the version.

A regression guard: it passed on the code it was written against (no sweep reads ``timeout_at``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest_asyncio

from hitl_review.archive import migrate
from hitl_review.archive.db import Archive
from hitl_review.archive.mirror import reconcile
from hitl_review.archive.schema import LiveMirror
from hitl_review.serve_app.work.archive_loop import ArchiveLoop
from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore import archive_queue, keys
from hitl_review.statecore.ids import now_iso
from hitl_review.statecore.store import Store

from .helpers import waiting_job

LEGACY = ("timeout_at", "timeout_seconds", "auto_submit_on_timeout")
# What consuming a pause, or answering it for the reviewer, would have written.
CONSUMING_EVENTS = {"INTERVENTION_ACCEPTED", "EMPTY_SELECTION_SUBMITTED", "JOB_FINISHED", "JOB_CANCELLED"}
SUBMITTED_NODES = {"VALIDATE_MANUAL_BOX_LIST", "PROCESS_APPROVED_BOX_LIST", "SEGMENT_SUBJECT", "FINALIZE_RESULTS"}


@pytest_asyncio.fixture
async def archive(tmp_path) -> AsyncIterator[Archive]:
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    await asyncio.to_thread(migrate.upgrade, url)
    a = Archive(url)
    yield a
    a.close()


async def _plant(store: Store, job_id: str) -> int:
    """The job's waiting pause as a legacy build wrote it: a timeout an hour past, to be auto-submitted;
    and that build's deadline for it in the running and heartbeat indices, so the inspector's pass
    reads this job (an hour lapsed). Written directly, as that build did: the version does not move."""
    jk = keys.job(job_id)
    past_ms = int(time.time() * 1000) - 3_600_000
    pause = json.loads(await store.r.hget(jk.meta, "active_pause"))
    pause.update({"timeout_at": now_iso(past_ms / 1000), "timeout_seconds": 60, "auto_submit_on_timeout": True})
    await store.r.hset(jk.meta, "active_pause", json.dumps(pause))
    await store.r.zadd(jk.running, {job_id: past_ms})
    await store.r.zadd(jk.heartbeats, {job_id: past_ms})
    return past_ms


async def _sweeps(store: Store, inspector: Inspector, loop: ArchiveLoop) -> dict[str, int]:
    """Every periodic pass once: the inspector's (in the dispatcher's loop) and the archiver's loop
    (copies reclaimed and read, lost copies swept, a mirror pass, which restores what Redis lost)."""
    counts = await inspector.sweep()
    await inspector.housekeeping()
    await loop.step(reclaim=True, sweep=True, mirror=True, block_ms=0)
    assert loop._mirroring is not None
    await loop._mirroring
    return counts


async def _nothing_consumed(store: Store, job_id: str) -> None:
    """The job waits on a person: its pause WAITING, none ever consumed, nothing answered or queued past
    detection."""
    st = await store.get(job_id)
    assert st.status == "WAITING_USER_SELECTION"
    assert st.active_pause is not None and st.active_pause.status == "WAITING"
    history = [json.loads(p) for p in (await store.r.hgetall(keys.job(job_id).pauses)).values()]
    assert all(p["status"] != "CONSUMED" and not p.get("consumed_by") for p in history), history
    assert not CONSUMING_EVENTS & {e.type for e in await store.events_after(job_id)}
    assert not SUBMITTED_NODES & {c.node_type for c in await store.outbox_commands(job_id)}
    actions = {e["action"] for e in (await store.audit(job_id))["entries"]}
    assert not actions & {"INTERVENE", "AUTO_APPROVE", "CANCEL"}, actions


async def test_a_legacy_pause_timeout_in_the_past_is_never_acted_on_by_any_sweep(store: Store, image, archive):
    await archive_queue.ensure_group(store)
    job_id = await waiting_job(store, image)
    token = (await store.get(job_id)).active_pause.pause_token
    await _plant(store, job_id)
    planted = await store.r.hgetall(keys.job(job_id).meta)
    version = int(planted["version"])
    events = await store.events_after(job_id)
    inspector = Inspector(store, owner="i1", grace_s=0, heartbeat_lapse_s=0.1)
    loop = ArchiveLoop(store, archive, consumer="arch-1")

    counts = await _sweeps(store, inspector, loop)
    # The inspector read the job through both planted entries and left it: no node of it runs.
    assert (counts["moved_on"], counts["lost"], counts["timed_out"]) == (2, 0, 0), counts
    assert await store.r.hgetall(keys.job(job_id).meta) == planted  # not one field written
    assert await store.events_after(job_id) == events
    await _nothing_consumed(store, job_id)
    assert loop.counts["mirrors"] == 1 and loop.counts["restored"] == 0
    with archive.reading() as s:  # the mirror pass read the planted pause, timeout and all
        row = s.get(LiveMirror, job_id)
        assert row is not None and row.version == version
        assert json.loads(row.meta["active_pause"])["auto_submit_on_timeout"] is True

    # Redis loses the job; the archiver's next mirror pass finds it gone and restores it.
    jk = keys.job(job_id)
    await store.r.delete(jk.meta, jk.pauses, jk.events, jk.idem, jk.reports, jk.claim, jk.audit)
    for index in (jk.waiting, jk.queued, jk.running, jk.heartbeats, jk.jobs):
        await store.r.zrem(index, job_id)
    await _sweeps(store, inspector, loop)
    assert loop.counts["restored"] == 1
    restored = await store.get(job_id)
    fresh = restored.active_pause
    assert fresh is not None and fresh.status == "WAITING" and fresh.pause_token != token
    assert not set(LEGACY) & set(json.loads(await store.r.hget(jk.meta, "active_pause")))
    old = json.loads(await store.r.hget(jk.pauses, token))
    assert old["status"] == "CANCELLED" and not old.get("consumed_by")  # refused from now on, never consumed
    (back,) = [e for e in await store.events_after(job_id) if e.type == "JOB_RESTORED"]
    assert back.data["from_version"] == version and restored.version > version  # the restore's own step
    await _nothing_consumed(store, job_id)

    after, events = await store.r.hgetall(jk.meta), await store.events_after(job_id)
    assert [e.type for e in events] == ["JOB_RESTORED", "PAUSE_SUPERSEDED", "PAUSE_OPENED"]
    await _sweeps(store, inspector, loop)  # and the sweeps leave the restored job as they found it
    assert await store.r.hgetall(jk.meta) == after
    assert await store.events_after(job_id) == events
    await _nothing_consumed(store, job_id)
    assert loop.counts["restored"] == 1
    assert (await reconcile(store, archive, [job_id]))["counts"] == {"PRESENT": 1}
    assert await store.r.hgetall(jk.meta) == after
