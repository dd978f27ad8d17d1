"""The gates a submission passes after the pause token, and the re-offer of a pause this build
cannot continue (docs/protocol.md § Snapshot echo and the fifth gate). Pure, like ``statecore.decide``:
the store hands the verdict and the re-offer's ``Plan`` to consume_pause.lua, which applies them only
while the job is still at the version they were computed from."""

from __future__ import annotations

from collections.abc import Collection

from .jobstate import JobState
from .models import InterventionRequest
from .plan import Plan, dump, open_pause

SNAPSHOT_MISMATCH = "SNAPSHOT_MISMATCH"
WORKFLOW_VERSION_INCOMPATIBLE = "WORKFLOW_VERSION_INCOMPATIBLE"


def snapshot_gate(state: JobState, req: InterventionRequest, continuable: Collection[str]) -> str:
    """``''`` when the submission may go on to the box checks; otherwise the 409 code.

    Only judged when the earlier gates (version, waiting pause, its token) pass on ``state``:
    the script answers those itself, first. The reviewer's ``snapshot_id`` is checked before the
    pause's workflow version, so a stale panel is told to redraw before a re-offer is made."""
    pause = state.active_pause
    if pause is None or pause.status != "WAITING" or pause.pause_token != req.pause_token:
        return ""
    if req.base_version != state.version:
        return ""
    if req.snapshot_id is not None and req.snapshot_id != pause.snapshot_id:
        return SNAPSHOT_MISMATCH
    if pause.workflow_version not in continuable:
        return WORKFLOW_VERSION_INCOMPATIBLE
    return ""


def plan_reoffer(state: JobState, now: str, now_ms: int, workflow: str) -> Plan:
    """Offer the waiting job for review again under ``workflow``: the old pause is CANCELLED (its
    token refused from now on), a new one opens at the same stage and round over the same boxes,
    with a new token and a snapshot id under the current definition. The status does not change
    and the job keeps its place in the review queue (it has waited that long)."""
    pause = state.active_pause
    assert pause is not None and pause.status == "WAITING"
    plan = Plan(expect_version=state.version, status=state.status)
    superseded = pause.model_copy(update={"status": "CANCELLED", "consumed_at": now})
    plan.pause_history[pause.pause_token] = dump(superseded)
    plan.events.append(
        (
            "PAUSE_SUPERSEDED",
            {
                "pause_token": pause.pause_token,
                "reason": WORKFLOW_VERSION_INCOMPATIBLE,
                "workflow_version": pause.workflow_version,
                "current_workflow_version": workflow,
            },
        )
    )
    open_pause(
        plan,
        state,
        pause.stage,
        pause.round,
        state.box_list,
        list(pause.box_ids_to_revise),
        now,
        now_ms,
        workflow,
        subjects_to_review=pause.subjects_to_review,
    )
    plan.waiting = None
    if state.votes:
        plan.meta["votes"] = None  # a quorum's votes were for the superseded pause
    return plan
