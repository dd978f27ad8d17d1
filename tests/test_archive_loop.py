"""The archiver's own path (docs/protocol.md § Archive), against a real redis-server and a real SQLite
archive: finished jobs' copies wait in the partitions' archive streams, apart from the node commands,
and the archiver's loop (``serve_app.work.archive_loop.ArchiveLoop``) reads them with its own consumer
group.

- A blocked archive (the database refusing every write) while 40 jobs are cancelled at once: the
  copies are retried far more often than ``--max-deliveries``, nothing is dead-lettered, and once
  the archive recovers all 40 are archived and their retention started.
- A dead archiver's pending copies are claimed by another one.
- The sweep queues the copy again of a job whose archive command was lost (deleted by hand), and
  leaves alone a job whose command is still there.
- The loop mirrors live jobs, of the partitions whose archiver lease it holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from sqlalchemy import select

from hitl_review.archive import migrate, reads
from hitl_review.archive.db import Archive
from hitl_review.archive.schema import LiveMirror
from hitl_review.serve_app.work.archive_loop import ArchiveLoop
from hitl_review.serve_app.work.archiving import archive_job
from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.statecore import archive_queue, deadletters, keys
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES, waiting_job


class Detector:
    async def run(self, cmd: NodeCommand, heartbeat: Any = None) -> dict[str, Any]:
        return {"boxes": THREE_BOXES}


@pytest_asyncio.fixture
async def archiving(redis_server: Any, tmp_path: Path) -> AsyncIterator[tuple[Store, Archive]]:
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    await asyncio.to_thread(migrate.upgrade, url)
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, archive=True))
    await store.r.flushdb()
    await store.ensure_groups()
    await archive_queue.ensure_group(store)
    archive = Archive(url)
    try:
        yield store, archive
    finally:
        archive.close()
        await store.close()


async def finished_jobs(store: Store, image: Any, n: int) -> list[str]:
    jobs = [await waiting_job(store, image) for _ in range(n)]
    await asyncio.gather(*(store.cancel(j, "rev1") for j in jobs))  # all at once
    return jobs


async def archived(store: Store, archive: Archive, job_id: str) -> bool:
    """The archive holds the job and its retention started (TTL, expiring index, out of the index)."""
    jk = keys.job(job_id)
    held = await asyncio.to_thread(reads.job, archive, job_id)
    return (
        held is not None
        and await store.r.ttl(jk.meta) > 0
        and await store.r.zscore(jk.expiring, job_id) is not None
        and await store.r.zscore(jk.archive_waiting, job_id) is None
    )


async def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def stop(*tasks: asyncio.Task[Any]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_blocked_archive_retries_without_dead_letters_and_archives_all_once_it_recovers(
    archiving: tuple[Store, Archive], image: Any
) -> None:
    store, archive = archiving
    healthy = False
    attempts = 0

    async def copy(job_id: str) -> str:  # the database refuses every write until it recovers
        nonlocal attempts
        attempts += 1
        if not healthy:
            await asyncio.sleep(0.002)
            raise RuntimeError("database is locked")
        return await archive_job(store, archive, job_id)

    jobs = await finished_jobs(store, image, 40)
    loop = ArchiveLoop(store, archive, consumer="a1", copy=copy, retry_idle_ms=50, reclaim_every_s=0.05, batch=64)
    # A node dispatcher runs beside it, with a tiny --max-deliveries: it never sees an archive copy.
    dispatcher = Dispatcher(store, Detector(), consumer="d", reclaim_idle_ms=50, reclaim_every_s=0.05, max_deliveries=2)
    tasks = [asyncio.create_task(loop.run_forever()), asyncio.create_task(dispatcher.run_forever())]
    try:

        async def retried_often() -> bool:
            pending = 0
            for p in {keys.partition_of(j) for j in jobs}:
                rows = await store.r.xpending_range(keys.archive_stream(p), keys.ARCHIVE_GROUP, "-", "+", 100)
                pending += sum(int(r["times_delivered"]) > 4 for r in rows)
            return pending == 40

        await wait_for(retried_often, 30, "the failed copies were not retried")
        assert attempts >= 40 * 4
        for j in jobs:  # nothing acknowledged: no record expires before the archive holds it
            assert await store.r.ttl(keys.job(j).meta) == -1
        healthy = True

        async def all_archived() -> bool:
            return all([await archived(store, archive, j) for j in jobs])

        await wait_for(all_archived, 30, "not every job was archived after the archive recovered")
    finally:
        await stop(*tasks)
    assert await deadletters.list_all(store.r) == []
    assert await archive_queue.waiting(store) == 0
    assert [await store.r.xlen(s) for s in keys.all_archive_streams()] == [0] * keys.PARTITIONS


async def test_a_dead_archivers_pending_copies_are_claimed_by_another(
    archiving: tuple[Store, Archive], image: Any
) -> None:
    store, archive = archiving
    jobs = await finished_jobs(store, image, 5)

    async def hang(job_id: str) -> str:
        await asyncio.Event().wait()
        return "OK"

    dead = ArchiveLoop(store, archive, consumer="dead", copy=hang)
    stuck = asyncio.create_task(dead.run_forever())
    try:

        async def all_pending() -> bool:
            n = 0
            for p in {keys.partition_of(j) for j in jobs}:
                n += int((await store.r.xpending(keys.archive_stream(p), keys.ARCHIVE_GROUP))["pending"])
            return n == 5

        await wait_for(all_pending, 10, "the first archiver did not take the copies")
    finally:
        await stop(stuck)  # it died holding them
    other = ArchiveLoop(store, archive, consumer="other", retry_idle_ms=100, reclaim_every_s=0.05)
    task = asyncio.create_task(other.run_forever())
    try:

        async def all_archived() -> bool:
            return all([await archived(store, archive, j) for j in jobs])

        await wait_for(all_archived, 20, "the dead archiver's copies were never claimed")
    finally:
        await stop(task)


async def test_the_sweep_queues_a_lost_copy_again(archiving: tuple[Store, Archive], image: Any) -> None:
    store, archive = archiving
    lost, failing = await finished_jobs(store, image, 2)
    for e in await store.r.xrange(keys.job(lost).archive_stream):
        if e[1]["job"] == lost:
            await store.r.xdel(keys.job(lost).archive_stream, e[0])  # the command is lost
    assert await archive_queue.commands(store, lost) == []

    async def copy(job_id: str) -> str:
        if job_id == failing:
            raise RuntimeError("this one keeps failing")
        return await archive_job(store, archive, job_id)

    loop = ArchiveLoop(
        store, archive, consumer="s", copy=copy, sweep_every_s=0.1, requeue_after_ms=300, retry_idle_ms=100
    )
    loop.reclaim_every_s = 0.05
    task = asyncio.create_task(loop.run_forever())
    try:
        await wait_for(lambda: archived(store, archive, lost), 20, "the lost copy was never queued again")
        await asyncio.sleep(1.0)  # several sweeps past requeue_after_ms
    finally:
        await stop(task)
    assert loop.counts["requeued"] == 1
    # The failing job's command is still in its stream (retried): it is not queued a second time.
    assert len(await archive_queue.commands(store, failing)) == 1
    assert await store.r.zscore(keys.job(failing).archive_waiting, failing) is not None
    assert await store.r.ttl(keys.job(failing).meta) == -1


async def test_the_archiver_mirrors_the_live_jobs_of_the_partitions_it_leases(
    archiving: tuple[Store, Archive], image: Any
) -> None:
    store, archive = archiving
    live = await waiting_job(store, image)
    assert len(await archive_queue.acquire_leases(store, "first", 60_000)) == keys.PARTITIONS
    assert await archive_queue.acquire_leases(store, "second", 60_000) == []  # one archiver per partition
    await store.r.delete(*(keys.archiver_lease(p) for p in range(keys.PARTITIONS)))
    loop = ArchiveLoop(store, archive, consumer="m", mirror_every_s=0.1)
    task = asyncio.create_task(loop.run_forever())

    def mirrored() -> set[str]:
        with archive.reading() as s:
            return set(s.scalars(select(LiveMirror.job_id)))

    async def seen() -> bool:
        return live in await asyncio.to_thread(mirrored)

    try:
        await wait_for(seen, 10, "the live job was never mirrored")
    finally:
        await stop(task)


async def test_the_archive_path_on_a_redis_cluster(cluster_store: Store, image: Any) -> None:
    """Every key of the path carries its job's partition tag: the loop reads, acknowledges and
    sweeps on a cluster as on one server (without an archive: acknowledging starts the retention)."""
    store = cluster_store
    store.config.archive = True
    await archive_queue.ensure_group(store)
    kept, lost = await finished_jobs(store, image, 2)
    for eid, f in await store.r.xrange(keys.job(lost).archive_stream):
        if f["job"] == lost:
            await store.r.xdel(keys.job(lost).archive_stream, eid)
    loop = ArchiveLoop(store, None, consumer="c", requeue_after_ms=0)
    assert await loop.step(block_ms=0) == 1
    assert await store.r.ttl(keys.job(kept).meta) > 0 and await store.r.ttl(keys.job(lost).meta) == -1
    assert await loop.step(sweep=True, block_ms=0) == 1 and loop.counts["requeued"] == 1
    assert await store.r.ttl(keys.job(lost).meta) > 0 and await archive_queue.waiting(store) == 0
