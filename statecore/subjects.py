"""One ``SEGMENT_SUBJECT`` node per approved subject, side by side (SPEC §13, docs/protocol.md § Cut-out
quality). Pure, like ``statecore.decide``: each function adds to the ``Plan`` the store commits.

When a box list is approved (``start``), the job's ``results`` list every approved subject ``QUEUED``
(and the boxes the revision round rejected, ``REJECTED``) in the same atomic write that queues one
node per subject (``fan_out``): they run in parallel over the Segmenter replicas, which batch their
encoder passes. Each node segments, gates and refines one subject, with its own node instance,
attempts, deadline and heartbeat (``statecore.subject_nodes``): a lost or failed attempt retries that
subject alone, and a subject whose attempts run out, or that its model fails for good, is ``FAILED``
with its reason while the others go on (``subject_failed``). When no subject is left (``go_on``) the
job continues: a mask review for what the gate still fails, else ``FINALIZING_RESULTS``
(``PARTIAL_SUCCEEDED`` when some subject is cut and another is not).

A reviewer's REFINE (``statecore.mask_review``) queues its subjects the same way: status
``REFINING``, their points in the job's ``refine_prompts``; those masks are final, not gated again.

A job whose current node is a ``SEGMENT_SUBJECT`` queued by an earlier build (which cut subjects one
after another) finishes that node through ``on_subject``; ``go_on`` then fans out the subjects still
to cut. One whose node is the older ``PROCESS_APPROVED_BOX_LIST`` finishes through
``reports._on_process`` as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from . import mask_review, subject_nodes
from .jobstate import JobState
from .models import Box, CurrentNode, SubjectResult
from .nodes import FinalizeInput, ProcessOutput, SubjectOutcome
from .plan import CUTTING, Plan, command, dump, enqueue, move, process_input_json
from .states import JobStatus, NodeType

S = JobStatus
PENDING = CUTTING  # a subject whose node is still to run (or running)
LIVE = PENDING | {"WAITING_REVIEW"}  # not finished: a finished job has none (SPEC §13)
NO_RESULT = "segmenter returned no result for this box"
CANCELLED_REASON = "the job was cancelled before this subject was decided"


def queued(box: Box) -> SubjectResult:
    return SubjectResult(box_id=box.box_id, bbox=box.bbox, label=box.label, status="QUEUED")


def rejected_result(b: Box) -> SubjectResult:
    reason = b.validation.reason if b.validation else None
    return SubjectResult(
        box_id=b.box_id,
        bbox=b.bbox,
        label=b.label,
        status="REJECTED",
        reason=reason or "did not pass naming in the revision round",
    )


def start(plan: Plan, state: JobState, approved: list[Box], box_list: list[Box], now: str, now_ms: int) -> None:
    """The approved subjects ``QUEUED`` (the rejected boxes of ``box_list`` with them) and one node per
    subject, in this one write. Nothing approved (every box kept was marked ``SKIP``): one
    ``PROCESS_APPROVED_BOX_LIST`` of no box, which answers nothing and lets the job finish as
    ``SUCCEEDED`` (``NOTHING_TO_SEGMENT``): the state table has no edge past the segmenting stage."""
    results = [queued(b) for b in approved]
    results += [rejected_result(b) for b in box_list if b.validation and b.validation.status == "REJECTED"]
    plan.meta["results"] = dump(results)
    if not approved:
        empty = process_input_json(state.image, [])
        enqueue(plan, command(state.job_id, NodeType.PROCESS_APPROVED_BOX_LIST, now, empty), now_ms)
        return
    fan_out(plan, state, [(b, None) for b in approved], now, now_ms)


def fan_out(
    plan: Plan, state: JobState, subjects: list[tuple[Box, list[dict[str, Any]] | None]], now: str, now_ms: int
) -> None:
    """One ``SEGMENT_SUBJECT`` node per subject (with a reviewer's points, for a REFINE), all in this write."""
    for box, points in subjects:
        subject_nodes.queue(plan, state, box, points, now, now_ms)


def node_box_id(state: JobState) -> str | None:
    """The subject the job's live ``SEGMENT_SUBJECT`` node segments (its input's one box)."""
    boxes = (state.node_input or {}).get("approved_box_list") or []
    return str(boxes[0].get("box_id")) if boxes and isinstance(boxes[0], Mapping) else None


def result_of(box: Box | SubjectResult, s: SubjectOutcome, artifact_url: Callable[[str], str]) -> SubjectResult:
    """A segmenter's answer for ``box`` (or the subject's entry, which names its box) as the job records it."""
    ok = s.status == "SUCCEEDED"
    return SubjectResult(
        box_id=box.box_id,
        bbox=box.bbox,
        label=box.label,
        status=s.status,
        reason=s.reason,
        mask_url=artifact_url(s.mask) if ok and s.mask else None,
        cutout_url=artifact_url(s.cutout) if ok and s.cutout else None,
        quality=s.quality if ok else None,
        refinements=s.refinements,
        decided_by="gate" if ok and s.quality is not None and s.quality.verdict == "PASS" else None,
    )


def announce(plan: Plan, r: SubjectResult, s: SubjectOutcome | None) -> None:
    """SUBJECT_SEGMENTED, then one SUBJECT_REFINED per refinement and SUBJECT_GATED (a mask made)."""
    plan.events.append(("SUBJECT_SEGMENTED", r.model_dump(mode="json")))
    if s is None:
        return
    for i, ref in enumerate(s.refinements, start=1):
        plan.events.append(("SUBJECT_REFINED", {"box_id": r.box_id, "refinement": i, **ref.model_dump(mode="json")}))
    if s.status == "SUCCEEDED" and s.quality is not None:
        plan.events.append(("SUBJECT_GATED", {"box_id": r.box_id, **s.quality.model_dump(mode="json")}))


def on_subject(
    plan: Plan,
    state: JobState,
    node: CurrentNode,
    output: ProcessOutput,
    now: str,
    now_ms: int,
    artifact_url: Callable[[str], str],
    workflow: str,
) -> None:
    """A ``SEGMENT_SUBJECT`` node answered: its subject's result in place of its pending entry, then
    what follows when no subject is left."""
    box_id = node.box_id or node_box_id(state)
    box = next((b for b in state.approved_box_list if b.box_id == box_id), None)
    s = next((x for x in output.subjects if x.box_id == box_id), None)
    if box is None:  # a job changed under its node (cannot happen through the store): nothing to record
        go_on(plan, state, state.results, now, now_ms, workflow)
        return
    fresh = (
        result_of(box, s, artifact_url)
        if s is not None
        else SubjectResult(box_id=box.box_id, bbox=box.bbox, label=box.label, status="FAILED", reason=NO_RESULT)
    )
    announce(plan, fresh, s)
    go_on(plan, state, _replaced(state.results, fresh), now, now_ms, workflow)


def subject_failed(
    plan: Plan, state: JobState, node: CurrentNode, reason: str, now: str, now_ms: int, workflow: str
) -> None:
    """A ``SEGMENT_SUBJECT`` node failed for good (its attempts ran out, a non-retryable error, its
    deadline, a dead letter): that subject ``FAILED`` with ``reason``, the others go on."""
    box_id = node.box_id or node_box_id(state)
    old = next((r for r in state.results if r.box_id == box_id), None)
    if old is None:
        go_on(plan, state, state.results, now, now_ms, workflow)
        return
    failed = old.model_copy(update={"status": "FAILED", "reason": reason, "mask_url": None, "cutout_url": None})
    announce(plan, failed, None)
    go_on(plan, state, _replaced(state.results, failed), now, now_ms, workflow)


def _replaced(results: list[SubjectResult], fresh: SubjectResult) -> list[SubjectResult]:
    """``fresh`` in place of its subject's entry; a reviewer's REFINE keeps its ``decided_by`` (final)."""
    out = []
    for r in results:
        if r.box_id != fresh.box_id:
            out.append(r)
        elif r.status == "REFINING":
            out.append(fresh.model_copy(update={"decided_by": r.decided_by, "attempts": r.attempts}))
        else:
            out.append(fresh.model_copy(update={"attempts": r.attempts}))
    return out


def go_on(plan: Plan, state: JobState, results: list[SubjectResult], now: str, now_ms: int, workflow: str) -> None:
    """While subject nodes still run, the results so far; a pending subject without a node (left by a
    build that cut them one after another) gets one; with none left, the mask review (unless this
    was a reviewer's REFINE round: final) or ``FINALIZING_RESULTS``."""
    boxes = {b.box_id: b for b in state.approved_box_list}
    cutting = set(subject_nodes.live_after(plan, state).values())
    orphans = [r for r in results if r.status in PENDING and r.box_id in boxes and r.box_id not in cutting]
    if orphans or cutting:
        plan.meta["results"] = dump(results)
        fan_out(
            plan, state, [(boxes[r.box_id], subject_nodes.points_of(state, r.box_id)) for r in orphans], now, now_ms
        )
        return
    # A pending subject without its box cannot be cut: it fails rather than wait for ever.
    results = [
        r.model_copy(update={"status": "FAILED", "reason": NO_RESULT}) if r.status in PENDING else r for r in results
    ]
    if state.refine_prompts:
        plan.meta["refine_prompts"] = None
    if not mask_review.is_refine_round(state) and mask_review.open_if_needed(
        plan, state, results, now, now_ms, workflow
    ):
        plan.meta["node_input"] = None
        return
    plan.meta["results"] = dump(results)
    move(plan, state, S.FINALIZING_RESULTS)
    enqueue(plan, command(state.job_id, NodeType.FINALIZE_RESULTS, now, FinalizeInput()), now_ms)


def cancel(plan: Plan, state: JobState) -> None:
    """A cancel's part: every subject still live (to cut, being cut or retried, refined, in a mask
    review) is ``CANCELLED`` in the cancel's own write, so a finished job's subjects are all
    finished. Its mask, if any, ships no more (nobody vouched for it); a decided subject keeps its
    result."""
    if not any(r.status in LIVE for r in state.results):
        return
    gone = {"status": "CANCELLED", "reason": CANCELLED_REASON, "mask_url": None, "cutout_url": None}
    results = [r.model_copy(update={**gone, "decided_by": None}) if r.status in LIVE else r for r in state.results]
    plan.meta["results"] = dump(results)
