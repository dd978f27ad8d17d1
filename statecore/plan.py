"""What one atomic write of a job changes (``Plan``), and the steps the decider builds it from.

Pure: the store serialises a ``Plan`` and one Lua script applies it (docs/protocol.md § Redis layout).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import TypeAdapter

from . import eventrefs
from .ids import canonical_json, new_id, now_iso
from .jobstate import JobState
from .keys import command_outbox, result_field
from .models import (
    FIRST_WORKFLOW_VERSION,
    Box,
    CurrentNode,
    ImageRef,
    NodeCommand,
    Pause,
    PauseStage,
    SubjectToReview,
)
from .nodes import NodeBox, NodeInput, ProcessInput, ValidateInput
from .states import JobStatus, NodeType, transition

# The workflow definition this build runs, recorded with every pause and in its snapshot id, so a
# pause names exactly what the reviewer was shown (docs/protocol.md § Pause); and the definitions
# whose pauses this build can continue. A pause opened under any other is re-offered for review
# under this one, never continued (docs/protocol.md § Snapshot echo and the fifth gate). A build
# that changes what a submission means bumps WORKFLOW_VERSION and keeps in CONTINUABLE only the
# versions whose pauses it still reads the same way.
WORKFLOW_VERSION = FIRST_WORKFLOW_VERSION
CONTINUABLE_WORKFLOW_VERSIONS: frozenset[str] = frozenset({WORKFLOW_VERSION})


@dataclass
class Plan:
    """Everything one atomic write changes. Serialised to JSON for the Lua side."""

    expect_version: int
    status: JobStatus
    meta: dict[str, str | None] = field(default_factory=dict)  # None: the field is removed
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    outbox: list[NodeCommand] = field(default_factory=list)  # several: one per subject (statecore.subjects)
    pause_history: dict[str, str] = field(default_factory=dict)
    waiting: tuple[str, int] | None = None  # ("add", score_ms) | ("del", 0)
    running: tuple[str, int] | None = None  # ("add", deadline_ms) | ("del", 0)
    queued: tuple[str, int] | None = None  # ("add", queued_at_ms) | ("del", 0)
    heartbeats: tuple[str, int] | None = None  # ("add", heartbeat_ms) | ("del", 0)
    # A live subject node's entries in those three indices (member ``<job_id>|<node id>``, keys.node_member):
    # (index: "queued" | "running" | "heartbeats", "add" | "del", score ms, node id).
    members: list[tuple[str, str, int, str]] = field(default_factory=list)
    terminal: bool = False

    def to_json(self, now: str, archive: bool = False) -> str:
        """``archive``: a terminal plan queues ``ARCHIVE_JOB`` instead of starting the records'
        retention (docs/protocol.md § Archive)."""
        meta = {"status": self.status.value, "updated_at": now, **self.meta}
        if self.meta.get("results"):  # lua/_lib.lua folds the subjects' own fields into it first
            meta.update(own_results(self.meta["results"] or ""))
        if self.terminal:
            meta["terminal"] = "1"
        return canonical_json(
            {
                "meta": meta,
                "events": [
                    [t, self.status.value, canonical_json(d)]
                    for (t, _), d in zip(self.events, eventrefs.stored(self.events, meta), strict=True)
                ],
                # [stream, command]: each command in its lane's stream (keys.command_outbox)
                "outbox": [[command_outbox(c.job_id, c.node_type), c.model_dump_json()] for c in self.outbox],
                "pauses": self.pause_history,
                "waiting": list(self.waiting) if self.waiting else [],
                "running": list(self.running) if self.running else [],
                "queued": list(self.queued) if self.queued else [],
                "heartbeats": list(self.heartbeats) if self.heartbeats else [],
                "members": [list(m) for m in self.members],
                "terminal": self.terminal,
                "archive": self.terminal and archive,
            }
        )


_BOX_LIST: TypeAdapter[list[Box]] = TypeAdapter(list[Box])

# A subject still to cut, being cut or refined (statecore.subjects.PENDING): a node of its own writes
# its result, in a field of its own (keys.result_field), with no read of the others (lua/subject_write.lua).
CUTTING = frozenset({"QUEUED", "SEGMENTING", "REFINING"})


def own_results(results_json: str) -> dict[str, str | None]:
    """The ``result:<box_id>`` field of every subject of ``results_json`` still being cut."""
    return {
        result_field(r["box_id"]): canonical_json(r) for r in orjson.loads(results_json) if r.get("status") in CUTTING
    }


def dump(model: Any) -> str:
    if model is None:
        return ""
    if isinstance(model, list):
        if all(type(m) is Box for m in model):  # the usual list: one serializer call for all of it
            return canonical_json(box_dicts(model))
        return canonical_json([m.model_dump(mode="json") for m in model])
    return canonical_json(model.model_dump(mode="json"))


def dump_node(node: CurrentNode) -> str:
    """The current node as stored in the job's meta: unset times left out (every byte of a waiting
    job counts), the live heartbeat only in the heartbeat index (``Store.snapshot`` adds it)."""
    return canonical_json(node.model_dump(mode="json", exclude_none=True, exclude={"heartbeat_at"}))


def move(plan: Plan, state: JobState, target: JobStatus, by_policy: str | None = None) -> None:
    """Check the move against the table, record it and its STATUS_CHANGED event; ``by_policy``: the
    auto-approve policy taking its edge (statecore.auto_plan)."""
    new = transition(state.status, target, job_id=state.job_id, by_policy=by_policy)
    if new != state.status:
        plan.events.append(("STATUS_CHANGED", {"from": state.status.value, "to": new.value}))
    plan.status = new


def finish(plan: Plan, reason_code: str | None) -> None:
    plan.terminal = True
    plan.waiting = ("del", 0)
    plan.running = ("del", 0)
    plan.queued = ("del", 0)
    plan.heartbeats = ("del", 0)
    plan.meta["node_input"] = None
    plan.meta["reason_code"] = reason_code or ""
    plan.events.append(("JOB_FINISHED", {"status": plan.status.value, "reason_code": reason_code}))


def command(job_id: str, node_type: NodeType, now: str, inp: NodeInput | dict[str, Any]) -> NodeCommand:
    """``inp``: the node's input, or its JSON dump already made (``process_input_json``)."""
    return NodeCommand(
        node_instance_id=new_id("node"),
        node_type=node_type.value,
        job_id=job_id,
        attempt=0,
        enqueued_at=now,
        input=inp if isinstance(inp, dict) else inp.model_dump(mode="json"),
    )


