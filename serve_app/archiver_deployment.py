"""The ``Archiver`` deployment: the archive's writer on Ray Serve (docs/archive.md § Where it runs).

The Api replicas' dispatchers hand it every ``ARCHIVE_JOB`` and, once per inspector period, the
partitions whose live jobs they mirror; it copies them into the relational archive in its own
process. Turning a finished job into rows is CPU work (JSON, SQLAlchemy, SQLite): done in the Api
replica it held that replica's interpreter while reviewers waited for their submissions (with
archiving on, the intervention benchmark's Ray Serve p50 went from 0.89x to 1.80x uvicorn's).

One replica is enough for a review team's rate of finished jobs; more are safe (each copy is an
idempotent upsert acknowledged through Redis, and SQLite writers serialize on ``BEGIN IMMEDIATE``).
Only the dispatchers call it, never a browser: it has no route.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from ray import serve

from . import durability
from .api import store_for
from .archiving import LocalArchiveWorker, open_archive
from .config import Settings

log = logging.getLogger("hitl.archiver")


@serve.deployment(
    name="Archiver",
    max_ongoing_requests=32,
    health_check_period_s=10.0,
    health_check_timeout_s=30.0,
    graceful_shutdown_wait_loop_s=0.5,
    graceful_shutdown_timeout_s=5.0,
)
class Archiver:
    """``LocalArchiveWorker`` in a replica of its own, opened on the first call (the schema is
    migrated by whichever process opens the archive first; Alembic's upgrade at head is a no-op)."""

    def __init__(self, settings_json: str) -> None:
        self.settings = Settings.model_validate_json(settings_json)
        self._worker: LocalArchiveWorker | None = None
        self._opening = asyncio.Lock()

    async def _open(self) -> LocalArchiveWorker:
        async with self._opening:
            if self._worker is None:
                settings = self.settings
                assert settings.redis_url
                store = store_for(settings, settings.redis_url)
                await durability.configure(store, settings.durability, settings.store_timeout_s)
                archive = await open_archive(settings)
                self._worker = LocalArchiveWorker(store, archive)
                log.info("archiver ready (archive %s)", "on" if archive is not None else "off")
            return self._worker

    async def copy(self, job_id: str) -> str:
        return await (await self._open()).copy(job_id)

    async def mirror(self, partitions: list[int]) -> None:
        await (await self._open()).mirror(partitions)


class ServeArchiveWorker:
    """The dispatcher's side: an ``ArchiveWorker`` that calls the Archiver deployment."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def copy(self, job_id: str) -> str:
        return str(await self.handle.copy.remote(job_id))

    async def mirror(self, partitions: Iterable[int]) -> None:
        await self.handle.mirror.remote(list(partitions))
