"""Job states, node types and the one transition table (docs/protocol.md § States, § Transitions).

Pure: no I/O."""

from __future__ import annotations

import re
from enum import StrEnum

from .errors import IllegalTransition, JobCancelled


class JobStatus(StrEnum):
    CREATED = "CREATED"
    DETECTING = "DETECTING"
    WAITING_USER_SELECTION = "WAITING_USER_SELECTION"
    VALIDATING_MANUAL_BOXES = "VALIDATING_MANUAL_BOXES"
    WAITING_BOX_BATCH_REVISION = "WAITING_BOX_BATCH_REVISION"
    PROCESSING_APPROVED_SUBJECTS = "PROCESSING_APPROVED_SUBJECTS"
    WAITING_MASK_REVIEW = "WAITING_MASK_REVIEW"
    FINALIZING_RESULTS = "FINALIZING_RESULTS"
    SUCCEEDED = "SUCCEEDED"
    PARTIAL_SUCCEEDED = "PARTIAL_SUCCEEDED"
    FAILED = "FAILED"
    EMPTY_SELECTION = "EMPTY_SELECTION"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


S = JobStatus


class NodeType(StrEnum):
    """Every kind of node the workflow knows (docs/protocol.md § Executors and the outbox).

    A ``str`` enum, so the wire format (HTTP, SSE, Redis, the outbox) stays the plain name.
    ``statecore.nodes`` says which of them have an input/output contract and who runs them;
    the others (``SEGMENT_SUBJECT``, ``QUALITY_GATE_SUBJECT``, ``REFINE_SUBJECT``) are named
    by the protocol but not implemented, so an executor answers ``UNSUPPORTED_NODE_TYPE``."""

    DETECT_SUBJECTS = "DETECT_SUBJECTS"
    VALIDATE_MANUAL_BOX_LIST = "VALIDATE_MANUAL_BOX_LIST"
    PROCESS_APPROVED_BOX_LIST = "PROCESS_APPROVED_BOX_LIST"
    SEGMENT_SUBJECT = "SEGMENT_SUBJECT"
    QUALITY_GATE_SUBJECT = "QUALITY_GATE_SUBJECT"
    REFINE_SUBJECT = "REFINE_SUBJECT"
    FINALIZE_RESULTS = "FINALIZE_RESULTS"


TERMINAL: frozenset[JobStatus] = frozenset(
    {S.SUCCEEDED, S.PARTIAL_SUCCEEDED, S.FAILED, S.EMPTY_SELECTION, S.CANCELLED, S.TIMED_OUT}
)
WAITING: frozenset[JobStatus] = frozenset(
    {S.WAITING_USER_SELECTION, S.WAITING_BOX_BATCH_REVISION, S.WAITING_MASK_REVIEW}
)

# The only place the allowed moves are written down. The WAITING states have no
# edge to TIMED_OUT: nothing but an intervention or a cancel leaves a pause.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.CREATED: frozenset({S.DETECTING, S.CANCELLED, S.FAILED}),
    S.DETECTING: frozenset(
        {S.WAITING_USER_SELECTION, S.PROCESSING_APPROVED_SUBJECTS, S.FAILED, S.CANCELLED, S.TIMED_OUT}
    ),
    S.WAITING_USER_SELECTION: frozenset(
        {S.VALIDATING_MANUAL_BOXES, S.PROCESSING_APPROVED_SUBJECTS, S.EMPTY_SELECTION, S.FAILED, S.CANCELLED}
    ),
    S.VALIDATING_MANUAL_BOXES: frozenset(
        {
            S.WAITING_BOX_BATCH_REVISION,
            S.PROCESSING_APPROVED_SUBJECTS,
            S.FINALIZING_RESULTS,
            S.FAILED,
            S.CANCELLED,
            S.TIMED_OUT,
        }
    ),
    S.WAITING_BOX_BATCH_REVISION: frozenset(
        {
            S.VALIDATING_MANUAL_BOXES,
            S.PROCESSING_APPROVED_SUBJECTS,
            S.FINALIZING_RESULTS,
            S.EMPTY_SELECTION,
            S.FAILED,
            S.CANCELLED,
        }
    ),
    S.PROCESSING_APPROVED_SUBJECTS: frozenset(
        {S.WAITING_MASK_REVIEW, S.FINALIZING_RESULTS, S.FAILED, S.CANCELLED, S.TIMED_OUT}
    ),
    # A person's decision on the masks the gate still fails (docs/protocol.md § Cut-out quality):
    # back to segmenting (REFINE with points) or on to the results. No TIMED_OUT: it is a wait.
    S.WAITING_MASK_REVIEW: frozenset({S.PROCESSING_APPROVED_SUBJECTS, S.FINALIZING_RESULTS, S.FAILED, S.CANCELLED}),
    S.FINALIZING_RESULTS: frozenset({S.SUCCEEDED, S.PARTIAL_SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT}),
    **{t: frozenset() for t in TERMINAL},
}


# Edges only an explicit, versioned auto-approve policy takes (SPEC §2): ``transition`` refuses them
# unless ``by_policy`` names one (``policy:<name>@<hash>``, statecore.autoapprove).
POLICY_EDGES: frozenset[tuple[JobStatus, JobStatus]] = frozenset({(S.DETECTING, S.PROCESSING_APPROVED_SUBJECTS)})
_POLICY_REF = re.compile(r"^policy:[A-Za-z0-9_.-]{1,64}@[0-9a-f]{16}$")


def is_terminal(status: JobStatus | str) -> bool:
    return JobStatus(status) in TERMINAL


def is_waiting(status: JobStatus | str) -> bool:
    return JobStatus(status) in WAITING


def transition(
    current: JobStatus | str, target: JobStatus | str, *, job_id: str | None = None, by_policy: str | None = None
) -> JobStatus:
    """Return the state after moving ``current`` to ``target``.

    Same-state is a no-op success (a replayed report). A cancelled job never
    moves again; any other move outside the table raises ``IllegalTransition``, and so does a
    ``POLICY_EDGES`` move without ``by_policy`` naming the policy that decided it.
    """
    cur, tgt = JobStatus(current), JobStatus(target)
    if cur == tgt:
        return cur
    if cur == S.CANCELLED:
        raise JobCancelled(job_id=job_id, message=f"job is cancelled; refusing move to {tgt}")
    if tgt not in TRANSITIONS[cur]:
        raise IllegalTransition(job_id=job_id, message=f"illegal transition {cur} -> {tgt}")
    if (cur, tgt) in POLICY_EDGES and not (by_policy and _POLICY_REF.match(by_policy)):
        raise IllegalTransition(
            job_id=job_id, message=f"{cur} -> {tgt} is taken only by a loaded auto-approve policy in on mode"
        )
    return tgt
