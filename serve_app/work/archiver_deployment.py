"""The ``Archiver`` deployment: the archive's writer on Ray Serve (docs/archive.md § In the running system).

Its replica runs the archiver's own loop (:class:`serve_app.work.archive_loop.ArchiveLoop`), started with
the replica: it reads the partitions' archive streams through the archivers' consumer group, copies
the finished jobs into the relational archive in its own process, and mirrors the live jobs of the
partitions whose archiver lease it holds. No node dispatcher takes part: a burst of finished jobs
never holds a slot a model command needs, and an Api replica never turns a job into rows (CPU work:
JSON, SQLAlchemy, SQLite; done in the Api replica it held that replica's interpreter while reviewers
waited, and the intervention benchmark's Ray Serve p50 went from 0.89x to 1.80x uvicorn's).

One replica is enough for a review team's rate of finished jobs; more are safe (the consumer group
gives each entry to one of them, each copy is an idempotent upsert acknowledged through Redis, SQLite
writers serialize on ``BEGIN IMMEDIATE``, and the mirror's partitions are split by lease). Nothing
calls it but Serve's health check: it has no route.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray import serve

from ..observability import metrics
from ..observability.logging_setup import configure_component
from ..ops.config import Settings
from ..recovery import durability
from ..serving.serve_options import CONTROL_PLANE
from ..serving.stores import store_for
from .archive_loop import ArchiveLoop, archive_loop
from .archiving import open_archive
from .webhook_delivery import start_webhooks

log = logging.getLogger("hitl.archiver")


@serve.deployment(name="Archiver", max_ongoing_requests=32, **CONTROL_PLANE)
class Archiver:
    """The archive loop in a replica of its own. The archive is opened by the loop's task (the schema
    is migrated by whichever process opens it first; Alembic's upgrade at head is a no-op); a loop
    that ended (it should not) is started again by the next health check."""

    def __init__(self, settings_json: str) -> None:
        self.settings = Settings.model_validate_json(settings_json)
        configure_component(self.settings.log_format, self.settings.log_level)
        self.loop: ArchiveLoop | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            self._start()
        except RuntimeError:  # no running event loop here: the first health check starts it
            pass

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        settings = self.settings
        assert settings.redis_url
        # The loop blocks in XREADGROUP for up to 1 s: its store's timeout allows for it.
        store = store_for(settings, settings.redis_url, blocking_s=2.0)
        flusher = asyncio.create_task(metrics.SHARED.flush_forever(store.r))  # its counters, to the shared totals
        hooks: asyncio.Task[None] | None = None
        try:
            archive = await open_archive(settings)
            await durability.configure(store, settings.durability, settings.store_timeout_s, archive)
            self.loop = archive_loop(settings, store, archive)
            log.info("archiver ready (archive %s)", "on" if archive is not None else "off")
            hooks = start_webhooks(settings, store)  # the webhooks' deliverer beside the loop (when any)
            await self.loop.run_forever()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("archiver loop ended; the next health check starts it again")
        finally:
            flusher.cancel()
            if hooks is not None:
                hooks.cancel()
            await store.close()

    async def check_health(self) -> None:
        self._start()

    async def stats(self) -> dict[str, Any]:
        """What the loop did so far (copies acknowledged, failures retried, jobs queued again)."""
        return dict(self.loop.counts) if self.loop is not None else {}
