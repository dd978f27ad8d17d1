"""Opening the archive: the URL (``HITL_ARCHIVE_URL``, else ``<data-dir>/archive.sqlite3``), the engine
and its transactions (docs/archive.md § Databases).

SQLite: WAL, a busy timeout, and every transaction begun with ``BEGIN IMMEDIATE``, so two archivers
serialize on the write lock at the start instead of failing to upgrade a read lock half-way.
PostgreSQL: ``postgresql://`` is read as psycopg 3 (``postgresql+psycopg://``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

ENV_URL = "HITL_ARCHIVE_URL"
SQLITE_NAME = "archive.sqlite3"
READ_ONLY = "hitl_read_only"  # an execution option: this transaction only reads


def archive_url(data_dir: str | Path | None = None, url: str | None = None) -> str:
    """``url``, else ``HITL_ARCHIVE_URL``, else the SQLite file in the data directory (``.hitl``)."""
    chosen = url or os.environ.get(ENV_URL)
    if chosen:
        return normalize_url(chosen)
    base = Path(data_dir or os.environ.get("HITL_DATA_DIR") or ".hitl").resolve()
    return f"sqlite:///{base / SQLITE_NAME}"


def normalize_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 (the only PostgreSQL driver installed)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str, **kw: Any) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kw)
        _sqlite_immediate(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, **kw)


def _sqlite_immediate(engine: Engine) -> None:
    """pysqlite's own transaction handling off; ours begins every transaction IMMEDIATE (the
    SQLAlchemy documentation's recipe for serializable SQLite)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # Readers (``Archive.reading``) take no write lock: WAL gives them a snapshot as it is.
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")


class Archive:
    """One archive database: an engine and its sessions. ``Archive.open(url)`` checks nothing about
    the schema; run :func:`archive.migrate.upgrade` first (``hitl`` does it at start)."""

    def __init__(self, url: str, **engine_kw: Any) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, **engine_kw)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._readers = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One session in one transaction: committed on success, rolled back on any exception."""
        with self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """One read-only transaction (a consistent view of one job's rows)."""
        with self._readers() as session, session.begin():
            yield session

    def close(self) -> None:
        self.engine.dispose()
