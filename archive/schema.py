"""The archive's tables as SQLAlchemy 2 ORM classes (docs/archive.md § Tables). The DDL comes from
the Alembic revisions in ``archive/alembic/versions``; a test checks they agree with these classes.

JSON columns are ``JSON`` (not PostgreSQL's ``JSONB``): JSON keeps the text as written, so a body
read back has its keys in the order the API wrote them (events' ``data`` is a free-form object)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Index, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ISO = String(40)  # the API's "…Z" timestamps, kept as the API spells them


class Base(DeclarativeBase):
    pass


class ArchivedJob(Base):
    """One finished job: the snapshot and the results exactly as ``GET /jobs/{id}`` and
    ``/results`` answer them, plus what filtering and the upsert need as columns, and what the
    job's writes are answered from once Redis forgot it (docs/protocol.md § Archive): the creation's
    fingerprint (a replay of ``POST /jobs`` under its ``Idempotency-Key``, found by submitter and
    key) and the intervention records (a replayed ``intervention_id``)."""

    __tablename__ = "archived_jobs"
    __table_args__ = (Index("ix_archived_jobs_submitter_idem_key", "submitter", "idem_key"),)

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    last_event_id: Mapped[int] = mapped_column(Integer, default=0)
    audit_seq: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(40), index=True)
    reason_code: Mapped[str | None] = mapped_column(String(80))
    submitter: Mapped[str] = mapped_column(String(200), index=True)
    idem_key: Mapped[str | None] = mapped_column(String(300))
    batch: Mapped[str | None] = mapped_column(String(200), index=True)
    created_at: Mapped[str] = mapped_column(ISO)
    finished_at: Mapped[str] = mapped_column(ISO)
    finished_ts: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    archived_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    snapshot: Mapped[dict[str, Any]] = mapped_column(JSON)
    results: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # statecore.decide.create_fingerprint of the creation; None without an Idempotency-Key (0004)
    create_hash: Mapped[str | None] = mapped_column(String(100))
    # intervention id → payload hash + "\n" + response, as Redis kept them (0004)
    interventions: Mapped[dict[str, str] | None] = mapped_column(JSON)


class ArchivedPause(Base):
    __tablename__ = "archived_pauses"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("archived_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    pause_token: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)  # order in the pause history (oldest first)
    status: Mapped[str] = mapped_column(String(20))
    stage: Mapped[str] = mapped_column(String(40))
    round: Mapped[int] = mapped_column(Integer)
    base_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[str] = mapped_column(ISO)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)


class ArchivedEvent(Base):
    __tablename__ = "archived_events"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("archived_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    event_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(60))
    version: Mapped[int] = mapped_column(Integer)
    at: Mapped[str] = mapped_column(ISO)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class AuditEntry(Base):
    """docs/protocol.md § Audit: one entry of a job's hash chain, as the audit route returns it."""

    __tablename__ = "audit_entries"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("archived_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[str] = mapped_column(ISO)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(80))
    base_version: Mapped[int | None] = mapped_column(BigInteger)  # up to 2**63 - 1: migration 0003
    snapshot_id: Mapped[str | None] = mapped_column(String(128))
    outcome: Mapped[str] = mapped_column(String(120))
    prev_hash: Mapped[str | None] = mapped_column(String(128))
    hash: Mapped[str] = mapped_column(String(128))
    # statecore.audit.INTENT fields the entry sets (role, proxy_user, intervention_id, payload_hash,
    # node, reason); NULL when none (0006)
    intent: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class ArtifactRef(Base):
    """A blob a job refers to (the input image, each mask and cut-out): names only, the bytes stay
    in the artifact store."""

    __tablename__ = "artifact_refs"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("archived_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)  # a mask shared by two boxes is two refs
    name: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(20))  # image | mask | cutout
    box_id: Mapped[str | None] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(String(300))


class LiveMirror(Base):
    """A live job as Redis last held it (its meta hash, pause history, intervention and creation
    records), mirrored asynchronously, or before the change is seen under ``--durability strict``
    (docs/protocol.md § Reconcile): what ``hitl admin reconcile`` restores when Redis loses it."""

    __tablename__ = "live_mirror"
    __table_args__ = (Index("ix_live_mirror_submitter_idem_key", "submitter", "idem_key"),)

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(40), index=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    pauses: Mapped[dict[str, Any]] = mapped_column(JSON)
    mirrored_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The records a retry is answered from (0007): {"idem": {intervention_id: record}, "create":
    # {the creation record's fields} | absent}; the creation's submitter and Idempotency-Key, to find it.
    records: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    submitter: Mapped[str | None] = mapped_column(String(64))
    idem_key: Mapped[str | None] = mapped_column(String(300))


class ReviewerAccount(Base):
    """A reviewer account added at run time (``hitl admin reviewers add``), as Redis holds it: its name,
    role and the SHA-256 of its token (never the token). Redis is where it is looked up; this copy is
    what a Redis that came back empty gets the accounts from again (``serve_app.recovery.recovery``), so an
    emptied Redis does not lock the team out (docs/protocol.md § Reviewer accounts)."""

    __tablename__ = "reviewer_accounts"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(20))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    added_at: Mapped[str] = mapped_column(ISO)
    added_by: Mapped[str] = mapped_column(String(200))


# An entry's columns (statecore.audit.LEGACY); the rest of what it shows is in its ``intent``.
AUDIT_FIELDS = ("seq", "at", "actor", "action", "base_version", "snapshot_id", "outcome", "prev_hash", "hash")
