"""Many jobs through the real scripts, fast: for the benchmarks and tests whose subject is a large
store (the /metrics scrape's cost at 300 000 waiting jobs), not the path that made it.

``bulk_create`` runs the ``create_job`` script with the store's own plan, keys and ARGV, pipelined in
batches (no shortcut around the Lua); ``bulk_waiting`` then applies each job's detection report
through ``Store.apply_report`` (the dispatcher's call, concurrently), so every
job waits for its box review exactly as after a real detection, and acknowledges and deletes the
outbox commands as a dispatcher does, so the outbox holds what it would hold: nothing.
"""

from __future__ import annotations

import asyncio
import time

from hitl_review.statecore import decide, keys, scripts
from hitl_review.statecore.ids import now_iso
from hitl_review.statecore.models import CreateJobResponse, ImageRef, NodeReport
from hitl_review.statecore.states import NodeType
from hitl_review.statecore.store import Store

IMAGE = ImageRef(sha256="b" * 64, width=640, height=480, url="/api/v1/artifacts/img_bench.png")
BOXES = [
    {"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.93},
    {"bbox": [200, 40, 320, 200], "label": "shoe", "score": 0.88},
]


async def bulk_create(store: Store, n: int, batch: int = 2000, image: ImageRef = IMAGE) -> list[tuple[str, str]]:
    """``n`` jobs through the create_job script, ``batch`` per pipeline: ``(job_id, node_instance_id)``
    of each, its detection node queued."""
    script = store.r.register_script(scripts.source("create_job"))
    made: list[tuple[str, str]] = []
    while len(made) < n:
        chunk = []
        async with store.r.pipeline(transaction=False) as pipe:
            for _ in range(min(batch, n - len(made))):
                job_id = keys.new_job_id()
                now, now_ms = now_iso(), int(time.time() * 1000)
                plan, cmd = decide.plan_create(job_id, "bench", image, None, now, now_ms)
                assert cmd is not None  # no boxes: a detection is queued
                body = CreateJobResponse(job_id=job_id, status=plan.status, version=1).model_dump_json()
                args = [*store._args(job_id, now, "bench"), plan.to_json(now), image.sha256, body, now_ms]
                await script(keys=keys.job(job_id).for_script(), args=args, client=pipe)
                chunk.append((job_id, cmd.node_instance_id))
            res = await pipe.execute()
        assert all(r[0] == "OK" for r in res), res[:3]
        made += chunk
    return made


async def drain_outbox(store: Store, consumer: str = "bulk", count: int = 10_000) -> int:
    """Read, acknowledge and delete every command in the outbox, as a dispatcher that ran them would."""
    drained = 0
    for stream in keys.all_outboxes():
        while True:
            res = await store.r.xreadgroup(keys.OUTBOX_GROUP, consumer, {stream: ">"}, count=count)
            ids = [eid for _s, entries in res or [] for eid, _f in entries]
            if not ids:
                break
            async with store.r.pipeline(transaction=False) as pipe:
                pipe.xack(stream, keys.OUTBOX_GROUP, *ids)
                pipe.xdel(stream, *ids)
                await pipe.execute()
            drained += len(ids)
    async with store.r.pipeline(transaction=False) as pipe:  # the consumer exists on every stream it read
        for stream in keys.all_outboxes():
            pipe.xgroup_delconsumer(stream, keys.OUTBOX_GROUP, consumer)
        await pipe.execute(raise_on_error=False)
    return drained


async def bulk_report(store: Store, made: list[tuple[str, str]], concurrency: int = 32) -> None:
    """Each job's detection report (``BOXES``, succeeded) through ``Store.apply_report``, the
    dispatcher's own call, ``concurrency`` at a time."""
    todo = list(made)

    async def worker() -> None:
        while todo:
            job_id, nid = todo.pop()
            report = NodeReport(
                node_instance_id=nid,
                node_type=NodeType.DETECT_SUBJECTS,
                job_id=job_id,
                outcome="SUCCEEDED",
                output={"boxes": BOXES},
            )
            got = await store.apply_report(report)
            assert got == "OK", (job_id, got)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def bulk_waiting(store: Store, n: int, batch: int = 2000) -> list[str]:
    """``n`` jobs waiting for their box review, through the create and report scripts; the outbox
    drained. Their ids."""
    out: list[str] = []
    while len(out) < n:
        made = await bulk_create(store, min(batch, n - len(out)), batch)
        await bulk_report(store, made)
        out += [job_id for job_id, _nid in made]
    await drain_outbox(store)
    return out
