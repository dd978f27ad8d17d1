"""The archiver's loop reads its archive streams in batches (``ArchiveLoop.step``), against a real
redis-server: at most ``batch`` entries of a partition a read, each job's copy made and acknowledged
on its own, one job's failure leaving only that job's entry pending (claimed again after
``retry_idle_ms`` and retried, its delivery count growing, never dead-lettered), a job queued twice
in one batch copied once. The copy is a recording stand-in; ``tests/test_archive_loop.py`` runs the
real one."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest_asyncio

from hitl_review.serve_app.work.archive_loop import ArchiveLoop
from hitl_review.statecore import archive_queue, deadletters, keys
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import waiting_job


@pytest_asyncio.fixture
async def store(redis_server: Any) -> Any:
    s = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, archive=True))
    await s.r.flushdb()
    await s.ensure_groups()
    await archive_queue.ensure_group(s)
    yield s
    await s.close()


async def test_entries_are_read_in_batches_and_one_failure_stays_pending_alone(store: Any, image: Any) -> None:
    jobs = []
    for _ in range(10):
        job_id = await waiting_job(store, image)
        await store.cancel(job_id, "rev1")
        jobs.append(job_id)
    bad = jobs[3]
    calls: list[str] = []
    healthy = False

    async def copy(job_id: str) -> str:
        calls.append(job_id)
        if job_id == bad and not healthy:
            raise RuntimeError("database is locked")
        return str(await store.archive_ack(job_id, None))  # as a copy would: retention starts

    # Six more commands in one job's partition: a read takes at most four entries a partition.
    stream = keys.job(jobs[0]).archive_stream
    for _ in range(6):
        await store.r.xadd(stream, {"job": jobs[0], "requeued": "1"})
    per_partition = Counter(keys.partition_of(j) for j in jobs)
    per_partition[keys.partition_of(jobs[0])] += 6
    loop = ArchiveLoop(store, None, consumer="b", batch=4, copy=copy, retry_idle_ms=50)
    acked = await loop.step(block_ms=0)  # one read, every partition's first entries, one copy per job
    assert acked == sum(min(4, n) for n in per_partition.values()) - 1  # all but the failed one
    assert len(calls) == len(set(calls))  # jobs[0]'s entries in that read: one copy
    while await archive_queue.commands(store, jobs[0]):
        acked += await loop.step(block_ms=0)
    assert sorted(set(calls)) == sorted(jobs) and acked == 15 and loop.counts["failed"] == 1
    assert await loop.step(block_ms=0) == 0  # nothing new; the failed entry waits for its retry
    assert [len(await archive_queue.commands(store, j)) for j in jobs] == [int(j == bad) for j in jobs]
    for _ in range(3):  # retried, again and again, past any --max-deliveries: never a dead letter
        await asyncio.sleep(0.06)
        assert await loop.step(reclaim=True, block_ms=0) == 0
    p = keys.partition_of(bad)
    (row,) = await store.r.xpending_range(keys.archive_stream(p), keys.ARCHIVE_GROUP, "-", "+", 10)
    assert int(row["times_delivered"]) == 4
    healthy = True
    await asyncio.sleep(0.06)
    assert await loop.step(reclaim=True, block_ms=0) == 1
    assert await archive_queue.waiting(store) == 0 and await deadletters.list_all(store.r) == []
    for j in jobs:
        assert await store.r.ttl(keys.job(j).meta) > 0


async def test_a_job_queued_twice_in_one_batch_is_copied_once(store: Any, image: Any) -> None:
    job_id = await waiting_job(store, image)
    await store.cancel(job_id, "rev1")
    await store.r.xadd(keys.job(job_id).archive_stream, {"job": job_id, "requeued": "1"})
    calls: list[str] = []

    async def copy(j: str) -> str:
        calls.append(j)
        return str(await store.archive_ack(j, None))

    loop = ArchiveLoop(store, None, consumer="b", copy=copy)
    assert await loop.step(block_ms=0) == 2 and calls == [job_id]
    assert await archive_queue.commands(store, job_id) == []


async def test_without_an_archive_the_loop_starts_the_retention_of_copies_queued_earlier(
    store: Any, image: Any
) -> None:
    """``--no-archive`` after a run with archiving: what that run queued is acknowledged as it is."""
    job_id = await waiting_job(store, image)
    await store.cancel(job_id, "rev1")
    assert await store.r.ttl(keys.job(job_id).meta) == -1
    loop = ArchiveLoop(store, None, consumer="n")
    assert loop.mirror is None
    assert await loop.step(block_ms=0) == 1
    assert await store.r.ttl(keys.job(job_id).meta) > 0
