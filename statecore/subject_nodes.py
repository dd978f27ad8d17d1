"""The lifecycle of a job's ``SEGMENT_SUBJECT`` nodes, which run side by side (SPEC §13).

A job has one current node (``current_node``, the index member ``<job_id>``) for every stage but the
cutting of its subjects: there it fans out one node per subject, each with its own node instance,
attempts, deadline and heartbeat (§9). Each lives in the job's meta as a field of its own,
``node:<id>`` (``keys.node_field``), and in the queued, running and heartbeat indices as the member
``<job_id>|<id>`` (``keys.node_member``), so the report check, the heartbeats, the inspector's
verdicts and the dispatchers' watch treat each alone. A node's field goes when it ends (its subject's
result recorded, or a retry queued as a new instance); when the job ends (a cancel) the fields stay,
marked, and the index members go (``_lib.lua``).

Pure, like ``statecore.decide``: each function adds to the ``Plan`` the store commits.
"""

from __future__ import annotations

from typing import Any

from .jobstate import JobState
from .keys import SUBJECT_NODE_FIELD, node_field
from .models import Box, CurrentNode, NodeCommand
from .plan import Plan, dump, dump_node, ms_to_iso, subject_command, subject_input
from .states import NodeType


def queue(
    plan: Plan,
    state: JobState,
    box: Box,
    points: list[dict[str, Any]] | None,
    now: str,
    now_ms: int,
    *,
    attempt: int = 0,
    not_before_ms: int | None = None,
) -> NodeCommand:
    """A new ``SEGMENT_SUBJECT`` node for ``box`` (``points``: a reviewer's REFINE): its command in the
    outbox, its field, its member in the queued index."""
    cmd = subject_command(state, box, points, now)
    cmd.attempt, cmd.not_before_ms = attempt, not_before_ms
    plan.outbox.append(cmd)
    node = CurrentNode(
        node_instance_id=cmd.node_instance_id,
        node_type=NodeType.SEGMENT_SUBJECT,
        status="RETRY_WAIT" if not_before_ms else "QUEUED",
        attempt=attempt,
        queued_at=now,
        box_id=box.box_id,
    )
    plan.meta[node_field(cmd.node_instance_id)] = dump_node(node)
    plan.members.append(("queued", "add", now_ms, cmd.node_instance_id))
    return cmd


def input_of(state: JobState, node: CurrentNode) -> dict[str, Any] | None:
    """The input a live subject node was queued with (rebuilt from the job: the box, and the
    reviewer's points while its subject is ``REFINING``); None when its box is gone."""
    box = next((b for b in state.approved_box_list if b.box_id == node.box_id), None)
    if box is None:
        return None
    return subject_input(state, box, points_of(state, box.box_id))


def points_of(state: JobState, box_id: str) -> list[dict[str, Any]] | None:
    r = next((r for r in state.results if r.box_id == box_id), None)
    return state.refine_prompts.get(box_id) if r is not None and r.status == "REFINING" else None


def started(plan: Plan, state: JobState, node: CurrentNode, deadline_ms: int, now_ms: int) -> None:
    """``node`` (already marked RUNNING) runs: its field, its members, and its subject ``SEGMENTING``
    (a reviewer's ``REFINING`` stays as it is) with one more attempt."""
    nid = node.node_instance_id
    plan.meta[node_field(nid)] = dump_node(node)
    plan.members += [
        ("queued", "del", 0, nid),
        ("running", "add", deadline_ms, nid),
        ("heartbeats", "add", now_ms, nid),
    ]
    results = []
    for r in state.results:
        if r.box_id == node.box_id:
            status = "SEGMENTING" if r.status == "QUEUED" else r.status
            r = r.model_copy(update={"status": status, "attempts": r.attempts + 1})
        results.append(r)
    plan.meta["results"] = dump(results)


def ended(plan: Plan, node: CurrentNode) -> None:
    """``node`` is done (answered, given up on, or replaced by a retry): its field and members go."""
    nid = node.node_instance_id
    plan.meta[node_field(nid)] = None
    plan.members += [("queued", "del", 0, nid), ("running", "del", 0, nid), ("heartbeats", "del", 0, nid)]


def retry(
    plan: Plan, state: JobState, node: CurrentNode, *, reason: str, now: str, now_ms: int, not_before_ms: int | None
) -> NodeCommand | None:
    """Run ``node``'s subject again as a new node instance (same attempt count), announced by
    NODE_RETRY_SCHEDULED; None when its box is gone (nothing to run)."""
    box = next((b for b in state.approved_box_list if b.box_id == node.box_id), None)
    if box is None:
        return None
    ended(plan, node)
    points = points_of(state, box.box_id)
    cmd = queue(plan, state, box, points, now, now_ms, attempt=node.attempt, not_before_ms=not_before_ms)
    plan.events.append(
        (
            "NODE_RETRY_SCHEDULED",
            {
                "node_instance_id": cmd.node_instance_id,
                "replaces": node.node_instance_id,
                "node_type": NodeType.SEGMENT_SUBJECT.value,
                "box_id": box.box_id,
                "attempt": node.attempt + 1,
                "reason": reason,
                "not_before": ms_to_iso(not_before_ms) if not_before_ms is not None else now,
            },
        )
    )
    return cmd


def live_after(plan: Plan, state: JobState) -> dict[str, str]:
    """The live subject nodes once ``plan`` is applied: node id -> box id."""
    live = {nid: n.box_id or "" for nid, n in state.subject_nodes.items() if n.status in LIVE}
    for field, raw in plan.meta.items():
        if field.startswith(SUBJECT_NODE_FIELD):
            nid = field[len(SUBJECT_NODE_FIELD) :]
            if raw is None:
                live.pop(nid, None)
            else:
                live[nid] = CurrentNode.model_validate_json(raw).box_id or ""
    return live


LIVE = frozenset({"QUEUED", "RETRY_WAIT", "RUNNING"})
