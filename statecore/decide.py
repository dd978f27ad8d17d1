"""The pure decider: given a job's state and a trigger, what must be written.

Nothing here does I/O. The store reads a ``JobState``, asks one of the
``plan_*`` functions for a ``Plan`` and hands it to a Lua script that checks
the preconditions and writes everything in one atomic step, guarded by the
version the plan was computed from.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable

from .errors import InvalidRequest, JobNotFound
from .ids import canonical_json, new_id
from .models import (PENDING_ACTIONS_WAITING, Box, ConsumedBy, CurrentNode, Diff, ImageRef,
                     InterventionRequest, InterventionResponse, JobSnapshot, JobSummary, NodeCommand,
                     NodeReport, Pause, Subject, SubjectResult, Validation)
from .states import JobStatus, is_terminal, transition

S = JobStatus

# The workflow definition recorded with every snapshot id, so a pause names
# exactly what the reviewer was shown (seed 003).
WORKFLOW_VERSION = "cutout-v1"


class NextHop(StrEnum):
    EMPTY_SELECTION = "EMPTY_SELECTION"
    VALIDATE_MANUAL_BOX_LIST = "VALIDATE_MANUAL_BOX_LIST"
    PROCESS_APPROVED_BOX_LIST = "PROCESS_APPROVED_BOX_LIST"


class RoundDecision(StrEnum):
    NEED_BATCH_REVISION = "NEED_BATCH_REVISION"
    ALL_REJECTED = "ALL_REJECTED"
    PARTIAL_APPROVED = "PARTIAL_APPROVED"
    ALL_PASSED = "ALL_PASSED"


# --------------------------------------------------------------------------- state


@dataclass
class JobState:
    """A job as read from its meta hash (one HGETALL)."""

    job_id: str
    submitter: str
    status: JobStatus
    version: int
    round: int
    created_at: str
    updated_at: str
    image: ImageRef
    box_list: list[Box]
    approved_box_list: list[Box]
    active_pause: Pause | None
    current_node: CurrentNode | None
    reason_code: str | None
    cancel_requested: bool
    empty_selection: bool
    results: list[SubjectResult]
    idem_key: str | None
    policy: dict[str, Any]

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> "JobState":
        def j(name: str, default: Any = None) -> Any:
            raw = meta.get(name)
            return json.loads(raw) if raw else default

        pause = j("active_pause")
        node = j("current_node")
        return cls(
            job_id=meta["job_id"],
            submitter=meta.get("submitter", ""),
            status=JobStatus(meta["status"]),
            version=int(meta["version"]),
            round=int(meta.get("round", 1)),
            created_at=meta["created_at"],
            updated_at=meta["updated_at"],
            image=ImageRef(**j("image")),
            box_list=[Box(**b) for b in j("box_list", [])],
            approved_box_list=[Box(**b) for b in j("approved_box_list", [])],
            active_pause=Pause(**pause) if pause else None,
            current_node=CurrentNode(**node) if node else None,
            reason_code=meta.get("reason_code") or None,
            cancel_requested=meta.get("cancel_requested") == "1",
            empty_selection=meta.get("empty_selection") == "1",
            results=[SubjectResult(**r) for r in j("results", [])],
            idem_key=meta.get("idem_key") or None,
            policy=j("policy", {}),
        )

    def snapshot(self) -> JobSnapshot:
        waiting = self.active_pause is not None and self.active_pause.status == "WAITING"
        return JobSnapshot(
            job_id=self.job_id, status=self.status, version=self.version, round=self.round,
            created_at=self.created_at, updated_at=self.updated_at, image=self.image,
            box_list=self.box_list, approved_box_list=self.approved_box_list,
            active_pause=self.active_pause,
            pending_actions=list(PENDING_ACTIONS_WAITING) if waiting else [],
            current_node=self.current_node, reason_code=self.reason_code,
            cancel_requested=self.cancel_requested, empty_selection=self.empty_selection,
        )

    def summary(self) -> JobSummary:
        p = self.active_pause
        return JobSummary(
            job_id=self.job_id, status=self.status, version=self.version, created_at=self.created_at,
            updated_at=self.updated_at, submitter=self.submitter, box_count=len(self.box_list),
            stage=p.stage if p else None, pause_created_at=p.created_at if p else None,
        )


# --------------------------------------------------------------------------- plan


@dataclass
class Plan:
    """Everything one atomic write changes. Serialised to JSON for the Lua side."""

    expect_version: int
    status: JobStatus
    meta: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    outbox: NodeCommand | None = None
    pause_history: dict[str, str] = field(default_factory=dict)
    waiting: tuple[str, int] | None = None  # ("add", score_ms) | ("del", 0)
    running: tuple[str, int] | None = None  # ("add", deadline_ms) | ("del", 0)
    terminal: bool = False

    def to_json(self, now: str) -> str:
        meta = {"status": self.status.value, "updated_at": now, **self.meta}
        if self.terminal:
            meta["terminal"] = "1"
        return canonical_json({
            "meta": meta,
            "events": [[t, self.status.value, canonical_json(d)] for t, d in self.events],
            "outbox": self.outbox.model_dump_json() if self.outbox else "",
            "pauses": self.pause_history,
            "waiting": list(self.waiting) if self.waiting else [],
            "running": list(self.running) if self.running else [],
            "terminal": self.terminal,
        })


def _dump(model: Any) -> str:
    if model is None:
        return ""
    if isinstance(model, list):
        return canonical_json([m.model_dump(mode="json") for m in model])
    return canonical_json(model.model_dump(mode="json"))


def _move(plan: Plan, state: JobState, target: JobStatus) -> None:
    """Check the move against the table, record it and its STATUS_CHANGED event."""
    new = transition(state.status, target, job_id=state.job_id)
    if new != state.status:
        plan.events.append(("STATUS_CHANGED", {"from": state.status.value, "to": new.value}))
    plan.status = new


def _finish(plan: Plan, reason_code: str | None) -> None:
    plan.terminal = True
    plan.waiting = ("del", 0)
    plan.running = ("del", 0)
    plan.meta["reason_code"] = reason_code or ""
    plan.events.append(("JOB_FINISHED", {"status": plan.status.value, "reason_code": reason_code}))


def _command(state_job_id: str, node_type: str, now: str, inp: dict[str, Any]) -> NodeCommand:
    return NodeCommand(node_instance_id=new_id("node"), node_type=node_type, job_id=state_job_id,
                       attempt=0, enqueued_at=now, input=inp)


def _enqueue(plan: Plan, cmd: NodeCommand, deadline_ms: int) -> None:
    plan.outbox = cmd
    node = CurrentNode(node_instance_id=cmd.node_instance_id, node_type=cmd.node_type, status="QUEUED", attempt=0)
    plan.meta["current_node"] = _dump(node)
    plan.meta["node_id"] = cmd.node_instance_id
    plan.running = ("add", deadline_ms)


def _open_pause(plan: Plan, state: JobState, stage: str, round_: int, box_list: list[Box],
                to_revise: list[str], now: str, now_ms: int) -> Pause:
    pause = Pause(
        pause_token=new_id("pause"), status="WAITING", stage=stage,  # type: ignore[arg-type]
        base_version=state.version + 1, round=round_,
        snapshot_id=snapshot_id(state.image.sha256, box_list),
        box_ids_to_revise=to_revise, created_at=now,
    )
    plan.meta["active_pause"] = _dump(pause)
    plan.meta["pause_token"] = pause.pause_token
    plan.meta["round"] = str(round_)
    plan.waiting = ("add", now_ms)
    plan.running = ("del", 0)
    plan.events.append(("PAUSE_OPENED", {
        "active_pause": pause.model_dump(mode="json"),
        "box_list": [b.model_dump(mode="json") for b in box_list],
    }))
    return pause


def snapshot_id(image_sha: str, box_list: list[Box]) -> str:
    """Names the exact boxes, image and workflow version a reviewer is shown."""
    import hashlib

    digest = hashlib.sha256(canonical_json({
        "image": image_sha, "workflow": WORKFLOW_VERSION,
        "boxes": [b.model_dump(mode="json") for b in box_list],
    }).encode()).hexdigest()
    return "snap_" + digest[:20]


# --------------------------------------------------------------------------- create


def plan_create(job_id: str, submitter: str, image: ImageRef, idem_key: str | None,
                now: str, deadline_ms: int) -> tuple[Plan, NodeCommand]:
    """A new job: CREATED then at once DETECTING with DETECT_SUBJECTS in the outbox (version 1)."""
    plan = Plan(expect_version=0, status=S.DETECTING)
    transition(S.CREATED, S.DETECTING, job_id=job_id)
    plan.meta.update({
        "job_id": job_id, "submitter": submitter, "round": "1", "created_at": now,
        "image": _dump(image), "box_list": "[]", "approved_box_list": "[]", "active_pause": "", "pause_token": "",
        "reason_code": "", "cancel_requested": "0", "empty_selection": "0", "terminal": "0",
        "results": "[]", "idem_key": idem_key or "",
        "policy": canonical_json({"workflow": WORKFLOW_VERSION, "auto_approve": None}),
    })
    plan.events.append(("JOB_CREATED", {"submitter": submitter, "width": image.width, "height": image.height}))
    plan.events.append(("STATUS_CHANGED", {"from": S.CREATED.value, "to": S.DETECTING.value}))
    cmd = _command(job_id, "DETECT_SUBJECTS", now, {"image": image.model_dump(mode="json")})
    _enqueue(plan, cmd, deadline_ms)
    return plan, cmd


# --------------------------------------------------------------------------- intervention


@dataclass
class SubjectDiff:
    box_list: list[Box]
    kept: list[str]
    added: list[str]
    deleted: list[str]


def diff_subjects(box_list: list[Box], subjects: list[Subject],
                  new_box_id: Callable[[], str] = lambda: new_id("box")) -> SubjectDiff:
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
            raise InvalidRequest(f"subjects[{i}].box_id {s.box_id!r} is not in the current box list",
                                 field=f"subjects[{i}].box_id")
        if ref is None:
            box = Box(box_id=new_box_id(), bbox=s.bbox, label=s.label, score=None, source="manual",
                      target_policy=s.target_policy, validation=None)
            out.append(box)
            added.append(box.box_id)
            continue
        if ref in seen:
            raise InvalidRequest(f"subjects[{i}] names box {ref!r} twice", field=f"subjects[{i}]")
        seen.add(ref)
        old = by_id[ref]
        label = s.label if s.label is not None else old.label
        changed = tuple(s.bbox) != tuple(old.bbox) or label != old.label
        validation = None if (old.source == "manual" and changed) else old.validation
        out.append(old.model_copy(update={"bbox": tuple(s.bbox), "label": label,
                                          "target_policy": s.target_policy, "validation": validation}))
        kept.append(ref)
    deleted = [b.box_id for b in box_list if b.box_id not in seen]
    return SubjectDiff(box_list=out, kept=kept, added=added, deleted=deleted)


def needs_validation(box: Box) -> bool:
    return box.source == "manual" and (box.validation is None or box.validation.status != "PASSED")


def next_hop(box_list: list[Box]) -> NextHop:
    if not box_list:
        return NextHop.EMPTY_SELECTION
    if any(needs_validation(b) for b in box_list):
        return NextHop.VALIDATE_MANUAL_BOX_LIST
    return NextHop.PROCESS_APPROVED_BOX_LIST


def approved_of(box_list: list[Box]) -> list[Box]:
    """Boxes allowed to go on: model boxes and manual boxes that passed naming, marked SEGMENT."""
    return [b for b in box_list if b.target_policy == "SEGMENT" and not needs_validation(b)
            and not (b.validation and b.validation.status == "REJECTED")]


def check_bboxes_in_image(subjects: list[Subject], width: int, height: int) -> None:
    for i, s in enumerate(subjects):
        x1, y1, x2, y2 = s.bbox
        if x2 > width or y2 > height:
            raise InvalidRequest(f"subjects[{i}].bbox {list(s.bbox)} lies outside the {width}x{height} image",
                                 field=f"subjects[{i}].bbox")


@dataclass
class InterventionPlan:
    plan: Plan | None
    response: InterventionResponse | None
    invalid: InvalidRequest | None


def plan_intervention(state: JobState, req: InterventionRequest, reviewer: str, now: str, now_ms: int,
                      deadline_ms: int) -> InterventionPlan:
    """Consume the active pause and choose the next hop from the diff.

    Returns ``invalid`` instead of raising for a bad box id, because the 409
    checks (idempotency, cancel, version, pause, token) must win over it and
    they run inside the Lua script.
    """
    try:
        d = diff_subjects(state.box_list, req.subjects)
    except InvalidRequest as e:
        return InterventionPlan(None, None, e)
    pause = state.active_pause
    if pause is None or pause.status != "WAITING" or state.status == S.CANCELLED or is_terminal(state.status):
        # The script will answer with the precise 409; nothing to plan.
        return InterventionPlan(None, None, None)
    plan = Plan(expect_version=state.version, status=state.status)
    hop = next_hop(d.box_list)
    consumed = pause.model_copy(update={
        "status": "CONSUMED", "consumed_at": now,
        "consumed_by": ConsumedBy(intervention_id=req.intervention_id, reviewer=reviewer)})
    plan.pause_history[pause.pause_token] = _dump(consumed)
    plan.meta["active_pause"] = ""
    plan.meta["pause_token"] = ""
    plan.meta["box_list"] = _dump(d.box_list)
    plan.waiting = ("del", 0)
    diff = Diff(kept=d.kept, added=d.added, deleted=d.deleted)
    plan.events.append(("INTERVENTION_ACCEPTED", {
        "intervention_id": req.intervention_id, "reviewer": reviewer, "pause_token": pause.pause_token,
        "round": pause.round, "diff": diff.model_dump(), "next_node_type": None if hop == NextHop.EMPTY_SELECTION else hop.value,
    }))
    approved = approved_of(d.box_list)
    if hop == NextHop.EMPTY_SELECTION:
        _move(plan, state, S.EMPTY_SELECTION)
        plan.meta["empty_selection"] = "1"
        plan.meta["approved_box_list"] = "[]"
        plan.events.append(("EMPTY_SELECTION_SUBMITTED", {"intervention_id": req.intervention_id}))
        _finish(plan, None)
        next_type = None
    elif hop == NextHop.VALIDATE_MANUAL_BOX_LIST:
        _move(plan, state, S.VALIDATING_MANUAL_BOXES)
        plan.meta["approved_box_list"] = _dump(approved)
        to_validate = [b for b in d.box_list if needs_validation(b)]
        cmd = _command(state.job_id, hop.value, now, {
            "image": state.image.model_dump(mode="json"), "round": pause.round,
            "box_list": [b.model_dump(mode="json") for b in d.box_list],
            "items_to_validate": [b.model_dump(mode="json") for b in to_validate],
            "reusable_valid_items": [b.box_id for b in approved],
            "deleted_box_ids": d.deleted,
        })
        _enqueue(plan, cmd, deadline_ms)
        next_type = hop.value
    else:
        _move(plan, state, S.PROCESSING_APPROVED_SUBJECTS)
        plan.meta["approved_box_list"] = _dump(approved)
        cmd = _command(state.job_id, hop.value, now, {
            "image": state.image.model_dump(mode="json"),
            "approved_box_list": [b.model_dump(mode="json") for b in approved],
        })
        _enqueue(plan, cmd, deadline_ms)
        next_type = hop.value
    if plan.outbox is not None:  # the one command this consumption produced, for audits
        plan.events[0][1]["node_instance_id"] = plan.outbox.node_instance_id
    resp = InterventionResponse(intervention_id=req.intervention_id, job_id=state.job_id, accepted=True,
                                status=plan.status, version=state.version + 1,
                                next_node_type=next_type, diff=diff)  # type: ignore[arg-type]
    return InterventionPlan(plan, resp, None)


# --------------------------------------------------------------------------- cancel


def plan_cancel(state: JobState, who: str, now: str) -> Plan:
    plan = Plan(expect_version=state.version, status=state.status)
    _move(plan, state, S.CANCELLED)
    plan.meta["cancel_requested"] = "1"
    plan.meta["cancelled_by"] = who
    if state.active_pause and state.active_pause.status == "WAITING":
        cancelled = state.active_pause.model_copy(update={"status": "CANCELLED", "consumed_at": now})
        plan.pause_history[cancelled.pause_token] = _dump(cancelled)
        plan.meta["active_pause"] = ""
        plan.meta["pause_token"] = ""
    node = state.current_node
    if node is not None and node.status in ("QUEUED", "RUNNING"):
        # The node's work is abandoned: say so, rather than leave it QUEUED/RUNNING for ever.
        plan.meta["current_node"] = _dump(node.model_copy(update={"status": "CANCELLED"}))
    plan.events.append(("JOB_CANCELLED", {"by": who, "from": state.status.value}))
    _finish(plan, None)
    return plan


# --------------------------------------------------------------------------- reports


def decide_round(round_: int, results: list[Validation]) -> RoundDecision:
    """Seed 000: round 1 with any problem box goes back to the reviewer once;
    round 2 decides per box and never waits again."""
    problems = [r for r in results if r.status != "PASSED"]
    if round_ <= 1 and problems:
        return RoundDecision.NEED_BATCH_REVISION
    if results and len(problems) == len(results):
        return RoundDecision.ALL_REJECTED
    if problems:
        return RoundDecision.PARTIAL_APPROVED
    return RoundDecision.ALL_PASSED


def plan_node_started(state: JobState, node_instance_id: str) -> Plan:
    node = state.current_node
    assert node is not None and node.node_instance_id == node_instance_id
    plan = Plan(expect_version=state.version, status=state.status)
    started = node.model_copy(update={"status": "RUNNING", "attempt": node.attempt + 1})
    plan.meta["current_node"] = _dump(started)
    plan.events.append(("NODE_STARTED", {"node_instance_id": node.node_instance_id,
                                         "node_type": node.node_type, "attempt": started.attempt}))
    return plan


def plan_report(state: JobState, report: NodeReport, now: str, now_ms: int, deadline_ms: int,
                artifact_url: Callable[[str], str] = lambda n: f"/api/v1/artifacts/{n}") -> Plan:
    """Apply one node's result. The caller has checked the node is current."""
    node = state.current_node
    assert node is not None and node.node_instance_id == report.node_instance_id
    plan = Plan(expect_version=state.version, status=state.status)
    done_status = {"SUCCEEDED": "COMPLETED", "FAILED": "FAILED", "TIMED_OUT": "TIMED_OUT"}[report.outcome]
    plan.meta["current_node"] = _dump(node.model_copy(update={"status": done_status}))
    ev = {"node_instance_id": node.node_instance_id, "node_type": node.node_type, "outcome": report.outcome}
    if report.outcome != "SUCCEEDED":
        ev.update(error_code=report.error_code, error_message=report.error_message)
        plan.events.append(("NODE_COMPLETED", ev))
        _move(plan, state, S.TIMED_OUT if report.outcome == "TIMED_OUT" else S.FAILED)
        _finish(plan, report.error_code)
        return plan
    plan.events.append(("NODE_COMPLETED", ev))
    handler = _REPORT_HANDLERS[node.node_type]
    handler(plan, state, report, now, now_ms, deadline_ms, artifact_url)
    return plan


