"""The node lifecycle below Serve (issue: Step 12), on a real redis-server:

- the outbox is read only within a dispatcher's free slots (``COUNT`` of a multi-stream
  ``XREADGROUP`` applies per stream: 64 streams at ``COUNT 2`` gave 128 commands);
- a model stuck past its deadline holds no slot: the node ends ``TIMED_OUT`` and the next job runs,
  whether the executor keeps the deadline itself or hangs past it;
- a result spooled through a Redis outage longer than ``--heartbeat-lapse-s`` is applied when Redis
  returns, never re-dispatched by another dispatcher's inspector meanwhile;
- heartbeats and deadlines are on Redis's clock, whatever the clock of the process sending them,
  and an inspector's verdict re-checks the lapse inside the script that acts.

The same causes on ``hitl up`` on Ray Serve: ``tests/test_burst_serve.py``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from harness.ci import require_binary
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.statecore import keys, scripts
from hitl_review.statecore.execution import RunSpec, run_started, start
from hitl_review.statecore.heartbeat import Heartbeat
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES

pytestmark = pytest.mark.faults


async def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := await check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return got


async def _status(store: Store, job_id: str) -> str:
    return str((await store.get(job_id)).status)


async def _run(dispatcher: Dispatcher) -> asyncio.Task[None]:
    return asyncio.create_task(dispatcher.run_forever())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait({task}, timeout=30)


async def test_the_outbox_is_read_within_the_free_slots_only(store, image):
    for i in range(3 * keys.PARTITIONS):  # every partition's stream holds a few commands
        await store.create_job("alice", image.model_copy(update={"sha256": f"{i:064x}"}))
    assert len(await store.outbox_read("d", count=2, block_ms=0)) == 2
    assert len(await store.outbox_read("d", count=1, block_ms=0)) == 1
    got = await store.outbox_read("d", count=100, block_ms=0)  # more than one stream's worth: several rounds
    assert len(got) == 100
    assert len({(e.stream, e.entry_id) for e in got}) == 100
    assert len(await store.outbox_read("d", count=1000, block_ms=0)) == 3 * keys.PARTITIONS - 103


class HangingModel:
    """Starts the node like a replica, then never answers (``keep_deadline``: through
    ``run_started``, which stops at the node's deadline; otherwise a replica that hangs past it)."""

    def __init__(self, keep_deadline: bool) -> None:
        self.keep_deadline = keep_deadline
        self.calls: list[str] = []
        self.cancelled = 0

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        self.calls.append(cmd.job_id)

        async def work() -> dict[str, Any]:
            if len(self.calls) > 1:
                return {"boxes": THREE_BOXES}  # the next job's detection answers at once
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return {}

        if self.keep_deadline:
            return await run_started(spec, work)
        assert await start(spec) == "OK"  # an executor that records the start, then ignores the deadline
        with Heartbeat(spec):
            return await work()


@pytest.mark.parametrize("keep_deadline", [True, False], ids=["executor-stops-at-deadline", "executor-hangs"])
async def test_a_model_stuck_past_its_deadline_holds_no_slot(redis_server, image, keep_deadline):
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=1.0))
    await store.r.flushdb()
    await store.ensure_groups()
    model = HangingModel(keep_deadline)
    # One slot: while the stuck call held it, nothing else could run.
    d = Dispatcher(
        store, model, consumer="d", concurrency=1, inspect_every_s=0.2, heartbeat_s=0.2, heartbeat_lapse_s=30
    )
    task = await _run(d)
    try:
        stuck = (await store.create_job("alice", image)).job_id
        await _until(lambda: _async_eq(_status(store, stuck), "TIMED_OUT"), 20, "the stuck node's deadline")
        assert (await store.get(stuck)).reason_code == "NODE_DEADLINE_EXCEEDED"
        nxt = (await store.create_job("alice", image.model_copy(update={"sha256": "b" * 64}))).job_id
        await _until(lambda: _async_eq(_status(store, nxt), "WAITING_USER_SELECTION"), 20, "the next job's detection")
        assert model.calls == [stuck, nxt] and model.cancelled == 1
    finally:
        await _stop(task)
        await store.close()


async def _async_eq(value: Any, want: Any) -> bool:
    return (await value) == want


