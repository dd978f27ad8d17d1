"""A cancelled job's current node says what happened to its work (real redis-server)."""

from __future__ import annotations

from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.states import JobStatus as S

from .helpers import create, waiting_job


async def test_a_queued_node_of_a_cancelled_job_says_cancelled(store, image):
    job_id = await create(store, image)
    assert (await store.get(job_id)).current_node.status == "QUEUED"
    snap = await store.cancel(job_id, "ops")
    assert snap.status == S.CANCELLED
    assert snap.current_node is not None and snap.current_node.status == "CANCELLED"


async def test_a_running_node_of_a_cancelled_job_says_cancelled_and_its_report_is_ignored(store, image):
    job_id = await create(store, image)
    node = (await store.get(job_id)).current_node
    [cmd] = await store.outbox_commands(job_id)
    assert await store.node_started(cmd) == "OK"
    assert (await store.get(job_id)).current_node.status == "RUNNING"
    snap = await store.cancel(job_id, "ops")
    assert snap.current_node.status == "CANCELLED" and snap.current_node.attempt == 1
    late = NodeReport(
        node_instance_id=node.node_instance_id,
        node_type=node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": []},
    )
    assert await store.apply_report(late) == "IGNORED"
    assert (await store.get(job_id)).current_node.status == "CANCELLED"


async def test_a_completed_node_stays_completed_when_a_waiting_job_is_cancelled(store, image):
    job_id = await waiting_job(store, image)
    snap = await store.cancel(job_id, "ops")
    assert snap.current_node.status == "COMPLETED"
