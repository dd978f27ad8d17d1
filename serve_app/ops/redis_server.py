"""Start and stop a real ``redis-server``: the embedded default of ``hitl up`` (one server with AOF),
also what the tests and benchmarks start (``harness.redis`` joins three into a cluster)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from ..observability.logging_setup import BACKUPS, MAX_BYTES, rotate_file
from .ports import free_cluster_port, free_port

# Small hashes stay listpack-encoded: a job's meta (with its box list) is a few
# hundred bytes, so this keeps a waiting job well under 4 KiB.
# A job's event stream is a handful of entries: Redis 7.0 preallocates a stream node
# to stream-node-max-bytes (4096 by default), so a smaller node saves ~3 KiB per job.
TUNING = [
    "--hash-max-listpack-value",
    "4096",
    "--hash-max-listpack-entries",
    "256",
    "--stream-node-max-bytes",
    "1024",
    "--zset-max-listpack-entries",
    "1024",
]


def find_binary(name: str) -> str | None:
    """``name`` on PATH, else in /usr/bin (where Debian puts it, also when PATH is minimal)."""
    return shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)


def redis_binary() -> str:
    path = find_binary("redis-server")
    if not path:
        raise RuntimeError(
            "redis-server not found (PATH, /usr/bin): run `make setup` (Debian: apt-get install redis-server), "
            "or use an existing Redis with --redis-url (or HITL_REDIS_URL)"
        )
    return path


@dataclass
class RedisServer:
    """One redis-server on loopback with AOF in ``data_dir`` (``appendfsync``: everysec, or always
    under ``--durability strict``)."""

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    cluster: bool = False
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    appendfsync: str = "everysec"
    restarts: int = 0
    # redis.log (redis-server's own logfile): rotated by renaming at this size, on each start and
    # whenever ``rotate_log`` is called (``hitl up`` does each second while it supervises the server);
    # redis-server opens the file for every line it writes, so it carries on in a new redis.log.
    log_max_bytes: int = MAX_BYTES
    log_backups: int = BACKUPS

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def rotate_log(self) -> bool:
        """redis.log to redis.log.1 (and so on) once it reached ``log_max_bytes``; True if it did."""
        return rotate_file(self.log_path, self.log_max_bytes, self.log_backups)

    def start(self, timeout: float = 15.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.rotate_log()
        if not self.port:
            self.port = free_cluster_port() if self.cluster else free_port()
        args = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--logfile",
            str(self.log_path),
            *TUNING,
        ]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.data_dir / "nodes.conf"),
                "--cluster-node-timeout",
                "5000",
            ]
        args += self.extra
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5)
        while True:
            try:
                client.ping()
                # Wait until the AOF is loaded (a restart replays it before serving).
                if client.info("persistence").get("loading", 0) == 0:
                    break
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited; see {self.log_path}") from None
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start in {timeout}s")
            time.sleep(0.05)
        client.close()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exited(self) -> int | None:
        """The exit code once the server has died (by itself or by a signal), else None."""
        return self.proc.poll() if self.proc is not None else None

    def restart(self, timeout: float = 60.0) -> RedisServer:
        """Start it again on the same port and data directory: it replays its AOF before serving."""
        self.stop(kill=True)
        self.restarts += 1
        return self.start(timeout)

    def stop(self, *, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
