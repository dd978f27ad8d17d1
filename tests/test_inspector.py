"""The node lifecycle and the inspector against a real redis-server: deadlines run from a node's
start (a backlog is never timed out), heartbeats from the process doing the work, re-dispatch of a
node whose executor was lost, one inspector per partition (lease with fencing), never a waiting job."""

from __future__ import annotations

import asyncio
import time

from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore import keys
from hitl_review.statecore.heartbeat import Heartbeat, HeartbeatSpec, beat
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES, report


def _fast(redis_server, **cfg) -> Store:
    return Store.from_url(redis_server.url, StoreConfig(retention_s=3600, **cfg))


async def _start(store: Store, job_id: str) -> str:
    """Play the dispatcher: start the job's queued node; its instance id."""
    (cmd,) = [
        c
        for c in await store.outbox_commands(job_id)
        if c.node_instance_id == (await store.get(job_id)).current_node.node_instance_id
    ]
    assert await store.node_started(cmd) == "OK"
    return cmd.node_instance_id


async def _beat_until(store: Store, job_id: str, nid: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await store.heartbeat(job_id, nid)
        await asyncio.sleep(0.05)


async def test_a_queued_node_is_never_timed_out_however_long_it_waits(redis_server, store, image):
    fast = _fast(redis_server, node_timeout_s=0.2)
    try:
        job_id = (await fast.create_job("alice", image)).job_id
        await asyncio.sleep(0.5)  # far past the node's maximum execution time, still in the queue
        counts = await Inspector(fast, owner="i1", grace_s=0, heartbeat_lapse_s=0.1).sweep()
        assert counts["timed_out"] == 0 and counts["lost"] == 0 and counts["partitions"] == keys.PARTITIONS
        st = await fast.get(job_id)
        assert st.status == "DETECTING" and st.current_node.status == "QUEUED"
        assert st.current_node.deadline_at is None  # no deadline until it starts
        assert (await fast.backlog())[0] == 1
    finally:
        await fast.close()


async def test_deadline_from_start_times_out_a_live_node_and_ignores_its_late_report(redis_server, store, image):
    fast = _fast(redis_server, node_timeout_s=0.3)
    try:
        job_id = (await fast.create_job("alice", image)).job_id
        waiting_id = (await fast.create_job("alice", image)).job_id
        assert await report(fast, waiting_id, {"boxes": THREE_BOXES}) == "OK"  # waits for a reviewer
        await asyncio.sleep(0.4)  # queued this long: does not count
        nid = await _start(fast, job_id)
        inspector = Inspector(fast, owner="i1", grace_s=0, heartbeat_lapse_s=5)
        assert (await inspector.sweep())["timed_out"] == 0  # started just now
        stop = asyncio.Event()
        beating = asyncio.create_task(_beat_until(fast, job_id, nid, stop))  # alive, just slow
        await asyncio.sleep(0.45)
        counts = await inspector.sweep()
        stop.set()
        await beating
        assert counts["timed_out"] == 1 and counts["lost"] == 0
        state = await fast.get(job_id)
        assert state.status == "TIMED_OUT" and state.reason_code == "NODE_DEADLINE_EXCEEDED"
        assert (await fast.get(waiting_id)).status == "WAITING_USER_SELECTION"  # waits have no deadline
        assert (await inspector.sweep())["timed_out"] == 0  # a second pass changes nothing
        events = await fast.events_after(job_id)
        assert "NODE_TIMED_OUT" in [e.type for e in events]
        late = NodeReport(
            node_instance_id=nid,
            node_type="DETECT_SUBJECTS",
            job_id=job_id,
            outcome="SUCCEEDED",
            output={"boxes": THREE_BOXES},
        )
        # The model's own report after the timeout is ignored with an event; its replay is the duplicate.
        assert await fast.apply_report(late) == "IGNORED"
        events = await fast.events_after(job_id)
        assert [e.type for e in events][-2:] == ["JOB_FINISHED", "REPORT_IGNORED"]
        assert events[-1].data["reason"] == "NODE_TIMED_OUT" and events[-1].data["node_instance_id"] == nid
        assert await fast.apply_report(late) == "DUPLICATE"
        assert len(await fast.events_after(job_id)) == len(events)
    finally:
        await fast.close()


async def test_a_lapsed_heartbeat_redispatches_then_fails_with_executor_lost(redis_server, store, image):
    fast = _fast(redis_server, node_timeout_s=60, max_attempts=2, retry_backoff_s=0.05)
    try:
        job_id = (await fast.create_job("alice", image)).job_id
        first = await _start(fast, job_id)
        inspector = Inspector(fast, owner="i1", heartbeat_lapse_s=0.15)
        assert (await inspector.sweep())["lost"] == 0
        await asyncio.sleep(0.25)  # nobody beats: the executor is gone
        assert (await inspector.sweep())["lost"] == 1
        st = await fast.get(job_id)
        node = st.current_node
        assert st.status == "DETECTING" and node.status == "RETRY_WAIT" and node.attempt == 1
        assert node.node_instance_id != first
        retry = [c for c in await fast.outbox_commands(job_id) if c.node_instance_id == node.node_instance_id]
        assert len(retry) == 1 and retry[0].not_before_ms > int(time.time() * 1000) - 1000
        assert retry[0].input == [c for c in await fast.outbox_commands(job_id) if c.node_instance_id == first][0].input
        second = await _start(fast, job_id)
        assert (await fast.get(job_id)).current_node.attempt == 2
        await asyncio.sleep(0.25)
        assert (await inspector.sweep())["lost"] == 1  # the last attempt lost too
        st = await fast.get(job_id)
        assert st.status == "FAILED" and st.reason_code == "EXECUTOR_LOST" and st.current_node.status == "LOST"
        events = await fast.events_after(job_id)
        types = [e.type for e in events]
        assert types.count("NODE_STARTED") == 2 and types.count("NODE_FAILED") == 2
        assert types.count("NODE_RETRY_SCHEDULED") == 1 and types[-1] == "JOB_FINISHED"
        failed = [e.data for e in events if e.type == "NODE_FAILED"]
        assert [(f["attempt"], f["retryable"], f["reason"]) for f in failed] == [
            (1, True, "EXECUTOR_LOST"),
            (2, False, "EXECUTOR_LOST"),
        ]
        late = NodeReport(node_instance_id=first, node_type="DETECT_SUBJECTS", job_id=job_id, outcome="FAILED")
        assert await fast.apply_report(late) == "IGNORED"
        assert second != first
    finally:
        await fast.close()


async def test_after_a_downtime_longer_than_the_deadline_the_node_runs_again_not_timed_out(redis_server, store, image):
    """Everything stopped while a node ran (no beats) for longer than its deadline: on return the
    node is re-dispatched; it is not TIMED_OUT for the downtime."""
    fast = _fast(redis_server, node_timeout_s=0.2, retry_backoff_s=0.01)
    try:
        job_id = (await fast.create_job("alice", image)).job_id
        await _start(fast, job_id)
        await asyncio.sleep(0.5)  # past the deadline and past the heartbeat lapse
        counts = await Inspector(fast, owner="i1", grace_s=0, heartbeat_lapse_s=0.1).sweep()
        assert counts["lost"] == 1 and counts["timed_out"] == 0
        st = await fast.get(job_id)
        assert st.status == "DETECTING" and st.current_node.status == "RETRY_WAIT"
    finally:
        await fast.close()


async def test_one_inspector_per_partition_and_a_stale_one_is_fenced(redis_server, store, image):
    fast = _fast(redis_server, node_timeout_s=60, retry_backoff_s=0.01)
    try:
        a = Inspector(fast, owner="a", period_s=5, heartbeat_lapse_s=0.1)
        b = Inspector(fast, owner="b", period_s=5, heartbeat_lapse_s=0.1)
        assert (await a.sweep())["partitions"] == keys.PARTITIONS
        assert (await b.sweep())["partitions"] == 0  # a holds every lease
        job_id = (await fast.create_job("alice", image)).job_id
        nid = await _start(fast, job_id)
        p = keys.partition_of(job_id)
        stale = await fast.acquire_lease(p, "a", 15_000)
        assert stale is not None and stale.startswith("a|")
        await fast.r.delete(keys.inspector_lease(p))  # a's lease expired while a was paused
        taken = await fast.acquire_lease(p, "b", 15_000)
        assert taken is not None and taken.startswith("b|") and taken != stale
        await asyncio.sleep(0.15)
        # a wakes up and acts on what it read before: its verdict carries the old lease and is refused.
        assert await fast.node_lost(job_id, nid, lease=stale) == "FENCED"
        assert (await fast.get(job_id)).current_node.node_instance_id == nid
        assert await fast.node_lost(job_id, nid, lease=taken) == "OK"
    finally:
        await fast.close()


async def test_the_heartbeat_thread_beats_while_the_node_runs_and_stops_after(redis_server, store, image):
    job_id = (await store.create_job("alice", image)).job_id
    nid = await _start(store, job_id)
    jk = keys.job(job_id)
    first = await store.r.zscore(jk.heartbeats, job_id)
    spec = HeartbeatSpec(redis_url=redis_server.url, job_id=job_id, node_instance_id=nid, every_s=0.05)
    with Heartbeat(spec) as hb:
        # Three beats, however loaded the machine (a timed sleep saw one beat under a busy CI run).
        deadline = time.monotonic() + 10
        while hb.beats < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert hb.beats >= 3
    assert await store.r.zscore(jk.heartbeats, job_id) > first
    # Once the node completed, a beat renews nothing and the thread stops by itself.
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    assert await store.r.zscore(jk.heartbeats, job_id) is None
    with Heartbeat(spec) as hb2:
        await asyncio.sleep(0.2)
    assert hb2.beats == 0
    assert not await store.heartbeat(job_id, nid)


async def test_a_confirmed_executor_is_waited_for_and_an_unconfirmed_one_is_replaced(redis_server, store, image):
    """Status confirmation: before a re-dispatch the inspector asks whoever runs the node. A busy
    executor that answers gets its heartbeat renewed (nothing re-runs); one that does not answer
    (stopped, dead) is replaced."""
    fast = _fast(redis_server, node_timeout_s=60, retry_backoff_s=0.01)
    try:
        job_id = (await fast.create_job("alice", image)).job_id
        nid = await _start(fast, job_id)
        asked: list[tuple[str, str]] = []

        async def alive(j: str, n: str) -> bool:
            asked.append((j, n))
            return True

        await asyncio.sleep(0.25)
        counts = await Inspector(fast, owner="i1", heartbeat_lapse_s=0.1, confirm=alive).sweep()
        assert counts["confirmed"] == 1 and counts["lost"] == 0 and asked == [(job_id, nid)]
        st = await fast.get(job_id)
        assert st.current_node.node_instance_id == nid and st.current_node.status == "RUNNING"

        async def gone(j: str, n: str) -> bool:
            return False

        await asyncio.sleep(0.25)
        counts = await Inspector(fast, owner="i1", heartbeat_lapse_s=0.1, confirm=gone).sweep()
        assert counts["lost"] == 1 and (await fast.get(job_id)).current_node.status == "RETRY_WAIT"
    finally:
        await fast.close()


async def test_a_confirmation_slower_than_the_lease_still_ends_in_a_re_dispatch(redis_server, image):
    """The confirmation waits for the executor's answer (3 s under Serve), longer than a short
    inspector lease (3 x its period): the verdict must not be fenced by the inspector's own lapsed
    lease, or a stopped replica's node is never re-dispatched. Lapsed jobs of one partition are
    asked at once, not one timeout after another."""
    fast = _fast(redis_server, node_timeout_s=60, retry_backoff_s=0.01)
    try:
        jobs = [(await fast.create_job("alice", image)).job_id for _ in range(3)]
        nids = {j: await _start(fast, j) for j in jobs}
        inspector = Inspector(fast, owner="i1", period_s=0.1, heartbeat_lapse_s=0.1)  # lease 1 s
        asked: list[str] = []
        waiting = [0, 0]  # now, most at once

        async def silent(j: str, n: str) -> bool:
            asked.append(j)
            waiting[0] += 1
            waiting[1] = max(waiting)
            await asyncio.sleep(1.3)  # past the lease
            waiting[0] -= 1
            return False

        inspector.confirm = silent
        await asyncio.sleep(0.25)
        counts = await inspector.sweep()
        assert sorted(asked) == sorted(jobs) and waiting[1] == 3, waiting
        assert counts["lost"] == 3 and counts["fenced"] == 0, counts
        for j in jobs:
            node = (await fast.get(j)).current_node
            assert node.node_instance_id != nids[j] and node.status == "RETRY_WAIT"
    finally:
        await fast.close()


async def test_the_executor_records_itself_while_it_runs_the_node_and_drops_the_record_after(
    redis_server, store, image
):
    job_id = (await store.create_job("alice", image)).job_id
    nid = await _start(store, job_id)
    spec = HeartbeatSpec(
        redis_url=redis_server.url, job_id=job_id, node_instance_id=nid, every_s=0.05, executor="replica-a"
    )
    assert await store.executor_of(job_id, nid) is None
    with Heartbeat(spec):
        assert await store.executor_of(job_id, nid) == "replica-a"  # recorded at once
        await asyncio.sleep(0.15)
        assert await store.executor_of(job_id, nid) == "replica-a"
    assert await store.executor_of(job_id, nid) is None  # done here: no longer vouches for the node
    # A release drops only its own record, never another executor's (a newer attempt elsewhere).
    await store.r.set(keys.job(job_id).executor_of(nid), "replica-b")
    assert await asyncio.to_thread(beat, spec, release=True)
    assert await store.executor_of(job_id, nid) == "replica-b"
