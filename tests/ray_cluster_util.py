"""A throw-away Ray cluster for tests that drive Ray's own CLI: ``ray start --head --block`` as a
child process group, every port chosen free on loopback, its own ``--temp-dir`` (short: Ray's
unix sockets live under it). Stopping is SIGTERM to ``ray start --block`` (it stops what it
started), then SIGKILL to any process left whose command line names the temp dir; never a global
``ray stop``, which would end other people's clusters on the machine.

Ray 2.60 clusters use token authentication: this one gets a token of its own (``auth_env``: give
it to every client, the ``serve`` CLI included), so it neither needs nor touches ~/.ray/auth_token."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from harness.proc import Child
from serve_app.redis_server import free_port

BIN = Path(sys.executable).parent
STARTED = re.compile(r"Ray runtime started|--block")


def ray_cli(name: str) -> str:
    """``ray`` or ``serve`` from this interpreter's environment (the venv's ``bin``)."""
    path = BIN / name
    return str(path) if path.exists() else name


class RayHead:
    def __init__(self, *, num_cpus: int = 6, num_gpus: int = 0, env: Mapping[str, str] | None = None) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hitl-rt-", dir="/tmp"))
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.gcs_address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        ports = {
            "--port": self.gcs_port,
            "--dashboard-port": self.dashboard_port,
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--ray-client-server-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
        }
        cmd = [
            ray_cli("ray"),
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--temp-dir",
            str(self.temp_dir),
            "--num-cpus",
            str(num_cpus),
            "--num-gpus",
            str(num_gpus),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--object-store-memory",
            str(200 * 1024 * 1024),
            "--disable-usage-stats",
        ]
        for flag, port in ports.items():
            cmd += [flag, str(port)]
        full_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        full_env.update(env or {})
        full_env.update(self.auth_env)
        self.child = Child(cmd, env=full_env)

    def start(self, timeout: float = 180) -> RayHead:
        self.child.start()
        try:
            self.child.wait_for(STARTED, timeout)
            self._wait_dashboard(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_dashboard(self, timeout: float) -> None:
        """``serve deploy``/``serve status`` go through the dashboard's REST API: wait until it answers
        (401 included: Ray's token authentication is on by default and the CLI sends the token)."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.dashboard_url}/api/version", timeout=5).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if not self.child.running:
                raise RuntimeError(f"ray start exited; last output:\n{self.child.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray dashboard did not answer within {timeout:.0f}s:\n{self.child.tail()}")
            time.sleep(0.5)

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this cluster still alive (their command line names its temp dir)."""
        mine = str(self.temp_dir)
        out = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if any(mine in part for part in p.info["cmdline"] or ()):
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    def stop(self, timeout: float = 60) -> None:
        if self.child.proc is not None and self.child.running:
            self.child.proc.send_signal(signal.SIGTERM)
            try:
                self.child.proc.wait(timeout=timeout)
            except Exception:
                self.child.kill()
        for p in self.leftovers():
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(self.leftovers(), timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
