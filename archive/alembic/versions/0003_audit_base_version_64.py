"""Audit entries' ``base_version`` as a 64-bit integer: a refused intervention records the version the
reviewer sent, which may be any integer up to 2**63 - 1 (docs/protocol.md § Audit).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_entries") as t:  # batch: SQLite rebuilds the table, PostgreSQL alters it
        t.alter_column("base_version", type_=sa.BigInteger, existing_type=sa.Integer, existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("audit_entries") as t:
        t.alter_column("base_version", type_=sa.Integer, existing_type=sa.BigInteger, existing_nullable=True)
