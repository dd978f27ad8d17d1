"""The archive's own queue (docs/protocol.md § Archive): finished jobs to copy into the archive, apart
from the node commands.

The script that ends a job (``queue_archive`` in ``lua/_lib.lua``) adds an entry ``{job, version}``
to its partition's archive stream (:func:`statecore.keys.archive_stream`) and the job to the index of
jobs waiting for their copy (:func:`statecore.keys.archive_waiting`, scored by when it was queued);
``archive_ack`` takes it out of the index once the archive holds the job. The archivers read the
streams through a consumer group of their own (``keys.ARCHIVE_GROUP``): no node dispatcher ever sees
an archive command, and an entry is never dead-lettered for waiting or being retried (a failed copy
stays pending and is claimed again, :func:`reclaim`). :func:`sweep` queues a job again whose entry
was lost, so no finished job stays un-archived (and un-expiring) for ever.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from . import keys
from .outbox import create_groups, prune_idle_consumers


@dataclass
class ArchiveEntry:
    stream: str
    entry_id: str
    job_id: str
    deliveries: int = 1


def _now_ms() -> int:
    return int(time.time() * 1000)


def _entries(stream: str, entries: list[Any]) -> list[ArchiveEntry]:
    return [ArchiveEntry(stream, eid, f["job"]) for eid, f in entries if f and f.get("job")]


async def ensure_group(store: Any) -> None:
    """Create the archivers' consumer group on every partition's archive stream (idempotent)."""
    await create_groups(store.r, keys.all_archive_streams(), keys.ARCHIVE_GROUP)


async def read(store: Any, consumer: str, count: int = 32, block_ms: int = 1000) -> list[ArchiveEntry]:
    """New archive commands for this archiver (each entry goes to one archiver of the group)."""
    streams = {s: ">" for s in keys.all_archive_streams()}
    out: list[ArchiveEntry] = []
    if not store.cluster:
        res = await store.r.xreadgroup(keys.ARCHIVE_GROUP, consumer, streams, count=count, block=block_ms or None)
        for stream, entries in res or []:
            out += _entries(stream, entries)
        return out
    # A multi-stream XREADGROUP would be CROSSSLOT on a cluster: poll each partition instead.
    for s in streams:
        for stream, entries in await store.r.xreadgroup(keys.ARCHIVE_GROUP, consumer, {s: ">"}, count=count) or []:
            out += _entries(stream, entries)
        if len(out) >= count:
            break
    if not out and block_ms:
        await asyncio.sleep(min(block_ms, 200) / 1000)
    return out


async def reclaim(store: Any, consumer: str, min_idle_ms: int, count: int = 64) -> list[ArchiveEntry]:
    """Entries pending for ``min_idle_ms`` (a failed copy of this archiver, or one a dead archiver
    held), now this consumer's; an entry deleted while pending is dropped from the group by Redis."""
    streams = keys.all_archive_streams()
    async with store.r.pipeline(transaction=False) as pipe:
        for s in streams:
            pipe.xautoclaim(s, keys.ARCHIVE_GROUP, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count)
        claimed = await pipe.execute()
    out: list[ArchiveEntry] = []
    for s, res in zip(streams, claimed, strict=True):
        out += _entries(s, res[1])
    return out


async def ack(store: Any, entries: list[ArchiveEntry]) -> None:
    """Acknowledge and delete: the stream holds only copies still to make."""
    if not entries:
        return
    async with store.r.pipeline(transaction=False) as pipe:
        for e in entries:
            pipe.xack(e.stream, keys.ARCHIVE_GROUP, e.entry_id)
            pipe.xdel(e.stream, e.entry_id)
        await pipe.execute()


async def touch(store: Any, job_ids: list[str]) -> None:
    """These jobs' copies are being attempted now: the sweep leaves them alone for a while."""
    if not job_ids:
        return
    now = _now_ms()
    async with store.r.pipeline(transaction=False) as pipe:
        for j in job_ids:
            pipe.zadd(keys.archive_waiting(keys.partition_of(j)), {j: now}, xx=True)
        await pipe.execute()


async def forget(store: Any, job_id: str) -> None:
    """A job Redis no longer holds (nothing to copy, nothing to expire) leaves the index."""
    await store.r.zrem(keys.archive_waiting(keys.partition_of(job_id)), job_id)


async def _queued_jobs(store: Any, stream: str) -> set[str]:
    """The jobs with an entry in the stream (not yet delivered, or pending)."""
    found: set[str] = set()
    start = "-"
    while True:
        entries = await store.r.xrange(stream, min=start, max="+", count=1000)
        found.update(f["job"] for _eid, f in entries if f and f.get("job"))
        if len(entries) < 1000:
            return found
        start = "(" + entries[-1][0]


async def sweep(store: Any, older_than_ms: int, count: int = 500) -> int:
    """Queue the copy again of every job waiting for it for over ``older_than_ms`` without an entry
    in its archive stream (the command was lost); a job whose entry is still there (a backlog, a
    copy being retried) only gets a fresh score. Returns how many commands it queued."""
    now = _now_ms()
    cutoff = now - older_than_ms
    async with store.r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.zrangebyscore(keys.archive_waiting(p), "-inf", cutoff, start=0, num=count)
        stale = await pipe.execute()
    queued = 0
    for p, job_ids in enumerate(stale):
        if not job_ids:
            continue
        there = await _queued_jobs(store, keys.archive_stream(p))
        lost = [j for j in job_ids if j not in there]
        await touch(store, [j for j in job_ids if j in there])
        if lost:
            queued += int(
                await store._scripts["archive_requeue"](
                    keys=[keys.archive_waiting(p), keys.archive_stream(p)], args=[now, cutoff, *lost]
                )
            )
    return queued


async def prune_consumers(store: Any, keep: str, idle_ms: int) -> int:
    """Forget archivers of earlier processes idle for ``idle_ms`` that hold nothing (one with pending
    entries is kept: its entries are claimed first, and a later pass deletes the name)."""
    return await prune_idle_consumers(store.r, keys.all_archive_streams(), keys.ARCHIVE_GROUP, keep, idle_ms)


async def waiting(store: Any) -> int:
    """Finished jobs whose copy the archive does not hold yet, over every partition."""
    async with store.r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.zcard(keys.archive_waiting(p))
        return sum(int(n) for n in await pipe.execute())


async def commands(store: Any, job_id: str) -> list[dict[str, str]]:
    """The job's entries still in its archive stream (not yet acknowledged; for checks and tests)."""
    stream = keys.job(job_id).archive_stream
    return [dict(f) for _eid, f in await store.r.xrange(stream) if f.get("job") == job_id]


async def acquire_leases(store: Any, owner: str, ttl_ms: int) -> list[int]:
    """Take or renew the archiver lease of every partition this archiver can have (``lua/lease.lua``):
    the partitions whose live jobs it mirrors. One archiver per partition, however many run."""
    lease = store._scripts["lease"]  # one call each, as the inspector's: a period has time for 64
    found = []
    for p in range(keys.PARTITIONS):
        if await lease(keys=[keys.archiver_lease(p), keys.archiver_fence(p)], args=[owner, ttl_ms]):
            found.append(p)
    return found
