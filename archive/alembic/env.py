"""Alembic's environment for the archive: configured by ``archive.migrate`` (no alembic.ini), on
the connection it hands over in ``config.attributes["connection"]`` (docs/archive.md § Migrations)."""

from __future__ import annotations

from alembic import context

from hitl_review.archive.schema import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run the archive's migrations through archive.migrate.upgrade(url)")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
)
with context.begin_transaction():
    context.run_migrations()
