"""A job's history as Redis holds it: its events (a LIST, id = position + the meta's ``event_base``,
0 but for a job restored from the mirror: ``statecore.eventrefs.read_after``) and its pauses
(docs/protocol.md § Events (SSE), § Pause). Reads only. A mixin of :class:`statecore.store.Store`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from . import eventrefs, gate_spot, keys
from .models import Event, Pause


class HistoryMixin:
    r: Any
    is_finished: Any  # Store.is_finished

    @staticmethod
    def _event(job_id: str, raw: str) -> Event:
        e = json.loads(raw)
        return Event(
            id=e["id"],
            type=e["type"],
            job_id=job_id,
            version=e["version"],
            at=e["at"],
            data={"status": e["status"], **e["data"]},
        )

    async def events_after(self, job_id: str, after: int = 0, count: int = 100_000) -> list[Event]:
        """Events with id > ``after``, oldest first. An ``after`` that a restore left behind (an id lost
        with Redis) gets every event stored, from the restore's ``JOB_RESTORED`` on."""
        raws = await eventrefs.read_after(self.r, job_id, after, count)
        return [self._event(job_id, raw) for raw in raws]

    async def review_is_blind(self, job_id: str) -> bool:
        """Whether the job's mask review withholds the gate's verdicts (statecore.gate_spot): its live
        event stream then sends them withheld (:func:`gate_spot.shown_event`)."""
        raw = await self.r.hget(keys.job(job_id).meta, "policy")
        return gate_spot.policy_share(json.loads(raw) if raw else {}) > 0

    async def stream_events(self, job_id: str, after: int = 0, poll_s: float = 0.2) -> AsyncIterator[Event]:
        """The whole history after ``after``; then, for a live job, live events until JOB_FINISHED.
        A simple polling reader for scripts; the SSE server uses serve_app.routes.events.EventHub."""
        last = after
        finished = False
        for ev in await self.events_after(job_id, after):
            yield ev
            last = ev.id
            finished = finished or ev.type == "JOB_FINISHED"
        if finished:
            return
        if await self.is_finished(job_id):
            # It ended after the history was read: the tail up to JOB_FINISHED is in the list now.
            for ev in await self.events_after(job_id, last):
                yield ev
            return
        while True:
            await asyncio.sleep(poll_s)
            for ev in await self.events_after(job_id, last):
                yield ev
                last = ev.id
                if ev.type == "JOB_FINISHED":
                    return

    async def pause_history(self, job_id: str) -> list[Pause]:
        raw = await self.r.hgetall(keys.job(job_id).pauses)
        pauses = [Pause.model_validate_json(v) for v in raw.values()]
        return sorted(pauses, key=lambda p: p.created_at)
