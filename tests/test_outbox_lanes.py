"""Outbox lanes (issue 37, item 4): a job's commands wait in their partition's stream of the lane of
the deployment they call, so a backlog of detections never delays a reviewed job's segmentation, and
what an earlier version queued in the partition's one stream is served, each command once: moved to
its lane when no dispatcher took it yet, else reclaimed where it is."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.statecore import keys
from hitl_review.statecore.execution import RunSpec
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.outbox import outbox_groups
from loadtest.check_invariants.reading import pending_commands, read_outboxes

from .helpers import iv, keep, waiting_job

DEPLOYMENT = {
    "DETECT_SUBJECTS": "Detector",
    "VALIDATE_MANUAL_BOX_LIST": "BoxValidator",
    "PROCESS_APPROVED_BOX_LIST": "Segmenter",
    "SEGMENT_SUBJECT": "Segmenter",
}


class HoldingRunner:
    """A model runner whose calls never end (the models are busy): what matters is which commands
    the dispatcher hands it, and when. Limits per deployment as Serve's capacity gives them."""

    def __init__(self, limits: dict[str, int]) -> None:
        self._limits = limits
        self.calls: list[NodeCommand] = []

    def deployment_of(self, node_type: str) -> str | None:
        return DEPLOYMENT.get(node_type)

    def limits(self) -> dict[str, int]:
        return self._limits

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        self.calls.append(cmd)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def jobs_in_partition(store, image, p: int, n: int) -> list[str]:
    """``n`` new jobs of partition ``p`` (an Idempotency-Key names the partition of the job it creates)."""
    made: list[str] = []
    i = 0
    while len(made) < n:
        i += 1
        key = f"k{i}"
        if keys.create_idem_partition("alice", key) == p:
            img = image.model_copy(update={"sha256": f"{i:064x}"})
            made.append((await store.create_job("alice", img, key)).job_id)
    return made


async def _commands(store, stream: str) -> list[NodeCommand]:
    return [NodeCommand.model_validate_json(f["cmd"]) for _eid, f in await store.r.xrange(stream)]


async def until(what: str, check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.02)


async def test_a_reviewed_jobs_segmentation_is_delivered_before_the_detection_backlog_drains(store, image):
    reviewed = await waiting_job(store, image)
    p = keys.partition_of(reviewed)
    backlog = await jobs_in_partition(store, image, p, 30)  # queued after the reviewed job's detection
    st = await store.get(reviewed)
    assert (await store.intervene(reviewed, iv(st, keep(st, 0, 1)), "rev")).status_code == 200
    # Its segmentation is queued behind 31 detections of its partition (its own, already answered).
    runner = HoldingRunner({"Detector": 2, "Segmenter": 2, "BoxValidator": 1})
    d = Dispatcher(store, runner, consumer="d1", reclaim_every_s=3600, inspect_every_s=3600)
    task = asyncio.create_task(d.run_forever())
    try:
        await until("a segmentation delivered", lambda: any(c.node_type == "SEGMENT_SUBJECT" for c in runner.calls))
        detections = [c for c in runner.calls if c.node_type == "DETECT_SUBJECTS"]
        assert {c.job_id for c in detections} <= set(backlog) and len(detections) <= 2  # the Detector's slots
        lag = (await outbox_groups(store.r))[keys.outbox(p, "detect")][1]
        assert lag is not None and lag >= 27, lag  # the backlog still waits, undelivered
        await until("both subjects delivered", lambda: sum(c.node_type == "SEGMENT_SUBJECT" for c in runner.calls) == 2)
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=10)


