"""Heartbeats of a running node, sent by the process doing its work.

The dispatcher awaiting a model call cannot tell a slow model from a stopped one; the process
running the model can. While a node runs, a daemon thread in that process renews the node's
heartbeat (a tiny script that touches only the heartbeat index, never job state) every
``every_s``. A SIGSTOPped or dead process stops beating; the inspector then re-dispatches the
node (docs/protocol.md § Executors and the outbox). The thread stops by itself when the node is
no longer the job's running node (completed, or superseded by a re-dispatch).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import redis
from pydantic import BaseModel

from . import keys, scripts

log = logging.getLogger("hitl.heartbeat")

_clients: dict[str, tuple[Any, Any]] = {}
_clients_lock = threading.Lock()


class HeartbeatSpec(BaseModel):
    """What a model replica needs to beat for one node (crosses the Ray boundary as a dict)."""

    redis_url: str
    job_id: str
    node_instance_id: str
    every_s: float = 2.0
    executor: str = ""  # who runs the node (e.g. a Serve replica's name): the inspector asks it first
    executor_ttl_s: float = 30.0  # the executor record outlives a stopped process by at most this


def _client(url: str) -> tuple[Any, Any]:
    """One synchronous client and registered script per Redis URL in this process."""
    with _clients_lock:
        if url not in _clients:
            cluster = url.startswith("redis+cluster://")
            plain = url.replace("redis+cluster://", "redis://")
            client: Any = (
                redis.RedisCluster.from_url(plain, socket_timeout=2.0)
                if cluster
                else redis.Redis.from_url(plain, socket_timeout=2.0, socket_connect_timeout=2.0)
            )
            _clients[url] = (client, client.register_script(scripts.source("heartbeat")))
        return _clients[url]


def beat(spec: HeartbeatSpec, *, release: bool = False) -> bool:
    """One renewal (and the executor record); False when the node is no longer running (stop
    beating). ``release``: the executor is done with the node, its record goes."""
    _, script = _client(spec.redis_url)
    jk = keys.job(spec.job_id)
    args = [spec.job_id, spec.node_instance_id, int(time.time() * 1000), spec.executor]
    args += [int(spec.executor_ttl_s * 1000), "release" if release else ""]
    return bool(script(keys=[jk.meta, jk.heartbeats, jk.executor_of(spec.node_instance_id)], args=args))


class Heartbeat:
    """``with Heartbeat(spec):`` around a node's work; ``spec=None`` beats nothing."""

    def __init__(self, spec: HeartbeatSpec | dict[str, Any] | None) -> None:
        self.spec = HeartbeatSpec.model_validate(spec) if isinstance(spec, dict) else spec
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0

    def _run(self) -> None:
        assert self.spec is not None
        while not self._stop.wait(self.spec.every_s):
            try:
                if not beat(self.spec):
                    return  # the node is no longer running here: nothing left to vouch for
                self.beats += 1
            except redis.RedisError as e:  # Redis away: keep trying; a lapse is the inspector's call
                log.warning("heartbeat for node %s failed: %s", self.spec.node_instance_id, e)

    def __enter__(self) -> Heartbeat:
        if self.spec is not None:
            if self.spec.executor:
                with contextlib.suppress(redis.RedisError):
                    beat(self.spec)  # record the executor at once, not one period later
            self._thread = threading.Thread(target=self._run, name="hitl-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.spec is not None and self.spec.executor:
            # Done here (answered or failed): asked now, this executor must not vouch for the node.
            with contextlib.suppress(redis.RedisError):
                beat(self.spec, release=True)
