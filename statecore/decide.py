"""The pure decider: given a job's state and a trigger, what must be written.

Nothing here does I/O. The store reads a ``JobState``, asks one of the
``plan_*`` functions for a ``Plan`` and hands it to a Lua script that checks
the preconditions and writes everything in one atomic step, guarded by the
version the plan was computed from. Creation, interventions and cancels are
here; executor reports in ``statecore.reports``; the ``Plan`` and its steps in
``statecore.plan``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from . import keys, mask_review, prelabelled, subjects
from .errors import InvalidRequest
from .ids import canonical_json, new_id
from .jobstate import JobState, require
from .models import (
    Box,
    ConsumedBy,
    CreateJobResponse,
    Diff,
    ImageRef,
    InterventionRequest,
    InterventionResponse,
    NodeCommand,
    Subject,
)
from .nodes import DetectInput, Detection, DetectOutput
from .plan import (
    WORKFLOW_VERSION,
    Plan,
    approved_of,
    box_dicts,
    command,
    dump,
    dump_node,
    enqueue,
    finish,
    move,
    needs_validation,
    snapshot_id,
    validate_input_json,
)
from .reports import (
    RoundDecision,
    decide_round,
    on_prelabelled,
    plan_node_dead,
    plan_node_lost,
    plan_node_started,
    plan_report,
)
from .states import JobStatus, NodeType, is_terminal, transition

__all__ = [
    "WORKFLOW_VERSION",
    "InterventionPlan",
    "JobState",
    "NextHop",
    "Plan",
    "RoundDecision",
    "SubjectDiff",
    "approved_of",
    "check_bboxes_in_image",
    "decide_round",
    "diff_subjects",
    "needs_validation",
    "next_hop",
    "plan_cancel",
    "plan_create",
    "plan_intervention",
    "plan_node_lost",
    "plan_node_started",
    "plan_node_dead",
    "plan_report",
    "require",
    "snapshot_id",
]

S = JobStatus


class NextHop(StrEnum):
    EMPTY_SELECTION = "EMPTY_SELECTION"
    VALIDATE_MANUAL_BOX_LIST = "VALIDATE_MANUAL_BOX_LIST"
    PROCESS_APPROVED_BOX_LIST = "PROCESS_APPROVED_BOX_LIST"


# --------------------------------------------------------------------------- create


def create_fingerprint(
    image_sha256: str, review_quorum: int = 1, quorum_policy: str = "all", boxes: list[Detection] | str | None = None
) -> str:
    """What a creation's replay is compared on (docs/protocol.md § Routes, Creating a job): the
    image, and the review quorum and its policy asked for, so the same ``Idempotency-Key`` with
    another quorum or policy is a conflict, not a replay of a job that waits for other reviewers. A
    one-reviewer creation is its image's sha256 alone, and an ``all`` quorum's has no policy part:
    the records written before the quorum (or its policy) counted compare as they did. Redis keeps
    it in the key's record; the archive keeps it with the job, to answer a replay once Redis has
    forgotten the job. A pre-labelled job's boxes count too (statecore.prelabelled)."""
    digest = prelabelled.boxes_hash(boxes) if isinstance(boxes, list) else boxes  # str: the job's kept digest
    boxes_part = prelabelled.fingerprint_part(digest)
    if review_quorum <= 1:
        return image_sha256 + boxes_part
    quorum = f":q{review_quorum}" + ("" if quorum_policy == "all" else f":{quorum_policy}")
    return image_sha256 + quorum + boxes_part


def job_fingerprint(state: JobState) -> str:
    """A stored job's creation fingerprint, from what it keeps (the archive's copy of it)."""
    p = state.policy
    return create_fingerprint(
        state.image.sha256, int(p.get("review_quorum") or 1), p.get("quorum_policy") or "all", p.get(prelabelled.SOURCE)
    )


def create_response(job_id: str, fingerprint: str = "") -> str:
    """The body ``POST /jobs`` answers a new job with, and every replay of it byte for byte, from
    Redis's record or, once Redis forgot the job, from the archive (``fingerprint``: the creation's,
    which says whether it was pre-labelled, so already waiting for review)."""
    status = S.WAITING_USER_SELECTION if prelabelled.is_prelabelled(fingerprint) else S.DETECTING
    return CreateJobResponse(job_id=job_id, status=status, version=1).model_dump_json()


