"""Loads the Lua scripts once and maps their return codes to typed errors, in one place."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from . import errors

SCRIPT_NAMES = (
    "create_job",
    "consume_pause",
    "apply_report",
    "cancel",
    "claim",
    "archive_ack",
    "restore_job",
    "audit_append",
    "notes",
    "subject_write",
)
# Touch no job state: no shared prologue.
STANDALONE = ("heartbeat", "lease", "archive_requeue", "mark_mirrored", "outbox_sort", "subject_read")
# Change nothing: never followed by the durability's sync or journal (statecore.durable.synced).
READ_ONLY = ("subject_read",)


@cache
def source(name: str) -> str:
    """The full text sent to Redis: the shared prologue (state-changing scripts), then the operation."""
    lua = resources.files("hitl_review.statecore") / "lua"
    body = (lua / f"{name}.lua").read_text()
    return body if name in STANDALONE else (lua / "_lib.lua").read_text() + "\n" + body


def register(client: Any) -> dict[str, Any]:
    """``register_script`` for each script; redis-py falls back from EVALSHA on NOSCRIPT."""
    return {name: client.register_script(source(name)) for name in SCRIPT_NAMES + STANDALONE}


# Codes whose second element is a flat HGETALL of the job's meta (the current snapshot).
_SNAPSHOT_CODES = {
    "IDEMPOTENCY_CONFLICT": errors.IdempotencyConflict,
    "JOB_CANCELLED": errors.JobCancelled,
    "VERSION_CONFLICT": errors.VersionConflict,
    "PAUSE_NOT_ACTIVE": errors.PauseNotActive,
    "PAUSE_TOKEN_MISMATCH": errors.PauseTokenMismatch,
    "SNAPSHOT_MISMATCH": errors.SnapshotMismatch,
    "WORKFLOW_VERSION_INCOMPATIBLE": errors.WorkflowVersionIncompatible,
    "JOB_TERMINAL": errors.JobTerminal,
    "CLAIMED_BY_OTHER": errors.ClaimedByOther,
}

_MESSAGES = {
    "IDEMPOTENCY_CONFLICT": "this intervention_id was already used with a different payload or reviewer",
    "JOB_CANCELLED": "the job was cancelled",
    "VERSION_CONFLICT": "your view of the job is out of date (base_version differs from the job's version)",
    "PAUSE_NOT_ACTIVE": "no review is waiting on this job any more",
    "PAUSE_TOKEN_MISMATCH": "this review was already submitted or replaced; the pause token is not the active one",
    "SNAPSHOT_MISMATCH": "the snapshot you reviewed is not the one the waiting pause shows (snapshot_id differs)",
    "WORKFLOW_VERSION_INCOMPATIBLE": "this pause was opened under a workflow definition this server cannot continue; "
    "the job was offered for review again under the current one: review the new pause",
    "JOB_TERMINAL": "the job has already ended",
    "CLAIMED_BY_OTHER": "another reviewer is looking at this job (their claim has not expired); "
    "take it over with ?force=true",
}


def pairs_to_dict(flat: list[Any]) -> dict[str, str]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def raise_for(result: list[Any], job_id: str, snapshot_of: Callable[[dict[str, str]], dict[str, Any] | None]) -> None:
    """Raise the typed error a script's return code stands for; return on success codes."""
    code = result[0]
    if code in _SNAPSHOT_CODES:
        snap = snapshot_of(pairs_to_dict(result[1])) if len(result) > 1 and isinstance(result[1], list) else None
        if code == "CLAIMED_BY_OTHER":  # claim.lua: the holder and when its claim expires follow
            claim = {"reviewer": result[2], "expires_at": result[3]}
            if snap is not None:
                snap["claim"] = claim
            raise errors.ClaimedByOther(_MESSAGES[code], job_id=job_id, snapshot=snap, claim=claim)
        raise _SNAPSHOT_CODES[code](_MESSAGES[code], job_id=job_id, snapshot=snap)
    if code == "JOB_NOT_FOUND":
        raise errors.JobNotFound(f"job {job_id} not found", job_id=job_id)
    if code == "INVALID_REQUEST":
        raise errors.InvalidRequest(result[1], job_id=job_id)
    if code == "STALE":
        raise errors.StaleRead(job_id=job_id)
