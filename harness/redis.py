"""A 3-master Redis Cluster on loopback for the tests (the scripts must stay within one hash slot).

Single servers are the product's own ``serve_app.ops.redis_server.RedisServer`` (the embedded Redis of
``hitl up``); the cluster is three of them joined with ``redis-cli --cluster create``.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from hitl_review.serve_app.ops.redis_server import RedisServer, find_binary


@dataclass
class RedisCluster:
    """Three masters on loopback, no replicas, each with AOF in ``base_dir/node<i>``."""

    base_dir: Path
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 30) -> RedisCluster:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> RedisCluster:
        for i in range(3):
            self.nodes.append(RedisServer(self.base_dir / f"node{i}", cluster=True).start())
        cli = find_binary("redis-cli") or "redis-cli"
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in self.nodes],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            client = redis.Redis(port=node.port, decode_responses=True)
            try:
                while not _cluster_ok(client):
                    if time.monotonic() > deadline:
                        raise RuntimeError("redis cluster did not become ok")
                    time.sleep(0.1)
            finally:
                client.close()
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def _cluster_ok(client: redis.Redis) -> bool:
    info = client.cluster("INFO")  # parsed into a dict by redis-py
    return isinstance(info, dict) and info.get("cluster_state") == "ok"
