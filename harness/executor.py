"""Playing the executor's part through the store: a report for the node a job is waiting on, as a
dispatcher would apply it (the tests' drivers and the benchmarks that prepare waiting jobs)."""

from __future__ import annotations

from typing import Any

from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.store import Store


async def report(store: Store, job_id: str, output: dict[str, Any], outcome: str = "SUCCEEDED", **kw: Any) -> str:
    """Apply a report for the node the job is waiting on; returns the store's verdict (``OK``, ``IGNORED``, …).

    For a job cutting its subjects (one ``SEGMENT_SUBJECT`` node each, side by side: statecore.subjects)
    a successful output with ``subjects`` is the answer of every subject's node: each node gets its own
    report with its own subject (none when the output has no entry for it), as the Segmenter would send,
    in the order of the approved boxes; the first verdict that is not ``OK`` is returned. Any other
    report goes to the first subject's node."""
    st = await store.get(job_id)
    order = {b.box_id: i for i, b in enumerate(st.approved_box_list)}
    live = sorted(
        (n for n in st.subject_nodes.values() if n.status in ("QUEUED", "RETRY_WAIT", "RUNNING")),
        key=lambda n: order.get(n.box_id or "", len(order)),
    )
    if not live:
        return await _report_node(store, job_id, st.current_node, output, outcome, **kw)
    if outcome != "SUCCEEDED" or "subjects" not in output:
        return await _report_node(store, job_id, live[0], output, outcome, **kw)
    by_box = {s.get("box_id"): s for s in output["subjects"]}
    for node in live:
        one = {**output, "subjects": [by_box[node.box_id]] if node.box_id in by_box else []}
        got = await _report_node(store, job_id, node, one, outcome, **kw)
        if got != "OK":
            return got
    return "OK"


async def _report_node(store: Store, job_id: str, node: Any, output: dict[str, Any], outcome: str, **kw: Any) -> str:
    assert node is not None, f"job {job_id} has no node to report for"
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
