"""Defect A7: model output that does not parse ends the node FAILED at once, with a reason.

Before the fix, a detector answer without ``bbox`` (or with the wrong types) made the
decider raise while applying the report; the dispatcher left the command unacked, took it
again and again, and the job only ended when the inspector timed it out (``TIMED_OUT``).
It is not a transient fault: no retry can make the same output parse.

Real redis-server, real Store and Dispatcher; only the model is a stub that answers junk.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore.execution import RunSpec, run_started
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.store import Store, StoreConfig

BAD_OUTPUTS = [
    pytest.param({"boxes": [{"label": "shoe", "score": 0.9}]}, id="missing-bbox"),
    pytest.param({"boxes": [{"bbox": "10,10,50,50", "label": "shoe", "score": 0.9}]}, id="bbox-not-a-list"),
    pytest.param({"boxes": [{"bbox": [10, 10, 50, 50], "label": "shoe", "score": "high"}]}, id="score-not-a-number"),
    pytest.param({"boxes": "none"}, id="boxes-not-a-list"),
]


class JunkModel:
    """A model replica that answers, every time, with output the contract does not allow."""

    def __init__(self, output: dict[str, Any]) -> None:
        self.output = output
        self.calls = 0

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        async def work() -> dict[str, Any]:
            self.calls += 1
            return self.output

        return await run_started(spec, work)


@pytest.mark.parametrize("output", BAD_OUTPUTS)
async def test_unparseable_model_output_fails_the_node_at_once(redis_server, image, output):
    # A short node deadline: on the old code the job ends TIMED_OUT within a couple of seconds.
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=1.0))
    await store.r.flushdb()
    await store.ensure_groups()
    model = JunkModel(output)
    dispatcher = Dispatcher(store, model, consumer="a7", reclaim_idle_ms=100, reclaim_every_s=0.1, inspect_every_s=0.2)
    dispatcher.inspector = Inspector(store, owner="a7", grace_s=0)
    task = asyncio.create_task(dispatcher.run_forever())
    try:
        job_id = (await store.create_job("alice", image)).job_id
        deadline = time.monotonic() + 15
        while not await store.is_finished(job_id):
            assert time.monotonic() < deadline, "the job never ended"
            await asyncio.sleep(0.05)
        state = await store.get(job_id)
        assert state.status == "FAILED", f"ended {state.status} ({state.reason_code})"
        assert state.reason_code == "INVALID_NODE_OUTPUT"
        assert model.calls == 1, "an output that does not parse must not be retried"
        events = await store.events_after(job_id)
        done = [e for e in events if e.type == "NODE_COMPLETED"]
        assert len(done) == 1 and done[0].data["outcome"] == "FAILED"
        assert done[0].data["error_code"] == "INVALID_NODE_OUTPUT" and done[0].data["error_message"]
        assert "PAUSE_OPENED" not in [e.type for e in events]
        deadline = time.monotonic() + 5
        while await store.outbox_pending():  # the command was acknowledged, not left for a reclaim
            assert time.monotonic() < deadline, "the command was never acknowledged"
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.close()


async def test_report_with_unparseable_output_is_applied_as_failed(store, image):
    """The report path itself (a replayed dead letter, another executor): the decider refuses the
    output and fails the node instead of raising, so the report is applied exactly once."""
    from hitl_review.statecore.models import NodeReport

    job_id = (await store.create_job("alice", image)).job_id
    node = (await store.get(job_id)).current_node
    assert node is not None
    bad = NodeReport(
        node_instance_id=node.node_instance_id,
        node_type=node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": [{"label": "shoe"}]},
    )
    assert await store.apply_report(bad) == "OK"
    state = await store.get(job_id)
    assert state.status == "FAILED" and state.reason_code == "INVALID_NODE_OUTPUT"
    assert state.current_node is not None and state.current_node.status == "FAILED"
    assert await store.apply_report(bad) == "DUPLICATE"
