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
from .serve_options import CONTROL_PLANE

log = logging.getLogger("hitl.archiver")

FAILED = "FAILED:"  # copy_many's answer for a job whose copy raised


@serve.deployment(name="Archiver", max_ongoing_requests=32, **CONTROL_PLANE)
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

    async def copy_many(self, job_ids: list[str]) -> list[str]:
        """Each job's ``archive_ack`` answer, in order, or ``FAILED`` and why: one job's failure (its
        database write, say) leaves only that job's command pending."""
        worker = await self._open()
        results = []
        for job_id in job_ids:
            try:
                results.append(await worker.copy(job_id))
            except Exception as e:
                log.warning("archiving %s failed: %s: %s", job_id, type(e).__name__, e)
                results.append(f"{FAILED}{type(e).__name__}: {e}")
        return results

    async def mirror(self, partitions: list[int]) -> None:
        await (await self._open()).mirror(partitions)


class ServeArchiveWorker:
    """The dispatcher's side: an ``ArchiveWorker`` that calls the Archiver deployment.

    Copies are sent in batches (``copy_many``): whatever the dispatcher asks for within ``wait_s``,
    up to ``batch`` jobs, is one call. A handle call costs the Api replica's interpreter more than
    the Redis round trips of the command around it, and at the end of a burst of reviews the
    finished jobs come in dozens per second."""

    def __init__(self, handle: Any, *, batch: int = 32, wait_s: float = 0.05) -> None:
        self.handle, self.batch, self.wait_s = handle, batch, wait_s
        self._pending: list[tuple[str, asyncio.Future[str]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._calls: set[asyncio.Task[None]] = set()  # in flight (a task nobody holds may be collected)

    async def copy(self, job_id: str) -> str:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        self._pending.append((job_id, fut))
        if len(self._pending) >= self.batch:
            self._send()
        elif self._timer is None:
            self._timer = loop.call_later(self.wait_s, self._send)
        return await fut

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._call(batch))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self, batch: list[tuple[str, asyncio.Future[str]]]) -> None:
        try:
            results = await self.handle.copy_many.remote([job_id for job_id, _ in batch])
        except Exception as e:  # every command of the batch stays pending (reclaimed and retried)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (job_id, fut), result in zip(batch, results, strict=True):
            if fut.done():  # its dispatcher task was cancelled meanwhile
                continue
            if result.startswith(FAILED):
                fut.set_exception(RuntimeError(f"archiving {job_id} failed: {result[len(FAILED) :]}"))
            else:
                fut.set_result(result)

    async def mirror(self, partitions: Iterable[int]) -> None:
        await self.handle.mirror.remote(list(partitions))
