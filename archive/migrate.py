"""Schema migrations of the archive through Alembic (docs/archive.md § Migrations): ``upgrade(url)``
brings a database, empty or older, to the newest revision; ``schema_version(url)`` reports where
it is. ``hitl`` runs the upgrade before it writes; ``hitl admin archive-upgrade`` runs it alone.

Every replica that opens the archive upgrades it as it starts, so on a cluster several processes call
:func:`upgrade` at once (and a Kubernetes Job, deploy/kuberay/archive-migrate.yaml, may too): on
PostgreSQL the upgrade's transaction first takes an advisory lock (``pg_advisory_xact_lock``,
released at its commit or rollback), so one process migrates and the others, waiting, find the
schema at head and do nothing. SQLite's ``BEGIN IMMEDIATE`` (archive.db) serializes them the same way."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from .db import archive_url, make_engine
from .options import add_upgrade_arguments

SCRIPTS = Path(__file__).resolve().parent / "alembic"
# The advisory lock every upgrade of a PostgreSQL archive holds (one number, the same in every process
# and every build: the bytes of "hitl-arc" as a signed 64-bit integer).
LOCK_KEY = int.from_bytes(b"hitl-arc", "big", signed=True)


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    return cfg


def head() -> str:
    """The newest revision this build knows."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None, "the archive has no migrations"
    return revision


def upgrade(url: str | None = None, revision: str = "head") -> str:
    """Migrate the archive at ``url`` (default: :func:`archive.db.archive_url`) to ``revision``;
    returns the schema version it is at afterwards. Idempotent; safe on an empty database."""
    engine = make_engine(archive_url(url=url))
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # one upgrade at a time; the others wait, then find it done
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
            cfg = _config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        with engine.connect() as conn:
            version = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    assert version is not None
    return version


def schema_version(url: str | None = None) -> str | None:
    """The revision the archive at ``url`` is at; None for a database never migrated."""
    engine = make_engine(archive_url(url=url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def _missing_sqlite(url: str) -> str | None:
    """The path of a SQLite archive file that does not exist (None: not SQLite, or there)."""
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[-1]
    return path if path and path != ":memory:" and not Path(path).exists() else None


def not_ready(url: str) -> str | None:
    """Why the archive at ``url`` cannot be read by this build (None: it can): a SQLite file that
    does not exist (checked before connecting, which would create it), a database never migrated,
    or one at another revision than this build's."""
    url = archive_url(url=url)
    if path := _missing_sqlite(url):
        return f"no archive at {path} (a server writes it as jobs finish)"
    version = schema_version(url)
    if version is None:
        return "the archive has no schema yet: run `hitl admin archive-upgrade`"
    if version != head():
        return f"the archive's schema is {version}, this build's {head()}: run `hitl admin archive-upgrade`"
    return None


def run(args: argparse.Namespace) -> int:
    """``hitl admin archive-upgrade`` with parsed arguments (archive.cli): migrate, or with
    ``--check`` only report (exit 1 when the archive is behind this build)."""
    url = archive_url(args.data_dir, args.archive_url)
    if args.check and (missing := _missing_sqlite(url)):  # connecting would create the file: --check changes nothing
        print(f"archive schema_version=None head={head()} (no archive at {missing})")
        return 1
    before = schema_version(url)
    if args.check:
        print(f"archive schema_version={before} head={head()}")
        return 0 if before == head() else 1
    after = upgrade(url)
    print(f"archive schema_version={after} (was {before})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``hitl admin archive-upgrade ARGS`` (archive.options)."""
    return run(add_upgrade_arguments(argparse.ArgumentParser(prog="hitl admin archive-upgrade")).parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
