"""Archiving never holds what jobs need (docs/protocol.md § Archive): against a real redis-server and a
real Dispatcher with a single slot, 50 finished jobs' copies wait (their archiver hangs on every one)
while a new job is detected and reaches its review. The copies are in the archive streams, read by
the archiver's own consumer group: the node dispatcher never sees one, so it takes none of its slots,
delivers none, and dead-letters none."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

from hitl_review.serve_app.work.archive_loop import ArchiveLoop
from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.statecore import archive_queue, deadletters, keys
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES, waiting_job


class Detector:
    def __init__(self) -> None:
        self.types: list[str] = []

    async def run(self, cmd: NodeCommand, heartbeat: Any = None) -> dict[str, Any]:
        self.types.append(cmd.node_type)
        return {"boxes": THREE_BOXES}


def test_the_dispatcher_has_no_archive_concern() -> None:
    params = inspect.signature(Dispatcher).parameters
    assert "archiver" not in params
    for gone in ("archive_slots", "_archiving", "archive_call_s", "_mirror", "archiver"):
        assert not hasattr(Dispatcher, gone), gone


async def test_a_burst_of_finished_jobs_never_takes_a_node_dispatchers_slot(redis_server, image) -> None:
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, archive=True))
    await store.r.flushdb()
    await store.ensure_groups()
    copying = 0

    async def hang(job_id: str) -> str:  # an archiver that never finishes a copy
        nonlocal copying
        copying += 1
        await asyncio.Event().wait()
        return "OK"

    detector = Detector()
    dispatcher = Dispatcher(
        store, detector, consumer="d", concurrency=1, reclaim_idle_ms=100, reclaim_every_s=0.1, max_deliveries=1
    )
    archiver = ArchiveLoop(store, None, consumer="a", copy=hang, retry_idle_ms=100, reclaim_every_s=0.1)
    try:
        finished = []
        for _ in range(50):  # fifty finished jobs: fifty copies queued before the new job's detection
            job_id = await waiting_job(store, image)
            await store.cancel(job_id, "rev1")
            finished.append(job_id)
        assert await archive_queue.waiting(store) == 50
        for s in keys.all_outboxes():  # their detections were reported by hand (helpers.waiting_job)
            await store.r.xtrim(s, maxlen=0)
        job = (await store.create_job("alice", image)).job_id
        tasks = [asyncio.create_task(dispatcher.run_forever()), asyncio.create_task(archiver.run_forever())]
        try:
            deadline = time.monotonic() + 20
            while (await store.get(job)).status == "DETECTING":
                assert time.monotonic() < deadline, "the waiting copies stopped the detection of a new job"
                await asyncio.sleep(0.05)
            assert (await store.get(job)).status == "WAITING_USER_SELECTION"
            assert copying >= 1  # the archiver did take its copy (and hangs on it)
            await asyncio.sleep(0.5)  # several reclaim periods of both
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert detector.types == ["DETECT_SUBJECTS"]
        # every copy still waits in the archive streams; none went through the node commands' outbox
        assert sum([len(await archive_queue.commands(store, j)) for j in finished]) == 50
        assert sum([await store.r.xlen(s) for s in keys.all_outboxes()]) == 0
        assert await deadletters.list_all(store.r) == []
        for job_id in finished:  # nothing copied or acknowledged: no retention started
            assert await store.r.ttl(keys.job(job_id).meta) == -1, job_id
    finally:
        await store.close()
