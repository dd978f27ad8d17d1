"""The live mirror: live jobs as Redis last held them, for ``hitl admin reconcile``.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "live_mirror",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(40), nullable=False),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("pauses", sa.JSON, nullable=False),
        sa.Column("mirrored_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_live_mirror_status", "live_mirror", ["status"])


def downgrade() -> None:
    op.drop_index("ix_live_mirror_status", table_name="live_mirror")
    op.drop_table("live_mirror")
