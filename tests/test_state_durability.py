"""Waiting survives restarts: redis-server stopped (SIGTERM) or killed (SIGKILL after
the everysec fsync) and started again on the same data directory shows the same
pause, token, version and pending outbox; a dispatcher that dies holding a
command loses nothing and applies nothing twice."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.exceptions

from harness.ci import require_binary
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore import keys
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES, create, iv, keep, waiting_job


@pytest.fixture
def own_server(tmp_path):
    require_binary("redis-server")
    server = RedisServer(tmp_path / "data").start()
    yield server
    server.stop()


def _store(server: RedisServer) -> Store:
    return Store.from_url(server.url, StoreConfig(retention_s=3600, node_timeout_s=60))


async def _outbox_state(store: Store, job_ids: list[str]) -> dict:
    out = {}
    for stream in sorted({s for j in job_ids for s in keys.job(j).outboxes}):
        groups = {g["name"]: (g["pending"], g["last-delivered-id"]) for g in await store.r.xinfo_groups(stream)}
        pending = await store.r.xpending_range(stream, keys.OUTBOX_GROUP, "-", "+", 100)
        out[stream] = {
            "len": await store.r.xlen(stream),
            "groups": groups,
            "pending": sorted((p["message_id"], p["consumer"]) for p in pending),
            "entries": await store.r.xrange(stream),
        }
    return out


async def _world(store: Store, job_ids: list[str]) -> dict:
    snaps = {j: (await store.snapshot(j)).model_dump(mode="json") for j in job_ids}
    hist = {j: [p.model_dump(mode="json") for p in await store.pause_history(j)] for j in job_ids}
    events = {j: [e.model_dump(mode="json") for e in await store.events_after(j)] for j in job_ids}
    return {"snaps": snaps, "hist": hist, "events": events, "outbox": await _outbox_state(store, job_ids)}


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
async def test_restart_keeps_pause_token_version_and_outbox(own_server, image, kill):
    store = _store(own_server)
    await store.ensure_groups()
    waiting = await waiting_job(store, image)
    # A job consumed into PROCESSING whose command a dispatcher read but never acked.
    processing = await waiting_job(store, image)
    st = await store.get(processing)
    req_before = iv(st, keep(st, 0, 1), iid="iv_before_crash")
    first = await store.intervene(processing, req_before, "rev")
    read = await store.outbox_read("d1", count=100, block_ms=0)
    assert sorted((e.command.job_id, e.command.node_type) for e in read) == sorted(
        [(waiting, "DETECT_SUBJECTS"), (processing, "DETECT_SUBJECTS")] + [(processing, "SEGMENT_SUBJECT")] * 2
    )
    for e in read:  # the detections were applied: ack those, keep the subjects' commands pending
        if e.command.node_type == "DETECT_SUBJECTS":
            await store.outbox_ack(e)
    # And one job whose DETECT command was never delivered to anyone.
    detecting = await create(store, image)
    jobs = [waiting, processing, detecting]
    before = await _world(store, jobs)
    assert before["snaps"][waiting]["active_pause"]["status"] == "WAITING"
    assert sum(len(v["pending"]) for v in before["outbox"].values()) == 2
    await store.close()

    if kill:
        time.sleep(1.5)  # appendfsync everysec: give the fsync its second, then die without a goodbye
    own_server.stop(kill=kill)
    probe = _store(own_server)
    with pytest.raises(redis.exceptions.ConnectionError):
        await probe.ping()
    await probe.close()

    again = RedisServer(own_server.data_dir, port=own_server.port).start()
    try:
        store = _store(again)
        after = await _world(store, jobs)
        assert after == before
        snap = after["snaps"][waiting]
        assert snap["status"] == "WAITING_USER_SELECTION" and snap["version"] == 2
        assert snap["active_pause"]["base_version"] == 2 and snap["pending_actions"]
        # The idempotency record survived: the pre-crash submission replays byte for byte.
        replay = await store.intervene(processing, req_before, "rev")
        assert replay.replayed and replay.body == first.body
        # The same pause, with the same token, is still consumable exactly once.
        st = await store.get(waiting)
        assert (await store.intervene(waiting, iv(st, keep(st, 0)), "rev")).status_code == 200
        # The pending command is still d1's and can be taken over; the undelivered one is still new.
        reclaimed = await store.outbox_reclaim("d2", min_idle_ms=0)
        assert [(e.command.job_id, e.command.node_type) for e in reclaimed] == [(processing, "SEGMENT_SUBJECT")] * 2
        fresh = await store.outbox_read("d2", count=100, block_ms=0)
        assert sorted((e.command.job_id, e.command.node_type) for e in fresh) == sorted(
            [(detecting, "DETECT_SUBJECTS"), (waiting, "SEGMENT_SUBJECT")]  # keep(st, 0): one subject
        )
        await store.close()
    finally:
        again.stop()


async def test_dead_dispatcher_command_is_redispatched_once_and_applied_once(own_server, image):
    """A dispatcher dies holding a started node. Its command is reclaimed but not started twice
    (BUSY); the node's heartbeat lapses, the inspector re-dispatches it as a new instance, which is
    applied once; the dead one's late report is ignored with an event."""
    store = _store(own_server)
    store.config.retry_backoff_s = 0.05
    await store.ensure_groups()
    job_id = await create(store, image)
    (got,) = await store.outbox_read("d1", count=10, block_ms=0)
    assert got.command.job_id == job_id and got.command.node_type == "DETECT_SUBJECTS"
    assert await store.node_started(got.command) == "OK"
    # d1 "dies" here: never beats, never reports, never acks.
    assert await store.outbox_read("d2", count=10, block_ms=0) == [], "a delivered entry is not handed out again"
    assert await store.outbox_reclaim("d2", min_idle_ms=60_000) == [], "not before it has been idle long enough"
    await asyncio.sleep(0.25)
    (taken,) = await store.outbox_reclaim("d2", min_idle_ms=200)
    assert taken.entry_id == got.entry_id and taken.command == got.command
    pending = await store.r.xpending_range(taken.stream, keys.OUTBOX_GROUP, "-", "+", 10)
    assert [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending] == [(got.entry_id, "d2", 2)]
    assert await store.node_started(taken.command) == "BUSY", "a running node is never started twice"
    assert (await store.get(job_id)).current_node.attempt == 1

    counts = await Inspector(store, owner="i1", heartbeat_lapse_s=0.1).sweep()
    assert counts["lost"] == 1
    st = await store.get(job_id)
    assert st.current_node.status == "RETRY_WAIT" and st.current_node.node_instance_id != got.command.node_instance_id
    (retry,) = await store.outbox_read("d2", count=10, block_ms=0)
    assert retry.command.node_instance_id == st.current_node.node_instance_id and retry.command.not_before_ms
    assert await store.node_started(retry.command) == "OK"
    assert (await store.get(job_id)).current_node.attempt == 2
    rep = NodeReport(
        node_instance_id=retry.command.node_instance_id,
        node_type="DETECT_SUBJECTS",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": THREE_BOXES},
    )
    late = NodeReport(  # d1 comes back with its own result, for the instance that was replaced
        node_instance_id=got.command.node_instance_id,
        node_type="DETECT_SUBJECTS",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": THREE_BOXES[:1]},
    )
    results = await asyncio.gather(store.apply_report(rep), store.apply_report(late))
    assert results == ["OK", "IGNORED"]
    st = await store.get(job_id)
    assert st.status == S.WAITING_USER_SELECTION and len(st.box_list) == 3
    events = await store.events_after(job_id)
    types = [e.type for e in events]
    assert types.count("NODE_STARTED") == 2 and types.count("NODE_COMPLETED") == 1 and types.count("PAUSE_OPENED") == 1
    assert types.count("NODE_FAILED") == 1 and types.count("NODE_RETRY_SCHEDULED") == 1
    ignored = [e for e in events if e.type == "REPORT_IGNORED"]
    assert [e.data["reason"] for e in ignored] == ["NODE_SUPERSEDED"]
    # The old entry, taken again, is no longer current: acked and gone; nothing is left pending.
    for entry in (taken, retry):
        if entry is retry:
            await store.outbox_ack(entry)
            continue
        assert await store.node_started(entry.command) not in ("OK", "BUSY")
        await store.outbox_ack(entry)
    assert await store.outbox_pending() == 0
    assert await store.apply_report(rep) == "DUPLICATE"
    await store.close()
