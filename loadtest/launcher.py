"""Start and stop the servers a load run or a benchmark talks to, as child processes.

- ``HitlUp``: a real ``hitl up --no-ui`` (embedded redis-server, local Ray, Serve) on free ports in
  a data directory of its own; the API URL comes from its ``READY`` line and the Redis URL from the
  "embedded redis-server on redis://…" log line.
- ``UvicornServer``: the same FastAPI app without Ray (``loadtest.uvicorn_server``), for the
  uvicorn column of the benchmark and for quick runs on machines where Ray is not wanted.

Both stop with SIGTERM (then SIGKILL of what they started, if they hang) and keep their output in
a log file for the report.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx
import psutil

from serve_app.redis_server import free_port

READY = re.compile(r"^READY api=(\S+)")
REDIS = re.compile(r"embedded redis-server on (redis://\S+)")


class Child:
    """A child process whose merged output is pumped into a log file and kept for matching."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._log: IO[str] | None = None

    def start(self) -> "Child":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w", buffering=1)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env, start_new_session=True, cwd=Path(__file__).resolve().parents[1])
        threading.Thread(target=self._pump, daemon=True).start()
        return self

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            if self._log:
                self._log.write(line)
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    m = pattern.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"{self.cmd[2:4]} exited with {self.proc.returncode} before "
                                       f"{pattern.pattern!r}; last output:\n" + "\n".join(self.lines[-40:]))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {pattern.pattern!r} within {timeout:.0f}s; last output:\n"
                                       + "\n".join(self.lines[-40:]))
                self._changed.wait(min(left, 1.0))

    def stop(self, timeout: float = 90) -> int | None:
        """SIGTERM, wait; if it hangs, SIGKILL it and every process it started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                tree = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                tree = []
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                for p in [psutil.Process(self.proc.pid), *tree]:
                    try:
                        p.kill()
                    except psutil.NoSuchProcess:
                        pass
                self.proc.wait(timeout=30)
        if self._log:
            time.sleep(0.2)  # let the pump drain the last lines
            self._log.close()
            self._log = None
        return self.proc.returncode


class HitlUp:
    """``hitl up --no-ui`` on a free port in ``data_dir``."""

    def __init__(self, data_dir: Path, log_path: Path, *, detector_delay_ms: int = 0,
                 extra: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        cmd = [sys.executable, "-m", "serve_app.cli", "up", "--no-ui", "--data-dir", str(data_dir),
               "--api-port", str(self.port), "--detector-delay-ms", str(detector_delay_ms), *(extra or [])]
        env = {"PYTHONUNBUFFERED": "1"}
        self.child = Child(cmd, log_path, env)
        self.api_url = ""
        self.redis_url = ""

    def start(self, timeout: float = 300) -> "HitlUp":
        os.environ.pop("HITL_TOKENS", None)  # loopback mode: the local admin token file
        self.child.env.pop("HITL_TOKENS", None)
        self.child.env.pop("REDIS_URL", None)
        self.child.start()
        try:
            self.api_url = self.child.wait_for(READY, timeout).group(1)
            self.redis_url = self.child.wait_for(REDIS, 5).group(1)
        except BaseException:
            self.child.stop(timeout=30)
            raise
        return self

    @property
    def token(self) -> str:
        return (self.data_dir / "api-token").read_text().strip()

    def stop(self, timeout: float = 90) -> int | None:
        return self.child.stop(timeout)


class UvicornServer:
    """The FastAPI control plane under plain uvicorn in a process of its own."""

    def __init__(self, data_dir: Path, redis_url: str, log_path: Path, *, dispatchers: int = 0,
                 detector_delay_ms: int = 0) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "loadtest.uvicorn_server", "--data-dir", str(data_dir), "--redis-url",
               redis_url, "--port", str(self.port), "--dispatchers", str(dispatchers),
               "--detector-delay-ms", str(detector_delay_ms)]
        self.child = Child(cmd, log_path, {"PYTHONUNBUFFERED": "1"})
        self.child.env.pop("HITL_TOKENS", None)

    def start(self, timeout: float = 120) -> "UvicornServer":
        self.child.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.child.proc is not None and self.child.proc.poll() is not None:
                raise RuntimeError("uvicorn server exited:\n" + "\n".join(self.child.lines[-40:]))
            if time.monotonic() > deadline:
                self.child.stop(timeout=10)
                raise TimeoutError("uvicorn server did not become ready")
            time.sleep(0.2)

    def stop(self, timeout: float = 30) -> int | None:
        return self.child.stop(timeout)
