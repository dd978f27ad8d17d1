"""The control plane's FastAPI app (``serve_app.serving.runtime.local_app``) under plain uvicorn, without Ray.

- ``LocalServer``: in a thread of this process (the API and client tests: fast to start, and the
  test can reach the same Redis directly);
- ``UvicornServer``: alone in a child process (``python -m harness.uvicorn``), so it does not share
  the GIL of the load generator: the uvicorn column of the benchmarks and Ray-free load runs.

Both start their own redis-server in ``<data-dir>/redis`` unless given a ``redis_url``, and stop it
again. With ``dispatchers=0`` the server answers HTTP only and loads no model: node commands stay in
the outbox for whichever dispatcher shares the Redis.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.ops.ports import free_port
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.recovery.durability import appendfsync
from hitl_review.serve_app.serving.runtime import local_app
from hitl_review.statecore.models import NodeCommand

from .proc import Child
from .tokens import token_file


class NoRunner:
    """Stands in for the model runner when the server dispatches nothing."""

    async def run(self, cmd: NodeCommand, spec: Any = None) -> dict[str, Any]:
        raise RuntimeError("this server runs no dispatcher")


def settings(data_dir: Path, port: int, redis_url: str | None = None, **fields: Any) -> Settings:
    """``Settings`` as ``hitl up`` would fill them (``fields``: more of them, e.g. ``tokens``,
    ``detector_delay_ms``); commands left unacknowledged are reclaimed after 3 s unless told otherwise.
    The quality gate only records its verdicts (``quality_gate="off"``) unless told otherwise: this
    harness drives the box stages' protocol, whose tests answer box pauses only; the mask review is
    tested with ``quality_gate="review-failing"`` here and through ``hitl up``'s default."""
    defaults = {"reclaim_idle_ms": 3000, "quality_gate": "off"}
    return Settings(data_dir=data_dir, api_port=port, redis_url=redis_url, **{**defaults, **fields})


def control_plane(cfg: Settings, dispatchers: int) -> FastAPI:
    return local_app(cfg, dispatchers=dispatchers, runner=None if dispatchers else NoRunner())


def wait_ready(url: str, timeout: float, alive: Callable[[], bool], what: Callable[[], str]) -> None:
    """Until ``GET /readyz`` answers 200; RuntimeError when ``alive()`` turns false or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if not alive():
            raise RuntimeError(f"the control plane at {url} exited before it was ready\n{what()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the control plane at {url} was not ready after {timeout:.0f}s\n{what()}")
        time.sleep(0.1)


class _Served:
    """What both servers share: a port, an optional Redis of their own, the token file."""

    def __init__(self, data_dir: Path, redis_url: str | None, durability: str = "fast") -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.own_redis = (
            RedisServer(data_dir / "redis", appendfsync=appendfsync(durability)) if redis_url is None else None
        )
        self.redis_url = redis_url or ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    api_url = url  # the name HitlUp has, so a load run can take either

    @property
    def token(self) -> str:
        """The loopback admin token (a server started without ``tokens``)."""
        return token_file(self.data_dir)

    def _start_redis(self) -> None:
        if self.own_redis is not None:
            self.redis_url = self.own_redis.start().url

    def _stop_redis(self) -> None:
        if self.own_redis is not None:
            self.own_redis.stop()


class LocalServer(_Served):
    """The control plane in a background thread of this process, its dispatchers running the models
    in threads."""

    def __init__(self, data_dir: Path, redis_url: str | None = None, *, dispatchers: int = 1, **fields: Any) -> None:
        super().__init__(data_dir, redis_url, fields.get("durability", "fast"))
        self.dispatchers = dispatchers
        self.settings = settings(data_dir, self.port, redis_url, **fields)
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def start(self, timeout: float = 60) -> LocalServer:
        self._start_redis()
        self.settings.redis_url = self.redis_url
        app = control_plane(self.settings, self.dispatchers)
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        try:
            wait_ready(self.url, timeout, self.thread.is_alive, lambda: "")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout=15)
        self._stop_redis()


class UvicornServer(_Served):
    """The control plane alone in a child process (``python -m harness.uvicorn``)."""

    def __init__(
        self,
        data_dir: Path,
        redis_url: str | None = None,
        *,
        dispatchers: int = 0,
        detector_delay_ms: int = 0,
        log_path: Path | None = None,
        detector: str = "classical",
        segmenter: str = "classical",
    ) -> None:
        super().__init__(data_dir, redis_url)
        self.dispatchers = dispatchers
        self.detector_delay_ms = detector_delay_ms
        self.backends = (detector, segmenter)
        self.log_path = log_path
        self.child: Child | None = None

    def start(self, timeout: float = 120) -> UvicornServer:
        self._start_redis()
        cmd = [
            sys.executable,
            "-m",
            "harness.uvicorn",
            "--data-dir",
            str(self.data_dir),
            "--redis-url",
            self.redis_url,
            "--port",
            str(self.port),
            "--dispatchers",
            str(self.dispatchers),
            "--detector-delay-ms",
            str(self.detector_delay_ms),
            "--detector",
            self.backends[0],
            "--segmenter",
            self.backends[1],
        ]
        env = {k: v for k, v in os.environ.items() if k != "HITL_TOKENS"}  # loopback mode: the token file
        self.child = Child(cmd, env={**env, "PYTHONUNBUFFERED": "1"}, log_path=self.log_path).start()
        child = self.child
        try:
            wait_ready(self.url, timeout, lambda: child.running, child.tail)
        except BaseException:
            self.stop(timeout=10)
            raise
        return self

    @property
    def pid(self) -> int | None:
        return self.child.proc.pid if self.child is not None and self.child.proc is not None else None

    def stop(self, timeout: float = 30) -> int | None:
        code = self.child.stop(timeout) if self.child is not None else None
        self._stop_redis()
        return code


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m harness.uvicorn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, type=Path, help="data directory (its api-token is the admin token)")
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dispatchers", type=int, default=0, help="outbox dispatchers in this process (default 0)")
    ap.add_argument("--detector-delay-ms", type=int, default=0)
    ap.add_argument("--detector", default="classical", help="as hitl up --detector (null: no model cost)")
    ap.add_argument("--segmenter", default="classical", help="as hitl up --segmenter")
    ap.add_argument("--reclaim-idle-ms", type=int, default=5000, help="reclaim unacknowledged commands after this")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = settings(
        args.data_dir,
        args.port,
        args.redis_url,
        detector_delay_ms=args.detector_delay_ms,
        reclaim_idle_ms=args.reclaim_idle_ms,
        detector=args.detector,
        segmenter=args.segmenter,
    )
    app = control_plane(cfg, args.dispatchers)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