def plan_create(
    job_id: str,
    submitter: str,
    image: ImageRef,
    idem_key: str | None,
    now: str,
    now_ms: int,
    review_quorum: int = 1,
    quality_gate: str = "off",
    quorum_policy: str = "all",
    boxes: list[Detection] | None = None,
    mask_spot: dict[str, Any] | None = None,
) -> tuple[Plan, NodeCommand | None]:
    """A new job: CREATED then at once DETECTING with DETECT_SUBJECTS in the outbox (version 1).
    With ``boxes`` (a pre-labelled job, statecore.prelabelled) no detector is asked: they are
    the detection's answer, in the same write, and the job waits for review (version 1 too).
    ``review_quorum`` ≥ 2: each pause needs that many reviewers, decided by ``quorum_policy``
    (docs/protocol.md § Quorum). ``quality_gate``: which masks wait for a person
    (statecore.mask_review). Both are fixed for the job's life."""
    policy: dict[str, Any] = {"workflow": WORKFLOW_VERSION, "auto_approve": None}
    if review_quorum > 1:
        policy["review_quorum"] = review_quorum
        if quorum_policy != "all":  # all, the default, left out: the policy of every quorum job before
            policy["quorum_policy"] = quorum_policy
    if quality_gate != "off":  # off, the default, left out: the policy of every job created before
        policy["quality_gate"] = quality_gate
    if boxes is not None:  # the boxes' digest: the archive's creation fingerprint (job_fingerprint)
        policy[prelabelled.SOURCE] = prelabelled.boxes_hash(boxes)
    if mask_spot:  # the mask spot checks' share and secret salt (statecore.gate_spot.policy_fields)
        policy.update(mask_spot)
    plan = Plan(expect_version=0, status=S.DETECTING)
    transition(S.CREATED, S.DETECTING, job_id=job_id)
    # Fields at their default are left out (every byte of a waiting job counts; JobState.from_meta
    # reads a missing one as its default): approved_box_list and results [], reason_code none,
    # cancel_requested and empty_selection 0, idem_key none.
    plan.meta.update(
        {
            "job_id": job_id,
            "submitter": submitter,
            "round": "1",
            "created_at": now,
            "image": dump(image),
            "box_list": "[]",
            "active_pause": "",
            "pause_token": "",
            "terminal": "0",
            "policy": canonical_json(policy),
        }
    )
    if idem_key:
        plan.meta["idem_key"] = idem_key
    created: dict[str, Any] = {"submitter": submitter, "width": image.width, "height": image.height}
    if boxes is not None:
        created["proposal_source"] = prelabelled.SOURCE
    if mask_spot:  # the share (the deployment's, never the salt): the population of hitl learn report
        created["mask_spot_check"] = mask_spot["mask_spot_check"]
    plan.events.append(("JOB_CREATED", created))
    plan.events.append(("STATUS_CHANGED", {"from": S.CREATED.value, "to": S.DETECTING.value}))
    if boxes is not None:
        meta = {k: v for k, v in plan.meta.items() if v is not None}
        state = JobState.from_meta({**meta, "status": S.DETECTING.value, "version": "0", "updated_at": now})
        output = DetectOutput(boxes=boxes, backend=prelabelled.SOURCE)
        on_prelabelled(plan, state, output, now, now_ms, WORKFLOW_VERSION)
        return plan, None
    cmd = command(job_id, NodeType.DETECT_SUBJECTS, now, DetectInput(image=image))
    enqueue(plan, cmd, now_ms)
    return plan, cmd


# --------------------------------------------------------------------------- intervention


@dataclass
class SubjectDiff:
    box_list: list[Box]
    kept: list[str]
    added: list[str]
    deleted: list[str]


def diff_subjects(
    box_list: list[Box], subjects: list[Subject], new_box_id: Callable[[], str] = lambda: new_id("box")
) -> SubjectDiff:
    """Normalise the submitted complete list against the panel's boxes.

    A subject with a known ``box_id`` (or a ``candidate_id`` naming one) keeps
    that box, possibly moved or relabelled; a manual box whose geometry or
    label changed is validated again. A subject without one is a new manual
    box. Unknown or repeated ids are a 400 with nothing written.
    """
    by_id = {b.box_id: b for b in box_list}
    seen: set[str] = set()
    out: list[Box] = []
    kept: list[str] = []
    added: list[str] = []
    for i, s in enumerate(subjects):
        ref = s.box_id or (s.candidate_id if s.candidate_id in by_id else None)
        if s.box_id and s.box_id not in by_id:
            raise InvalidRequest(
                f"subjects[{i}].box_id {s.box_id!r} is not in the current box list", field=f"subjects[{i}].box_id"
            )
        if ref is None:
            box = Box(
                box_id=new_box_id(),
                bbox=s.bbox,
                label=s.label,
                score=None,
                source="manual",
                target_policy=s.target_policy,
                validation=None,
            )
            out.append(box)
            added.append(box.box_id)
            continue
        if ref in seen:
            raise InvalidRequest(f"subjects[{i}] names box {ref!r} twice", field=f"subjects[{i}]")
        seen.add(ref)
        old = by_id[ref]
        label = s.label if s.label is not None else old.label
        moved = tuple(s.bbox) != tuple(old.bbox)
        changed = moved or label != old.label
        validation = None if (old.source == "manual" and changed) else old.validation
        out.append(
            old.model_copy(
                update={
                    "bbox": tuple(s.bbox),
                    "label": label,
                    "target_policy": s.target_policy,
                    "validation": validation,
                    # What the detector saw is about the box it proposed, not the one a reviewer drew from it.
                    "evidence": None if moved else old.evidence,
                }
            )
        )
        kept.append(ref)
    deleted = [b.box_id for b in box_list if b.box_id not in seen]
    return SubjectDiff(box_list=out, kept=kept, added=added, deleted=deleted)


