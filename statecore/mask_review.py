"""The mask review (docs/protocol.md § Cut-out quality, SPEC §13): a person's decision on the masks
the quality gate still fails after their refinements. Pure, like ``statecore.decide``.

When the segmenting node reports, ``open_if_needed`` decides under the job's quality-gate mode
(recorded in its policy at creation, so a restart with another ``--quality-gate`` does not change
a job in flight) whether some subjects wait for a person: they are marked ``WAITING_REVIEW`` and a
pause of stage ``WAITING_MASK_REVIEW`` lists them (``subjects_to_review``). The others keep their
results. The reviewer's submission (``plan_decisions``) consumes that pause through the same Lua
script, gates, claims and quorum as a box stage's: ``ACCEPT`` keeps the mask (``decided_by`` the
reviewer), ``REJECT`` drops the subject with the reviewer's reason, ``REFINE`` segments the subject
again from the reviewer's points and its box (one ``SEGMENT_SUBJECT`` node per subject to refine,
``statecore.subjects``; its masks are final, not gated again). Then ``FINALIZING_RESULTS``.
"""

from __future__ import annotations

from typing import Final, Literal

from . import gate_spot, subject_nodes
from .errors import InvalidRequest
from .ids import canonical_json
from .jobstate import JobState
from .models import Box, Diff, InterventionRequest, MaskDecision, SubjectResult, SubjectToReview
from .nodes import FinalizeInput
from .plan import Plan, command, dump, enqueue, move, open_pause
from .states import JobStatus, NodeType

S = JobStatus
GateMode = Literal["review-failing", "review-all", "off"]
NextNode = Literal["PROCESS_APPROVED_BOX_LIST", "FINALIZE_RESULTS"]
GATE_MODES: tuple[GateMode, ...] = ("review-failing", "review-all", "off")
STAGE: Final = "WAITING_MASK_REVIEW"


def gate_mode(state: JobState) -> str:
    """The job's mode; a job created before the mask review existed records none: ``off``."""
    return str(state.policy.get("quality_gate") or "off")


NO_VERDICT = "the quality gate gave no verdict on this mask (it failed, timed out or did not run): a person decides"


def needs_review(mode: str, r: SubjectResult) -> bool:
    """Whether a segmented subject waits for a person under ``mode``. ``review-failing`` fails
    closed: a mask the gate did not pass, a ``FAIL`` or no verdict at all, is one nobody vouched for."""
    if r.status != "SUCCEEDED" or not r.mask_url:
        return False
    if mode == "review-all":
        return True
    return mode == "review-failing" and (r.quality is None or r.quality.verdict != "PASS")


def open_if_needed(
    plan: Plan, state: JobState, results: list[SubjectResult], now: str, now_ms: int, workflow: str
) -> bool:
    """Open the mask review when a subject of ``results`` needs a person (True), writing the results
    with those subjects ``WAITING_REVIEW``; False: nothing to review, ``results`` untouched."""
    mode = gate_mode(state)
    # A passed mask drawn for a spot check (statecore.gate_spot) is listed as a failed one is.
    listed = [r for r in results if needs_review(mode, r) or gate_spot.drawn(state, r)]
    if not listed:
        return False
    waiting = {r.box_id for r in listed}
    marked = [
        r.model_copy(update={"status": "WAITING_REVIEW", "decided_by": None}) if r.box_id in waiting else r
        for r in results
    ]
    plan.meta["results"] = dump(marked)
    move(plan, state, S.WAITING_MASK_REVIEW)
    blind = gate_spot.blind(state)  # no verdict shown: a spot check looks like a failure
    subjects = [
        SubjectToReview(
            box_id=r.box_id,
            label=r.label,
            bbox=r.bbox,
            mask_url=r.mask_url,
            cutout_url=r.cutout_url,
            quality=None if blind else r.quality,
            reason=gate_spot.BLIND if blind else NO_VERDICT if r.quality is None else None,
        )
        for r in listed
    ]
    open_pause(plan, state, STAGE, state.round, state.box_list, [], now, now_ms, workflow, subjects_to_review=subjects)
    return True


