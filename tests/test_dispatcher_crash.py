"""A dispatcher process killed while it holds a command: another one reclaims it, and the
node's report is applied exactly once (at-least-once delivery + at-most-once application)."""

from __future__ import annotations

import asyncio
import sys
import time

from harness.proc import Child
from hitl_review.deployments.executor import build_models
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.serve_app.work.dispatcher import Dispatcher, LocalRunner
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef


async def _events(store, job_id):
    return [e.type for e in await store.events_after(job_id)]


async def test_killed_dispatcher_command_completes_once(store, redis_server, tmp_path):
    artifacts = ArtifactStore(f"file://{tmp_path / 'artifacts'}")
    png, _ = product_composite(seed=3, width=320, height=240)
    name = artifacts.put("image", png, "png")
    image = ImageRef(sha256="b" * 64, width=320, height=240, url=ArtifactStore.url(name))
    job_id = (await store.create_job("alice", image)).job_id

    # Dispatcher 1, a separate process with a slow detector: it takes the command, then dies.
    d1 = Child(
        [
            sys.executable,
            "-m",
            "hitl_review.serve_app.work.standalone",
            "--redis-url",
            redis_server.url,
            "--data-dir",
            str(tmp_path),
            "--detector-delay-ms",
            "30000",
            "--consumer",
            "d1",
        ]
    ).start()
    try:
        deadline = time.monotonic() + 60
        while "NODE_STARTED" not in await _events(store, job_id):
            assert time.monotonic() < deadline, "dispatcher 1 never picked the command up:\n" + d1.tail()
            await asyncio.sleep(0.1)
    finally:
        d1.kill()
    assert (await store.get(job_id)).status == "DETECTING"
    assert await store.outbox_pending() == 1  # delivered, never acked

    # Dispatcher 2 reclaims it after the idle time but does not start it again while it may still
    # run (BUSY); once d1's heartbeat lapsed, d2's inspector re-dispatches it and d2 completes it.
    models = build_models(
        {
            "artifacts": str(artifacts.root),
            "detector": {"name": "classical"},
            "validator": {"name": "classical"},
            "segmenter": {"name": "classical"},
        }
    )
    store.config.retry_backoff_s = 0.1
    d2 = Dispatcher(
        store,
        LocalRunner(models, artifacts),
        consumer="d2",
        reclaim_idle_ms=500,
        reclaim_every_s=0.2,
        inspect_every_s=0.2,
        heartbeat_lapse_s=1.0,
        redis_url=redis_server.url,
    )
    task = asyncio.create_task(d2.run_forever())
    try:
        deadline = time.monotonic() + 60
        while (await store.get(job_id)).status != "WAITING_USER_SELECTION":
            assert time.monotonic() < deadline, "the reclaimed command never completed"
            await asyncio.sleep(0.1)
        while await store.outbox_pending():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    types = await _events(store, job_id)
    assert types.count("NODE_STARTED") == 2  # attempt 1 (killed) and attempt 2
    assert types.count("NODE_FAILED") == 1 and types.count("NODE_RETRY_SCHEDULED") == 1  # visible
    assert types.count("NODE_COMPLETED") == 1 and types.count("PAUSE_OPENED") == 1
    state = await store.get(job_id)
    assert state.current_node.attempt == 2 and state.active_pause is not None
    assert await store.outbox_commands(job_id) == []  # acknowledged and deleted once handled


async def test_equal_entry_ids_in_two_partitions_are_two_commands(store, image):
    """Stream ids are per stream: two partitions can hand out the same id in the same
    millisecond. The dispatcher must tell them apart by (stream, id)."""
    from dataclasses import replace

    from hitl_review.statecore import keys

    jobs: dict[int, str] = {}
    while len(jobs) < 2:
        job_id = (await store.create_job("alice", image)).job_id
        jobs.setdefault(keys.partition_of(job_id), job_id)
    entries = await store.outbox_read("t", count=10, block_ms=100)
    a = next(e for e in entries if e.command.job_id == list(jobs.values())[0])
    b = next(e for e in entries if e.command.job_id == list(jobs.values())[1])
    b = replace(b, entry_id=a.entry_id)
    handled: list[str] = []

    class Recording(Dispatcher):
        async def handle(self, entry):
            handled.append(entry.command.job_id)

    d = Recording(store, LocalRunner(None, None))
    d._spawn(a)
    d._spawn(b)
    await asyncio.gather(*d._tasks)
    assert sorted(handled) == sorted(jobs.values())