class StopsRedisModel:
    """Stops Redis while it computes: its result can only be spooled."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.calls = 0

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        async def work() -> dict[str, Any]:
            self.calls += 1
            await asyncio.to_thread(self.server.stop)
            return {"boxes": THREE_BOXES}

        return await run_started(spec, work)


async def test_a_result_spooled_through_an_outage_longer_than_the_lapse_is_applied_not_rerun(tmp_path: Path, image):
    require_binary("redis-server")
    server = RedisServer(tmp_path / "redis").start()
    cfg = StoreConfig(retention_s=3600, node_timeout_s=120)
    a, b, c = (Store.from_url(server.url, cfg, timeout_s=1) for _ in range(3))
    model = StopsRedisModel(server)
    worker = Dispatcher(a, model, consumer="worker", data_dir=tmp_path / "data", inspect_every_s=3600)
    # Another replica's inspector, sweeping often, with a lapse far shorter than the outage.
    watcher = Dispatcher(c, model, consumer="watcher", heartbeat_lapse_s=1.0)
    tasks: list[asyncio.Task[None]] = []
    try:
        await a.ensure_groups()
        job_id = (await a.create_job("alice", image)).job_id
        tasks.append(await _run(worker))
        await _until(lambda: _async(bool(worker.writeback.spooled())), 20, "the result in the spool")
        tasks.append(asyncio.create_task(_inspect_forever(watcher, 0.2)))
        await asyncio.sleep(3.0)  # Redis stays away three lapses
        server.start()
        await _until(lambda: _async_eq(_status(b, job_id), "WAITING_USER_SELECTION"), 30, "the spooled result")
        await asyncio.sleep(2.0)  # the watcher sweeps on after Redis came back
        state = await b.get(job_id)
        assert state.current_node is not None and state.current_node.attempt == 1
        assert model.calls == 1  # applied, not computed again
        body = await b.audit(job_id)
        assert body is not None
        audit = [e["action"] for e in body["entries"]]
        assert "NODE_LOST" not in audit, audit
        nid = state.current_node.node_instance_id
        assert not await b.r.exists(keys.job(job_id).writeback_of(nid))  # the marker went with the spool
    finally:
        for t in tasks:
            await _stop(t)
        for s in (a, b, c):
            await s.close()
        server.stop()


async def _async(value: Any) -> Any:
    return value


async def _inspect_forever(d: Dispatcher, period_s: float) -> None:
    while True:
        try:
            await d.inspector.sweep()
        except Exception:  # Redis away: the sweep notes it
            pass
        await asyncio.sleep(period_s)


async def test_heartbeats_are_on_redis_clock_and_a_verdict_rechecks_the_lapse(store, image):
    job_id = (await store.create_job("alice", image)).job_id
    (cmd,) = await store.outbox_commands(job_id)
    assert await store.node_started(cmd) == "OK"
    jk = keys.job(job_id)
    # An executor whose clock runs an hour behind sends its time: the beat is on Redis's clock anyway.
    skewed = int((time.time() - 3600) * 1000)
    beat = store.r.register_script(scripts.source("heartbeat"))
    assert await beat(
        keys=[jk.meta, jk.heartbeats, jk.executor], args=[job_id, cmd.node_instance_id, skewed, "", 0, ""]
    )
    now = await store.server_ms(jk.meta)
    score = await store.r.zscore(jk.heartbeats, job_id)
    assert abs(score - now) < 2000, (score, now)
    lease = await store.acquire_lease(jk.p, "insp", 10_000)
    assert lease is not None
    # An inspector that read the lapsed index a while ago: the node beat since, so it is left alone.
    assert await store.node_lost(job_id, cmd.node_instance_id, lease=lease, lapse_ms=10_000) == "ALIVE"
    assert (await store.get(job_id)).current_node.status == "RUNNING"  # type: ignore[union-attr]  # started above


class SlowModel:
    """Answers three boxes after ``seconds``, started like a replica starts it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        async def work() -> dict[str, Any]:
            self.calls += 1
            await asyncio.sleep(self.seconds)
            return {"boxes": THREE_BOXES}

        return await run_started(spec, work)


async def test_a_node_running_many_reclaim_periods_is_neither_reclaimed_nor_dead_lettered(store, image):
    from hitl_review.statecore import deadletters

    model = SlowModel(3.0)
    fast = {"reclaim_idle_ms": 300, "reclaim_every_s": 0.1, "max_deliveries": 2, "inspect_every_s": 3600}
    a = Dispatcher(store, model, consumer="a", **fast)
    job_id = (await store.create_job("alice", image)).job_id
    tasks = [await _run(a)]
    try:
        await _until(lambda: _async_eq(_status(store, job_id), "DETECTING"), 10, "the detection")
        await _until(lambda: _async(model.calls == 1), 10, "the model call")
        tasks.append(await _run(Dispatcher(store, model, consumer="b", **fast)))  # it would reclaim idle entries
        await _until(lambda: _async_eq(_status(store, job_id), "WAITING_USER_SELECTION"), 20, "the slow detection")
        assert model.calls == 1 and await deadletters.list_all(store.r) == []
        body = await store.audit(job_id)
        assert body is not None
        assert [e["action"] for e in body["entries"]].count("NODE_STARTED") == 1
    finally:
        for t in tasks:
            await _stop(t)
