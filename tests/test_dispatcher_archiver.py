"""A hung archive worker (an Archiver replica that stopped answering, a database holding its lock)
delays the archive, never the jobs: against a real redis-server and a real Dispatcher, with an
archive worker that hangs on purpose, a new job is still detected and reaches its review while a
backlog of finished jobs waits to be copied; at most a quarter of the dispatcher's slots copy at
once, and each call ends at the dispatcher's bound (the command then stays pending, retried)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from serve_app.dispatcher import Dispatcher
from statecore import keys
from statecore.models import NodeCommand
from statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES, waiting_job


class Detector:
    async def run(self, cmd: NodeCommand, heartbeat: Any = None) -> dict[str, Any]:
        return {"boxes": THREE_BOXES}


class HungArchiver:
    """Never answers: every copy and mirror call waits until it is cancelled."""

    def __init__(self) -> None:
        self.copying = 0
        self.most = 0
        self.mirrors = 0

    async def copy(self, job_id: str) -> str:
        self.copying += 1
        self.most = max(self.most, self.copying)
        try:
            await asyncio.Event().wait()
        finally:
            self.copying -= 1
        return "OK"

    async def mirror(self, partitions: list[int]) -> None:
        self.mirrors += 1
        await asyncio.Event().wait()


async def test_a_hung_archiver_holds_neither_the_loop_nor_the_slots_jobs_need(redis_server, image) -> None:
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, archive=True))
    await store.r.flushdb()
    await store.ensure_groups()
    archiver = HungArchiver()
    dispatcher = Dispatcher(
        store, Detector(), consumer="d", concurrency=8, reclaim_every_s=0.2, inspect_every_s=0.2, archiver=archiver
    )
    dispatcher.archive_call_s = 1.0
    try:
        finished = []
        for _ in range(12):  # twelve finished jobs: twelve ARCHIVE_JOB commands before the new job's detection
            job_id = await waiting_job(store, image)
            await store.cancel(job_id, "rev1")
            finished.append(job_id)
        job = (await store.create_job("alice", image)).job_id
        task = asyncio.create_task(dispatcher.run_forever())
        try:
            deadline = time.monotonic() + 20
            while (await store.get(job)).status == "DETECTING":
                assert time.monotonic() < deadline, "a hung archiver stopped the detection of a new job"
                await asyncio.sleep(0.05)
            assert (await store.get(job)).status == "WAITING_USER_SELECTION"
            await asyncio.sleep(1.5)  # past the call bound: the first copies time out, others take the slots
            assert archiver.mirrors >= 1 and archiver.most == dispatcher.archive_slots == 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # nothing was copied or acknowledged: no finished job's records started their retention
        for job_id in finished:
            assert await store.r.ttl(keys.job(job_id).meta) == -1, job_id
    finally:
        await store.close()
