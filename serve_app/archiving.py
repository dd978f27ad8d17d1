"""Finished jobs into the archive (docs/protocol.md § Archive).

A terminal write queues ``ARCHIVE_JOB`` in the job's partition outbox; a dispatcher copies the job
(snapshot, pause history, events, results, artifact references) into the relational archive as an
idempotent upsert (:mod:`archive.archiver`), then acknowledges the copy to Redis, which only then
starts the records' retention. A copy that fell behind (the job gained an event meanwhile) is made
again; a database that is down leaves the command pending (retried, then a dead letter), and the
job's records do not expire meanwhile.

Where the copying runs is an :class:`ArchiveWorker`: in the dispatcher's own process
(:class:`LocalArchiveWorker`: plain uvicorn, tests), or on Ray Serve in the ``Archiver`` deployment
(:mod:`serve_app.archiver_deployment`), so that turning a job into rows never holds the API
replica's interpreter while it answers reviewers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from statecore.errors import JobNotFound

from .config import Settings

if TYPE_CHECKING:
    from archive.db import Archive
    from archive.mirror import Mirror

log = logging.getLogger("hitl.archiving")

ARCHIVE_JOB = "ARCHIVE_JOB"
COPIES = 3  # a job that keeps moving while it is copied (late events): try this often, then later


def _open(url: str) -> Archive:
    from archive import migrate
    from archive.db import Archive

    migrate.upgrade(url)  # creates or upgrades the schema (Alembic); a no-op when at head
    return Archive(url)


async def open_archive(settings: Settings) -> Archive | None:
    """The archive the settings name, its schema at head; None when archiving is off."""
    if not settings.archive:
        return None
    from archive.db import archive_url

    url = archive_url(settings.data_dir, settings.archive_url)
    archive = await asyncio.to_thread(_open, url)
    log.info("archive: %s (%s)", archive.dialect, url.split("@")[-1])
    return archive


async def archive_job(store: Any, archive: Archive | None, job_id: str) -> str:
    """Copy one finished job and acknowledge it; the acknowledgement's answer. Without an archive
    (archiving turned off since the job ended) the records' retention starts as they are."""
    if archive is None:
        return str(await store.archive_ack(job_id, None))
    from archive.archiver import copy_job

    result = "STALE"
    for _ in range(COPIES):
        try:
            copied = await copy_job(store, archive, job_id)
        except JobNotFound:
            return "JOB_NOT_FOUND"
        result = str(await store.archive_ack(job_id, copied.version, copied.last_event_id, copied.audit_seq))
        log.info("archived job=%s v%d (%s): %s", job_id, copied.version, copied.outcome, result)
        if result != "STALE":
            break
    return result


class ArchiveWorker(Protocol):
    """Copies finished jobs (``ARCHIVE_JOB``) and mirrors live ones (docs/protocol.md § Reconcile)."""

    async def copy(self, job_id: str) -> str:
        """Copy one finished job and acknowledge it to Redis; ``archive_ack``'s answer (``STALE``: again later)."""
        ...

    async def mirror(self, partitions: list[int]) -> None:
        """Mirror the live jobs of these outbox partitions (those this dispatcher's inspector holds)."""
        ...


class LocalArchiveWorker:
    """The archive worker in the calling process. Without an archive (``--no-archive``) a copy only
    starts the records' retention and there is no mirror."""

    def __init__(self, store: Any, archive: Archive | None) -> None:
        self.store, self.archive = store, archive
        self._mirror: Mirror | None = None
        if archive is not None:
            from archive.mirror import Mirror

            self._mirror = Mirror(store, archive)

    async def copy(self, job_id: str) -> str:
        return await archive_job(self.store, self.archive, job_id)

    async def mirror(self, partitions: Iterable[int]) -> None:
        if self._mirror is not None:
            await self._mirror.sync(partitions)
