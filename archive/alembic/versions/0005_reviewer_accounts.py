"""Reviewer accounts added at run time, copied from Redis (name, role, the SHA-256 of the token): what a
Redis that came back empty gets them from again (docs/protocol.md § Reviewer accounts).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reviewer_accounts",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("added_at", sa.String(40), nullable=False),
        sa.Column("added_by", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reviewer_accounts")
