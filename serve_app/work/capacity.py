"""How many calls a dispatcher may have outstanding per model deployment (docs/protocol.md § Lifecycle).

A call handed to a DeploymentHandle beyond the deployment's free slots waits in Serve's router
queue, where no heartbeat, deadline or backlog count can see it. So a dispatcher keeps at most
what the deployment can start now: its RUNNING replicas × ``max_ongoing_requests``, read from
Serve's controller every ``refresh_s`` (5 s: autoscaling acts in tens of seconds), shared among the
Api replicas' dispatchers, plus one call per replica waiting at the router: Serve's autoscaler scales
on ongoing + queued requests, and with ``max_ongoing_requests`` at ``target_ongoing_requests`` a
saturated deployment would otherwise never ask for more replicas. Everything else stays in the
outbox, where admission control counts it and any dispatcher can take it.

:class:`Slots` is the dispatcher's side: it waits for a free slot of the node's deployment before
the call is made, and tells the dispatcher how many more commands of each outbox lane it can start now.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hitl_review.statecore.durable import reraise_if_cancelled

from ..observability import metrics

log = logging.getLogger("hitl.capacity")

Limits = Callable[[], Mapping[str, int]]


class Slots:
    """Outstanding model calls per deployment, each bounded by ``limits()[deployment]``; a
    deployment the limits do not name (the in-process runner) is bounded only by the dispatcher's
    own concurrency."""

    def __init__(self, limits: Limits, poll_s: float = 0.25) -> None:
        self.limits = limits
        self.poll_s = poll_s  # limits change without a notification (autoscaling): look this often
        self.busy: defaultdict[str, int] = defaultdict(int)
        # Per deployment, commands this dispatcher read that wait for one of its slots (a command of
        # the detect lane an earlier version queued for another deployment, a reclaimed one).
        self.waiting: defaultdict[str, int] = defaultdict(int)
        self._freed = asyncio.Event()

    def free(self, deployments: Iterable[str], starting: Mapping[str, int] | None = None) -> int | None:
        """How many more commands to read now for a lane whose nodes run on ``deployments``: the
        free slots of the one with the most, less the commands already waiting here for its slots
        (and ``starting``: read, on their way to them); None when one of them is not bounded (the
        limits do not name it). Each lane is read within its own deployments' slots
        (statecore.outbox), so a command read is one that can start."""
        limits = self.limits()
        starting = starting or {}
        free = []
        for d in deployments:
            if d not in limits:
                return None
            free.append(max(0, limits[d] - self.busy[d] - self.waiting[d] - starting.get(d, 0)))
        return max(free, default=None)

    async def acquire(self, deployment: str) -> None:
        self.waiting[deployment] += 1
        try:
            while True:
                limit = self.limits().get(deployment)
                if limit is None or self.busy[deployment] < limit:
                    self.busy[deployment] += 1
                    self._export(deployment, limit)
                    return
                self._freed.clear()
                try:
                    await asyncio.wait_for(self._freed.wait(), self.poll_s)
                except TimeoutError:
                    pass
        finally:
            self.waiting[deployment] -= 1

    def release(self, deployment: str) -> None:
        self.busy[deployment] -= 1
        self._export(deployment, self.limits().get(deployment))
        self._freed.set()

    def _export(self, deployment: str, limit: int | None) -> None:
        metrics.DISPATCH_CALLS.labels(deployment).set(self.busy[deployment])
        if limit is not None:
            metrics.DISPATCH_LIMIT.labels(deployment).set(limit)


class ServeCapacity:
    """The model deployments' capacity as Serve's controller reports it, refreshed in the background.

    ``fallback``: each deployment's ``max_ongoing_requests`` as configured, used (with one replica)
    until the controller first answers; ``share``: how many dispatchers (Api replicas) divide it."""

    def __init__(self, app: str, fallback: Mapping[str, int], share: int = 1, refresh_s: float = 5.0) -> None:
        self.app = app
        self.share = max(1, share)
        self.refresh_s = refresh_s
        self.seen: dict[str, tuple[int, int]] = {name: (1, n) for name, n in fallback.items()}
        self._task: asyncio.Task[None] | None = None

    def limits(self) -> dict[str, int]:
        if self._task is None:
            try:
                self._task = asyncio.get_running_loop().create_task(self._refresh_forever())
            except RuntimeError:  # no loop yet: the fallback until one asks again
                pass
        return {name: limit(replicas, slots, self.share) for name, (replicas, slots) in self.seen.items()}

    async def _refresh_forever(self) -> None:
        while True:
            reraise_if_cancelled(None)  # a cancel swallowed on the way ends the loop
            try:
                found = await asyncio.to_thread(read_deployments, self.app, list(self.seen))
                for name, (replicas, slots) in found.items():
                    if self.seen.get(name) != (replicas, slots):
                        log.info("%s: %d running replica(s) x %d slots", name, replicas, slots)
                    self.seen[name] = (replicas, slots)
            except Exception as e:  # the controller is busy or restarting: keep the last figures
                log.warning("could not read the deployments' replicas from Serve: %s: %s", type(e).__name__, e)
            await asyncio.sleep(self.refresh_s)


def limit(replicas: int, slots: int, share: int) -> int:
    """This dispatcher's share of what a deployment can start now, plus a call per replica queued
    at the router for the autoscaler; never 0 (a deployment between replicas is asked once)."""
    return max(1, math.ceil((max(1, replicas) * (slots + 1)) / share))


def read_deployments(app: str, names: list[str]) -> dict[str, tuple[int, int]]:
    """(RUNNING replicas, max_ongoing_requests) of each named deployment of ``app``, from the
    controller's details as a plain mapping (what ``serve.status()`` reads; parsing it into Serve's
    pydantic models cost the Api replica more CPU than everything else it did while idle)."""
    from ray.serve.context import _get_global_client  # the client serve.status() uses

    client = _get_global_client()
    if client is None:  # Serve is not running (yet)
        return {}
    details: dict[str, Any] = client.get_serve_details()
    deployments = ((details.get("applications") or {}).get(app) or {}).get("deployments") or {}
    out: dict[str, tuple[int, int]] = {}
    for name in names:
        d = deployments.get(name)
        if not d:
            continue
        states = [getattr(r.get("state"), "value", r.get("state")) for r in d.get("replicas") or []]
        running = states.count("RUNNING")
        slots = (d.get("deployment_config") or {}).get("max_ongoing_requests")
        out[name] = (running, int(slots) if isinstance(slots, int) else 1)
    return out
