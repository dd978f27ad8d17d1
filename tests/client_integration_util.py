"""What the client integration tests (``test_client_integration.py``) drive a real control plane
with: sample images on disk, raw requests, an automatic reviewer approving every pause, a TCP proxy on
loopback that cuts streams or answers 503 (``LoopbackProxy``) and logs requests, and running the
``hitl`` CLI in this process."""

from __future__ import annotations

import hashlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.tokens import TOKENS
from hitl_review.client import (
    ApiError,
    ConnectionFailed,
    HitlClient,
    new_intervention_id,
)
from hitl_review.serve_app.cli import main as hitl_main
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore.models import JobSnapshot

ROOT = Path(__file__).resolve().parents[1]
HITL = ROOT / ".venv" / "bin" / "hitl"
WIDTH, HEIGHT = 160, 120
ENDED_WELL = {"SUCCEEDED", "PARTIAL_SUCCEEDED", "EMPTY_SELECTION"}


def write_images(folder: Path, seeds: range, prefix: str = "img") -> dict[Path, str]:
    """Small product composites (one or two objects each) → {path: sha256}."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[Path, str] = {}
    for seed in seeds:
        data, _ = product_composite(seed=seed, width=WIDTH, height=HEIGHT, n=1 + seed % 2)
        path = folder / f"{prefix}_{seed:05d}.png"
        path.write_bytes(data)
        out[path] = hashlib.sha256(data).hexdigest()
    return out


def raw_get(base_url: str, path: str, who: str = "admin") -> httpx.Response:
    return httpx.get(base_url + path, headers={"Authorization": f"Bearer {TOKENS[who]}"}, timeout=30)


def job_ids_of(base_url: str, who: str) -> set[str]:
    """Every job ``who`` may see, through raw GET /api/v1/jobs, following next_cursor."""
    ids: set[str] = set()
    cursor: str | None = None
    for _ in range(1000):
        params: dict[str, Any] = {"limit": 100}
        if cursor:
            params["cursor"] = cursor
        r = httpx.get(
            f"{base_url}/api/v1/jobs", params=params, headers={"Authorization": f"Bearer {TOKENS[who]}"}, timeout=30
        )
        assert r.status_code == 200, r.text
        body = r.json()
        ids.update(j["job_id"] for j in body["jobs"])
        cursor = body["next_cursor"]
        if not cursor or not body["jobs"]:
            return ids
    raise AssertionError("job list paging does not end")


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class AutoReviewer:
    """A reviewer in a thread: polls the queue (GET /jobs?status=WAITING, reviewer token) and
    approves every pause of the jobs ``accept`` picks, keeping all boxes (and all masks of a mask
    review). With ``delay_s`` it lets a pause sit that long before answering (so a stream has something to wait for)."""

    def __init__(
        self, base_url: str, accept: Callable[[JobSnapshot], bool], *, delay_s: float = 0.0, who: str = "rev1"
    ) -> None:
        self.client = HitlClient(base_url, TOKENS[who], backoff=0.05)
        self.accept = accept
        self.delay_s = delay_s
        self.approved: dict[str, list[str]] = {}  # job_id -> pause tokens answered
        self.errors: list[Exception] = []
        self._ignored: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auto-reviewer", daemon=True)

    def __enter__(self) -> AutoReviewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except ApiError as exc:
                if exc.status_code != 409:  # a pause answered meanwhile is fine; anything else is not
                    self.errors.append(exc)
            except ConnectionFailed as exc:
                self.errors.append(exc)
            self._stop.wait(0.05)

    def _round(self) -> None:
        for summary in self.client.iter_jobs("WAITING", page_size=200):
            if summary.job_id in self._ignored or self._stop.is_set():
                continue
            snap = self.client.get_job(summary.job_id)
            pause = snap.active_pause
            if pause is None:
                continue
            if not self.accept(snap):
                self._ignored.add(snap.job_id)
                continue
            seen = self._first_seen.setdefault(pause.pause_token, time.monotonic())
            if time.monotonic() - seen < self.delay_s:
                continue
            self.client.approve(snap, intervention_id=new_intervention_id())  # every box, or every mask
            self.approved.setdefault(snap.job_id, []).append(pause.pause_token)


class _RequestLog:
    """Splits the client→server byte stream of one connection into HTTP/1.1 requests
    (request line and headers; bodies skipped by Content-Length)."""

    def __init__(self) -> None:
        self.buf = b""
        self.body_left = 0
        self.pending: dict[str, Any] | None = None

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.buf += data
        done: list[dict[str, Any]] = []
        while True:
            if self.pending is not None:
                take = min(self.body_left, len(self.buf))
                self.buf, self.body_left = self.buf[take:], self.body_left - take
                if self.body_left:
                    return done
                done.append(self.pending)
                self.pending = None
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return done
            head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4 :]
            line, *lines = head.split("\r\n")
            method, target, _ = line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
            self.pending, self.body_left = (
                {"method": method, "path": target, "headers": headers},
                int(headers.get("content-length") or 0),
            )


REJECT_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 20\r\nConnection: close\r\n\r\nupstream unavailable"
)


class LoopbackProxy:
    """A TCP proxy on 127.0.0.1 in front of the control plane that can misbehave on purpose.

    ``reject_first``: answer that many requests with a raw 503 (Retry-After: 0) and close.
    ``cut_bytes(n)``: close connection number ``n`` after that many response bytes.
    ``cut_after_s``: close every connection that long after it was opened.
    ``response_delay_s``: hold every chunk of a response that long (a slow link).
    ``requests`` lists every request that arrived (method, path, headers, connection number).
    """

    def __init__(
        self,
        upstream: str,
        *,
        reject_first: int = 0,
        cut_bytes: Callable[[int], int] | None = None,
        cut_after_s: float | None = None,
        response_delay_s: float = 0.0,
    ) -> None:
        url = httpx.URL(upstream)
        self.upstream = (url.host, url.port)
        self.reject_left = reject_first
        self.cut_bytes = cut_bytes
        self.cut_after_s = cut_after_s
        self.response_delay_s = response_delay_s
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.active = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._closed = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.1)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LoopbackProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            self._shut(s)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                n = self.connections
                self.connections += 1
                self.active += 1
                self._socks.add(conn)
            threading.Thread(target=self._serve, args=(conn, n), daemon=True).start()

    def _shut(self, s: socket.socket) -> None:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
        with self._lock:
            self._socks.discard(s)

    def _record(self, requests: list[dict[str, Any]], n: int) -> None:
        with self._lock:
            self.requests.extend({**r, "conn": n} for r in requests)

    def _serve(self, client: socket.socket, n: int) -> None:
        log = _RequestLog()
        upstream: socket.socket | None = None
        try:
            pending, first = b"", []
            while not first:
                data = client.recv(65536)
                if not data:
                    return
                pending += data
                first = log.feed(data)
            self._record(first, n)
            with self._lock:
                reject = self.reject_left > 0
                self.reject_left -= int(reject)
            if reject:
                client.sendall(REJECT_503)
                return
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._socks.add(upstream)
            upstream.sendall(pending)
            threading.Thread(target=self._downstream, args=(upstream, client, n), daemon=True).start()
            while True:
                data = client.recv(65536)
                if not data:
                    return
                self._record(log.feed(data), n)
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._shut(client)
            if upstream is not None:
                self._shut(upstream)
            with self._lock:
                self.active -= 1

    def _downstream(self, upstream: socket.socket, client: socket.socket, n: int) -> None:
        limit = self.cut_bytes(n) if self.cut_bytes else None
        opened, sent = time.monotonic(), 0
        try:
            while True:
                if self.cut_after_s is not None and time.monotonic() - opened >= self.cut_after_s:
                    with self._lock:
                        self.cuts += 1
                    return
                ready, _, _ = select.select([upstream], [], [], 0.05)
                if not ready:
                    continue
                data = upstream.recv(65536)
                if not data:
                    return
                if self.response_delay_s:
                    time.sleep(self.response_delay_s)
                if limit is not None and sent + len(data) >= limit:
                    client.sendall(data[: limit - sent])
                    with self._lock:
                        self.cuts += 1
                    return
                client.sendall(data)
                sent += len(data)
        except (OSError, ValueError):
            pass
        finally:
            self._shut(client)
            self._shut(upstream)


def collect(iterator: Iterator[Any], timeout: float) -> list[Any]:
    """``list(iterator)`` in a thread, failing (instead of hanging the run) when it has not ended in time."""
    items: list[Any] = []
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            items.extend(iterator)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=drain, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise AssertionError(f"the iterator did not end within {timeout}s; got ids {[e.id for e in items][-20:]}")
    if errors:
        raise errors[0]
    return items


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``hitl <args>`` in this process; (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = hitl_main(args)
    out, err = capsys.readouterr()
    return code, out, err
