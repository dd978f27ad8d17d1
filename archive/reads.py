"""Reading a job back from the archive with the API's own bodies (docs/archive.md § Reads), for the
routes to answer from when Redis no longer holds the job: ``GET /jobs/{id}`` (``job(...).snapshot``),
``/results``, ``/events`` (the history; the stream ends after its ``JOB_FINISHED``) and ``/audit``;
and what the writes answer a forgotten job with (``serve_app.recovery.archived_writes``): the creation under
a submitter's ``Idempotency-Key`` (:func:`creation`) and a recorded intervention
(:func:`intervention_record`).

Every function returns None for a job the archive does not hold; the route then answers 404.
The archive's engine is synchronous: an async route calls these through ``asyncio.to_thread``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from hitl_review.statecore import audit as statecore_audit
from hitl_review.statecore.jobstate import JobState
from hitl_review.statecore.models import Event, JobResults, JobSnapshot, Pause
from hitl_review.statecore.states import TERMINAL

from .db import Archive
from .schema import AUDIT_FIELDS, ArchivedEvent, ArchivedJob, ArchivedPause, AuditEntry, LiveMirror

log = logging.getLogger("hitl.archive")

TERMINAL_STATUSES = frozenset(t.value for t in TERMINAL)


@dataclass(frozen=True)
class ArchivedView:
    """A finished job as the archive holds it; ``submitter`` for the routes' visibility rule
    (a submitter sees only its own jobs)."""

    job_id: str
    submitter: str
    version: int
    snapshot: JobSnapshot
    results: JobResults | None


def job(archive: Archive, job_id: str) -> ArchivedView | None:
    """The archived job, else a job whose live mirror row says it ended (it finished, and Redis lost
    it before the archive took its copy: its row is the record, docs/protocol.md § Redis outages)."""
    with archive.reading() as s:
        row = s.get(ArchivedJob, job_id)
        if row is None:
            return _ended_in_mirror(s.get(LiveMirror, job_id))
        return ArchivedView(
            job_id=row.job_id,
            submitter=row.submitter,
            version=row.version,
            snapshot=JobSnapshot.model_validate(row.snapshot),
            results=JobResults.model_validate(row.results) if row.results is not None else None,
        )


def _ended_in_mirror(row: LiveMirror | None) -> ArchivedView | None:
    """The view of a finished job from its mirror row (meta as Redis last held it), or None."""
    if row is None or row.status not in TERMINAL_STATUSES:
        return None
    state = JobState.from_meta(dict(row.meta))
    snap = state.snapshot()
    results = JobResults(job_id=row.job_id, status=state.status, reason_code=state.reason_code, subjects=state.results)
    return ArchivedView(
        job_id=row.job_id, submitter=state.submitter, version=state.version, snapshot=snap, results=results
    )


def lookup(archive: Archive, job_id: str) -> ArchivedView | None:
    """:func:`job` for a route's fallback: an archive that cannot be read (the database down, the
    network cut) answers like one without the job, with a warning in the log, so a request for a
    job Redis does not hold is a 404 rather than a 500 (docs/archive.md § Reads)."""
    try:
        return job(archive, job_id)
    except SQLAlchemyError as e:
        log.warning("archive read failed job=%s: %s: %s", job_id, type(e).__name__, e)
        return None


@dataclass(frozen=True)
class ArchivedCreation:
    """What a replay of ``POST /jobs`` is answered from once Redis forgot the job: the job, what
    the creation is compared on (``statecore.decide.create_fingerprint``) and the snapshot a
    conflict carries."""

    job_id: str
    fingerprint: str
    snapshot: dict[str, Any]


def creation(archive: Archive, submitter: str, idem_key: str) -> ArchivedCreation | None:
    """The archived job ``submitter`` created under ``idem_key`` (the first, should there be two: a
    key rerun before the archive answered replays created another). A job archived before its
    fingerprint was kept (migration 0004) compares on its image alone, as a one-reviewer job."""
    with archive.reading() as s:
        row = s.execute(
            select(ArchivedJob.job_id, ArchivedJob.create_hash, ArchivedJob.snapshot)
            .where(ArchivedJob.submitter == submitter, ArchivedJob.idem_key == idem_key)
            .order_by(ArchivedJob.created_at, ArchivedJob.job_id)
            .limit(1)
        ).first()
    if row is None:
        return None
    job_id, create_hash, snap = row
    return ArchivedCreation(job_id, create_hash or str(snap["image"]["sha256"]), snap)


@dataclass(frozen=True)
class MirroredCreation:
    """A creation the live mirror holds (the job Redis lost, or not yet archived): its job, whether
    the job ended, and the creation record as Redis kept it (``job_id``, ``image_sha`` — the
    fingerprint — and ``response``), None for a row written before revision 0007."""

    job_id: str
    ended: bool
    record: dict[str, str] | None
    view: ArchivedView | None  # the finished job's view (from its row), for a 409's snapshot


def mirrored_creation(archive: Archive, submitter: str, idem_key: str) -> MirroredCreation | None:
    """The job ``submitter`` created under ``idem_key`` as the live mirror holds it, or None."""
    with archive.reading() as s:
        row = s.scalars(
            select(LiveMirror)
            .where(LiveMirror.submitter == submitter, LiveMirror.idem_key == idem_key)
            .order_by(LiveMirror.job_id)
            .limit(1)
        ).first()
        if row is None:
            return None
        record = (row.records or {}).get("create")
        view = _ended_in_mirror(row)
        return MirroredCreation(row.job_id, view is not None, dict(record) if record else None, view)


def intervention_record(archive: Archive, job_id: str, intervention_id: str) -> str | None:
    """The job's record of ``intervention_id`` as Redis kept it (payload hash, a newline, the
    response), or None."""
    with archive.reading() as s:
        recorded = s.scalar(select(ArchivedJob.interventions).where(ArchivedJob.job_id == job_id))
        if recorded is None:  # not archived: the live mirror's records (a finished job Redis lost first)
            records = s.scalar(select(LiveMirror.records).where(LiveMirror.job_id == job_id))
            recorded = (records or {}).get("idem")
    return (recorded or {}).get(intervention_id)


def snapshot(archive: Archive, job_id: str) -> JobSnapshot | None:
    view = job(archive, job_id)
    return view.snapshot if view else None


def results(archive: Archive, job_id: str) -> JobResults | None:
    view = job(archive, job_id)
    return view.results if view else None


def events(archive: Archive, job_id: str, after: int = 0) -> list[Event] | None:
    """The job's events with id > ``after``, oldest first (as ``Store.events_after``)."""
    with archive.reading() as s:
        if s.get(ArchivedJob, job_id) is None:
            return None
        rows = s.scalars(
            select(ArchivedEvent)
            .where(ArchivedEvent.job_id == job_id, ArchivedEvent.event_id > after)
            .order_by(ArchivedEvent.event_id)
        )
        return [Event(id=e.event_id, type=e.type, job_id=job_id, version=e.version, at=e.at, data=e.data) for e in rows]


