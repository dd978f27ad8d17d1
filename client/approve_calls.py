"""``HitlClient.approve``: answer the waiting pause by keeping what it shows, whatever its stage (a
script's or a test's reviewer, the quickstart's ``--approve``). A box stage keeps every box the
snapshot lists; a mask review (stage ``WAITING_MASK_REVIEW``, docs/protocol.md § Cut-out quality)
accepts every listed mask. Written once as a plan over ``ClientCore``; ``ApproveCalls`` runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hitl_review.statecore.models import JobSnapshot
from hitl_review.statecore.states import JobStatus

from .core import ClientCore
from .steps import Plan
from .wire import InterventionResult, subject_dict


class NothingToApprove(ValueError):
    """The snapshot has no waiting pause: nothing to answer."""


def keep_everything(snapshot: JobSnapshot) -> dict[str, list[dict[str, Any]]]:
    """The answer that keeps what the waiting pause shows: ``{"subjects": …}`` for a box stage,
    ``{"decisions": …}`` (ACCEPT each) for a mask review."""
    pause = snapshot.active_pause
    if pause is None:
        raise NothingToApprove(f"job {snapshot.job_id} has no waiting pause (status {snapshot.status})")
    if pause.stage == JobStatus.WAITING_MASK_REVIEW:
        return answer_keeping(pause.model_dump(mode="json"), [])
    return {"subjects": [subject_dict(b) for b in snapshot.box_list]}


def answer_keeping(pause: dict[str, Any], box_list: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``keep_everything`` on the wire's JSON (a snapshot's or a PAUSE_OPENED event's ``active_pause``
    and ``box_list``), for scripts that read raw responses: every box (``box_id``, ``bbox``) kept,
    or every listed mask accepted."""
    if pause.get("stage") == JobStatus.WAITING_MASK_REVIEW:
        return {"decisions": [{"box_id": s["box_id"], "decision": "ACCEPT"} for s in pause["subjects_to_review"] or ()]}
    return {"subjects": [{"box_id": b["box_id"], "bbox": b["bbox"], "label": b.get("label")} for b in box_list]}


def approve_plan(core: ClientCore, snapshot: JobSnapshot, intervention_id: str) -> Plan[InterventionResult]:
    answer = keep_everything(snapshot)
    pause = snapshot.active_pause
    assert pause is not None  # keep_everything refused a snapshot without one
    return (
        yield from core.answer_pause(
            snapshot.job_id, intervention_id, pause.pause_token, snapshot.version, pause.snapshot_id, **answer
        )
    )


class ApproveCalls:
    """A base of ``HitlClient``, which provides ``_core`` and ``_run``."""

    _core: ClientCore
    _run: Callable[[Plan[Any]], Any]

    def approve(self, snapshot: JobSnapshot, *, intervention_id: str) -> InterventionResult:
        """Answer ``snapshot``'s waiting pause keeping what it shows (every box; every mask accepted).
        Safe to retry with the same ``intervention_id``; 409s as for ``intervene`` (a pause answered
        meanwhile: ``PAUSE_NOT_ACTIVE``). ``NothingToApprove`` when the snapshot has no pause."""
        result: InterventionResult = self._run(approve_plan(self._core, snapshot, intervention_id))
        return result