def _on_detect(plan: Plan, state: JobState, report: NodeReport, now: str, now_ms: int, deadline_ms: int,
               artifact_url: Callable[[str], str]) -> None:
    boxes = []
    for d in report.output.get("boxes", []):
        bbox = _clip(d["bbox"], state.image.width, state.image.height)
        if bbox is None:
            continue
        boxes.append(Box(box_id=new_id("box"), bbox=bbox, label=d.get("label"), score=d.get("score"),
                         source="model", target_policy="SEGMENT", validation=None))
    plan.meta["box_list"] = _dump(boxes)
    plan.meta["detector"] = str(report.output.get("backend", ""))
    _move(plan, state, S.WAITING_USER_SELECTION)
    # Always a pause, even with zero boxes: the reviewer may draw what the model missed.
    _open_pause(plan, state, "WAITING_USER_SELECTION", 1, boxes, [], now, now_ms)


def _clip(bbox: list[float], width: int, height: int) -> tuple[float, float, float, float] | None:
    x1, y1, x2, y2 = (float(v) for v in bbox)
    x1, x2 = max(0.0, min(x1, width)), max(0.0, min(x2, width))
    y1, y2 = max(0.0, min(y1, height)), max(0.0, min(y2, height))
    if x2 - x1 < 1 or y2 - y1 < 1:
        return None
    return (round(x1, 2), round(y1, 2), round(x2, 2), round(y2, 2))


