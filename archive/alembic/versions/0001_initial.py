"""The first schema: finished jobs, their pauses, events, audit entries and artifact references.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ISO = sa.String(40)


def _job_fk() -> sa.Column[str]:
    return sa.Column(
        "job_id", sa.String(64), sa.ForeignKey("archived_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )


def upgrade() -> None:
    op.create_table(
        "archived_jobs",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("last_event_id", sa.Integer, nullable=False),
        sa.Column("audit_seq", sa.Integer, nullable=False),
        sa.Column("status", sa.String(40), nullable=False),
        sa.Column("reason_code", sa.String(80)),
        sa.Column("submitter", sa.String(200), nullable=False),
        sa.Column("idem_key", sa.String(300)),
        sa.Column("batch", sa.String(200)),
        sa.Column("created_at", ISO, nullable=False),
        sa.Column("finished_at", ISO, nullable=False),
        sa.Column("finished_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("snapshot", sa.JSON, nullable=False),
        sa.Column("results", sa.JSON),
    )
    op.create_index("ix_archived_jobs_status", "archived_jobs", ["status"])
    op.create_index("ix_archived_jobs_submitter", "archived_jobs", ["submitter"])
    op.create_index("ix_archived_jobs_batch", "archived_jobs", ["batch"])
    op.create_index("ix_archived_jobs_finished_ts", "archived_jobs", ["finished_ts"])
    op.create_table(
        "archived_pauses",
        _job_fk(),
        sa.Column("pause_token", sa.String(128), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("stage", sa.String(40), nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("base_version", sa.Integer, nullable=False),
        sa.Column("created_at", ISO, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )
    op.create_table(
        "archived_events",
        _job_fk(),
        sa.Column("event_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("type", sa.String(60), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("at", ISO, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
    )
    op.create_table(
        "audit_entries",
        _job_fk(),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("at", ISO, nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(80), nullable=False),
        sa.Column("base_version", sa.Integer),
        sa.Column("snapshot_id", sa.String(128)),
        sa.Column("outcome", sa.String(120), nullable=False),
        sa.Column("prev_hash", sa.String(128)),
        sa.Column("hash", sa.String(128), nullable=False),
    )
    op.create_table(
        "artifact_refs",
        _job_fk(),
        sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("box_id", sa.String(64)),
        sa.Column("url", sa.String(300), nullable=False),
    )
    op.create_index("ix_artifact_refs_name", "artifact_refs", ["name"])


def downgrade() -> None:
    for table in ("artifact_refs", "audit_entries", "archived_events", "archived_pauses"):
        op.drop_table(table)
    for index in ("finished_ts", "batch", "submitter", "status"):
        op.drop_index(f"ix_archived_jobs_{index}", "archived_jobs")
    op.drop_table("archived_jobs")