def ms_to_iso(ms: int) -> str:
    return now_iso(ms / 1000)


def enqueue(plan: Plan, cmd: NodeCommand, now_ms: int) -> None:
    """Queue ``cmd``: it waits in the outbox (the ``queued`` index) with no deadline; its deadline
    starts when a dispatcher starts it (``reports.plan_node_started``)."""
    plan.outbox.append(cmd)
    # dump_node(CurrentNode(...)) of these five fields (none of them None), without the model.
    node = {
        "node_instance_id": cmd.node_instance_id,
        "node_type": NodeType(cmd.node_type).value,
        "status": "RETRY_WAIT" if cmd.not_before_ms else "QUEUED",
        "attempt": cmd.attempt,
        "queued_at": cmd.enqueued_at,
    }
    plan.meta["current_node"] = canonical_json(node)
    plan.meta["node_id"] = cmd.node_instance_id
    plan.meta["node_input"] = canonical_json(cmd.input)  # kept only while the node is live
    plan.queued = ("add", now_ms)
    plan.running = ("del", 0)
    plan.heartbeats = ("del", 0)


def requeue(
    plan: Plan,
    state: JobState,
    node: CurrentNode,
    *,
    reason: str,
    now: str,
    now_ms: int,
    not_before_ms: int | None = None,
) -> NodeCommand:
    """Run ``node`` again as a new instance (same type and attempt count, the input the job keeps for
    it), announced by NODE_RETRY_SCHEDULED: a failed attempt's retry (``reports.plan_node_failed``)
    and a restored job's lost node (``restore.plan_restore``) alike. ``not_before_ms``: its backoff."""
    cmd = NodeCommand(
        node_instance_id=new_id("node"),
        node_type=node.node_type.value,
        job_id=state.job_id,
        attempt=node.attempt,
        enqueued_at=now,
        not_before_ms=not_before_ms,
        input=state.node_input or {},  # validated when first queued; passed on as it is
    )
    enqueue(plan, cmd, now_ms)
    plan.events.append(
        (
            "NODE_RETRY_SCHEDULED",
            {
                "node_instance_id": cmd.node_instance_id,
                "replaces": node.node_instance_id,
                "node_type": node.node_type.value,
                "attempt": node.attempt + 1,
                "reason": reason,
                "not_before": ms_to_iso(not_before_ms) if not_before_ms is not None else now,
            },
        )
    )
    return cmd


