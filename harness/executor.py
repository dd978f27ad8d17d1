"""Playing the executor's part through the store: a report for the node a job is waiting on, as a
dispatcher would apply it (the tests' drivers and the benchmarks that prepare waiting jobs)."""

from __future__ import annotations

from typing import Any

from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.store import Store


async def report(store: Store, job_id: str, output: dict[str, Any], outcome: str = "SUCCEEDED", **kw: Any) -> str:
    """Apply a report for the job's current node; returns the store's verdict (``OK``, ``IGNORED``, …)."""
    node = (await store.get(job_id)).current_node
    assert node is not None, f"job {job_id} has no current node to report for"
    return await store.apply_report(
        NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job_id,
            outcome=outcome,
            output=output,
            **kw,
        )
    )