def _on_validate(plan: Plan, state: JobState, report: NodeReport, now: str, now_ms: int, deadline_ms: int,
                 artifact_url: Callable[[str], str]) -> None:
    verdicts: dict[str, Validation] = {}
    for r in report.output.get("results", []):
        verdicts[r["box_id"]] = Validation(status="PASSED" if r.get("passed") else "NEEDS_REVISION",
                                           score=r.get("score"), reason=r.get("reason"))
    round_ = state.round
    decision = decide_round(round_, list(verdicts.values()))
    if round_ >= 2:
        # The second round decides: problem boxes are rejected with their reason.
        verdicts = {k: (v if v.status == "PASSED" else v.model_copy(update={"status": "REJECTED"}))
                    for k, v in verdicts.items()}
    box_list = [b.model_copy(update={"validation": verdicts[b.box_id]}) if b.box_id in verdicts else b
                for b in state.box_list]
    plan.meta["box_list"] = _dump(box_list)
    approved = approved_of(box_list)
    plan.meta["approved_box_list"] = _dump(approved)
    plan.meta["round_decision"] = decision.value
    if decision == RoundDecision.NEED_BATCH_REVISION:
        to_revise = [k for k, v in verdicts.items() if v.status != "PASSED"]
        _move(plan, state, S.WAITING_BOX_BATCH_REVISION)
        _open_pause(plan, state, "WAITING_BOX_BATCH_REVISION", 2, box_list, to_revise, now, now_ms)
        return
    rejected = [b for b in box_list if b.validation and b.validation.status == "REJECTED"]
    if not approved:
        # ALL_REJECTED with no model box left approved: the job ends FAILED.
        plan.meta["results"] = _dump([_rejected_result(b) for b in rejected])
        _move(plan, state, S.FAILED)
        _finish(plan, "ALL_REJECTED")
        return
    _move(plan, state, S.PROCESSING_APPROVED_SUBJECTS)
    cmd = _command(state.job_id, "PROCESS_APPROVED_BOX_LIST", now, {
        "image": state.image.model_dump(mode="json"),
        "approved_box_list": [b.model_dump(mode="json") for b in approved],
    })
    _enqueue(plan, cmd, deadline_ms)


