"""What the box policy's decision does to a job's plan (SPEC §14, docs/protocol.md § Auto-approval).

Pure, like ``statecore.decide``: each function adds to the ``Plan`` the store commits, so an automatic
approval is one atomic write as every transition is: the move DETECTING → PROCESSING_APPROVED_SUBJECTS
(the table's policy edge, taken ``by_policy``), one ``SEGMENT_SUBJECT`` command per subject, the
``AUTO_APPROVED`` event and ``decided_by`` on the job and its subjects (the audit entry naming the
policy is written by the same script: ``apply_report.lua``).

A job the policy does not approve, or draws for a spot check, waits for a person with the same pause
as any other: what the policy thought is kept in the meta field ``auto_review``, which no snapshot,
pause or event shows, until the reviewer's submission is compared with it (``on_reviewed``). Only in
``shadow`` does the job say what the policy would have done (``POLICY_SHADOW_DECISION``): there every
job waits, so nothing is told apart.
"""

from __future__ import annotations

from typing import Any

import orjson

from . import subjects
from .autoapprove import Decision, unchanged
from .ids import canonical_json
from .jobstate import JobState
from .models import Box
from .plan import Plan, approved_of, box_dicts, dump, move, snapshot_id
from .states import JobStatus

S = JobStatus
FIELD = "auto_review"  # the meta field the control plane alone reads
# What a reviewer's submission on a job the policy had a say on is recorded as (counted per policy by
# apply_plan's count_event in _lib.lua: the live false-accept rate comes from POLICY_SPOT_CHECKED).
SPOT_CHECKED = "POLICY_SPOT_CHECKED"
SHADOW_COMPARED = "POLICY_SHADOW_COMPARED"
REVIEW_COMPARED = "POLICY_REVIEW_COMPARED"


def on_detection(
    plan: Plan, state: JobState, boxes: list[Box], decision: Decision | None, now: str, now_ms: int
) -> bool:
    """True when the policy approved the detector's list and the job took its edge; else the caller
    opens the review pause as for any job (the decision, if any, recorded for the comparison)."""
    if decision is None:
        return False
    if not decision.approve:
        plan.meta[FIELD] = canonical_json(decision.record())
        if decision.mode == "shadow":
            data = {k: v for k, v in decision.record().items() if k != "spot_check"}
            plan.events.append(("POLICY_SHADOW_DECISION", data))
        return False
    move(plan, state, S.PROCESSING_APPROVED_SUBJECTS, by_policy=decision.policy)
    approved = approved_of(boxes)
    plan.meta["approved_box_list"] = canonical_json(box_dicts(approved))
    plan.meta["decided_by"] = decision.policy
    plan.events.append(
        (
            "AUTO_APPROVED",
            {
                "policy": decision.policy,
                "p": round(decision.p, 6),
                "threshold": decision.threshold,
                "box_ids": [b.box_id for b in approved],
                "snapshot_id": snapshot_id(state.image.sha256, boxes),
            },
        )
    )
    subjects.start(plan, state, approved, boxes, now, now_ms)
    queued = [subjects.queued(b).model_copy(update={"decided_by": decision.policy}) for b in approved]
    plan.meta["results"] = dump(queued)
    return True


def audit_of(plan: Plan) -> tuple[str, str]:
    """(the policy, the snapshot id of the list it approved) for the automatic decision's audit entry
    (apply_report.lua ARGV[14], ARGV[15]); ("", "") when the plan carries none."""
    for etype, data in plan.events:
        if etype == "AUTO_APPROVED":
            return str(data["policy"]), str(data["snapshot_id"])
    return "", ""


def on_reviewed(plan: Plan | None, state: JobState) -> dict[str, Any] | None:
    """A submission that consumes the first box review of a job the policy had a say on: the
    reviewer's list compared with the detector's (``autoapprove.unchanged``), as an event against
    the policy; the hidden record goes. Returns the event's data (with ``type``), or None."""
    raw = state.auto_review
    pause = state.active_pause
    if plan is None or not raw or pause is None or pause.round != 1 or pause.stage != "WAITING_USER_SELECTION":
        return None
    consumed = plan.pause_history.get(pause.pause_token)
    if consumed is None or orjson.loads(consumed).get("status") != "CONSUMED":
        return None  # a quorum's vote, or a re-offer: the pause is still to be decided
    rec = orjson.loads(raw)
    final_raw = plan.meta.get("box_list")
    final = orjson.loads(final_raw) if final_raw else box_dicts(state.box_list)
    same, change = unchanged(box_dicts(state.box_list), final)
    would = bool(rec.get("would_approve"))
    data: dict[str, Any] = {"policy": rec["policy"], "would_approve": would, "unchanged": same, "change": change}
    if rec.get("spot_check"):
        etype = SPOT_CHECKED
        data["false_accept"] = not same
    elif rec.get("mode") == "shadow":
        etype = SHADOW_COMPARED
        data["agreed"] = would == same
        data["false_accept"] = would and not same
    else:
        etype = REVIEW_COMPARED
        data["agreed"] = not same  # the policy sent it to a person; the person changed the list
    plan.events.append((etype, data))
    plan.meta[FIELD] = None
    return {"type": etype, **data}