def next_hop(box_list: list[Box]) -> NextHop:
    if not box_list:
        return NextHop.EMPTY_SELECTION
    if any(needs_validation(b) for b in box_list):
        return NextHop.VALIDATE_MANUAL_BOX_LIST
    return NextHop.PROCESS_APPROVED_BOX_LIST


def check_bboxes_in_image(subjects: list[Subject], width: int, height: int) -> None:
    for i, s in enumerate(subjects):
        x1, y1, x2, y2 = s.bbox
        if x2 > width or y2 > height:
            raise InvalidRequest(
                f"subjects[{i}].bbox {list(s.bbox)} lies outside the {width}x{height} image",
                field=f"subjects[{i}].bbox",
            )


@dataclass
class InterventionPlan:
    plan: Plan | None
    response: InterventionResponse | None
    invalid: InvalidRequest | None


def plan_intervention(
    state: JobState, req: InterventionRequest, reviewer: str, now: str, now_ms: int
) -> InterventionPlan:
    """Consume the active pause and choose the next hop from the diff.

    Returns ``invalid`` instead of raising for a bad box id, because the 409
    checks (idempotency, cancel, version, pause, token) must win over it and
    they run inside the Lua script.
    """
    pause = state.active_pause
    if pause is not None and pause.status == "WAITING" and pause.stage == mask_review.STAGE:
        return _plan_mask_review(state, req, reviewer, now, now_ms)
    try:
        if req.subjects is None:
            raise InvalidRequest(
                "this pause is a box stage: send 'subjects' (the complete box list), not 'decisions'", field="subjects"
            )
        d = diff_subjects(state.box_list, req.subjects)
    except InvalidRequest as e:
        return InterventionPlan(None, None, e)
    if pause is None or pause.status != "WAITING" or state.status == S.CANCELLED or is_terminal(state.status):
        # The script will answer with the precise 409; nothing to plan.
        return InterventionPlan(None, None, None)
    plan = Plan(expect_version=state.version, status=state.status)
    hop = next_hop(d.box_list)
    _consume(plan, state, req, reviewer, now)
    boxes = box_dicts(d.box_list)  # dumped once: the meta's box list and the node's input share it
    plan.meta["box_list"] = canonical_json(boxes)
    diff = Diff(kept=d.kept, added=d.added, deleted=d.deleted)
    plan.events.append(
        (
            "INTERVENTION_ACCEPTED",
            {
                "intervention_id": req.intervention_id,
                "reviewer": reviewer,
                "pause_token": pause.pause_token,
                "round": pause.round,
                "diff": diff.model_dump(),
                "next_node_type": None if hop == NextHop.EMPTY_SELECTION else hop.value,
            },
        )
    )
    approved = approved_of(d.box_list)
    if hop == NextHop.EMPTY_SELECTION:
        move(plan, state, S.EMPTY_SELECTION)
        plan.meta["empty_selection"] = "1"
        plan.meta["approved_box_list"] = "[]"
        plan.events.append(("EMPTY_SELECTION_SUBMITTED", {"intervention_id": req.intervention_id}))
        finish(plan, None)
        next_type = None
    elif hop == NextHop.VALIDATE_MANUAL_BOX_LIST:
        move(plan, state, S.VALIDATING_MANUAL_BOXES)
        plan.meta["approved_box_list"] = dump(approved)
        to_validate = [b for b in d.box_list if needs_validation(b)]
        inp = validate_input_json(
            state.image,
            pause.round,
            boxes,
            box_dicts(to_validate),
            [b.box_id for b in approved],
            d.deleted,
        )
        cmd = command(state.job_id, NodeType.VALIDATE_MANUAL_BOX_LIST, now, inp)
        enqueue(plan, cmd, now_ms)
        next_type = hop.value
    else:
        move(plan, state, S.PROCESSING_APPROVED_SUBJECTS)
        plan.meta["approved_box_list"] = canonical_json(box_dicts(approved))
        subjects.start(plan, state, approved, d.box_list, now, now_ms)  # one SEGMENT_SUBJECT node per subject
        next_type = hop.value  # the stage's name in the answer (SPEC §4): PROCESS_APPROVED_BOX_LIST
    return _accepted(plan, state, req, next_type, diff)