async def test_commands_an_earlier_version_queued_in_the_partitions_one_stream_are_delivered_once(store, image):
    reviewed = await waiting_job(store, image)
    p = keys.partition_of(reviewed)
    old = keys.outbox(p, "detect")
    assert old == f"hitl:{{p{p}}}:outbox"  # the name of the one stream a partition had before lanes
    others = await jobs_in_partition(store, image, p, 3)
    st = await store.get(reviewed)
    assert (await store.intervene(reviewed, iv(st, keep(st, 0, 1)), "rev")).status_code == 200
    # As an earlier version queued them: the segmentation in the partition's one stream, after the
    # detections; nothing in the other lanes.
    lane = keys.outbox(p, "segment")
    for eid, fields in await store.r.xrange(lane):
        await store.r.xadd(old, fields)
        await store.r.xdel(lane, eid)
    assert await store.r.xlen(lane) == 0
    queued = [NodeCommand.model_validate_json(f["cmd"]) for _eid, f in await store.r.xrange(old)]
    # ...and all but the last taken by dispatchers of that version that died holding them (pending):
    # the reviewed job's answered detection, the other jobs' detections and one segmentation.
    held = await store.r.xreadgroup(keys.OUTBOX_GROUP, "old-1", {old: ">"}, count=2)
    held += await store.r.xreadgroup(keys.OUTBOX_GROUP, "old-2", {old: ">"}, count=3)
    taken = [eid for _s, entries in held for eid, _f in entries]
    live = {c.node_instance_id for c in queued if await store.node_status(c.job_id, c.node_instance_id) == "QUEUED"}
    assert Counter(c.node_type for c in queued) == {"DETECT_SUBJECTS": 4, "SEGMENT_SUBJECT": 2}
    assert len(live) == 5  # the reviewed job's answered detection is no longer its node

    last = queued[-1].node_instance_id  # the one segmentation nobody took

    runner = HoldingRunner({"Detector": 8, "Segmenter": 8, "BoxValidator": 8})
    d = Dispatcher(store, runner, consumer="new", reclaim_idle_ms=300, reclaim_every_s=0.1, inspect_every_s=3600)
    await store.ensure_groups()  # what a dispatcher does first: the one nobody took moves to its lane
    assert [c.node_instance_id for c in await _commands(store, lane)] == [last]
    assert last not in {c.node_instance_id for c in await _commands(store, old)}
    assert await store.outbox_sort() == 0  # once
    task = asyncio.create_task(d.run_forever())
    try:
        await until("every queued command delivered", lambda: {c.node_instance_id for c in runner.calls} >= live)
        await asyncio.sleep(1.5)  # reclaims and reads go on: nothing is handed out again
        assert Counter(c.node_instance_id for c in runner.calls) == dict.fromkeys(live, 1)
        assert {c.job_id for c in runner.calls} == {reviewed, *others}
        pending = await store.r.xpending_range(old, keys.OUTBOX_GROUP, min="-", max="+", count=100)
        # the live ones the dead dispatchers held were reclaimed and are held here now
        assert {r["message_id"]: r["consumer"] for r in pending if r["message_id"] in taken[1:]} == dict.fromkeys(
            taken[1:], "new"
        )
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=10)


async def test_the_sort_of_an_earlier_versions_stream_on_a_cluster(cluster_store, image):
    store = cluster_store
    job_id = (await store.create_job("alice", image)).job_id
    (detect,) = await store.outbox_commands(job_id)
    segment = detect.model_copy(update={"node_instance_id": "node_seg", "node_type": "SEGMENT_SUBJECT"})
    old = keys.outbox(keys.partition_of(job_id), "detect")
    await store.r.xadd(old, {"job": job_id, "cmd": segment.model_dump_json()})  # as an earlier version did
    assert await store.outbox_sort() == 1  # one script per partition, in the partition's slot
    assert [c.node_instance_id for c in await _commands(store, old)] == [detect.node_instance_id]
    assert [c.node_instance_id for c in await _commands(store, keys.command_outbox(job_id, "SEGMENT_SUBJECT"))] == [
        "node_seg"
    ]


async def test_the_invariant_checker_waits_for_every_lanes_commands(store, image):
    reviewed = await waiting_job(store, image)  # its detection, answered by hand, still queued
    st = await store.get(reviewed)
    assert (await store.intervene(reviewed, iv(st, keep(st, 0, 1)), "rev")).status_code == 200
    assert await pending_commands(store.r) == 3  # one in the detect lane, two in the segment lane
    commands = (await read_outboxes(store.r))[reviewed]
    assert [c.node_type for c in commands] == ["DETECT_SUBJECTS", "SEGMENT_SUBJECT", "SEGMENT_SUBJECT"]