def check_decisions(state: JobState, req: InterventionRequest) -> list[MaskDecision]:
    """The decisions of a submission to the waiting mask review, or ``InvalidRequest`` (400): one
    per listed subject and no other, a reason for REJECT, points on the image for REFINE."""
    pause = state.active_pause
    assert pause is not None and pause.subjects_to_review is not None
    if req.decisions is None:
        raise InvalidRequest(
            "this pause is a mask review: send 'decisions' (one per subject in subjects_to_review), not 'subjects'",
            field="decisions",
        )
    listed = [s.box_id for s in pause.subjects_to_review]
    seen: set[str] = set()
    for i, d in enumerate(req.decisions):
        where = f"decisions[{i}]"
        if d.box_id not in listed:
            raise InvalidRequest(f"{where}.box_id {d.box_id!r} is not a subject of this mask review", field=where)
        if d.box_id in seen:
            raise InvalidRequest(f"{where} decides subject {d.box_id!r} a second time", field=where)
        seen.add(d.box_id)
        if d.decision == "REJECT" and not (d.reason or "").strip():
            raise InvalidRequest(f"{where}: a REJECT needs a reason", field=f"{where}.reason")
        if d.decision == "REFINE" and not d.points:
            raise InvalidRequest(f"{where}: a REFINE needs at least one point", field=f"{where}.points")
        for j, p in enumerate(d.points):
            if p.x >= state.image.width or p.y >= state.image.height:
                raise InvalidRequest(
                    f"{where}.points[{j}] ({p.x}, {p.y}) lies outside the "
                    f"{state.image.width}x{state.image.height} image",
                    field=f"{where}.points[{j}]",
                )
    missing = [b for b in listed if b not in seen]
    if missing:
        raise InvalidRequest(f"no decision for subject(s) {missing}: every listed subject needs one", field="decisions")
    return req.decisions


def apply_decisions(
    plan: Plan, state: JobState, decisions: list[MaskDecision], reviewer: str, now: str, now_ms: int
) -> tuple[Diff, NextNode]:
    """Write the decisions into the results and queue what follows; returns the diff the response
    reports (kept: accepted and refined, deleted: rejected) and the next node's type."""
    by_id = {d.box_id: d for d in decisions}
    results: list[SubjectResult] = []
    for r in state.results:
        d = by_id.get(r.box_id)
        if d is None:
            results.append(r)
        elif d.decision == "ACCEPT":
            results.append(r.model_copy(update={"status": "SUCCEEDED", "decided_by": reviewer}))
        elif d.decision == "REJECT":
            # A rejected mask is never shipped: its references go with it.
            rejected = {"status": "REJECTED", "reason": d.reason, "decided_by": reviewer}
            results.append(r.model_copy(update={**rejected, "mask_url": None, "cutout_url": None}))
        else:
            results.append(r.model_copy(update={"status": "REFINING", "decided_by": reviewer}))
        if d is not None:
            plan.events.append(
                (
                    "SUBJECT_DECIDED",
                    {
                        "box_id": r.box_id,
                        "decision": d.decision,
                        "decided_by": reviewer,
                        "reason": d.reason,
                        "points": len(d.points),
                    },
                )
            )
            spot = gate_spot.checked(state, r, d.decision)
            if spot is not None:  # the person's word on a mask the gate passed, against the gate
                plan.events.append((gate_spot.EVENT, spot))
    plan.meta["results"] = dump(results)
    refine = [d for d in decisions if d.decision == "REFINE"]
    boxes: dict[str, Box] = {b.box_id: b for b in state.approved_box_list}
    refine = [d for d in refine if d.box_id in boxes]  # check_decisions lists only the job's subjects
    if refine:
        # One SEGMENT_SUBJECT node per subject to refine, side by side (statecore.subjects): the points
        # are kept in the job for a retry.
        move(plan, state, S.PROCESSING_APPROVED_SUBJECTS)
        points = {d.box_id: [p.model_dump(mode="json") for p in d.points] for d in refine}
        plan.meta["refine_prompts"] = canonical_json(points)
        for d in refine:
            subject_nodes.queue(plan, state, boxes[d.box_id], points[d.box_id], now, now_ms)
        next_type: NextNode = "PROCESS_APPROVED_BOX_LIST"  # the stage's name in the answer (SPEC §4)
    else:
        move(plan, state, S.FINALIZING_RESULTS)
        enqueue(plan, command(state.job_id, NodeType.FINALIZE_RESULTS, now, FinalizeInput()), now_ms)
        next_type = "FINALIZE_RESULTS"
    kept = [d.box_id for d in decisions if d.decision != "REJECT"]
    deleted = [d.box_id for d in decisions if d.decision == "REJECT"]
    return Diff(kept=kept, added=[], deleted=deleted), next_type


def refined_results(state: JobState, fresh: list[SubjectResult]) -> list[SubjectResult]:
    """The job's results with each ``REFINING`` subject replaced by its new segmentation (final, the
    reviewer's decision: ``decided_by`` kept); a subject the segmenter did not answer FAILS."""
    by_id = {r.box_id: r for r in fresh}
    out: list[SubjectResult] = []
    for r in state.results:
        if r.status != "REFINING":
            out.append(r)
            continue
        new = by_id.get(r.box_id)
        if new is None:
            out.append(r.model_copy(update={"status": "FAILED", "reason": "segmenter returned no result for this box"}))
        else:
            out.append(new.model_copy(update={"decided_by": r.decided_by}))
    return out


def is_refine_round(state: JobState) -> bool:
    return any(r.status == "REFINING" for r in state.results)
