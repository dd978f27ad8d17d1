"""Finished jobs into the archive (docs/protocol.md § Archive).

A terminal write queues the job's copy in its partition's archive stream; the archiver's own loop
(:mod:`serve_app.work.archive_loop`) copies the job (snapshot, pause history, events, results, artifact
references) into the relational archive as an idempotent upsert (:mod:`archive.archiver`), then
acknowledges the copy to Redis, which only then starts the records' retention. A copy that fell
behind (the job gained an event meanwhile) is made again; a database that is down leaves the entry
pending (retried), and the job's records do not expire meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from hitl_review.statecore.errors import JobNotFound

from ..ops.config import Settings

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive

log = logging.getLogger("hitl.archiving")

COPIES = 3  # a job that keeps moving while it is copied (late events): try this often, then later


def _open(url: str) -> Archive:
    from hitl_review.archive import migrate
    from hitl_review.archive.db import Archive

    migrate.upgrade(url)  # creates or upgrades the schema (Alembic); a no-op when at head
    return Archive(url)


async def open_archive(settings: Settings) -> Archive | None:
    """The archive the settings name, its schema at head; None when archiving is off."""
    if not settings.archive:
        return None
    from hitl_review.archive.db import archive_url

    url = archive_url(settings.data_dir, settings.archive_url)
    archive = await asyncio.to_thread(_open, url)
    log.info("archive: %s (%s)", archive.dialect, url.split("@")[-1])
    return archive


async def archive_job(store: Any, archive: Archive | None, job_id: str) -> str:
    """Copy one finished job and acknowledge it; the acknowledgement's answer. Without an archive
    (archiving turned off since the job ended) the records' retention starts as they are."""
    if archive is None:
        return str(await store.archive_ack(job_id, None))
    from hitl_review.archive.archiver import copy_job

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
