"""Errors raised by the client.

``ApiError`` is an HTTP answer the server gave (status >= 400), mapped from the
error body ``{"code", "message", ...}`` (docs/protocol.md § Error codes); every 409 carries the job's current
``snapshot`` so a caller can redraw without another request. ``ConnectionFailed``
means no answer came at all (after the retries the policy allowed).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from pydantic import ValidationError

from hitl_review.statecore.models import ClaimView, JobSnapshot


class HitlClientError(Exception):
    """Base of every error this package raises."""


class ConnectionFailed(HitlClientError):
    """The server could not be reached, or the connection broke, and retrying did not help."""

    def __init__(self, message: str, *, url: str | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.url = url
        self.attempts = attempts


class WaitTimeout(HitlClientError, TimeoutError):
    """``wait_for`` ran out of time; ``snapshot`` is the last state seen (or None)."""

    def __init__(self, job_id: str, timeout: float, snapshot: JobSnapshot | None = None) -> None:
        status = snapshot.status if snapshot else "unknown"
        super().__init__(f"job {job_id} did not reach the wanted status within {timeout:g}s (last status {status})")
        self.job_id = job_id
        self.timeout = timeout
        self.snapshot = snapshot


class ApiError(HitlClientError):
    """An error answer of the HTTP API."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        body: Any = None,
        snapshot: dict[str, Any] | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.body = body
        self.snapshot = snapshot
        self.request_id = request_id
        self.retry_after = retry_after

    @property
    def is_conflict(self) -> bool:
        return self.status_code == 409

    @property
    def job_snapshot(self) -> JobSnapshot | None:
        """``snapshot`` parsed into the domain model, or None when absent or not a snapshot."""
        if not isinstance(self.snapshot, dict):
            return None
        try:
            return JobSnapshot.model_validate(self.snapshot)
        except ValidationError:
            return None


class InvalidRequestError(ApiError):
    """400, 413, 415, 422: the request itself is wrong; retrying the same request cannot help."""


class AuthError(ApiError):
    """401 (missing or unknown token) or 403 (the token's role may not do this)."""


class NotFoundError(ApiError):
    """404: no such job (or not one the caller may see), or no such artifact."""


class ConflictError(ApiError):
    """409: the request clashed with the job's state; ``snapshot`` is the job as it is now."""

    @property
    def claim(self) -> ClaimView | None:
        """``CLAIMED_BY_OTHER``: who holds the job's claim and until when (docs/protocol.md § Claims)."""
        raw = self.body.get("claim") if isinstance(self.body, dict) else None
        return ClaimView.model_validate(raw) if isinstance(raw, dict) else None

    @property
    def rebase(self) -> dict[str, Any] | None:
        """A refused intervention's box-level change since its ``base_version`` (``added``, ``removed``,
        ``moved``, ``relabelled``; docs/protocol.md § Rebase help), or None on other routes."""
        raw = self.body.get("rebase") if isinstance(self.body, dict) else None
        return raw if isinstance(raw, dict) else None


class RateLimitedError(ApiError):
    """429 after the retries the policy allowed."""


class ServerError(ApiError):
    """5xx after the retries the policy allowed (or a 500, which is never retried)."""


def _class_for(status: int) -> type[ApiError]:
    if status == 409:
        return ConflictError
    if status == 404:
        return NotFoundError
    if status in (401, 403):
        return AuthError
    if status == 429:
        return RateLimitedError
    if status >= 500:
        return ServerError
    if status in (400, 413, 415, 422):
        return InvalidRequestError
    return ApiError


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def error_from_response(response: httpx.Response) -> ApiError:
    """Map an error response to the matching ``ApiError`` subclass.

    The API's error body gives ``code``/``message``/``snapshot``; FastAPI's own
    ``{"detail": …}`` and non-JSON bodies (a proxy's 502 page) still give a usable error.
    """
    status = response.status_code
    text = response.text
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    code, message, snapshot = f"HTTP_{status}", (response.reason_phrase or "error"), None
    if isinstance(body, dict) and isinstance(body.get("detail"), dict) and "code" in body["detail"]:
        body = body["detail"]  # an API error body wrapped by FastAPI's HTTPException(detail=…)
    if isinstance(body, dict):
        if isinstance(body.get("code"), str):
            code = body["code"]
        elif status == 422:
            code = "INVALID_REQUEST"
        if isinstance(body.get("message"), str):
            message = body["message"]
        elif "detail" in body:
            detail = body["detail"]
            message = detail if isinstance(detail, str) else json.dumps(detail)[:1000]
        if isinstance(body.get("snapshot"), dict):
            snapshot = body["snapshot"]
    elif isinstance(body, str) and body.strip():
        message = body.strip()[:500]
    return _class_for(status)(
        status,
        code,
        message,
        body=body,
        snapshot=snapshot,
        request_id=_request_id(response),
        retry_after=parse_retry_after(response.headers.get("Retry-After")),
    )


def _request_id(response: httpx.Response) -> str | None:
    try:
        rid: str | None = response.request.headers.get("X-Request-ID")
        return rid
    except RuntimeError:  # a Response built without a request (tests)
        return None


def is_conflict(exc: BaseException, code: str | None = None) -> bool:
    """True for a 409 ``ApiError`` (with that ``code`` when one is given)."""
    return isinstance(exc, ApiError) and exc.status_code == 409 and (code is None or exc.code == code)
