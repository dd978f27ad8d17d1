"""Event ids across a restore (docs/protocol.md § Events, § Reconcile): a live job that Redis lost
comes back from its mirror (``statecore.restore``) with a new event list whose ids go on from past
the old ones. A reader that resumes after the last id it saw gets the restored events, none
skipped, and a live stream (``Store.stream_events``, the SSE hub) still ends with ``JOB_FINISHED``;
an id lost with Redis reads the whole new list; a ``PAUSE_OPENED`` stored by reference after the
restore is written out whole when its pause is consumed; the archive's copy keeps the true ids.
Real redis-server and Store; the mirror is taken as ``archive.mirror`` takes it (the meta hash and
the pause history), the loss is a FLUSHDB."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from hitl_review.archive import migrate, reads
from hitl_review.archive.archiver import copy_job
from hitl_review.archive.db import Archive
from hitl_review.serve_app.routes.events import EventHub
from hitl_review.statecore import audit, keys
from hitl_review.statecore.models import Event
from hitl_review.statecore.restore import EVENT_ID_GAP, restore
from hitl_review.statecore.store import Store

from .helpers import THREE_BOXES, create, iv, keep, manual, report, validate, waiting_job

STREAM_TIMEOUT_S = 5.0


async def _mirror(store: Store, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    jk = keys.job(job_id)
    return await store.r.hgetall(jk.meta), await store.r.hgetall(jk.pauses)


async def _lose_and_restore(store: Store, job_id: str, mirror: tuple[dict[str, str], dict[str, str]]) -> None:
    await store.r.flushdb()  # Redis came back empty
    await store.ensure_groups()
    assert await restore(store, *mirror) == "RESTORED"


def _contiguous(events: list[Event]) -> bool:
    return [e.id for e in events] == list(range(events[0].id, events[0].id + len(events)))


async def _collect(events: AsyncIterator[Event]) -> list[Event]:
    return [ev async for ev in events]


async def test_a_restored_job_resumes_after_the_last_id_seen_and_its_streams_end_with_job_finished(store, image):
    job_id = await waiting_job(store, image)
    seen = await store.events_after(job_id)
    last_seen = seen[-1].id
    await _lose_and_restore(store, job_id, await _mirror(store, job_id))

    new = await store.events_after(job_id, last_seen)
    assert [e.type for e in new][:1] == ["JOB_RESTORED"], [e.type for e in new]
    assert "PAUSE_OPENED" in [e.type for e in new]
    assert new[0].id > last_seen and _contiguous(new)
    assert new[0].data["from_event"] == last_seen  # the mirror knew every event
    assert await store.events_after(job_id, 0) == new  # everything stored
    for i, ev in enumerate(new):  # resuming after any restored id: the rest, by id
        assert await store.events_after(job_id, ev.id) == new[i + 1 :]
    assert await store.events_after(job_id, new[0].id, count=2) == new[1:3]

    # Subscribers that reconnect with the id they saw before the loss: the restored history, then live.
    hub = EventHub(store, poll_s=0.05)
    hub_task = asyncio.create_task(asyncio.wait_for(_collect(hub.stream(job_id, last_seen)), STREAM_TIMEOUT_S))
    store_task = asyncio.create_task(
        asyncio.wait_for(_collect(store.stream_events(job_id, last_seen, poll_s=0.02)), STREAM_TIMEOUT_S)
    )
    await asyncio.sleep(0.2)
    st = await store.get(job_id)
    assert (await store.intervene(job_id, iv(st, keep(st, 0, 1, 2)), "rev")).status_code == 200
    await store.cancel(job_id, "ops")
    everything = await store.events_after(job_id, 0)
    assert everything[-1].type == "JOB_FINISHED" and _contiguous(everything)
    for streamed in await asyncio.gather(hub_task, store_task):
        assert streamed == everything, [(e.id, e.type) for e in streamed]


async def test_a_pause_opened_by_reference_after_a_restore_keeps_its_data_once_consumed(store, image):
    job_id = await waiting_job(store, image)
    await _lose_and_restore(store, job_id, await _mirror(store, job_id))
    jk = keys.job(job_id)
    st = await store.get(job_id)
    subjects = [*keep(st, 0, 1), manual([300, 300, 400, 400], "bad")]
    body = json.loads((await store.intervene(job_id, iv(st, subjects), "rev")).body)
    (bad,) = body["diff"]["added"]
    # Round 2 (a box failed validation): its PAUSE_OPENED is stored by reference while it waits.
    assert await validate(store, job_id, {bad: False}) == "OK"
    st2 = await store.get(job_id)
    opened = [e for e in await store.events_after(job_id) if e.type == "PAUSE_OPENED"][-1]
    assert await store.r.hget(jk.meta, "pause_event") == str(opened.id)
    raw = {json.loads(x)["id"]: x for x in await store.r.lrange(jk.events, 0, -1)}
    assert raw[opened.id].endswith('"data":"@meta"}')
    assert st2.active_pause is not None
    assert opened.data["active_pause"] == st2.active_pause.model_dump(mode="json", exclude_none=True)
    assert opened.data["box_list"] == [b.model_dump(mode="json") for b in st2.box_list]
    assert opened.data["active_pause"]["box_ids_to_revise"] == [bad]

    assert (await store.intervene(job_id, iv(st2, keep(st2, 0)), "rev")).status_code == 200
    # Consumed: the event was written out whole in the same step, and reads as it opened.
    assert await store.r.hget(jk.meta, "pause_event") is None
    raw = {json.loads(x)["id"]: x for x in await store.r.lrange(jk.events, 0, -1)}
    assert not raw[opened.id].endswith('"data":"@meta"}')
    again = [e for e in await store.events_after(job_id) if e.type == "PAUSE_OPENED"][-1]
    assert again == opened
    assert again.data["active_pause"]["status"] == "WAITING"


async def test_an_id_the_mirror_never_saw_reads_the_whole_new_list_and_the_archive_keeps_the_ids(
    store, image, tmp_path
):
    job_id = await create(store, image)
    mirror = await _mirror(store, job_id)  # the mirror's last write: the job in model work
    mirrored_seq = int(mirror[0]["event_seq"])
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"  # within the mirror's last period
    last_seen = (await store.events_after(job_id))[-1].id
    assert last_seen > mirrored_seq  # a live subscriber saw events the mirror did not
    await _lose_and_restore(store, job_id, mirror)

    new = await store.events_after(job_id, last_seen)
    assert new == await store.events_after(job_id, 0) and _contiguous(new)
    assert new[0].type == "JOB_RESTORED" and new[0].id == mirrored_seq + EVENT_ID_GAP + 1
    assert new[0].data["from_event"] == mirrored_seq
    assert "NODE_RETRY_SCHEDULED" in [e.type for e in new]

    # Lost again and restored from a mirror of the restored job: the ids keep increasing.
    first_restored = new[-1].id
    await _lose_and_restore(store, job_id, await _mirror(store, job_id))
    newer = await store.events_after(job_id, first_restored)
    assert newer == await store.events_after(job_id, 0) and newer[0].id == first_restored + EVENT_ID_GAP + 1

    # The job ends; its archive copy carries the true ids, and the copy's acknowledgement matches.
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    await store.cancel(job_id, "ops")
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    migrate.upgrade(url)
    archive = Archive(url)
    try:
        copied = await copy_job(store, archive, job_id)
        stored = await store.events_after(job_id)
        assert stored[-1].type == "JOB_FINISHED" and _contiguous(stored)
        assert reads.events(archive, job_id) == stored
        assert reads.events(archive, job_id, after=stored[1].id) == stored[2:]
        assert copied.last_event_id == stored[-1].id
        assert await store.archive_ack(job_id, copied.version, copied.last_event_id, copied.audit_seq) == "OK"
        kept = reads.audit(archive, job_id)
        assert kept is not None and audit.verify(kept["entries"], kept["head"], kept["head_seq"]) is None
    finally:
        archive.close()
