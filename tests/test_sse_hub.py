"""The SSE hub (serve_app.routes.events.EventHub) against a real redis-server: streams that race a job's
end still end with JOB_FINISHED, and the hub forgets a job once its last subscriber leaves."""

from __future__ import annotations

import asyncio

from hitl_review.serve_app.routes.events import EventHub
from hitl_review.statecore.models import Event
from hitl_review.statecore.store import Store

from .helpers import create


async def _drain(hub: EventHub, job_id: str) -> list[Event]:
    return [ev async for ev in hub.stream(job_id, 0)]


async def test_streams_opened_as_jobs_end_all_end_with_job_finished(store, image):
    """Open a stream and cancel its job at the same moment, for many jobs: a stream that read the
    history just before the cancel committed must still deliver the tail, not stop short."""
    hub = EventHub(store, poll_s=0.05)
    jobs = [await create(store, image) for _ in range(100)]

    async def one(job_id: str) -> list[Event]:
        task = asyncio.create_task(asyncio.wait_for(_drain(hub, job_id), 10))
        await asyncio.sleep(0)
        await store.cancel(job_id, "ops")
        return await task

    streams = await asyncio.gather(*(one(j) for j in jobs))
    for job_id, events in zip(jobs, streams, strict=True):
        assert events, job_id
        assert events[-1].type == "JOB_FINISHED", (job_id, [e.type for e in events])
        ids = [e.id for e in events]
        assert ids == list(range(1, len(ids) + 1)), ids  # no gap, no duplicate


async def test_store_stream_events_ends_with_job_finished_when_racing_the_end(store, image):
    jobs = [await create(store, image) for _ in range(100)]

    async def one(job_id: str) -> list[Event]:
        async def drain() -> list[Event]:
            return [ev async for ev in store.stream_events(job_id, 0, poll_s=0.02)]

        task = asyncio.create_task(asyncio.wait_for(drain(), 10))
        await asyncio.sleep(0)
        await store.cancel(job_id, "ops")
        return await task

    for job_id, events in zip(jobs, await asyncio.gather(*(one(j) for j in jobs)), strict=True):
        assert events[-1].type == "JOB_FINISHED", (job_id, [e.type for e in events])


class _GatedStore(Store):
    """A real store whose event reads can be held at a gate, to place an unsubscribe exactly
    between a fetch's read and its bookkeeping."""

    gate: asyncio.Event | None = None

    async def events_after(self, job_id: str, after: int = 0, count: int = 100_000) -> list[Event]:
        events = await super().events_after(job_id, after, count)
        if self.gate is not None:
            await self.gate.wait()
        return events


async def test_hub_keeps_no_position_after_the_last_subscriber_leaves(redis_server, store, image):
    gated = _GatedStore.from_url(redis_server.url)
    try:
        hub = EventHub(gated, poll_s=0.05)
        job_id = await create(store, image)
        q = hub.subscribe(job_id, 0)
        await asyncio.sleep(0.2)  # the fetch loop is running
        gated.gate = asyncio.Event()
        await store.cancel(job_id, "ops")  # new events: the next fetch reads them, then parks
        await asyncio.sleep(0.2)
        hub.unsubscribe(job_id, q)
        gated.gate.set()
        await asyncio.sleep(0.3)
        assert hub._subs == {} and hub._pos == {}, (hub._subs, hub._pos)
        assert job_id not in hub._dirty
    finally:
        for t in hub._tasks:
            t.cancel()
        await asyncio.gather(*hub._tasks, return_exceptions=True)
        await gated.close()


async def test_a_transitions_events_arrive_as_one_batch(store, image):
    """A cancel writes several events at once (NODE…, JOB_FINISHED): a live subscriber gets them in
    one batch, not one by one, and the events flattened are the job's history exactly."""
    hub = EventHub(store, poll_s=5.0)  # only the wake-up delivers within the test
    job_id = await create(store, image)
    history = await store.events_after(job_id, 0)
    got: list[list[Event]] = []

    async def follow() -> None:
        async for batch in hub.batches(job_id, 0):
            got.append(batch)

    task = asyncio.create_task(asyncio.wait_for(follow(), 10))
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.02)
    await store.cancel(job_id, "ops")
    await task
    flat = [ev for batch in got for ev in batch]
    assert flat == await store.events_after(job_id, 0)
    live = got[1:]  # the first batch is the history read at subscription
    assert [len(b) for b in got[:1]] == [len(history)]
    assert len(flat) - len(history) >= 2 and len(live) == 1, [[e.type for e in b] for b in got]
