"""The audit routes (docs/protocol.md § Audit): ``GET /jobs/{id}/audit`` (the job's hash-chained
log, from Redis or, once Redis no longer holds the job, from the archive: the same body) and
``GET /admin/audit/verify`` (admin: each job's chain checked in every copy there is, Redis and
the archive, naming the first broken entry). Roles: ``serve_app.routes.api.ROUTE_ROLES``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel

from hitl_review.statecore import audit, errors, keys

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive
    from hitl_review.statecore.store import Store

log = logging.getLogger("hitl.api")

API = "/api/v1"
VERIFY_LIMIT = 10_000  # jobs one verify call checks at most; --all over more pages by ``after``


class AuditEntry(BaseModel):
    """statecore.audit.FIELDS: who (``actor``, the token's ``role``, the ``proxy_user`` a trusted proxy
    named), what (``action``, the ``node`` a model step ran, ``reason``) on what the reviewer was shown
    (``base_version``, ``snapshot_id``), with which intent (``intervention_id``, ``payload_hash``:
    ids.payload_hash of the body and the reviewer, as the idempotency record keeps it), and how it ended."""

    seq: int
    at: str
    actor: str
    role: str | None = None
    proxy_user: str | None = None
    action: str
    node: str | None = None
    base_version: int | None
    snapshot_id: str | None
    intervention_id: str | None = None
    payload_hash: str | None = None
    reason: str | None = None
    outcome: str
    prev_hash: str
    hash: str


class AuditLog(BaseModel):
    job_id: str
    entries: list[AuditEntry]
    head: str | None


class Finding(BaseModel):
    job_id: str
    source: str  # "redis" | "archive"
    position: int  # 1-based: the first entry that does not verify (entries + 1: entries missing at the end)
    seq: int | None
    reason: str


class Verification(BaseModel):
    checked: int  # jobs
    copies: int  # chains verified (a job archived while Redis still holds it has two)
    broken: list[Finding]
    next_after: str | None  # with all=true: the job id to continue after, None when every job was checked


def _body(found: dict[str, Any]) -> AuditLog:
    return AuditLog(job_id=found["job_id"], entries=found["entries"], head=found["head"])


async def _archived_log(archive: Archive | None, job_id: str) -> dict[str, Any] | None:
    if archive is None:
        return None
    from hitl_review.archive import reads

    return await asyncio.to_thread(reads.audit, archive, job_id)


async def _all_job_ids(store: Store, archive: Archive | None, after: str, limit: int) -> tuple[list[str], str | None]:
    """Every job id Redis or the archive holds, in order, ``limit`` at most after ``after``."""
    ids: set[str] = set()
    for p in range(keys.PARTITIONS):
        ids.update(await store.r.zrange(keys.jobs(p), 0, -1))
    if archive is not None:
        from hitl_review.archive import reads

        ids.update(await asyncio.to_thread(reads.job_ids, archive))
    ordered = sorted(i for i in ids if i > after)
    page = ordered[:limit]
    return page, (page[-1] if len(ordered) > limit else None)


async def verify_job(store: Store, archive: Archive | None, job_id: str) -> tuple[int, list[Finding]]:
    """Verify each copy of ``job_id``'s chain: (copies verified, findings). With both copies intact,
    the archive's must also be where Redis's begins (entries may follow it: a late report), so a
    live chain rewritten and re-hashed end to end still disagrees with the copy written earlier."""
    copies, found = 0, []
    logs = {"redis": await store.audit(job_id), "archive": await _archived_log(archive, job_id)}
    for source, log_ in logs.items():
        if log_ is None:
            continue
        copies += 1
        b = audit.verify(log_["entries"], log_["head"], log_.get("head_seq"))
        if b is not None:
            other = logs["archive" if source == "redis" else "redis"]
            why = b.reason + _fields_apart(log_["entries"], other, b.position)
            found.append(Finding(job_id=job_id, source=source, position=b.position, seq=b.seq, reason=why))
    live, kept = logs["redis"], logs["archive"]
    if not found and live is not None and kept is not None:
        found.extend(_disagreement(job_id, live["entries"], kept["entries"]))
    return copies, found


def _fields_apart(entries: list[dict[str, Any]], other: dict[str, Any] | None, position: int) -> str:
    """For a broken entry, the fields in which it differs from the other copy's entry of the same
    ``seq`` (an edited ``role`` or ``payload_hash`` is named, not only its entry); "" when none is known."""
    if other is None or not 0 < position <= len(entries):
        return ""
    mine = entries[position - 1]
    theirs = next((e for e in other["entries"] if e.get("seq") == mine.get("seq")), None)
    if theirs is None:
        return ""
    apart = [f for f in audit.FIELDS if f not in ("prev_hash", "hash") and mine.get(f) != theirs.get(f)]
    return f"; differs from the other copy in {', '.join(apart)}" if apart else ""


def _disagreement(job_id: str, live: list[dict[str, Any]], kept: list[dict[str, Any]]) -> list[Finding]:
    """The first entry where Redis's chain leaves the archive's copy, if any."""
    for i, (a, b) in enumerate(zip(live, kept, strict=False), start=1):
        if a["hash"] != b["hash"]:
            why = "differs from the archive's copy of this entry (the live chain was rewritten)"
            return [Finding(job_id=job_id, source="redis", position=i, seq=a["seq"], reason=why)]
    if len(live) < len(kept):
        why = f"{len(live)} entries, the archive holds {len(kept)} (entries removed)"
        return [Finding(job_id=job_id, source="redis", position=len(live) + 1, seq=None, reason=why)]
    return []


def add_audit_routes(
    app: FastAPI,
    store_of: Callable[[], Store],
    archive_of: Callable[[], Archive | None],
    located: Callable[[Request, str], Awaitable[tuple[Any, Any]]],
) -> None:
    @app.get(f"{API}/jobs/{{job_id}}/audit", response_model=AuditLog, responses={404: {}})
    async def job_audit(request: Request, job_id: str) -> AuditLog:
        """The job's audit log, oldest first, and its head (docs/protocol.md § Audit)."""
        _snap, view = await located(request, job_id)  # 404 and the submitter's own jobs, as GET /jobs/{id}
        found = await store_of().audit(job_id) if view is None else await _archived_log(archive_of(), job_id)
        if found is None:  # expired from Redis between the two reads: the archive has it by now
            found = await _archived_log(archive_of(), job_id)
        if found is None:
            raise errors.JobNotFound(f"job {job_id} not found", job_id=job_id)
        return _body(found)

    @app.get(f"{API}/admin/audit/verify", response_model=Verification, responses={400: {}})
    async def verify(
        request: Request,
        job_id: Annotated[list[str] | None, Query(max_length=1000)] = None,
        all_jobs: bool = Query(default=False, alias="all"),
        after: str = Query(default="", max_length=64),
        limit: int = Query(default=VERIFY_LIMIT, ge=1, le=VERIFY_LIMIT),
    ) -> Verification:
        """Verify the chains of the jobs named (``job_id``, repeatable) or of every job (``all=true``,
        ``limit`` per call from ``after``): each copy there is, Redis's and the archive's."""
        if not job_id and not all_jobs:
            raise errors.InvalidRequest("name jobs with job_id=… (repeatable) or ask for all=true", field="job_id")
        store, archive = store_of(), archive_of()
        nxt = None
        ids = list(job_id or [])
        if all_jobs:
            ids, nxt = await _all_job_ids(store, archive, after, limit)
        copies, broken = 0, []
        for jid in ids:
            n, found = await verify_job(store, archive, jid)
            if n == 0 and not all_jobs:
                raise errors.JobNotFound(f"job {jid} not found (neither Redis nor the archive holds it)", job_id=jid)
            copies += n
            broken.extend(found)
        if broken:
            log.error("audit: %d broken chain(s), first: %s", len(broken), broken[0].model_dump())
        return Verification(checked=len(ids), copies=copies, broken=broken, next_after=nxt)