def _rejected_result(b: Box) -> SubjectResult:
    reason = b.validation.reason if b.validation else None
    return SubjectResult(box_id=b.box_id, bbox=b.bbox, label=b.label, status="REJECTED",
                         reason=reason or "did not pass naming in the revision round")


def _on_process(plan: Plan, state: JobState, report: NodeReport, now: str, now_ms: int, deadline_ms: int,
                artifact_url: Callable[[str], str]) -> None:
    by_id = {b.box_id: b for b in state.approved_box_list}
    results: list[SubjectResult] = []
    for s in report.output.get("subjects", []):
        box = by_id.get(s["box_id"])
        if box is None:
            continue
        ok = s.get("status") == "SUCCEEDED"
        r = SubjectResult(box_id=box.box_id, bbox=box.bbox, label=box.label,
                          status="SUCCEEDED" if ok else "FAILED", reason=s.get("reason"),
                          mask_url=artifact_url(s["mask"]) if ok and s.get("mask") else None,
                          cutout_url=artifact_url(s["cutout"]) if ok and s.get("cutout") else None)
        results.append(r)
        plan.events.append(("SUBJECT_SEGMENTED", r.model_dump(mode="json")))
    for b in state.approved_box_list:
        if b.box_id not in {r.box_id for r in results}:
            results.append(SubjectResult(box_id=b.box_id, bbox=b.bbox, label=b.label, status="FAILED",
                                         reason="segmenter returned no result for this box"))
    results += [_rejected_result(b) for b in state.box_list if b.validation and b.validation.status == "REJECTED"]
    plan.meta["results"] = _dump(results)
    _move(plan, state, S.FINALIZING_RESULTS)
    cmd = _command(state.job_id, "FINALIZE_RESULTS", now, {})
    _enqueue(plan, cmd, deadline_ms)


