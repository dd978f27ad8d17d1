"""Review quorum (docs/protocol.md § Quorum): a job created with ``review_quorum: N`` (N ≥ 2) needs
N distinct reviewers to submit compatible box lists before its pause is consumed.

Pure, like ``statecore.decide``. A submission before the Nth is a **vote**: kept in the job's meta
(``votes``: reviewer → the list they submitted), never a change of the job (the version does not
move, so the other reviewers' ``base_version`` stays good); a reviewer who votes again replaces
their vote. The Nth distinct reviewer's submission decides: lists that agree (the same box ids
kept; every box within IoU ≥ ``IOU_AGREE`` of its counterpart, manual boxes matched by position)
consume the pause with the deciding list, as a single reviewer's would; lists that disagree
supersede the pause with a **reconciliation pause** at the same stage over the same boxes, which
carries the lists side by side and is decided by one reviewer. The store hands the verdict to
consume_pause.lua, which applies it only while the votes are still those it was computed from.

The job's ``quorum_policy`` says what decides (docs/protocol.md § Quorum): ``all`` (the above),
``majority`` (⌈(N+1)/2⌉ compatible submissions of the N invited: a submission whose list agrees with
that many votes, its own included, consumes the pause with its list; a reconciliation pause opens
as soon as no such group can form any more), ``any`` (the first submission decides, as one
reviewer's: a pause of one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from .ids import canonical_json
from .jobstate import JobState, needed_of
from .models import InterventionRequest, InterventionResponse, QuorumProgress, Subject
from .plan import Plan, dump, open_pause

if TYPE_CHECKING:
    from .decide import InterventionPlan

IOU_AGREE = 0.9
MAX_QUORUM = 10


def invited_of(state: JobState) -> int:
    """How many distinct reviewers the job invites to each pause (its ``review_quorum``)."""
    return int(state.policy.get("review_quorum") or 1)


def policy_of(state: JobState) -> str:
    return str(state.policy.get("quorum_policy") or "all")


def quorum_of(state: JobState) -> int:
    """How many compatible submissions decide the active pause: the job's quorum under its policy,
    1 for a reconciliation pause (its lists were already compared) and under ``any``."""
    pause = state.active_pause
    if pause is not None and pause.reconciliation:
        return 1
    return needed_of(invited_of(state), policy_of(state))


def votes_of(meta_votes: str) -> dict[str, dict[str, Any]]:
    """The meta's ``votes`` field: reviewer → {"intervention_id", "at", "subjects"}."""
    return orjson.loads(meta_votes) if meta_votes else {}


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _key(s: dict[str, Any]) -> str | None:
    return s.get("box_id") or s.get("candidate_id")


def decisions_disagree(lists: Sequence[Sequence[dict[str, Any]]]) -> str | None:
    """A mask review's votes agree when every reviewer made the same decision on every subject
    (a REFINE's points may differ: the deciding reviewer's are run)."""
    first = {d["box_id"]: d["decision"] for d in lists[0]}
    for other in lists[1:]:
        mine = {d["box_id"]: d["decision"] for d in other}
        for box_id in sorted(first):
            if mine.get(box_id) != first[box_id]:
                return f"subject {box_id}: {first[box_id]} and {mine.get(box_id)}"
    return None


def disagreement(lists: Sequence[Sequence[dict[str, Any]]]) -> str | None:
    """None when every list agrees with the first; else why not (for the event and the panel)."""
    if any("decision" in d for ls in lists for d in ls):
        return decisions_disagree(lists)
    first = lists[0]
    ids0 = {k for s in first if (k := _key(s))}
    manual0 = [s for s in first if not _key(s)]
    by_id0 = {_key(s): s for s in first if _key(s)}
    for other in lists[1:]:
        ids = {k for s in other if (k := _key(s))}
        if ids != ids0:
            return f"different boxes kept: {sorted(ids0 ^ ids)}"
        for s in other:
            k = _key(s)
            if k and iou(s["bbox"], by_id0[k]["bbox"]) < IOU_AGREE:
                return f"box {k} drawn differently (IoU < {IOU_AGREE})"
        manual = [s for s in other if not _key(s)]
        if len(manual) != len(manual0):
            return f"{len(manual0)} and {len(manual)} boxes drawn by hand"
        free = list(manual0)
        for s in manual:
            match = next((m for m in free if iou(s["bbox"], m["bbox"]) >= IOU_AGREE), None)
            if match is None:
                return f"a box drawn by hand at {list(s['bbox'])} has no counterpart (IoU < {IOU_AGREE})"
            free.remove(match)
    return None


def agreeing(votes: dict[str, dict[str, Any]], reviewer: str) -> list[str]:
    """The voters whose list agrees with ``reviewer``'s (``reviewer`` included), sorted."""
    mine = votes[reviewer]["subjects"]
    return sorted(r for r, v in votes.items() if r == reviewer or disagreement([mine, v["subjects"]]) is None)


def majority_can_form(votes: dict[str, dict[str, Any]], invited: int, needed: int) -> bool:
    """Whether ``needed`` compatible submissions can still gather: some vote's group (the votes that
    agree with it, itself included) plus every invited reviewer yet to vote reaches ``needed``. Once
    all ``invited`` have voted without a decision, it cannot."""
    remaining = invited - len(votes)
    if remaining <= 0:
        return False
    return max(len(agreeing(votes, r)) for r in votes) + remaining >= needed


def subjects_json(subjects: Sequence[Subject]) -> list[dict[str, Any]]:
    return [s.model_dump(mode="json", exclude_none=True) for s in subjects]


