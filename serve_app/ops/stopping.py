"""Stopping ``hitl up`` in under 10 s with no process left behind, whichever signal came first.

In order, each step bounded (and all of them within ``BUDGET_LOCAL_S`` on a cluster of our own) so
that a wedged part cannot hold the others up: the UI gets SIGTERM
(it exits meanwhile); the ``hitl`` Serve application is deleted, which lets the ingress drain its
requests and stop its dispatcher (on a cluster of our own within ``APP_DELETE_LOCAL_S``: an idle
application takes Serve ~4 s to delete, replica by replica, and whatever a model replica is still
computing resumes after a restart as after a crash, docs/protocol.md § Executors and the outbox;
on a joined cluster within ``APP_DELETE_JOINED_S``, and Serve's controller finishes it anyway);
Ray goes (our own cluster: ``ray.shutdown`` stops its daemons; a joined one: this driver only
disconnects, and Serve, its proxies and every other application stay); the embedded redis-server
gets SIGTERM (it writes its AOF); then every process this one started that is still there
(dashboard modules ``ray.shutdown`` does not wait for, workers of a raylet that died first, a UI
that ignored SIGTERM) is SIGKILLed by PID. A second SIGINT/SIGTERM while stopping skips to that
last step. Never ``serve.shutdown()``: on a shared cluster it would take other people's
applications down.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

log = logging.getLogger("hitl.up")

# All the steps but the last within this, whatever each one's own limit: SIGKILL and the exit follow.
BUDGET_LOCAL_S = 7.0
BUDGET_JOINED_S = 20.0
APP_DELETE_LOCAL_S = 2.5  # the replicas' drain (0.5 s graceful-shutdown wait loops, no direct-ingress drain) and more
APP_DELETE_JOINED_S = 15.0
RAY_SHUTDOWN_S = 3.0
REDIS_STOP_S = 2.0
KILL_WAIT_S = 2.0


class Stopper:
    def __init__(self) -> None:
        self.hurry = threading.Event()  # a second signal: no more waiting
        self.t0 = time.monotonic()
        self.deadline = self.t0 + BUDGET_LOCAL_S

    def begin(self, *, joined: bool) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + (BUDGET_JOINED_S if joined else BUDGET_LOCAL_S)

    def bounded(self, what: str, fn: Callable[[], Any], timeout: float) -> bool:
        """Run ``fn`` in a daemon thread for at most ``timeout`` s (less when hurried); False when it
        did not finish (it is left behind: the process is about to exit) or raised."""
        if self.hurry.is_set():
            log.info("stopping: skipping %s (hurried)", what)
            return False
        done = threading.Event()
        error: list[BaseException] = []

        def target() -> None:
            try:
                fn()
            except BaseException as e:  # reported below; the next step runs anyway
                error.append(e)
            finally:
                done.set()

        started = time.monotonic()
        deadline = min(started + timeout, self.deadline)
        if deadline <= started:
            log.warning("stopping: skipping %s (out of time)", what)
            return False
        threading.Thread(target=target, name=f"stop-{what}", daemon=True).start()
        while not done.wait(0.05):
            if self.hurry.is_set() or time.monotonic() > deadline:
                log.warning("stopping: %s did not finish within %.1fs; going on", what, time.monotonic() - started)
                return False
        if error:
            log.warning("stopping: %s failed: %s", what, error[0])
            return False
        log.info("stopping: %s took %.1fs", what, time.monotonic() - started)
        return True

    def terminate_ui(self, proc: subprocess.Popen[Any] | None) -> None:
        """SIGTERM, not waited for: it exits while Serve and Ray stop (or is killed at the end)."""
        if proc is not None and proc.poll() is None:
            proc.terminate()

    def stop_ray(self, app_name: str, *, serving: bool, joined: bool) -> None:
        import ray

        if serving and ray.is_initialized():
            from ray import serve

            limit = APP_DELETE_JOINED_S if joined else APP_DELETE_LOCAL_S
            self.bounded(f"deleting the {app_name!r} Serve application", lambda: serve.delete(app_name), limit)
        if ray.is_initialized():
            self.bounded("disconnecting from Ray" if joined else "Ray", ray.shutdown, RAY_SHUTDOWN_S)

    def stop_redis(self, redis: Any) -> None:
        if redis is not None:
            self.bounded("redis-server", redis.stop, REDIS_STOP_S)

    def kill_stragglers(self, procs: list[psutil.Process]) -> None:
        """SIGKILL what is still alive of ``procs`` (this process's descendants, listed when the stop
        began, plus any started since) and wait until they are gone or zombies (dead; reaping is
        their parent's job, or init's once ``hitl up`` has exited)."""
        with contextlib.suppress(psutil.Error):
            procs = procs + psutil.Process().children(recursive=True)
        left = _alive(list({p.pid: p for p in procs}.values()))
        if left:
            log.warning("stopping: killing %s", ", ".join(f"{_name(p)} ({p.pid})" for p in left))
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            deadline = time.monotonic() + KILL_WAIT_S
            while left and time.monotonic() < deadline:
                time.sleep(0.02)
                left = _alive(left)
        log.info("stopped in %.1fs", time.monotonic() - self.t0)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"
