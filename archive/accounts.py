"""The archive's copy of the reviewer accounts added at run time (``schema.ReviewerAccount``): written
when an account is added or removed (``serve_app.routes.reviewer_routes``), read when Redis lost them
(``serve_app.recovery.recovery``). Synchronous, as the rest of the archive: an async caller goes through
``asyncio.to_thread``."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select

from .db import Archive
from .schema import ReviewerAccount


@dataclass(frozen=True)
class KeptAccount:
    """An account as the archive keeps it: what ``statecore.accounts.restore`` writes back to Redis."""

    name: str
    role: str
    token_hash: str
    added_at: str
    added_by: str


def save(archive: Archive, kept: KeptAccount) -> None:
    """Keep ``kept`` (an account of that name kept before is replaced: the name was removed and added again)."""
    with archive.transaction() as s:
        s.execute(delete(ReviewerAccount).where(ReviewerAccount.name == kept.name))
        s.add(ReviewerAccount(**kept.__dict__))


def forget(archive: Archive, name: str) -> None:
    """The account named ``name`` removed: its token must not come back with a restore."""
    with archive.transaction() as s:
        s.execute(delete(ReviewerAccount).where(ReviewerAccount.name == name))


def load_all(archive: Archive) -> list[KeptAccount]:
    """Every account kept, by name."""
    with archive.reading() as s:
        rows = s.scalars(select(ReviewerAccount).order_by(ReviewerAccount.name)).all()
        return [KeptAccount(r.name, r.role, r.token_hash, r.added_at, r.added_by) for r in rows]
