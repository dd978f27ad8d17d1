"""Copying one finished job from Redis into the archive (docs/archive.md § Archiver).

The copy is an idempotent upsert keyed by the job id and how far the job had got: its ``version``,
then its last event id and audit sequence (a finished job keeps its version but may still gain
events, such as a ``REPORT_IGNORED`` for a late report, and audit entries). A copy replaces the
archived one only when it is further along; an equal copy changes nothing; an older one never
replaces a newer. Everything for one job is written in one database transaction: a copy
interrupted half-way (the process killed, the connection lost) leaves the previous state.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from hitl_review.statecore import audit, keys
from hitl_review.statecore.decide import job_fingerprint
from hitl_review.statecore.errors import JobNotFound
from hitl_review.statecore.ids import batch_of
from hitl_review.statecore.models import Event, JobResults, JobSnapshot, Pause
from hitl_review.statecore.states import is_terminal
from hitl_review.statecore.store import Store

from .db import Archive
from .schema import AUDIT_FIELDS, ArchivedEvent, ArchivedJob, ArchivedPause, ArtifactRef, AuditEntry

Outcome = Literal["INSERTED", "REPLACED", "UNCHANGED", "OLDER"]
ATTEMPTS = 5  # two first copies of one job racing: the loser's insert fails, it re-reads and yields


class NotFinished(Exception):
    """Only finished jobs are archived (a live job's record is Redis)."""


@dataclass(frozen=True)
class JobRecord:
    """Everything archived for one job, read from Redis: the API's bodies as plain JSON."""

    job_id: str
    version: int
    submitter: str
    idem_key: str | None
    snapshot: dict[str, Any]
    results: dict[str, Any]
    pauses: list[dict[str, Any]]
    events: list[Event]
    audit: list[dict[str, Any]]
    create_hash: str | None = None  # what a creation replay must match (statecore.decide.create_fingerprint)
    interventions: dict[str, str] | None = None  # the job's intervention records, as Redis kept them

    @property
    def progress(self) -> tuple[int, int, int]:
        return (self.version, self.events[-1].id if self.events else 0, _last_seq(self.audit))

    @property
    def finished_at(self) -> str:
        finished = [e.at for e in self.events if e.type == "JOB_FINISHED"]
        return finished[0] if finished else str(self.snapshot["updated_at"])


def _last_seq(audit: Sequence[Mapping[str, Any]]) -> int:
    return int(audit[-1]["seq"]) if audit else 0


async def read_job(store: Store, job_id: str) -> JobRecord:
    """The finished job as the API would answer for it now, its audit log included
    (docs/protocol.md § Audit), and what its writes are answered from once Redis forgot it: the
    creation's fingerprint and the intervention records (docs/protocol.md § Archive)."""
    state = await store.get(job_id)
    if not is_terminal(state.status):
        raise NotFinished(f"job {job_id} is {state.status.value}; only finished jobs are archived")
    snapshot = await store.snapshot_of(state)
    results = JobResults(job_id=job_id, status=state.status, reason_code=state.reason_code, subjects=state.results)
    pauses = await store.pause_history(job_id)
    events = await store.events_after(job_id, 0)
    log = await audit.read(store.r, job_id)
    recorded: dict[str, str] = await store.r.hgetall(keys.job(job_id).idem)
    return JobRecord(
        job_id=job_id,
        version=state.version,
        submitter=state.submitter,
        idem_key=state.idem_key or None,
        snapshot=snapshot.model_dump(mode="json"),
        results=results.model_dump(mode="json"),
        pauses=[p.model_dump(mode="json") for p in pauses],
        events=events,
        audit=[
            {**{k: e.get(k) for k in AUDIT_FIELDS}, "intent": audit.intent_of(e)}
            for e in (log or {}).get("entries", [])
        ],
        create_hash=job_fingerprint(state) if state.idem_key else None,
        interventions=recorded or None,
    )


@dataclass(frozen=True)
class Copied:
    """How a copy ended, and how far the job had got in it: what an acknowledgement to Redis names
    (docs/archive.md § Still to wire: the keys expire only once the archive holds this far)."""

    outcome: Outcome
    version: int
    last_event_id: int
    audit_seq: int


async def copy_job(
    store: Store,
    archive: Archive,
    job_id: str,
    *,
    on_written: Callable[[], None] | None = None,
) -> Copied:
    """Copy the finished job ``job_id`` from Redis into ``archive`` (see the module's docstring).
    ``on_written`` runs after the rows are written and before the commit (the crash tests stop
    the process there)."""
    record = await read_job(store, job_id)
    outcome = await asyncio.to_thread(write_record, archive, record, on_written)
    return Copied(outcome, *record.progress)


async def archive_job(
    store: Store,
    archive: Archive,
    job_id: str,
    *,
    on_written: Callable[[], None] | None = None,
) -> Outcome:
    """:func:`copy_job`, answering only how it ended."""
    return (await copy_job(store, archive, job_id, on_written=on_written)).outcome


async def archive_finished(store: Store, archive: Archive, *, page: int = 200) -> Counter[str]:
    """Copy every finished job Redis still holds (a catch-up: jobs finished before the archive was
    configured, or whose archive command was lost). Returns how many copies ended how; ``GONE``
    counts jobs that expired between the listing and the copy."""
    outcomes: Counter[str] = Counter()
    cursor: str | None = None
    while True:
        jobs, cursor = await store.list_jobs(limit=page, cursor=cursor)
        for summary in jobs:
            if not is_terminal(summary.status):
                continue
            try:
                outcomes[await archive_job(store, archive, summary.job_id)] += 1
            except JobNotFound:
                outcomes["GONE"] += 1
        if cursor is None:
            return outcomes


def write_record(archive: Archive, record: JobRecord, on_written: Callable[[], None] | None = None) -> Outcome:
    """The upsert of one job's record in one transaction (retried when a concurrent first copy won)."""
    for attempt in range(ATTEMPTS):
        try:
            with archive.transaction() as session:
                return _upsert(session, record, on_written)
        except (IntegrityError, OperationalError):
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _upsert(session: Session, record: JobRecord, on_written: Callable[[], None] | None) -> Outcome:
    existing = session.execute(
        select(ArchivedJob).where(ArchivedJob.job_id == record.job_id).with_for_update()
    ).scalar_one_or_none()
    if existing is not None:
        have = (existing.version, existing.last_event_id, existing.audit_seq)
        if have == record.progress:
            return "UNCHANGED"
        if have > record.progress:
            return "OLDER"
        for table in (ArchivedPause, ArchivedEvent, AuditEntry, ArtifactRef):
            session.execute(delete(table).where(table.job_id == record.job_id))
        _fill_job(existing, record)
    else:
        job = ArchivedJob(job_id=record.job_id)
        _fill_job(job, record)
        session.add(job)
    session.flush()  # the job's own row (inserted or replaced) before its children
    connection = session.connection()
    for table, rows in _children(record).items():
        if rows:  # one Core executemany a table: the ORM's unit of work cost ~0.2 ms a row
            connection.execute(insert(table.__table__), rows)
    if on_written is not None:
        on_written()
    return "INSERTED" if existing is None else "REPLACED"


def _fill_job(job: ArchivedJob, r: JobRecord) -> None:
    job.version, job.last_event_id, job.audit_seq = r.progress
    job.status = str(r.snapshot["status"])
    job.reason_code = r.snapshot.get("reason_code")
    job.submitter = r.submitter
    job.idem_key = r.idem_key
    job.batch = batch_of(r.idem_key)
    job.created_at = str(r.snapshot["created_at"])
    job.finished_at = r.finished_at
    job.finished_ts = parse_iso(r.finished_at)
    job.archived_at = datetime.now(UTC)
    job.snapshot = r.snapshot
    job.results = r.results
    job.create_hash = r.create_hash
    job.interventions = r.interventions


def _children(r: JobRecord) -> dict[type[Any], list[dict[str, Any]]]:
    """The job's child rows, by table, as the column values an ``INSERT`` takes."""
    pauses = []
    for i, p in enumerate(r.pauses):
        pause = Pause.model_validate(p)
        pauses.append(
            {
                "job_id": r.job_id,
                "pause_token": pause.pause_token,
                "position": i,
                "status": pause.status,
                "stage": pause.stage,
                "round": pause.round,
                "base_version": pause.base_version,
                "created_at": pause.created_at,
                "body": p,
            }
        )
    return {
        ArchivedPause: pauses,
        ArchivedEvent: [
            {"job_id": r.job_id, "event_id": e.id, "type": e.type, "version": e.version, "at": e.at, "data": e.data}
            for e in r.events
        ],
        AuditEntry: [{"job_id": r.job_id, **{k: a.get(k) for k in (*AUDIT_FIELDS, "intent")}} for a in r.audit],
        ArtifactRef: [
            {"job_id": r.job_id, "position": i, "name": name, "kind": kind, "box_id": box_id, "url": url}
            for i, (kind, name, box_id, url) in enumerate(artifact_refs(r.snapshot, r.results))
        ],
    }


def artifact_refs(snapshot: Mapping[str, Any], results: Mapping[str, Any]) -> list[tuple[str, str, str | None, str]]:
    """(kind, name, box_id, url) of every blob the job refers to: its image, then each subject's
    mask and cut-out."""
    refs: list[tuple[str, str, str | None, str]] = []
    image_url = JobSnapshot.model_validate(snapshot).image.url
    refs.append(("image", artifact_name(image_url), None, image_url))
    for s in results.get("subjects", []):
        for kind in ("mask", "cutout"):
            url = s.get(f"{kind}_url")
            if url:
                refs.append((kind, artifact_name(url), s["box_id"], url))
    return refs


def artifact_name(url: str) -> str:
    """``/api/v1/artifacts/<name>`` → ``<name>`` (statecore.artifacts names blobs by content)."""
    return url.rsplit("/", 1)[-1]


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