def record_vote(
    votes: dict[str, dict[str, Any]], req: InterventionRequest, reviewer: str, now: str
) -> dict[str, dict[str, Any]]:
    """The votes with ``reviewer``'s (a second vote of one reviewer replaces the first)."""
    # A mask review's vote keeps its decisions where a box stage's keeps its list.
    if req.decisions is not None:
        shown = [d.model_dump(mode="json") for d in req.decisions]
    else:
        shown = subjects_json(req.subjects or [])
    mine = {"intervention_id": req.intervention_id, "at": now, "subjects": shown}
    return {**{r: v for r, v in votes.items() if r != reviewer}, reviewer: mine}


def plan_reconciliation(
    state: JobState, votes: dict[str, dict[str, Any]], why: str, now: str, now_ms: int, workflow: str
) -> Plan:
    """The reviewers disagreed: the pause is superseded (its token refused from now on) by one at the
    same stage, round and boxes that shows every reviewer's list and needs one decision."""
    pause = state.active_pause
    assert pause is not None and pause.status == "WAITING"
    plan = Plan(expect_version=state.version, status=state.status)
    plan.pause_history[pause.pause_token] = dump(pause.model_copy(update={"status": "CANCELLED", "consumed_at": now}))
    reviewers = sorted(votes)
    plan.events.append(("QUORUM_DISAGREED", {"pause_token": pause.pause_token, "reviewers": reviewers, "reason": why}))
    plan.events.append(
        ("PAUSE_SUPERSEDED", {"pause_token": pause.pause_token, "reason": "QUORUM_DISAGREED", "reviewers": reviewers})
    )
    lists = {r: votes[r]["subjects"] for r in reviewers}
    new = open_pause(
        plan,
        state,
        pause.stage,
        pause.round,
        state.box_list,
        list(pause.box_ids_to_revise),
        now,
        now_ms,
        workflow,
        reconciliation=lists,
        subjects_to_review=pause.subjects_to_review,
    )
    assert new.reconciliation == lists
    plan.meta["votes"] = None  # the reconciliation pause starts without votes
    plan.waiting = None  # the job keeps its place in the review queue
    return plan


@dataclass(frozen=True)
class QuorumStep:
    """What consume_pause.lua does with a submission to a quorum pause: ``mode`` VOTE (record the
    vote, nothing else) or DECIDE (apply ``plan``), only while the meta's votes are still ``seen``."""

    mode: str
    seen: str
    votes_json: str
    event: str  # the QUORUM_VOTE event's data (VOTE)
    audit_action: str  # the audit entry's action; its outcome is ACCEPTED, as for any accepted submission
    plan: Plan | None
    response: InterventionResponse


def verdict(
    votes: dict[str, dict[str, Any]], reviewer: str, invited: int, needed: int, policy: str
) -> tuple[str, list[str], str]:
    """What ``reviewer``'s vote makes of the votes: VOTE while more are needed, REACHED with the
    reviewers whose lists decide, or DISAGREED with why."""
    reviewers = sorted(votes)
    lists = [votes[r]["subjects"] for r in reviewers]
    if policy == "majority":
        group = agreeing(votes, reviewer)
        if len(group) >= needed:
            return "REACHED", group, ""
        if majority_can_form(votes, invited, needed):
            return "VOTE", [], ""
        detail = disagreement(lists)
        why = f"no {needed} of the {invited} invited reviewers can agree" + (f": {detail}" if detail else "")
        return "DISAGREED", [], why
    if len(votes) < needed:
        return "VOTE", [], ""
    differs = disagreement(lists)
    return ("REACHED", reviewers, "") if differs is None else ("DISAGREED", [], differs)


def step(
    state: JobState, req: InterventionRequest, reviewer: str, ip: InterventionPlan, now: str, now_ms: int, workflow: str
) -> QuorumStep | None:
    """None when the pause needs one submission (one reviewer, a reconciliation, ``any``), or when the
    submission will be refused anyway (the script's gates, a 400): the normal path answers. Else the
    vote or the decision."""
    needed = quorum_of(state)
    if needed < 2 or ip.plan is None or ip.response is None or ip.invalid is not None:
        return None
    votes = record_vote(votes_of(state.votes), req, reviewer, now)
    reviewers = sorted(votes)
    invited, policy = invited_of(state), policy_of(state)
    outcome, group, why = verdict(votes, reviewer, invited, needed, policy)

    def progress(what: str, who: list[str]) -> QuorumProgress:
        return QuorumProgress(
            needed=needed, received=len(votes), reviewers=who, outcome=what, invited=invited, policy=policy
        )

    if outcome == "VOTE":
        resp = ip.response.model_copy(
            update={
                "status": state.status,
                "version": state.version,
                "next_node_type": None,
                "quorum": progress("VOTE_RECORDED", reviewers),
            }
        )
        event = {"intervention_id": req.intervention_id, "reviewer": reviewer, "received": len(votes), "needed": needed}
        return QuorumStep("VOTE", state.votes, canonical_json(votes), canonical_json(event), "QUORUM_VOTE", None, resp)
    if outcome == "REACHED":
        plan = ip.plan
        plan.meta["votes"] = None
        plan.events.append(("QUORUM_REACHED", {"reviewers": group, "needed": needed, "policy": policy}))
        resp = ip.response.model_copy(update={"quorum": progress("QUORUM_REACHED", group)})
        return QuorumStep("DECIDE", state.votes, "", "", "INTERVENE", plan, resp)
    plan = plan_reconciliation(state, votes, why, now, now_ms, workflow)
    resp = ip.response.model_copy(
        update={
            "status": state.status,
            "version": state.version + 1,
            "next_node_type": None,
            "quorum": progress("QUORUM_DISAGREED", reviewers),
        }
    )
    return QuorumStep("DECIDE", state.votes, "", "", "QUORUM_DISAGREED", plan, resp)
