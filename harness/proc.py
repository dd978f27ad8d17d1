"""A child process the harness starts: a session (process group) of its own, stdout and stderr
merged, every line kept in ``lines`` (and written to a log file when given) for matching and for
the report when something goes wrong. Stopping is SIGTERM first; what does not exit in time is
SIGKILLed with every process it started, so nothing outlives a test or a benchmark."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil


class Child:
    def __init__(
        self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, log_path: Path | None = None
    ) -> None:
        self.cmd = list(cmd)
        self.env = dict(os.environ if env is None else env)
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._log: IO[str] | None = None
        self._pump_thread: threading.Thread | None = None

    def start(self) -> Child:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("w", buffering=1)
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env, start_new_session=True
        )
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        return self

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            with self._changed:
                if self._log is not None:
                    self._log.write(line)
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:])

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first output line matching ``pattern``; RuntimeError when the process exits first,
        TimeoutError when ``timeout`` passes."""
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
                    raise RuntimeError(
                        f"{' '.join(self.cmd[:4])} exited with {self.proc.returncode} before "
                        f"{pattern.pattern!r}; last output:\n{self.tail()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {pattern.pattern!r} within {timeout:.0f}s; last output:\n{self.tail()}")
                self._changed.wait(min(left, 1.0))

    def tree(self) -> list[psutil.Process]:
        """The process and every process it started (still alive)."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the process group and every descendant (also those that left the group), as a crash
        or the OOM killer would, and wait for them."""
        procs = self.tree()
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=20)
        if self.proc is not None:
            self.proc.wait(timeout=20)
        self._close_log()

    def stop(self, timeout: float = 90) -> int | None:
        """SIGTERM and wait for the exit code; past ``timeout``, :meth:`kill` (the code is then negative)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()
        return self.proc.returncode

    def _close_log(self) -> None:
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=2)  # the last lines of a process that just exited
        with self._changed:
            log, self._log = self._log, None
        if log is not None:
            log.close()