def pause_history(archive: Archive, job_id: str) -> list[Pause] | None:
    with archive.reading() as s:
        if s.get(ArchivedJob, job_id) is None:
            return None
        rows = s.scalars(select(ArchivedPause).where(ArchivedPause.job_id == job_id).order_by(ArchivedPause.position))
        return [Pause.model_validate(p.body) for p in rows]


def audit(archive: Archive, job_id: str) -> dict[str, Any] | None:
    """``GET /jobs/{id}/audit``'s body: ``{"job_id", "entries" (oldest first), "head"}``, where
    ``head`` is the last entry's hash (None without entries) (docs/protocol.md § Audit)."""
    with archive.reading() as s:
        job = s.get(ArchivedJob, job_id)
        if job is None:
            return None
        rows = s.scalars(select(AuditEntry).where(AuditEntry.job_id == job_id).order_by(AuditEntry.seq))
        entries = [statecore_audit.shown({k: getattr(r, k) for k in AUDIT_FIELDS}, r.intent) for r in rows]
        head_seq = job.audit_seq
    # head_seq: how many entries the copy held (the verifier's check that none were removed at the end)
    head = entries[-1]["hash"] if entries else None
    return {"job_id": job_id, "entries": entries, "head": head, "head_seq": head_seq}


def job_ids(archive: Archive) -> list[str]:
    """Every archived job's id (``hitl admin verify-audit --all``)."""
    with archive.reading() as s:
        return list(s.scalars(select(ArchivedJob.job_id)))
