"""A dispatcher process killed while it holds a command: another one reclaims it, and the
node's report is applied exactly once (at-least-once delivery + at-most-once application)."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from serve_app.dispatcher import Dispatcher, LocalRunner
from serve_app.samples import product_composite
from statecore.artifacts import ArtifactStore
from statecore.models import ImageRef

from deployments.executor import build_models


async def _events(store, job_id):
    return [e.type for e in await store.events_after(job_id)]


async def test_killed_dispatcher_command_completes_once(store, redis_server, tmp_path):
    artifacts = ArtifactStore(f"file://{tmp_path / 'artifacts'}")
    png, _ = product_composite(seed=3, width=320, height=240)
    name = artifacts.put("image", png, "png")
    image = ImageRef(sha256="b" * 64, width=320, height=240, url=ArtifactStore.url(name))
    job_id = (await store.create_job("alice", image)).job_id

    # Dispatcher 1, a separate process with a slow detector: it takes the command, then dies.
    proc = subprocess.Popen([sys.executable, "-m", "serve_app.dispatcher", "--redis-url", redis_server.url,
                             "--data-dir", str(tmp_path), "--detector-delay-ms", "30000", "--consumer", "d1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "NODE_STARTED" not in await _events(store, job_id):
            assert time.monotonic() < deadline, "dispatcher 1 never picked the command up"
            await asyncio.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (await store.get(job_id)).status == "DETECTING"
    assert await store.outbox_pending() == 1  # delivered, never acked

    # Dispatcher 2 reclaims it after the idle time and completes it.
    models = build_models({"artifacts": str(artifacts.root), "detector": {"name": "classical"},
                           "validator": {"name": "classical"}, "segmenter": {"name": "classical"}})
    d2 = Dispatcher(store, LocalRunner(models, artifacts), consumer="d2", reclaim_idle_ms=500, reclaim_every_s=0.2)
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
    assert types.count("NODE_COMPLETED") == 1 and types.count("PAUSE_OPENED") == 1
    state = await store.get(job_id)
    assert state.current_node.attempt == 2 and state.active_pause is not None
    assert await store.outbox_commands(job_id) == []  # acknowledged and deleted once handled
