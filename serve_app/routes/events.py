"""Server-sent events: history after ``Last-Event-ID``, then live, without gaps or duplicates.

A job's events are a Redis list (the record); the Lua scripts also PUBLISH each new
id on the job's channel, only to wake readers up. One ``EventHub`` per process
serves every open stream: one pattern subscription for all jobs, per job the
last event id fetched, and a fetch of the events after it when a job's channel
fires. A slow poll (``poll_s``) catches anything a wake-up missed (a reconnect, or
a Redis Cluster, where the hub polls only). Everything here is by event id, never
by list position: a job restored from the mirror keeps increasing ids over a new
list (``Store.events_after`` translates; an id the restore left behind reads the
new list whole), so a stream open across the loss goes on with ``JOB_RESTORED``
and still ends with ``JOB_FINISHED``.

Who watches: every ``watchers.BEACON_S`` the hub writes the jobs it streams and its count of open
streams to Redis (``statecore.watchers``), so ``/metrics`` on any replica reads the deployment's
open streams and the waiting jobs nobody follows.

Ordering argument: a subscriber registers before it reads the history, so a
wake-up after registration triggers a fetch from a position no later than what
the history covered; ids already yielded are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator

from hitl_review.statecore import gate_spot, keys, watchers
from hitl_review.statecore.durable import reraise_if_cancelled
from hitl_review.statecore.models import Event
from hitl_review.statecore.store import Store

log = logging.getLogger("hitl.events")

KEEPALIVE_S = 15.0


class EventHub:
    def __init__(self, store: Store, poll_s: float = 1.0) -> None:
        self.store = store
        self.poll_s = poll_s if not store.cluster else min(poll_s, 0.25)
        self._subs: dict[str, set[asyncio.Queue[Event]]] = defaultdict(set)
        self._pos: dict[str, int] = {}  # job id -> the last event id fetched for its subscribers
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.open_streams = 0
        # Who watches which job, in Redis for every replica to count (statecore.watchers).
        self.server = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"

    def _ensure_started(self) -> None:
        if self._tasks and not all(t.done() for t in self._tasks):
            return
        self._tasks = [asyncio.create_task(self._fetch_loop()), asyncio.create_task(self._beacon_loop())]
        if not self.store.cluster:
            self._tasks.append(asyncio.create_task(self._listen()))

    def subscribe(self, job_id: str, after: int) -> asyncio.Queue[Event]:
        self._ensure_started()
        q: asyncio.Queue[Event] = asyncio.Queue()
        self._subs[job_id].add(q)
        self._pos[job_id] = min(self._pos.get(job_id, after), after)
        return q

    def unsubscribe(self, job_id: str, q: asyncio.Queue[Event]) -> None:
        subs = self._subs.get(job_id)
        if subs is None:
            return
        subs.discard(q)
        if not subs:
            del self._subs[job_id]
            self._pos.pop(job_id, None)
            self._dirty.discard(job_id)

    async def _listen(self) -> None:
        """Wake-ups: one pattern subscription per partition on one connection."""
        while True:
            pubsub = self.store.r.pubsub()
            try:
                await pubsub.psubscribe(*[keys.events_channel_pattern(p) for p in range(keys.PARTITIONS)])
                async for msg in pubsub.listen():
                    if msg.get("type") != "pmessage":
                        continue
                    job_id = msg["channel"].split(":job:", 1)[1].rsplit(":", 1)[0]
                    if job_id in self._subs:
                        self._dirty.add(job_id)
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # reconnect; the poll covers the gap
                log.warning("event wake-up subscription lost (%s); reconnecting", e)
                await asyncio.sleep(0.5)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:
                    pass

    async def _beacon_loop(self) -> None:
        """Every ``watchers.BEACON_S``: the jobs streamed here are watched, and how many streams are open."""
        while True:
            reraise_if_cancelled(None)  # a cancel swallowed on the way ends the loop
            try:
                await watchers.beacon(self.store.r, self.server, list(self._subs), self.open_streams)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis away: the next beacon renews
                log.debug("watchers beacon failed: %s", e)
            await asyncio.sleep(watchers.BEACON_S)

    async def _fetch_loop(self) -> None:
        """Fetch the new tail of every woken job; every ``poll_s``, of every watched job."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
                jobs = self._dirty
            except TimeoutError:
                jobs = set(self._subs)
            self._wake.clear()
            self._dirty = set()
            for job_id in [j for j in jobs if j in self._subs]:
                try:
                    events = await self.store.events_after(job_id, self._pos.get(job_id, 0))
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning("event fetch for %s failed: %s", job_id, e)
                    continue
                subs = self._subs.get(job_id)
                if not subs:
                    continue  # the last subscriber left during the read: keep nothing for it
                for ev in events:
                    self._pos[job_id] = max(self._pos.get(job_id, 0), ev.id)
                    for q in list(subs):
                        q.put_nowait(ev)

    async def stream(self, job_id: str, after: int = 0) -> AsyncIterator[Event]:
        """The whole history after ``after``; then, for a live job, live events until JOB_FINISHED; in a
        job whose mask review is blind (spot checks of passed masks), without the gate's verdicts."""
        async with contextlib.aclosing(self.batches(job_id, after)) as batches:
            async for batch in batches:
                for ev in batch:
                    yield ev

    async def batches(self, job_id: str, after: int = 0) -> AsyncGenerator[list[Event], None]:
        """:meth:`stream` in batches: the history in chunks of at most ``BATCH_MAX`` events, then what
        one wake-up brought (a transition writes several events at once). An SSE response sends a
        batch as one chunk: through Ray Serve each chunk is one streamed item from the Events replica
        to the Api replica, whose per-item cost was most of the Events replica's CPU (docs/benchmarks.md)."""
        shown = gate_spot.shown_event if await self.store.review_is_blind(job_id) else None
        async with contextlib.aclosing(self._batches(job_id, after)) as batches:  # a client gone: unsubscribed now
            async for batch in batches:
                yield batch if shown is None else [shown(ev) for ev in batch]

    async def _batches(self, job_id: str, after: int) -> AsyncGenerator[list[Event], None]:
        q = self.subscribe(job_id, after)
        self.open_streams += 1
        last = after
        try:
            # History is replayed whole: a late REPORT_IGNORED may follow JOB_FINISHED.
            history = await self.store.events_after(job_id, after)
            for chunk in _chunks(history):
                yield chunk
            last = history[-1].id if history else after
            if any(ev.type == "JOB_FINISHED" for ev in history):
                return
            if await self.store.is_finished(job_id):
                # The job ended after the history was read: its tail (JOB_FINISHED last) is in the
                # list now, since the end is one atomic write; read it rather than wait for a wake-up.
                for chunk in _chunks(await self.store.events_after(job_id, last)):
                    yield chunk
                return
            finished = False
            while not finished:
                woken = [await q.get()]
                while not q.empty():  # what the same fetch (or an earlier one) queued: one batch
                    woken.append(q.get_nowait())
                batch: list[Event] = []
                for ev in woken:
                    if ev.id <= last:
                        continue
                    batch.append(ev)
                    last = ev.id
                    if ev.type == "JOB_FINISHED":
                        finished = True
                        break
                if batch:
                    yield batch
        finally:
            self.open_streams -= 1
            self.unsubscribe(job_id, q)


BATCH_MAX = 200  # events in one SSE chunk of a replayed history (a chunk stays well under a MiB)


def _chunks(events: list[Event]) -> list[list[Event]]:
    return [events[i : i + BATCH_MAX] for i in range(0, len(events), BATCH_MAX)]


def sse_frame(ev: Event) -> str:
    return f"id: {ev.id}\nevent: {ev.type}\ndata: {json.dumps(ev.model_dump(mode='json'), separators=(',', ':'))}\n\n"


async def sse_lines(batches: AsyncIterator[list[Event]], keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[str]:
    """SSE text, a batch of events as one chunk of frames, with a comment line whenever nothing was
    sent for ``keepalive_s``."""
    it = batches.__aiter__()
    yield ": stream open\n\n"
    pending: asyncio.Task[list[Event]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
            if not done:
                yield ": keep-alive\n\n"
                continue
            try:
                batch = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            if batch:
                yield "".join(sse_frame(ev) for ev in batch)
    finally:
        if pending is not None:
            if pending.done():
                if not pending.cancelled():
                    pending.exception()  # consumed, so asyncio does not log it as lost
            else:
                pending.cancel()
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except RuntimeError:
                pass
