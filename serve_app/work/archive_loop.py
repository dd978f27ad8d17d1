"""The archiver's own loop (docs/archive.md § In the running system, docs/protocol.md § Archive).

Finished jobs come to the archive on a path of their own: the script that ends a job queues its copy
in the partition's archive stream (:mod:`statecore.archive_queue`), and this loop, not a node
dispatcher, reads those streams through the archivers' consumer group: in batches, it copies each job
(:func:`serve_app.work.archiving.archive_job`; a job queued twice in one batch once) and acknowledges the
entries whose copy the archive holds; a batch is at most ``batch`` entries of each partition.
A copy that failed (the database down or locked) or fell behind stays pending and is claimed again
after ``retry_idle_ms`` (by this archiver, or another one when this one died): it is retried, never
dead-lettered, and the job's records do not expire meanwhile. A periodic sweep queues the copy again
of a job waiting for it longer than ``requeue_after_ms`` whose entry was lost.

The same loop mirrors the live jobs (docs/protocol.md § Reconcile) of the partitions whose archiver
lease it holds (one archiver per partition, however many run), beside the copies, one pass at a time;
a followed job a pass finds gone from Redis (it came back empty) is restored from the mirror at once
(:mod:`serve_app.recovery.recovery`), with an incident report.

It runs in the ``Archiver`` deployment's replica on Ray Serve (:mod:`serve_app.work.archiver_deployment`)
and in the server's own process under plain uvicorn (:func:`serve_app.serving.runtime.local_runtime`). With
no archive (``--no-archive``) it only acknowledges what an earlier run queued: retention starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hitl_review.statecore import archive_queue
from hitl_review.statecore.archive_queue import ArchiveEntry
from hitl_review.statecore.durable import reraise_if_cancelled

from ..observability import metrics
from ..recovery.recovery import Recovery
from .archiving import archive_job

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive
    from hitl_review.archive.mirror import Mirror

log = logging.getLogger("hitl.archiver")

Copy = Callable[[str], Awaitable[str]]  # job id -> archive_ack's answer (archiving.archive_job)
DONE = ("OK", "JOB_NOT_FOUND", "NOT_FINISHED")  # nothing left to copy: the entry is acknowledged
PRUNE_EVERY_S = 300.0  # forget the consumer names of earlier archivers this often ...
CONSUMER_IDLE_MS = 3_600_000  # ... once idle this long and holding nothing


class ArchiveLoop:
    def __init__(
        self,
        store: Any,
        archive: Archive | None,
        *,
        consumer: str | None = None,
        batch: int = 32,
        copy_timeout_s: float = 60.0,
        retry_idle_ms: int = 30_000,
        reclaim_every_s: float = 5.0,
        sweep_every_s: float = 15.0,
        requeue_after_ms: int = 60_000,
        mirror_every_s: float = 5.0,
        copy: Copy | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{random.randrange(1 << 30):x}"
        self.batch = batch
        self.copy_timeout_s = copy_timeout_s  # a copy taking longer counts as failed (its entry stays pending)
        self.retry_idle_ms = retry_idle_ms  # a pending entry idle this long is claimed again (retried)
        self.reclaim_every_s = reclaim_every_s
        self.sweep_every_s = sweep_every_s
        self.requeue_after_ms = requeue_after_ms
        self.mirror_every_s = mirror_every_s
        self.copy: Copy = copy or functools.partial(archive_job, store, archive)
        self.mirror: Mirror | None = None
        self.recovery: Recovery | None = None
        if archive is not None:
            from hitl_review.archive.mirror import Mirror

            self.mirror = Mirror(store, archive)
            # The jobs a mirror pass finds gone from Redis are restored at once (no admin needed).
            self.recovery = Recovery(store, archive, data_dir=data_dir, who=f"archiver-{self.consumer}")
        self._mirroring: asyncio.Task[None] | None = None
        self._pruned = 0.0
        self.counts = dict.fromkeys(
            ("copied", "failed", "stale", "requeued", "mirrors", "restored", "accounts_restored"), 0
        )

    async def run_forever(self) -> None:
        while True:
            try:
                await archive_queue.ensure_group(self.store)
                break
            except (RedisConnectionError, RedisTimeoutError) as e:  # started while Redis is away: wait
                reraise_if_cancelled(e)
                log.warning("archiver: Redis unavailable at start (%s); retrying in 1s", e)
                await asyncio.sleep(1)
        log.info("archiver %s started (archive %s)", self.consumer, "on" if self.mirror is not None else "off")
        last_reclaim = last_mirror = 0.0
        last_sweep = time.monotonic()  # entries already queued are read before any is thought lost
        try:
            while True:
                reraise_if_cancelled(None)
                now = time.monotonic()
                reclaim = now - last_reclaim > self.reclaim_every_s
                sweep = now - last_sweep > self.sweep_every_s
                mirror = now - last_mirror > self.mirror_every_s
                last_reclaim = now if reclaim else last_reclaim
                last_sweep = now if sweep else last_sweep
                last_mirror = now if mirror else last_mirror
                try:
                    await self.step(reclaim=reclaim, sweep=sweep, mirror=mirror)
                except (RedisConnectionError, RedisTimeoutError) as e:
                    reraise_if_cancelled(e)
                    log.warning("archiver: Redis unavailable (%s); retrying in 1s", e)
                    await asyncio.sleep(1)
                except Exception as e:
                    reraise_if_cancelled(e)
                    if isinstance(e, ResponseError) and "NOGROUP" in str(e):  # Redis came back empty
                        log.warning("archiver: consumer group missing (%s); re-creating it", e)
                        with contextlib.suppress(Exception):
                            await archive_queue.ensure_group(self.store)
                        continue
                    log.exception("archiver loop error (retrying): %s", e)
                    await asyncio.sleep(1)
        finally:
            if self._mirroring is not None:
                self._mirroring.cancel()

    async def step(
        self, *, reclaim: bool = False, sweep: bool = False, mirror: bool = False, block_ms: int = 1000
    ) -> int:
        """One pass: claim failed or orphaned copies again, sweep for lost ones, start a mirror pass,
        then read and copy one batch of new entries. Returns how many entries it acknowledged."""
        done = 0
        if reclaim:
            done += await self.process(
                await archive_queue.reclaim(self.store, self.consumer, self.retry_idle_ms, count=self.batch)
            )
        if sweep:
            if time.monotonic() - self._pruned > PRUNE_EVERY_S:
                self._pruned = time.monotonic()
                await archive_queue.prune_consumers(self.store, self.consumer, CONSUMER_IDLE_MS)
            n = await archive_queue.sweep(self.store, self.requeue_after_ms)
            if n:
                self.counts["requeued"] += n
                log.warning("archiver: queued the copy of %d finished jobs again (their command was lost)", n)
        if mirror and self.mirror is not None and (self._mirroring is None or self._mirroring.done()):
            self._mirroring = asyncio.create_task(self._mirror())
        return done + await self.process(
            await archive_queue.read(self.store, self.consumer, count=self.batch, block_ms=block_ms)
        )

    async def process(self, entries: list[ArchiveEntry]) -> int:
        """Copy each entry's job and acknowledge those the archive now holds; a failed or stale copy
        leaves its entry pending (claimed again after ``retry_idle_ms``)."""
        if not entries:
            return 0
        await archive_queue.touch(self.store, sorted({e.job_id for e in entries}))
        finished: list[ArchiveEntry] = []
        answers: dict[str, str] = {}  # a job queued twice in one batch is copied once
        for e in entries:
            if e.job_id not in answers:
                try:
                    answers[e.job_id] = await asyncio.wait_for(self.copy(e.job_id), self.copy_timeout_s)
                except Exception as err:
                    reraise_if_cancelled(err)
                    self.counts["failed"] += 1
                    metrics.MIRROR_FAILURES.labels("archive").inc()
                    log.warning("archiving job=%s failed (will retry): %s: %s", e.job_id, type(err).__name__, err)
                    answers[e.job_id] = "FAILED"
            result = answers[e.job_id]
            if result in ("JOB_NOT_FOUND", "NOT_FINISHED"):  # nothing to copy (yet): out of the index
                await archive_queue.forget(self.store, e.job_id)
            if result in DONE:
                finished.append(e)
            elif result == "STALE":
                self.counts["stale"] += 1
                log.warning("archive of job=%s fell behind; will retry", e.job_id)
        await archive_queue.ack(self.store, finished)
        self.counts["copied"] += len(finished)
        return len(finished)

    async def _mirror(self) -> None:
        """Mirror the live jobs of the partitions whose archiver lease this loop holds."""
        assert self.mirror is not None
        try:
            ttl_ms = int(max(3 * self.mirror_every_s, 1.0) * 1000)
            held = await archive_queue.acquire_leases(self.store, self.consumer, ttl_ms)
            if held:
                await asyncio.wait_for(self.mirror.sync(held), self.copy_timeout_s)
                for lag in self.mirror.lags:
                    metrics.MIRROR_LAG.observe(lag)
                if self.mirror.vanished and self.recovery is not None:
                    report = await self.recovery.restore_lost(self.mirror.vanished)
                    self.counts["restored"] += len(report["restored"]) if report else 0
            if self.recovery is not None:  # the reviewer accounts too, before anyone asks (one EXISTS when kept)
                self.counts["accounts_restored"] += await self.recovery.restore_accounts()
            self.counts["mirrors"] += 1
            metrics.MIRROR_PASSES.inc()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the next period mirrors again
            metrics.MIRROR_FAILURES.labels("mirror").inc()
            log.warning("live mirror failed: %s: %s", type(e).__name__, e)


def archive_loop(settings: Any, store: Any, archive: Archive | None) -> ArchiveLoop:
    """The loop as the settings configure it: the mirror (and the restore of what Redis lost) once
    per inspector period; incident reports in the data directory."""
    return ArchiveLoop(store, archive, mirror_every_s=settings.inspector_period_s, data_dir=settings.data_dir)
