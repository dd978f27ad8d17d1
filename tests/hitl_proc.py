"""Runs a real `hitl up` (embedded Redis, local Ray, Serve, optionally the UI) as a child process group."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from serve_app.redis_server import free_port


class HitlUp:
    def __init__(self, data_dir: Path, *args: str, ui: bool = False, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.api_port = free_port()
        self.ui_port = free_port() if ui else None
        self.args = list(args)
        self.ui = ui
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.ui_url = f"http://127.0.0.1:{self.ui_port}" if ui else None

    @property
    def token(self) -> str:
        return (self.data_dir / "api-token").read_text().strip()

    def start(self, timeout: float = 240) -> "HitlUp":
        cmd = [sys.executable, "-m", "serve_app.cli", "up", "--data-dir", str(self.data_dir),
               "--api-port", str(self.api_port), *self.args]
        cmd += ["--ui-port", str(self.ui_port)] if self.ui else ["--no-ui"]
        env = {**os.environ, **self.env}
        if "HITL_TOKENS" not in self.env:
            env.pop("HITL_TOKENS", None)  # loopback mode: the local token file
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        ready: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert self.proc and self.proc.stdout
            for line in self.proc.stdout:
                self.lines.append(line)
                if line.startswith("READY "):
                    ready.put(line)

        threading.Thread(target=pump, daemon=True).start()
        try:
            line = ready.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise RuntimeError("hitl up did not print READY:\n" + "".join(self.lines[-60:]))
        assert f"api={self.api_url}" in line, line
        if self.ui:
            assert f"ui={self.ui_url}" in line, line
        else:
            assert "ui=" not in line, line
        return self

    def _tree(self) -> list[psutil.Process]:
        if not self.proc:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the whole process tree, as a crash or an OOM would."""
        procs = self._tree()
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=20)
        if self.proc:
            self.proc.wait(timeout=20)

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        assert self.proc
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        return self.proc.returncode

    def wait_port_free(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(c.laddr and c.laddr.port == self.api_port for c in psutil.net_connections("tcp")
                       if c.status == psutil.CONN_LISTEN):
                return
            time.sleep(0.2)
        raise RuntimeError(f"port {self.api_port} still in use")
