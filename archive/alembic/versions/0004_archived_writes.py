"""What a finished job's writes are answered from once Redis forgot it (docs/protocol.md § Archive):
the creation's fingerprint, found by submitter and ``Idempotency-Key`` (a rerun ``hitl submit`` after
the retention replays instead of creating every job again), and the job's intervention records
(a replayed ``intervention_id`` answers as it did). Jobs archived before this revision have neither:
their creation compares on the snapshot's image alone, and their interventions have no record.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("archived_jobs", sa.Column("create_hash", sa.String(100)))
    op.add_column("archived_jobs", sa.Column("interventions", sa.JSON))
    op.create_index("ix_archived_jobs_submitter_idem_key", "archived_jobs", ["submitter", "idem_key"])


def downgrade() -> None:
    op.drop_index("ix_archived_jobs_submitter_idem_key", table_name="archived_jobs")
    with op.batch_alter_table("archived_jobs") as t:  # batch: SQLite rebuilds the table to drop columns
        t.drop_column("interventions")
        t.drop_column("create_hash")
