"""Spot checks of masks the quality gate passed (SPEC §14, docs/protocol.md § Cut-out quality): without
them the bad masks that slip through are never seen and the gate's recall on real work is unknowable.

``hitl up --mask-spot-check SHARE`` (default 0: off): each job created under ``review-failing`` records
the share and a secret salt in its policy (never shown by any route). A passed mask is drawn when a
hash of the salt and its subject falls below the share: pure (a re-planned write draws the same), as
uniform as SHA-256, and unpredictable to anyone without the salt. A drawn mask goes to the mask review
with the failed ones, and the review is *blind* in every such job: no subject shows the gate's verdict
(the pause's ``quality`` is withheld, the snapshot's while the subject waits, and the verdicts the
``SUBJECT_SEGMENTED``/``SUBJECT_REFINED``/``SUBJECT_GATED`` events carry in the job's live event
stream: :func:`shown_event`; the stored events keep them, for the archive and ``hitl learn``), so a
reviewer cannot tell a spot check from a failure and judges both by the mask alone. When the review is consumed,
``GATE_SPOT_CHECKED`` records the person's decision against the gate (``false_accept``: the person did
not accept the mask the gate passed), counted live in the partition counters (``gate_spot``,
``gate_spot_fa``); ``hitl learn report`` turns the archived events into the gate's recall with its bound.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from typing import Any, Final, Protocol

from .models import Event, SubjectResult
from .states import JobStatus, is_terminal


class JobState(Protocol):
    """What this module reads of a job (statecore.jobstate.JobState, which blinds its snapshot through
    this module: no import of it here)."""

    job_id: str
    status: JobStatus
    policy: dict[str, Any]
    results: list[SubjectResult]


SHARE: Final = "mask_spot_check"  # the job policy's fields
SALT: Final = "spot_salt"
EVENT: Final = "GATE_SPOT_CHECKED"
BLIND: Final = "judge this cut-out by itself: the quality gate's verdicts are not shown in this review"


def new_salt() -> str:
    return secrets.token_hex(16)


def policy_fields(share: float, quality_gate: str, salt: Callable[[], str] = new_salt) -> dict[str, Any]:
    """What a new job's policy records: the share and a fresh salt, under ``review-failing`` only (in
    ``review-all`` a person sees every mask already; in ``off`` nobody does)."""
    if share <= 0 or quality_gate != "review-failing":
        return {}
    return {SHARE: share, SALT: salt()}


def share_of(state: JobState) -> float:
    return policy_share(state.policy)


def policy_share(policy: dict[str, Any]) -> float:
    """The share of passed masks a job with this policy sends to a person (0: none)."""
    return float(policy.get(SHARE) or 0.0) if policy.get(SALT) else 0.0


def blind(state: JobState) -> bool:
    """Whether this job's mask review withholds the gate's verdicts (it may hold spot checks)."""
    return share_of(state) > 0


def draw(salt: str, job_id: str, box_id: str) -> float:
    """A uniform number in [0, 1) fixed by the subject and the job's secret salt."""
    digest = hashlib.sha256(f"{salt}\x00{job_id}\x00{box_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def drawn(state: JobState, r: SubjectResult) -> bool:
    """Whether ``r``, a mask the gate passed, goes to a person all the same."""
    share = share_of(state)
    if share <= 0 or r.status not in ("SUCCEEDED", "WAITING_REVIEW") or not r.mask_url:
        return False
    if r.quality is None or r.quality.verdict != "PASS":
        return False
    return draw(str(state.policy[SALT]), state.job_id, r.box_id) < share


def checked(state: JobState, r: SubjectResult, decision: str) -> dict[str, Any] | None:
    """The ``GATE_SPOT_CHECKED`` event's data for a reviewer's ``decision`` on ``r``, or None when ``r``
    was no spot check. ``false_accept``: the gate passed a mask the person did not accept as it was."""
    if not drawn(state, r):
        return None
    assert r.quality is not None  # drawn: a PASS verdict
    return {"policy": r.quality.policy, "box_id": r.box_id, "decision": decision, "false_accept": decision != "ACCEPT"}


def shown(state: JobState) -> list[SubjectResult]:
    """The job's results as its snapshot shows them: in a blind job, until the job ends, no subject
    shows the gate's verdict, the refinements it tried (a mask that passed at once has none) or a
    ``decided_by`` of "gate", so the snapshot does not tell a spot check from a failure either, while
    the subject waits for the mask review nor before (a page opened while the masks were made)."""
    if not blind(state) or is_terminal(state.status):
        return state.results
    hidden: dict[str, Any] = {"quality": None, "refinements": []}
    return [
        r.model_copy(update={**hidden, "decided_by": None if r.decided_by == "gate" else r.decided_by})
        for r in state.results
    ]


VERDICT_EVENTS: Final = frozenset({"SUBJECT_SEGMENTED", "SUBJECT_REFINED", "SUBJECT_GATED"})


def shown_event(ev: Event) -> Event:
    """``ev`` as a blind job's live event stream sends it: a subject's result without the gate's verdict,
    its refinements or who let it through (``decided_by`` "gate" names a pass); a refinement or a
    verdict as its subject and number alone, ``withheld`` saying why. Other events are unchanged."""
    if ev.type not in VERDICT_EVENTS:
        return ev
    data = ev.data
    if ev.type == "SUBJECT_SEGMENTED":
        hidden: dict[str, Any] = {"quality": None, "refinements": []}
        if data.get("decided_by") == "gate":
            hidden["decided_by"] = None
        return ev.model_copy(update={"data": {**data, **{k: v for k, v in hidden.items() if k in data}}})
    kept = {k: data[k] for k in ("status", "box_id", "refinement") if k in data}
    return ev.model_copy(update={"data": {**kept, "withheld": BLIND}})
