"""Counters and histograms that add up across processes (docs/scaling.md § Monitoring).

Each control-plane process (an Api replica, the Archiver, a standalone dispatcher, plain uvicorn)
increments its own prometheus_client counters and histograms, kept in ``metrics.LOCAL``: a registry
that is never rendered. Every ``FLUSH_S`` and before each scrape it adds what changed since its
last flush to one Redis hash (``HINCRBYFLOAT`` per sample, one pipeline), and ``/metrics`` renders
that hash. So every replica serves the totals of the whole deployment: two scrapes through a load
balancer agree, ``rate()`` is the deployment's, and dashboards aggregate with ``max()`` across
instances (as for the other figures read from Redis), never ``sum()``.

What it costs and loses: one pipelined round trip per process per ``FLUSH_S`` (only the samples
that moved); a process that dies loses at most its last ``FLUSH_S`` of increments; a Redis that
came back empty starts the totals from 0 again, a counter reset that ``rate()`` takes in its stride.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from hitl_review.statecore.durable import reraise_if_cancelled

log = logging.getLogger("hitl.metrics")

KEY = "hitl:metrics:shared"  # HASH: sample (name and labels, JSON) -> the deployment's total
FLUSH_S = 1.0
SHARED_TYPES = ("counter", "histogram")
SUFFIXES = ("_total", "_bucket", "_count", "_sum")  # the samples that add up (not ``_created``)


def field(name: str, labels: dict[str, str]) -> str:
    return json.dumps([name, sorted(labels.items())], separators=(",", ":"))


class Shared(Collector):
    """The shared totals as a collector of the rendered registry; ``flush`` and ``refresh`` are
    the two Redis operations (a scrape runs both, the background flusher the first)."""

    def __init__(self, local: CollectorRegistry) -> None:
        self.local = local
        self.flushed: dict[str, float] = {}
        self.totals: dict[str, float] = {}
        # A thread lock held only between awaits, never across one: one process may run several event
        # loops (the tests' in-process uvicorn server beside their own loop), and an asyncio.Lock waited
        # on from one loop and released from another's thread never wakes the waiting loop.
        self._lock = threading.Lock()

    def _families(self) -> list[Metric]:
        return [m for m in self.local.collect() if m.type in SHARED_TYPES]

    def _samples(self) -> dict[str, float]:
        return {
            field(s.name, s.labels): float(s.value)
            for m in self._families()
            for s in m.samples
            if s.name.endswith(SUFFIXES)
        }

    async def flush(self, r: Any) -> int:
        """Add this process's increments since the last flush to Redis; how many samples moved.
        The increments are taken as flushed before the write (so a concurrent flush sends only what
        moved after) and given back if the write fails, to go with the next flush."""
        with self._lock:
            now = self._samples()
            moved = {k: v - self.flushed.get(k, 0.0) for k, v in now.items() if v != self.flushed.get(k, 0.0)}
            self.flushed.update({k: now[k] for k in moved})
        if not moved:
            return 0
        try:
            async with r.pipeline(transaction=False) as pipe:
                for k, delta in moved.items():
                    pipe.hincrbyfloat(KEY, k, delta)
                await pipe.execute()
        except BaseException:
            with self._lock:
                for k, delta in moved.items():
                    self.flushed[k] -= delta
            raise
        return len(moved)

    async def refresh(self, r: Any) -> None:
        raw = await r.hgetall(KEY)
        self.totals = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}

    async def flush_forever(self, r: Any, every_s: float = FLUSH_S) -> None:
        """The background flusher of a process (its increments reach Redis within ``every_s``). A cancel
        that redis-py swallowed without an error (seen: a shutdown waiting on this task for good)
        ends the loop at the next round (``reraise_if_cancelled``)."""
        while True:
            reraise_if_cancelled(None)
            await asyncio.sleep(every_s)
            try:
                await self.flush(r)
            except Exception as e:  # Redis away: the increments stay here and go with the next flush
                reraise_if_cancelled(e)
                log.debug("shared metrics flush failed: %s", e)

    def collect(self) -> Iterator[Metric]:
        # A sample no process has moved yet (an unlabelled histogram before its first observation) is
        # in no Redis total: it is exported as 0, as prometheus_client would, so a rule over it has a series.
        totals = {k: 0.0 for k in self._samples()} | self.totals
        by_name: dict[str, list[tuple[str, dict[str, str], float]]] = {}
        for k, v in totals.items():
            name, labels = json.loads(k)
            by_name.setdefault(name, []).append((name, dict(labels), v))
        for family in self._families():
            out = Metric(family.name, family.documentation, family.type)
            for suffix in SUFFIXES:
                for name, labels, v in sorted(by_name.get(family.name + suffix, []), key=lambda s: _order(s[1])):
                    out.add_sample(name, labels, v)
            yield out


def _order(labels: dict[str, str]) -> tuple[Any, ...]:
    """Samples in a stable order, histogram buckets by their bound (``+Inf`` last)."""
    le = labels.get("le")
    return (tuple(sorted((k, v) for k, v in labels.items() if k != "le")), float(le) if le is not None else 0.0)