def _on_finalize(plan: Plan, state: JobState, report: NodeReport, now: str, now_ms: int, deadline_ms: int,
                 artifact_url: Callable[[str], str]) -> None:
    segmented = [r for r in state.results if r.status != "REJECTED"]
    ok = [r for r in segmented if r.status == "SUCCEEDED"]
    if ok and len(ok) == len(state.results):
        target, reason = S.SUCCEEDED, None
    elif ok:
        target, reason = S.PARTIAL_SUCCEEDED, "SOME_SUBJECTS_FAILED"
    elif not state.results:
        target, reason = S.SUCCEEDED, "NOTHING_TO_SEGMENT"
    else:
        target, reason = S.FAILED, "ALL_SUBJECTS_FAILED"
    _move(plan, state, target)
    _finish(plan, reason)


_REPORT_HANDLERS = {
    "DETECT_SUBJECTS": _on_detect,
    "VALIDATE_MANUAL_BOX_LIST": _on_validate,
    "PROCESS_APPROVED_BOX_LIST": _on_process,
    "FINALIZE_RESULTS": _on_finalize,
}
CONTROL_PLANE_NODES = frozenset({"FINALIZE_RESULTS"})


def require(meta: dict[str, str], job_id: str) -> JobState:
    if not meta:
        raise JobNotFound(f"job {job_id} not found", job_id=job_id)
    return JobState.from_meta(meta)
