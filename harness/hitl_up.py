"""A real ``hitl up`` (embedded redis-server, local Ray, Ray Serve, optionally the UI) as a child
process group on free ports: what the end-to-end tests, the load test and the benchmarks run.

``start`` waits for the ``READY api=<url> [ui=<url>] [dashboard=<url>]`` line; the embedded Redis's
URL comes from its "embedded redis-server on redis://…" log line. The Ray dashboard is off
(``--no-dashboard``, a cheaper start) unless ``dashboard=True``; joining a cluster
(``--ray-address`` among the options) the API is wherever that cluster's Serve proxy listens, as
the READY line says. ``stop`` is a SIGTERM and a clean exit, ``kill``
a SIGKILL of the whole tree (a crash); the data directory outlives both, so a second ``HitlUp`` on
it finds the same jobs.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from hitl_review.serve_app.ops.ports import quiet_port

from .proc import Child
from .tokens import token_file

READY = re.compile(r"^READY (.*)$")
EMBEDDED_REDIS = re.compile(r"embedded redis-server on (redis://\S+)")
# Inherited from the caller's shell they would point `hitl up` elsewhere: unset unless ``env`` sets them.
FOREIGN_ENV = ("HITL_TOKENS", "REDIS_URL", "HITL_REDIS_URL")


class HitlUp:
    def __init__(
        self,
        data_dir: Path,
        *args: str,
        ui: bool = False,
        dashboard: bool = False,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        api_port: int | None = None,
    ) -> None:
        """``args`` are more ``hitl up`` options (``"--detector-delay-ms", "80"``); ``log_path``
        keeps the whole output in a file as well; ``api_port``: the port of an earlier ``hitl up``
        on this data directory (a restart), a free one by default."""
        self.data_dir = data_dir
        self.api_port = api_port or quiet_port()
        self.ui_port = quiet_port() if ui else None
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.ui_url = f"http://127.0.0.1:{self.ui_port}" if ui else None
        self.redis_url: str | None = None
        self.dashboard = dashboard
        self.dashboard_url: str | None = None
        self.joins_cluster = "--ray-address" in args
        self.ready: dict[str, str] = {}
        cmd = [
            sys.executable,
            "-m",
            "hitl_review.serve_app.cli",
            "up",
            "--data-dir",
            str(data_dir),
            "--api-port",
            str(self.api_port),
            *args,
        ]
        cmd += ["--ui-port", str(self.ui_port)] if ui else ["--no-ui"]
        if "--log-format" not in args:  # its lines are read here (ports, URLs, what it logged): as text
            cmd += ["--log-format", "text"]
        if not dashboard:
            cmd.append("--no-dashboard")
        full_env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update(env or {})
        self.child = Child(cmd, env=full_env, log_path=log_path)

    @property
    def lines(self) -> list[str]:
        return self.child.lines

    @property
    def token(self) -> str:
        """The loopback admin token (``hitl up`` without ``HITL_TOKENS``)."""
        return token_file(self.data_dir)

    def start(self, timeout: float = 300) -> HitlUp:
        self.child.start()
        try:
            line = self.child.wait_for(READY, timeout).group(1)
            self.ready = dict(part.split("=", 1) for part in line.split() if "=" in part)
            if self.joins_cluster and self.ready.get("api"):
                self.api_url = self.ready["api"]
            if self.ready.get("api") != self.api_url or self.ready.get("ui") != self.ui_url:
                raise RuntimeError(f"hitl up is not where it was asked to be: READY {line}")
            self.dashboard_url = self.ready.get("dashboard")
            if self.dashboard and not self.joins_cluster and not self.dashboard_url:
                raise RuntimeError(f"hitl up names no dashboard: READY {line}")
            m = next((EMBEDDED_REDIS.search(ln) for ln in self.lines if EMBEDDED_REDIS.search(ln)), None)
            self.redis_url = m.group(1) if m else None
        except BaseException:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL the whole process tree, as a crash or an OOM would."""
        self.child.kill()

    def stop(self, timeout: float = 90) -> int | None:
        """SIGTERM and wait for a clean exit; returns the exit code (negative when it had to be killed)."""
        return self.child.stop(timeout)

    @property
    def pid(self) -> int:
        """The ``hitl up`` process, leader of its own process group (as a terminal's job would be)."""
        assert self.child.proc is not None, "not started"
        return self.child.proc.pid

    def wait_port_free(self, timeout: float = 30) -> None:
        """Until nothing listens on the API port (Ray's proxy may linger after a SIGKILL)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(
                c.laddr and c.laddr.port == self.api_port
                for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"port {self.api_port} still in use")


def ray_token_header() -> dict[str, str]:
    """Ray's authentication token (``RAY_AUTH_TOKEN``, else ``~/.ray/auth_token``, which a local
    ``ray.init`` creates) as a bearer header: what the API of ``hitl up``'s dashboard asks for."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    path = Path.home() / ".ray" / "auth_token"
    if not token and path.exists():
        token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}
