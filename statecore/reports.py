"""The decider's half for executor reports: a node started, a node answered.

Pure, like ``statecore.decide``: each function returns the ``Plan`` the store commits. A
report is applied only to the job's current node (docs/protocol.md § Executors and the outbox);
the rounds of naming manual boxes follow docs/protocol.md § Second round.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

from . import auto_plan, autoapprove, mask_review, subject_nodes, subjects
from .errors import NodeExecutionError
from .ids import new_id
from .jobstate import JobState
from .models import Box, CurrentNode, NodeReport, SubjectResult, Validation
from .nodes import (
    NAME_THIS_BOX,
    DetectOutput,
    FinalizeInput,
    FinalizeOutput,
    NodeOutput,
    ProcessOutput,
    ValidateOutput,
    Verdict,
    check_answers,
    parse_output,
)
from .plan import (
    WORKFLOW_VERSION,
    Plan,
    approved_of,
    command,
    dump,
    dump_node,
    enqueue,
    finish,
    move,
    ms_to_iso,
    open_pause,
    requeue,
)
from .states import JobStatus, NodeType

S = JobStatus


class RoundDecision(StrEnum):
    NEED_BATCH_REVISION = "NEED_BATCH_REVISION"
    ALL_REJECTED = "ALL_REJECTED"
    PARTIAL_APPROVED = "PARTIAL_APPROVED"
    ALL_PASSED = "ALL_PASSED"


def decide_round(round_: int, results: list[Validation]) -> RoundDecision:
    """docs/protocol.md § Second round: round 1 with any problem box goes back to the reviewer once;
    round 2 decides per box and never waits again."""
    problems = [r for r in results if r.status != "PASSED"]
    if round_ <= 1 and problems:
        return RoundDecision.NEED_BATCH_REVISION
    if results and len(problems) == len(results):
        return RoundDecision.ALL_REJECTED
    if problems:
        return RoundDecision.PARTIAL_APPROVED
    return RoundDecision.ALL_PASSED


def plan_node_started(state: JobState, node_instance_id: str, now: str, now_ms: int, max_execution_s: float) -> Plan:
    """The executor (the process doing the work) starts the node: RUNNING, one more attempt, and
    only now a deadline (start + the node type's maximum execution time) and a first heartbeat,
    both on Redis's clock (``now_ms``)."""
    node = state.live_node(node_instance_id)
    assert node is not None
    plan = Plan(expect_version=state.version, status=state.status)
    deadline_ms = now_ms + int(max_execution_s * 1000)
    started = node.model_copy(
        update={
            "status": "RUNNING",
            "attempt": node.attempt + 1,
            "started_at": now,
            "deadline_at": ms_to_iso(deadline_ms),
        }
    )
    if node_instance_id in state.subject_nodes:
        subject_nodes.started(plan, state, started, deadline_ms, now_ms)
    else:
        plan.meta["current_node"] = dump_node(started)
        plan.queued = ("del", 0)
        plan.running = ("add", deadline_ms)
        plan.heartbeats = ("add", now_ms)
    data: dict[str, Any] = {
        "node_instance_id": node.node_instance_id,
        "node_type": node.node_type,
        "attempt": started.attempt,
    }
    if node.box_id is not None:
        data["box_id"] = node.box_id
    plan.events.append(("NODE_STARTED", data))
    return plan


def node_failed_event(node: CurrentNode, reason: str, retryable: bool) -> tuple[str, dict[str, Any]]:
    """NODE_FAILED: one attempt of the node failed (lost, crashed, given up on)."""
    data: dict[str, Any] = {
        "node_instance_id": node.node_instance_id,
        "node_type": node.node_type.value,
        "attempt": node.attempt,
        "reason": reason,
        "retryable": retryable,
    }
    if node.box_id is not None:
        data["box_id"] = node.box_id
    return ("NODE_FAILED", data)


def plan_node_lost(
    state: JobState, nid: str, now: str, now_ms: int, *, reason: str, max_attempts: int, backoff_s: float
) -> Plan:
    """The running node ``nid``'s heartbeat lapsed and nobody confirmed it is alive: the attempt failed.

    Another attempt gets a new node instance (the old one's late report is then ignored) after a
    backoff that doubles per attempt; after ``max_attempts`` starts the job ends FAILED with
    ``EXECUTOR_LOST`` (a subject's node: that subject fails, the others go on). Every step is an
    event: NODE_FAILED, then NODE_RETRY_SCHEDULED."""
    node = state.live_node(nid)
    assert node is not None and node.status == "RUNNING"
    subject = nid in state.subject_nodes
    plan = Plan(expect_version=state.version, status=state.status)
    retry = node.attempt < max_attempts and (subject or state.node_input is not None)
    plan.events.append(node_failed_event(node, reason, retry))
    if not retry:
        lost = reason == "EXECUTOR_LOST"  # else the attempt failed with an error of its own
        _node_ended(plan, state, node.model_copy(update={"status": "LOST" if lost else "FAILED"}))
        if node.node_type == NodeType.SEGMENT_SUBJECT:  # that subject fails, the others go on
            subjects.subject_failed(plan, state, node, reason, now, now_ms, WORKFLOW_VERSION)
            return plan
        move(plan, state, S.FAILED)
        finish(plan, reason)
        return plan
    not_before_ms = now_ms + int(backoff_s * 2 ** (node.attempt - 1) * 1000)
    if subject:
        if subject_nodes.retry(plan, state, node, reason=reason, now=now, now_ms=now_ms, not_before_ms=not_before_ms):
            return plan
        subject_nodes.ended(plan, node)  # its box is gone: nothing to run again
        subjects.subject_failed(plan, state, node, reason, now, now_ms, WORKFLOW_VERSION)
        return plan
    requeue(plan, state, node, reason=reason, now=now, now_ms=now_ms, not_before_ms=not_before_ms)
    return plan


def _node_ended(plan: Plan, state: JobState, node: CurrentNode) -> None:
    """``node`` ended without an answer: a subject's node leaves the job (its field and members); the
    job's own node stays current, marked, and leaves the indices (a SEGMENT_SUBJECT of an earlier
    build before the next subject's node, or the next stage)."""
    if node.node_instance_id in state.subject_nodes:
        subject_nodes.ended(plan, node)
        return
    plan.meta["current_node"] = dump_node(node)
    if node.node_type == NodeType.SEGMENT_SUBJECT:
        plan.meta["node_input"] = None
        plan.running = ("del", 0)
        plan.heartbeats = ("del", 0)
        plan.queued = ("del", 0)


def plan_node_dead(state: JobState, nid: str, *, reason: str, now: str, now_ms: int) -> Plan:
    """The node's command was given up on (a dead letter): the job ends FAILED with ``reason``,
    announced by NODE_FAILED, whatever state the node was in (queued or running); a
    ``SEGMENT_SUBJECT`` fails its subject only, and the others go on."""
    node = state.live_node(nid)
    assert node is not None
    plan = Plan(expect_version=state.version, status=state.status)
    plan.events.append(node_failed_event(node, reason, False))
    _node_ended(plan, state, node.model_copy(update={"status": "FAILED"}))
    if node.node_type == NodeType.SEGMENT_SUBJECT:
        subjects.subject_failed(plan, state, node, reason, now, now_ms, WORKFLOW_VERSION)
        return plan
    move(plan, state, S.FAILED)
    finish(plan, reason)
    return plan


def plan_report(
    state: JobState,
    report: NodeReport,
    now: str,
    now_ms: int,
    artifact_url: Callable[[str], str] = lambda n: f"/api/v1/artifacts/{n}",
    workflow: str = WORKFLOW_VERSION,
    auto: autoapprove.Ask | None = None,
) -> Plan:
    """Apply one node's result. The caller has checked the node is live. ``auto``: the box policy
    that has a say on a detection (statecore.auto_plan), with the store's draw for its spot check.

    A SUCCEEDED report whose output does not parse, or does not answer what the node was asked
    (``nodes.check_answers``), fails the node at once with ``INVALID_NODE_OUTPUT``: the same output
    would never parse on a retry."""
    node = state.live_node(report.node_instance_id)
    assert node is not None
    subject = node.node_instance_id in state.subject_nodes
    output: NodeOutput | None = None
    if report.outcome == "SUCCEEDED":
        try:
            parsed = parse_output(node.node_type, report.output)
            # e.g. one verdict per box the validator was asked about
            check_answers(parsed, subject_nodes.input_of(state, node) if subject else state.node_input)
            output = parsed
        except NodeExecutionError as e:
            report = report.model_copy(update={"outcome": "FAILED", "error_code": e.code, "error_message": e.message})
    plan = Plan(expect_version=state.version, status=state.status)
    done_status = {"SUCCEEDED": "COMPLETED", "FAILED": "FAILED", "TIMED_OUT": "TIMED_OUT"}[report.outcome]
    if subject:
        subject_nodes.ended(plan, node)
    else:
        # A finished node keeps what identifies it; its times are in its events (a waiting job's bytes count).
        done = {"status": done_status, "queued_at": None, "started_at": None, "deadline_at": None}
        plan.meta["current_node"] = dump_node(node.model_copy(update=done))
        plan.meta["node_input"] = None
        plan.running = ("del", 0)
        plan.heartbeats = ("del", 0)
        plan.queued = ("del", 0)
    ev: dict[str, Any] = {
        "node_instance_id": node.node_instance_id,
        "node_type": node.node_type.value,
        "outcome": report.outcome,
    }
    if node.box_id is not None:
        ev["box_id"] = node.box_id
    if output is None:
        ev.update(error_code=report.error_code, error_message=report.error_message)
        plan.events.append(("NODE_COMPLETED", ev))
        if report.outcome == "TIMED_OUT":
            plan.events.append(("NODE_TIMED_OUT", {**ev, "attempt": node.attempt, "deadline_at": node.deadline_at}))
        if node.node_type == NodeType.SEGMENT_SUBJECT:  # that subject fails, the others go on
            why = report.error_code or ("NODE_TIMED_OUT" if report.outcome == "TIMED_OUT" else "NODE_FAILED")
            subjects.subject_failed(plan, state, node, why, now, now_ms, workflow)
            return plan
        move(plan, state, S.TIMED_OUT if report.outcome == "TIMED_OUT" else S.FAILED)
        finish(plan, report.error_code)
        return plan
    plan.events.append(("NODE_COMPLETED", ev))
    if isinstance(output, DetectOutput):
        _on_detect(plan, state, output, now, now_ms, workflow, auto)
    elif isinstance(output, ValidateOutput):
        _on_validate(plan, state, output, now, now_ms, workflow)
    elif isinstance(output, ProcessOutput) and node.node_type == NodeType.SEGMENT_SUBJECT:
        subjects.on_subject(plan, state, node, output, now, now_ms, artifact_url, workflow)
    elif isinstance(output, ProcessOutput):  # a job queued by an earlier build: every subject at once
        _on_process(plan, state, output, now, now_ms, artifact_url, workflow)
    else:
        _on_finalize(plan, state, output)
    return plan


def on_prelabelled(plan: Plan, state: JobState, output: DetectOutput, now: str, now_ms: int, workflow: str) -> None:
    """A pre-labelled creation's boxes, taken as the detector's answer (statecore.prelabelled): the
    same pause a detection opens, no box policy asked (a person reviews what another system drew)."""
    _on_detect(plan, state, output, now, now_ms, workflow)


def _on_detect(
    plan: Plan,
    state: JobState,
    output: DetectOutput,
    now: str,
    now_ms: int,
    workflow: str,
    auto: autoapprove.Ask | None = None,
) -> None:
    boxes = []
    for d in output.boxes:
        bbox = _clip(d.bbox, state.image.width, state.image.height)
        if bbox is None:
            continue
        boxes.append(
            Box(
                box_id=new_id("box"),
                bbox=bbox,
                label=d.label,
                score=d.score,
                source="model",
                target_policy="SEGMENT",
                validation=None,
                evidence=d.evidence,
            )
        )
    plan.meta["box_list"] = dump(boxes)
    plan.meta["detector"] = output.backend
    if auto is not None:  # the box policy's say: its edge, or what it thought kept for the comparison
        w, h = state.image.width, state.image.height
        decision = autoapprove.decide(auto, [b.model_dump(mode="json") for b in boxes], w, h)
        if auto_plan.on_detection(plan, state, boxes, decision, now, now_ms):
            return
    move(plan, state, S.WAITING_USER_SELECTION)
    # Always a pause, even with zero boxes: the reviewer may draw what the model missed.
    open_pause(plan, state, "WAITING_USER_SELECTION", 1, boxes, [], now, now_ms, workflow)


def _clip(bbox: tuple[float, ...], width: int, height: int) -> tuple[float, float, float, float] | None:
    x1, y1, x2, y2 = (float(v) for v in bbox)
    x1, x2 = max(0.0, min(x1, width)), max(0.0, min(x2, width))
    y1, y2 = max(0.0, min(y1, height)), max(0.0, min(y2, height))
    if x2 - x1 < 1 or y2 - y1 < 1:
        return None
    return (round(x1, 2), round(y1, 2), round(x2, 2), round(y2, 2))


def _verdict_of(r: Verdict, box: Box | None, backend: str) -> tuple[Validation, str | None]:
    """A verdict as the box keeps it, and the label the validator gave a manual box sent without one.
    Such a box it did not name is never PASSED, whatever it said of the geometry (an executor of an
    earlier build, a backend that cannot name): it goes back to the reviewer with ``NAME_THIS_BOX``."""
    v = Validation(status="PASSED" if r.passed else "NEEDS_REVISION", score=r.score, reason=r.reason)
    if box is None or box.source != "manual" or (box.label or "").strip():
        return v, None
    label = (r.label or "").strip()
    if label:
        return v.model_copy(update={"label_source": r.label_source or backend, "label_score": r.label_score}), label
    if not (v.reason or "").startswith(NAME_THIS_BOX):
        why = f"{NAME_THIS_BOX}: the validator gave it no label" + (f"; {v.reason}" if v.reason else "")
        v = v.model_copy(update={"status": "NEEDS_REVISION", "reason": why})
    return v, None


def _on_validate(plan: Plan, state: JobState, output: ValidateOutput, now: str, now_ms: int, workflow: str) -> None:
    boxes = {b.box_id: b for b in state.box_list}
    verdicts: dict[str, Validation] = {}
    names: dict[str, dict[str, str]] = {}  # box_id -> {"label": the validator's name} (unlabelled boxes)
    for r in output.results:
        verdicts[r.box_id], label = _verdict_of(r, boxes.get(r.box_id), output.backend)
        if label:
            names[r.box_id] = {"label": label}
    round_ = state.round
    decision = decide_round(round_, list(verdicts.values()))
    if round_ >= 2:
        # The second round decides: problem boxes are rejected with their reason.
        verdicts = {
            k: (v if v.status == "PASSED" else v.model_copy(update={"status": "REJECTED"})) for k, v in verdicts.items()
        }
    box_list = [
        b.model_copy(update={"validation": verdicts[b.box_id], **names.get(b.box_id, {})})
        if b.box_id in verdicts
        else b
        for b in state.box_list
    ]
    plan.meta["box_list"] = dump(box_list)
    approved = approved_of(box_list)
    plan.meta["approved_box_list"] = dump(approved)
    plan.meta["round_decision"] = decision.value
    if decision == RoundDecision.NEED_BATCH_REVISION:
        to_revise = [k for k, v in verdicts.items() if v.status != "PASSED"]
        move(plan, state, S.WAITING_BOX_BATCH_REVISION)
        open_pause(plan, state, "WAITING_BOX_BATCH_REVISION", 2, box_list, to_revise, now, now_ms, workflow)
        return
    rejected = [b for b in box_list if b.validation and b.validation.status == "REJECTED"]
    if not approved:
        # ALL_REJECTED with no model box left approved: the job ends FAILED.
        plan.meta["results"] = dump([subjects.rejected_result(b) for b in rejected])
        move(plan, state, S.FAILED)
        finish(plan, "ALL_REJECTED")
        return
    move(plan, state, S.PROCESSING_APPROVED_SUBJECTS)
    subjects.start(plan, state, approved, box_list, now, now_ms)  # one SEGMENT_SUBJECT node per subject


def _on_process(
    plan: Plan,
    state: JobState,
    output: ProcessOutput,
    now: str,
    now_ms: int,
    artifact_url: Callable[[str], str],
    workflow: str,
) -> None:
    by_id = {b.box_id: b for b in state.approved_box_list}
    results: list[SubjectResult] = []
    for s in output.subjects:
        box = by_id.get(s.box_id)
        if box is None:
            continue
        r = subjects.result_of(box, s, artifact_url)
        results.append(r)
        subjects.announce(plan, r, s)
    refine_round = mask_review.is_refine_round(state)  # refined_results answers the missing ones
    for b in state.approved_box_list:
        if not refine_round and b.box_id not in {r.box_id for r in results}:
            results.append(
                SubjectResult(
                    box_id=b.box_id,
                    bbox=b.bbox,
                    label=b.label,
                    status="FAILED",
                    reason="segmenter returned no result for this box",
                )
            )
    if refine_round:  # a reviewer's REFINE: final masks, no second review
        results = mask_review.refined_results(state, results)
    else:
        results += [
            subjects.rejected_result(b) for b in state.box_list if b.validation and b.validation.status == "REJECTED"
        ]
        if mask_review.open_if_needed(plan, state, results, now, now_ms, workflow):
            return
    plan.meta["results"] = dump(results)
    move(plan, state, S.FINALIZING_RESULTS)
    cmd = command(state.job_id, NodeType.FINALIZE_RESULTS, now, FinalizeInput())
    enqueue(plan, cmd, now_ms)


def _on_finalize(plan: Plan, state: JobState, output: FinalizeOutput) -> None:
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
    move(plan, state, target)
    finish(plan, reason)