def _accepted(
    plan: Plan, state: JobState, req: InterventionRequest, next_type: str | None, diff: Diff
) -> InterventionPlan:
    """The consumption planned: the INTERVENTION_ACCEPTED event (``plan.events[0]``) names the one
    command it queued (the commands: one per subject), for audits, and the answer every replay of it gets."""
    if len(plan.outbox) == 1:
        plan.events[0][1]["node_instance_id"] = plan.outbox[0].node_instance_id
    elif plan.outbox:
        plan.events[0][1]["node_instance_ids"] = [c.node_instance_id for c in plan.outbox]
    resp = InterventionResponse(
        intervention_id=req.intervention_id,
        job_id=state.job_id,
        accepted=True,
        status=plan.status,
        version=state.version + 1,
        next_node_type=next_type,
        diff=diff,
    )
    return InterventionPlan(plan, resp, None)


def _consume(plan: Plan, state: JobState, req: InterventionRequest, reviewer: str, now: str) -> None:
    """The waiting pause becomes CONSUMED by this intervention and the job leaves the review queue."""
    pause = state.active_pause
    assert pause is not None
    consumed = pause.model_copy(
        update={
            "status": "CONSUMED",
            "consumed_at": now,
            "consumed_by": ConsumedBy(intervention_id=req.intervention_id, reviewer=reviewer),
        }
    )
    plan.pause_history[pause.pause_token] = dump(consumed)
    plan.meta["active_pause"] = ""
    plan.meta["pause_token"] = ""
    plan.waiting = ("del", 0)


def _plan_mask_review(
    state: JobState, req: InterventionRequest, reviewer: str, now: str, now_ms: int
) -> InterventionPlan:
    """A submission to a mask review: its decisions checked (400 after the script's 409s), the pause
    consumed, the decisions applied (statecore.mask_review)."""
    try:
        decisions = mask_review.check_decisions(state, req)
    except InvalidRequest as e:
        return InterventionPlan(None, None, e)
    if state.status == S.CANCELLED or is_terminal(state.status):
        return InterventionPlan(None, None, None)
    pause = state.active_pause
    assert pause is not None
    plan = Plan(expect_version=state.version, status=state.status)
    _consume(plan, state, req, reviewer, now)
    accepted: dict[str, Any] = {
        "intervention_id": req.intervention_id,
        "reviewer": reviewer,
        "pause_token": pause.pause_token,
        "round": pause.round,
        "stage": pause.stage,
        "decisions": {d.box_id: d.decision for d in decisions},
    }
    plan.events.append(("INTERVENTION_ACCEPTED", accepted))
    diff, next_type = mask_review.apply_decisions(plan, state, decisions, reviewer, now, now_ms)
    accepted["diff"] = diff.model_dump()
    accepted["next_node_type"] = next_type
    return _accepted(plan, state, req, next_type, diff)


# --------------------------------------------------------------------------- cancel


def plan_cancel(state: JobState, who: str, now: str) -> Plan:
    plan = Plan(expect_version=state.version, status=state.status)
    move(plan, state, S.CANCELLED)
    plan.meta["cancel_requested"] = "1"
    plan.meta["cancelled_by"] = who
    if state.active_pause and state.active_pause.status == "WAITING":
        cancelled = state.active_pause.model_copy(update={"status": "CANCELLED", "consumed_at": now})
        plan.pause_history[cancelled.pause_token] = dump(cancelled)
        plan.meta["active_pause"] = ""
        plan.meta["pause_token"] = ""
    node = state.current_node
    if node is not None and node.status in ("QUEUED", "RETRY_WAIT", "RUNNING"):
        # The node's work is abandoned: say so, rather than leave it live for ever (finish() takes
        # it out of the indices; a dispatcher runs only a QUEUED or RETRY_WAIT node).
        plan.meta["current_node"] = dump_node(node.model_copy(update={"status": "CANCELLED"}))
    for nid, n in state.subject_nodes.items():  # the subjects' nodes too (their index members go: _lib.lua)
        if n.status in ("QUEUED", "RETRY_WAIT", "RUNNING"):
            plan.meta[keys.node_field(nid)] = dump_node(n.model_copy(update={"status": "CANCELLED"}))
    subjects.cancel(plan, state)  # and the subjects still live: CANCELLED
    plan.events.append(("JOB_CANCELLED", {"by": who, "from": state.status.value}))
    finish(plan, None)
    return plan
