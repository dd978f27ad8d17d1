"""Audit entries' intent (docs/protocol.md § Audit): the token's role, the user a trusted proxy named, an
intervention's id and payload hash, the node a model step ran, a cancel's reason. One JSON column,
NULL for an entry without them (every entry archived before this revision), as the chain hashes them:
only when set.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_entries") as t:  # batch: SQLite rebuilds the table, PostgreSQL alters it
        t.add_column(sa.Column("intent", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_entries") as t:
        t.drop_column("intent")
