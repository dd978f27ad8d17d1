"""Fault 3: an API replica's dispatcher dies while it holds running nodes.

Two dispatcher processes share the outbox consumer group, as the dispatchers of two API replicas
do, next to one control plane on one redis-server. The one holding the most started detections
is SIGKILLed mid-run. The survivor reclaims its commands but must not start them again while their
heartbeat is live (docs/protocol.md § Lifecycle of a node: a command already running elsewhere is
never started a second time); once the heartbeat lapses, the inspector fails the attempt
(NODE_FAILED, EXECUTOR_LOST) and re-dispatches it as a new node instance, which the survivor
completes. Every job reaches the review, and the invariant checker finds no breach.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from harness.proc import Child
from harness.tokens import TOKENS_SPEC
from harness.uvicorn import LocalServer
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore import keys
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.store import Store
from loadtest.check_invariants import check

from .api_util import submit

pytestmark = [pytest.mark.faults, pytest.mark.slow]

JOBS = 6
DETECT = "DETECT_SUBJECTS"


def _dispatcher(redis_url: str, data_dir: Path, name: str) -> Child:
    return Child(
        [
            sys.executable,
            "-m",
            "hitl_review.serve_app.work.standalone",
            "--redis-url",
            redis_url,
            "--data-dir",
            str(data_dir),
            "--consumer",
            name,
            "--detector-delay-ms",
            "3000",
            "--reclaim-idle-ms",
            "1000",
            "--reclaim-every-s",
            "0.5",
            "--heartbeat-s",
            "0.3",
            "--heartbeat-lapse-s",
            "2",
            "--inspector-period-s",
            "0.5",
        ]
    ).start()


async def _held(store: Store, consumer: str) -> set[str]:
    """Node instances whose commands ``consumer`` holds (delivered to it, not acknowledged)."""
    held: set[str] = set()
    for stream in keys.all_outboxes():
        for p in await store.r.xpending_range(stream, keys.OUTBOX_GROUP, "-", "+", 100, consumername=consumer):
            for _eid, fields in await store.r.xrange(stream, p["message_id"], p["message_id"]):
                if fields:
                    held.add(NodeCommand.model_validate_json(fields["cmd"]).node_instance_id)
    return held


async def _events(store: Store, job_id: str) -> list[dict]:
    return [e.model_dump(mode="json") for e in await store.events_after(job_id)]


async def _wait(what: str, cond, timeout: float, children: list[Child]) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(c.tail() for c in children))
        await asyncio.sleep(0.1)


async def test_killed_api_replica_dispatcher_loses_no_job(store, redis_server, tmp_path):
    server = LocalServer(tmp_path, redis_server.url, tokens=TOKENS_SPEC, dispatchers=0).start()
    d1 = _dispatcher(redis_server.url, tmp_path, "replica-a")
    d2 = _dispatcher(redis_server.url, tmp_path, "replica-b")
    kids = {"replica-a": d1, "replica-b": d2}
    try:
        for name, child in kids.items():
            await asyncio.to_thread(child.wait_for, re.compile(f"dispatcher {name} started"), 60)
        with httpx.Client(base_url=server.url, timeout=30) as c:
            ids = []
            for i in range(JOBS):
                r = submit(c, product_composite(seed=70 + i, width=240, height=180)[0])
                assert r.status_code in (200, 201, 202), r.text
                ids.append(r.json()["job_id"])

        async def all_started() -> bool:
            for j in ids:
                if not any(e["type"] == "NODE_STARTED" for e in await _events(store, j)):
                    return False
            return True

        await _wait("every detection to start", all_started, 30, [d1, d2])
        held = {name: await _held(store, name) for name in kids}
        victim = max(held, key=lambda n: len(held[n]))
        lost = held[victim]
        assert lost, f"no dispatcher holds a started node: {held}"
        survivor = next(n for n in kids if n != victim)
        kids[victim].kill()  # SIGKILL to its process group: mid-detection, nothing acked

        async def all_in_review() -> bool:
            for j in ids:
                if (await store.get(j)).status != "WAITING_USER_SELECTION":
                    return False
            return True

        await _wait("every job to reach the review", all_in_review, 40, [kids[survivor]])
        assert kids[survivor].running, kids[survivor].tail()

        rep = await check(store, quiet_timeout=15)
        assert rep.info["quiet"], rep.info
        assert rep.ok, rep.details()

        started_per_instance: Counter[str] = Counter()
        failed_lost: set[str] = set()
        for job_id in ids:
            events = await _events(store, job_id)
            for e in events:
                if e["type"] == "NODE_STARTED":
                    started_per_instance[e["data"]["node_instance_id"]] += 1
                if e["type"] == "NODE_FAILED" and e["data"].get("reason") == "EXECUTOR_LOST":
                    failed_lost.add(e["data"]["node_instance_id"])
            types = [e["type"] for e in events]
            completed = [e for e in events if e["type"] == "NODE_COMPLETED" and e["data"]["node_type"] == DETECT]
            assert len(completed) == 1, f"{job_id}: {len(completed)} applied detections: {types}"
            assert types.count("PAUSE_OPENED") == 1, f"{job_id}: {types}"
            if any(e["data"].get("node_instance_id") in lost for e in events if e["type"] == "NODE_STARTED"):
                # The killed replica's node: a visible failed attempt, then a new instance completes.
                assert types.count("NODE_RETRY_SCHEDULED") == 1, f"{job_id}: {types}"
                assert types.count("NODE_STARTED") == 2, f"{job_id}: {types}"
                assert completed[0]["data"]["node_instance_id"] not in lost
            else:
                assert types.count("NODE_STARTED") == 1 and "NODE_FAILED" not in types, f"{job_id}: {types}"
        assert failed_lost == lost, f"lost with the replica {sorted(lost)}, failed EXECUTOR_LOST {sorted(failed_lost)}"
        twice = {n: k for n, k in started_per_instance.items() if k > 1}
        assert not twice, f"node instances started more than once: {twice}"
        assert await store.outbox_pending() == 0
    finally:
        for child in (d1, d2):
            child.stop(10)
        server.stop()
