"""A replica that crashes mid-call (the call fails at once) costs a visible attempt, not a silent
in-process retry: NODE_FAILED, NODE_RETRY_SCHEDULED, a new node instance, then the job goes on —
or ends FAILED after the last attempt. Real redis-server and a real Dispatcher; the model is a
stand-in that crashes on purpose."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.statecore.execution import RunSpec, run_started
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES


class CrashingModel:
    """Crashes on the first ``crashes`` calls, then answers with three boxes."""

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.calls: list[str] = []

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        async def work() -> dict[str, Any]:  # started like a replica starts it, then crashes
            self.calls.append(cmd.node_instance_id)
            if len(self.calls) <= self.crashes:
                raise RuntimeError("replica died (ActorDiedError)")
            return {"boxes": THREE_BOXES}

        return await run_started(spec, work)


async def _run_until_settled(store: Store, model: CrashingModel, job_id_of) -> str:
    dispatcher = Dispatcher(store, model, consumer="d", reclaim_every_s=0.2, inspect_every_s=0.2)
    task = asyncio.create_task(dispatcher.run_forever())
    try:
        job_id = await job_id_of()
        deadline = time.monotonic() + 20
        while (await store.get(job_id)).status == "DETECTING":
            assert time.monotonic() < deadline, "the job never moved on"
            await asyncio.sleep(0.05)
        # The report is written before its command is acknowledged (a crash between the two leaves the
        # command to be reclaimed and found done): the dispatcher is stopped once it has acknowledged.
        while await store.outbox_pending():
            assert time.monotonic() < deadline, "a command stayed in the outbox after the job moved on"
            await asyncio.sleep(0.05)
        return job_id
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_crash_is_a_visible_attempt_and_the_next_one_completes(redis_server, image):
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, max_attempts=3, retry_backoff_s=0.05))
    await store.r.flushdb()
    await store.ensure_groups()
    model = CrashingModel(crashes=1)
    try:
        job_id = await _run_until_settled(store, model, lambda: _create(store, image))
        st = await store.get(job_id)
        assert st.status == "WAITING_USER_SELECTION" and st.current_node.attempt == 2
        assert len(model.calls) == 2 and model.calls[0] != model.calls[1]  # a new node instance
        events = await store.events_after(job_id)
        types = [e.type for e in events]
        assert types.count("NODE_STARTED") == 2 and types.count("NODE_COMPLETED") == 1
        (failed,) = [e.data for e in events if e.type == "NODE_FAILED"]
        assert failed["attempt"] == 1 and failed["retryable"] and failed["reason"] == "NODE_FAILED"
        (scheduled,) = [e.data for e in events if e.type == "NODE_RETRY_SCHEDULED"]
        assert scheduled["attempt"] == 2 and scheduled["node_instance_id"] == model.calls[1]
        assert await store.outbox_pending() == 0
    finally:
        await store.close()


async def test_the_last_failed_attempt_ends_the_job_failed(redis_server, image):
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, max_attempts=2, retry_backoff_s=0.05))
    await store.r.flushdb()
    await store.ensure_groups()
    model = CrashingModel(crashes=99)
    try:
        job_id = await _run_until_settled(store, model, lambda: _create(store, image))
        st = await store.get(job_id)
        assert st.status == "FAILED" and st.reason_code == "NODE_FAILED"
        assert st.current_node.status == "FAILED" and st.current_node.attempt == 2
        assert len(model.calls) == 2
        types = [e.type for e in await store.events_after(job_id)]
        assert types.count("NODE_FAILED") == 2 and types.count("NODE_RETRY_SCHEDULED") == 1
    finally:
        await store.close()


async def _create(store: Store, image) -> str:
    return (await store.create_job("alice", image)).job_id
