"""Flags, skips and comments (docs/protocol.md § Flags, skips and comments): ``POST``/``DELETE
/jobs/{id}/flag``, ``POST /jobs/{id}/comments``, ``POST /jobs/{id}/skip``.

Reviewer role (the role table is ``serve_app.routes.api.ROUTE_ROLES``). None of them decides the job or
changes its version: a flag asks a lead to look (the job stays waiting, the queue shows the flag, a
lead lists ``GET /jobs?status=WAITING&flagged=true``), a comment is for the next reviewer, a skip
hands the job back (the caller's claim released, their next-job query passing it over for a while).
Each is in the job's audit log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hitl_review.statecore.models import JobComment, JobFlag
from hitl_review.statecore.store import Store

log = logging.getLogger("hitl.api")

API = "/api/v1"
JOB = f"{API}/jobs/{{job_id}}"
SKIP_S = 600.0  # a skip lasts this long unless the request says otherwise
NOTE_409 = "PAUSE_NOT_ACTIVE (flag, skip: no review waits), JOB_CANCELLED or JOB_TERMINAL, with the snapshot"


class _Text(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @staticmethod
    def _words(v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("must not be blank")
        return v


class FlagRequest(_Text):
    reason: str = Field(max_length=500)

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str) -> str:
        return cls._words(v)


class CancelRequest(_Text):
    """``POST /jobs/{id}/cancel``'s optional body: why (``hitl cancel --reason``), kept in the CANCEL
    audit entry (docs/protocol.md § Audit)."""

    reason: str | None = Field(default=None, max_length=500)

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str | None) -> str | None:
        return None if v is None else cls._words(v)


class CommentRequest(_Text):
    text: str = Field(max_length=2000)

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        return cls._words(v)


class SkipRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    for_s: float = Field(default=SKIP_S, ge=1, le=7 * 24 * 3600)


class FlagRemoved(BaseModel):
    removed: bool


class Skipped(BaseModel):
    job_id: str
    until: str  # the caller's next-job query passes the job over until then


def add_note_routes(app: FastAPI, store_of: Callable[[], Store]) -> None:
    @app.post(f"{JOB}/flag", response_model=JobFlag, responses={400: {}, 404: {}, 409: {"description": NOTE_409}})
    async def flag(request: Request, job_id: str, body: FlagRequest) -> JobFlag:
        """Flag the waiting job for a lead, with why; it stays waiting (a new flag replaces the old)."""
        who = request.state.identity.name
        flagged = await store_of().flag(job_id, who, body.reason)
        log.info("flag job=%s reviewer=%s reason=%r", job_id, who, body.reason)
        return flagged

    @app.delete(f"{JOB}/flag", response_model=FlagRemoved, responses={404: {}, 409: {"description": NOTE_409}})
    async def unflag(request: Request, job_id: str) -> FlagRemoved:
        """Take the flag off (a lead who looked); ``removed: false`` when there was none."""
        removed = await store_of().unflag(job_id, request.state.identity.name)
        return FlagRemoved(removed=removed)

    @app.post(
        f"{JOB}/comments",
        response_model=JobComment,
        status_code=201,
        responses={400: {}, 404: {}, 409: {"description": NOTE_409}},
    )
    async def comment(request: Request, job_id: str, body: CommentRequest) -> JobComment:
        """A comment on a live job, shown to the next reviewer (the snapshot's ``comments``)."""
        return await store_of().comment(job_id, request.state.identity.name, body.text)

    @app.post(f"{JOB}/skip", response_model=Skipped, responses={400: {}, 404: {}, 409: {"description": NOTE_409}})
    async def skip(request: Request, job_id: str, body: SkipRequest | None = None) -> Skipped:
        """Hand the waiting job back: the caller's claim is released and their next-job query
        (``GET /jobs?status=WAITING&unclaimed=true``) passes it over for ``for_s`` seconds (600)."""
        who = request.state.identity.name
        for_s = body.for_s if body is not None else SKIP_S
        until = await store_of().skip(job_id, who, for_s)
        log.info("skip job=%s reviewer=%s until=%s", job_id, who, until)
        return Skipped(job_id=job_id, until=until)
