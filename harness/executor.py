"""Playing the executor's part through the store: a report for the node a job is waiting on, as a
dispatcher would apply it (the tests' drivers and the benchmarks that prepare waiting jobs)."""

from __future__ import annotations

from typing import Any

from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.store import Store


async def report(store: Store, job_id: str, output: dict[str, Any], outcome: str = "SUCCEEDED", **kw: Any) -> str:
    """Apply a report for the job's current node; returns the store's verdict (``OK``, ``IGNORED``, …).

    For a job cutting its subjects (one ``SEGMENT_SUBJECT`` node each, statecore.subjects) a successful
    output with several ``subjects`` is the answer of each subject's node in turn: each node gets its own
    report with its own subject (none when the output has no entry for it), as the Segmenter would send;
    the first verdict that is not ``OK`` is returned."""
    st = await store.get(job_id)
    node = st.current_node
    if node is not None and node.node_type == "SEGMENT_SUBJECT" and outcome == "SUCCEEDED" and "subjects" in output:
        by_box = {s.get("box_id"): s for s in output["subjects"]}
        while (
            node is not None
            and node.node_type == "SEGMENT_SUBJECT"
            and node.status in ("QUEUED", "RETRY_WAIT", "RUNNING")
        ):
            box_id = ((st.node_input or {}).get("approved_box_list") or [{}])[0].get("box_id")
            one = {**output, "subjects": [by_box[box_id]] if box_id in by_box else []}
            got = await _report_node(store, job_id, node, one, outcome, **kw)
            if got != "OK":
                return got
            st = await store.get(job_id)
            node = st.current_node
        return "OK"
    return await _report_node(store, job_id, node, output, outcome, **kw)


async def _report_node(store: Store, job_id: str, node: Any, output: dict[str, Any], outcome: str, **kw: Any) -> str:
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
