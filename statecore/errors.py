"""One error hierarchy for the whole project.

Every error carries its ``code`` (docs/protocol.md § Error codes), the HTTP ``status`` it maps to, the
``job_id`` when there is one, whether retrying can help, and for 409s the
job's current snapshot so a client can redraw without another request.
"""

from __future__ import annotations

from typing import Any, ClassVar


class HitlError(Exception):
    code: ClassVar[str] = "INTERNAL"
    status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False
    # Seconds for a ``Retry-After`` header (the 429s and 503s): when a retry may succeed.
    retry_after_s: ClassVar[int | None] = None

    def __init__(
        self,
        message: str | None = None,
        *,
        job_id: str | None = None,
        snapshot: dict[str, Any] | None = None,
        **details: Any,
    ) -> None:
        self.message = message or self.code.replace("_", " ").lower()
        self.job_id = job_id
        self.snapshot = snapshot
        self.details = details
        super().__init__(self.message)

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.job_id:
            body["job_id"] = self.job_id
        body.update(self.details)
        if self.status == 409:
            body["snapshot"] = self.snapshot
        return body


class InvalidRequest(HitlError):
    code = "INVALID_REQUEST"
    status = 400


class Unauthorized(HitlError):
    code = "UNAUTHORIZED"
    status = 401


class Forbidden(HitlError):
    code = "FORBIDDEN"
    status = 403


class CsrfFailed(Forbidden):
    """A write signed in by a session cookie without the session's CSRF token, or from another origin."""

    code = "CSRF_FAILED"


class JobNotFound(HitlError):
    code = "JOB_NOT_FOUND"
    status = 404


class ArtifactNotFound(HitlError):
    code = "ARTIFACT_NOT_FOUND"
    status = 404


class PayloadTooLarge(HitlError):
    code = "PAYLOAD_TOO_LARGE"
    status = 413


class Conflict(HitlError):
    status = 409


class IdempotencyConflict(Conflict):
    code = "IDEMPOTENCY_CONFLICT"


class JobCancelled(Conflict):
    code = "JOB_CANCELLED"


class VersionConflict(Conflict):
    code = "VERSION_CONFLICT"


class PauseNotActive(Conflict):
    code = "PAUSE_NOT_ACTIVE"


class PauseTokenMismatch(Conflict):
    code = "PAUSE_TOKEN_MISMATCH"


class SnapshotMismatch(Conflict):
    code = "SNAPSHOT_MISMATCH"


class WorkflowVersionIncompatible(Conflict):
    code = "WORKFLOW_VERSION_INCOMPATIBLE"


class ClaimedByOther(Conflict):
    """Another reviewer holds the job's review claim; the body carries ``claim``."""

    code = "CLAIMED_BY_OTHER"


class JobTerminal(Conflict):
    code = "JOB_TERMINAL"


class JobNotFinished(Conflict):
    code = "JOB_NOT_FINISHED"


class IllegalTransition(HitlError):
    """A move outside the transition table: a bug, never applied silently."""

    code = "ILLEGAL_TRANSITION"
    status = 500


class StaleRead(HitlError):
    """The job changed between the read and the guarded write; retry."""

    code = "STALE_READ"
    status = 503
    retryable = True
    retry_after_s = 1


class StoreUnavailable(HitlError):
    """Redis did not answer within the store's operation timeout (down, hung, loading its AOF,
    or the connection broke): nothing was decided; the same request may be sent again."""

    code = "STORE_UNAVAILABLE"
    status = 503
    retryable = True
    retry_after_s = 1


class BacklogFull(HitlError):
    """Admission control: more node commands wait in the outbox than ``--max-backlog``; a new job
    would only queue behind them. Interventions and cancels are never refused for this."""

    code = "BACKLOG_FULL"
    status = 429
    retryable = True
    retry_after_s = 2


class RateLimited(HitlError):
    """A reviewer asked for previews faster than the preview route's per-reviewer rate."""

    code = "RATE_LIMITED"
    status = 429
    retryable = True
    retry_after_s = 1


class PreviewUnavailable(HitlError):
    """No segmenter with a prompted path answers here (the preview route)."""

    code = "PREVIEW_UNAVAILABLE"
    status = 503
    retryable = True
    retry_after_s = 5


class NodeExecutionError(HitlError):
    """Raised by executors; ``retryable`` is per instance here."""

    code = "NODE_FAILED"
    status = 500

    def __init__(
        self, message: str | None = None, *, code: str = "NODE_FAILED", retryable: bool = True, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.code = code  # type: ignore[misc]  # a ClassVar elsewhere; per instance for node errors
        self.retryable = retryable  # type: ignore[misc]  # likewise