def open_pause(
    plan: Plan,
    state: JobState,
    stage: PauseStage,
    round_: int,
    box_list: list[Box],
    to_revise: list[str],
    now: str,
    now_ms: int,
    workflow: str = WORKFLOW_VERSION,
    reconciliation: dict[str, list[dict[str, Any]]] | None = None,
    subjects_to_review: list[SubjectToReview] | None = None,
) -> Pause:
    """``subjects_to_review``: a mask review's subjects (stage WAITING_MASK_REVIEW); its snapshot id
    names them too (the masks shown), not only the boxes."""
    pause = Pause(
        pause_token=new_id("pause"),
        status="WAITING",
        stage=stage,
        base_version=state.version + 1,
        round=round_,
        snapshot_id=snapshot_id(state.image.sha256, box_list, workflow, subjects_to_review),
        box_ids_to_revise=to_revise,
        created_at=now,
        workflow_version=workflow,
        reconciliation=reconciliation,
        subjects_to_review=subjects_to_review,
    )
    # A waiting pause is stored without its null fields (consumed_at, consumed_by: null until it is
    # consumed): every byte of a waiting job counts, and reading it back gives the same Pause.
    stored = pause.model_dump(mode="json", exclude_none=True)
    plan.meta["active_pause"] = canonical_json(stored)
    plan.meta["pause_token"] = pause.pause_token
    plan.meta["round"] = str(round_)
    plan.waiting = ("add", now_ms)
    plan.running = ("del", 0)
    plan.heartbeats = ("del", 0)
    plan.events.append(
        (
            "PAUSE_OPENED",
            {
                "active_pause": stored,
                "box_list": [b.model_dump(mode="json") for b in box_list],
            },
        )
    )
    return pause


def snapshot_id(
    image_sha: str,
    box_list: list[Box],
    workflow: str = WORKFLOW_VERSION,
    subjects_to_review: list[SubjectToReview] | None = None,
) -> str:
    """Names the exact boxes, image and workflow version a reviewer is shown (and a mask review's
    masks and verdicts)."""
    shown: dict[str, Any] = {
        "image": image_sha,
        "workflow": workflow,
        "boxes": [b.model_dump(mode="json") for b in box_list],
    }
    if subjects_to_review is not None:
        shown["subjects_to_review"] = [s.model_dump(mode="json") for s in subjects_to_review]
    digest = hashlib.sha256(canonical_json(shown).encode()).hexdigest()
    return "snap_" + digest[:20]


def needs_validation(box: Box) -> bool:
    return box.source == "manual" and (box.validation is None or box.validation.status != "PASSED")


def approved_of(box_list: list[Box]) -> list[Box]:
    """Boxes allowed to go on: model boxes and manual boxes that passed naming, marked SEGMENT."""
    return [
        b
        for b in box_list
        if b.target_policy == "SEGMENT"
        and not needs_validation(b)
        and not (b.validation and b.validation.status == "REJECTED")
    ]


def subject_input(state: JobState, box: Box, points: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A ``SEGMENT_SUBJECT`` node's input: a ``ProcessInput`` of ``box`` alone; ``points``: a reviewer's
    REFINE, segmented from them and the box."""
    inp = process_input_json(state.image, [box.model_dump(mode="json")])
    if points is not None:
        inp["prompts"] = {box.box_id: points}
    return inp


def subject_command(state: JobState, box: Box, points: list[dict[str, Any]] | None, now: str) -> NodeCommand:
    """The ``SEGMENT_SUBJECT`` command for ``box`` (statecore.subjects, ``subject_input``)."""
    return command(state.job_id, NodeType.SEGMENT_SUBJECT, now, subject_input(state, box, points))


def process_input(image: ImageRef, approved: list[Box]) -> ProcessInput:
    return ProcessInput(image=image, approved_box_list=[NodeBox.of(b) for b in approved])


# A node input's boxes (``NodeBox``) have exactly a ``Box``'s fields in the same order, and the
# inputs below these fields in this order: a box list's JSON dump *is* the dump of
# ``[NodeBox.of(b) for b in boxes]``, so the hot paths build a node's input from the dump without
# a model per box (the same bytes in the outbox and the meta's ``node_input``).
if (
    tuple(NodeBox.model_fields) != tuple(Box.model_fields)
    or tuple(ProcessInput.model_fields)[:2] != ("image", "approved_box_list")
    or tuple(ValidateInput.model_fields)
    != ("image", "round", "box_list", "items_to_validate", "reusable_valid_items", "deleted_box_ids")
):
    raise RuntimeError("statecore.nodes changed: update statecore.plan.box_dicts and the inputs built from it")


def box_dicts(boxes: list[Box]) -> list[dict[str, Any]]:
    """``[b.model_dump(mode="json") for b in boxes]`` in one serializer call."""
    out: list[dict[str, Any]] = _BOX_LIST.dump_python(boxes, mode="json")
    return out


def process_input_json(image: ImageRef, approved: list[dict[str, Any]]) -> dict[str, Any]:
    """``process_input(image, boxes).model_dump(mode="json")`` from ``box_dicts(boxes)``."""
    return {"image": image.model_dump(mode="json"), "approved_box_list": approved}


def validate_input_json(
    image: ImageRef,
    round_: int,
    box_list: list[dict[str, Any]],
    to_validate: list[dict[str, Any]],
    reusable: list[str],
    deleted: list[str],
) -> dict[str, Any]:
    """A ``ValidateInput``'s JSON dump from ``box_dicts`` of its two box lists."""
    return {
        "image": image.model_dump(mode="json"),
        "round": round_,
        "box_list": box_list,
        "items_to_validate": to_validate,
        "reusable_valid_items": reusable,
        "deleted_box_ids": deleted,
    }
