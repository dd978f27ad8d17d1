"""What a live job's mirror row carries besides its meta and pauses (docs/protocol.md § Reconcile): the
records that answer a retry after Redis lost the job — its intervention and vote records (a retried
``intervention_id`` answers as it did) and its creation record (a retried ``Idempotency-Key`` names the
same job) — and the creation's submitter and key as columns, so a retried creation finds the row.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("live_mirror") as t:  # batch: SQLite rebuilds the table, PostgreSQL alters it
        t.add_column(sa.Column("records", sa.JSON, nullable=True))
        t.add_column(sa.Column("submitter", sa.String(64), nullable=True))
        t.add_column(sa.Column("idem_key", sa.String(300), nullable=True))
    op.create_index("ix_live_mirror_submitter_idem_key", "live_mirror", ["submitter", "idem_key"])


def downgrade() -> None:
    op.drop_index("ix_live_mirror_submitter_idem_key", table_name="live_mirror")
    with op.batch_alter_table("live_mirror") as t:
        t.drop_column("idem_key")
        t.drop_column("submitter")
        t.drop_column("records")
