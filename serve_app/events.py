"""Server-sent events: history after ``Last-Event-ID``, then live, without gaps or duplicates.

One ``EventHub`` per process multiplexes every open stream onto at most one
blocking XREAD per partition (all of a partition's keys share a hash slot, so
this is Cluster-safe), instead of one Redis connection per browser tab.

Ordering argument: a subscriber registers with the hub *before* reading the
history, and the hub starts a newly watched stream at the subscriber's
position, so every event appended after registration reaches the queue; the
history read covers everything before. Ids already yielded are dropped.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from typing import AsyncIterator

from statecore import keys
from statecore.models import Event
from statecore.store import Store

from . import metrics

log = logging.getLogger("hitl.events")

KEEPALIVE_S = 15.0


class EventHub:
    def __init__(self, store: Store, block_ms: int = 1000) -> None:
        self.store = store
        self.block_ms = block_ms
        self._subs: dict[str, set[asyncio.Queue[Event]]] = defaultdict(set)
        self._pos: dict[str, int] = {}
        self._readers: dict[int, asyncio.Task[None]] = {}
        self._wake: dict[int, asyncio.Event] = defaultdict(asyncio.Event)

    def subscribe(self, job_id: str, after: int) -> asyncio.Queue[Event]:
        q: asyncio.Queue[Event] = asyncio.Queue()
        self._subs[job_id].add(q)
        self._pos[job_id] = min(self._pos.get(job_id, after), after)
        p = keys.partition_of(job_id)
        task = self._readers.get(p)
        if task is None or task.done():
            self._readers[p] = asyncio.create_task(self._read_partition(p))
        return q

    def unsubscribe(self, job_id: str, q: asyncio.Queue[Event]) -> None:
        subs = self._subs.get(job_id)
        if subs is None:
            return
        subs.discard(q)
        if not subs:
            del self._subs[job_id]
            self._pos.pop(job_id, None)

    async def _read_partition(self, p: int) -> None:
        """Deliver new events of every watched job of partition ``p`` until none is watched."""
        while True:
            watched = {j: self._pos[j] for j in list(self._subs) if keys.partition_of(j) == p}
            if not watched:
                return
            streams = {keys.job(j).events: f"{pos}-0" for j, pos in watched.items()}
            try:
                res = await self.store.r.xread(streams, block=self.block_ms, count=500)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep serving; a Redis blip must not kill every stream
                log.warning("event reader for partition %d: %s", p, e)
                await asyncio.sleep(0.5)
                continue
            for stream, entries in res or []:
                job_id = stream.split(":job:", 1)[1].rsplit(":", 1)[0]
                for eid, fields in entries:
                    ev = Store._event(job_id, eid, fields)
                    self._pos[job_id] = max(self._pos.get(job_id, 0), ev.id)
                    for q in list(self._subs.get(job_id, ())):
                        q.put_nowait(ev)

    async def stream(self, job_id: str, after: int = 0) -> AsyncIterator[Event]:
        """The whole history after ``after``; then, for a live job, live events until JOB_FINISHED."""
        q = self.subscribe(job_id, after)
        metrics.SSE_STREAMS.inc()
        last = after
        try:
            finished = False
            for ev in await self.store.events_after(job_id, after):
                # History is replayed whole: a late REPORT_IGNORED may follow JOB_FINISHED.
                yield ev
                last = ev.id
                finished = finished or ev.type == "JOB_FINISHED"
            if finished or await self.store.is_finished(job_id):
                return  # nothing live will ever come
            while True:
                ev = await q.get()
                if ev.id <= last:
                    continue
                yield ev
                last = ev.id
                if ev.type == "JOB_FINISHED":
                    return
        finally:
            metrics.SSE_STREAMS.dec()
            self.unsubscribe(job_id, q)


def sse_frame(ev: Event) -> str:
    return f"id: {ev.id}\nevent: {ev.type}\ndata: {json.dumps(ev.model_dump(mode='json'), separators=(',', ':'))}\n\n"


async def sse_lines(events: AsyncIterator[Event], keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[str]:
    """SSE text frames, with a comment line whenever nothing was sent for ``keepalive_s``."""
    it = events.__aiter__()
    yield ": stream open\n\n"
    pending: asyncio.Task[Event] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
            if not done:
                yield ": keep-alive\n\n"
                continue
            try:
                ev = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield sse_frame(ev)
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


def parse_last_event_id(header: str | None, query: str | None) -> int:
    raw = header or query or "0"
    try:
        value = int(raw)
    except ValueError:
        return -1
    return value
