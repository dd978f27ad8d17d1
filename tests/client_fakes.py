"""Fakes for the client unit tests: a scripted ``httpx.MockTransport``, an async client driven like a
sync one, canned snapshots and SSE streams that break on cue (see ``test_client_api.py``)."""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
from PIL import Image

from hitl_review.client import AsyncHitlClient, HitlClient

BASE = "http://hitl.test"
JOB = "job_0123456789abcdef0123"


def snapshot(status: str = "WAITING_USER_SELECTION", version: int = 3) -> dict[str, Any]:
    waiting = status.startswith("WAITING")
    return {
        "job_id": JOB,
        "status": status,
        "version": version,
        "round": 1,
        "created_at": "2025-01-01T00:00:00.000Z",
        "updated_at": "2025-01-01T00:00:01.000Z",
        "image": {"sha256": "a" * 64, "width": 640, "height": 480, "url": "/api/v1/artifacts/img_a.png"},
        "box_list": [{"box_id": "box_1", "bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.9, "source": "model"}],
        "approved_box_list": [],
        "active_pause": {
            "pause_token": "pause_x",
            "status": "WAITING",
            "stage": "WAITING_USER_SELECTION",
            "base_version": version,
            "round": 1,
            "snapshot_id": "snap_1",
            "created_at": "2025-01-01T00:00:01.000Z",
        }
        if waiting
        else None,
        "pending_actions": ["SUBMIT_BOX_LIST", "DRAW_MANUAL_BOX"] if waiting else [],
        "current_node": None,
        "reason_code": None,
        "cancel_requested": False,
        "empty_selection": False,
    }


def intervention_response() -> dict[str, Any]:
    return {
        "intervention_id": "iv_1",
        "job_id": JOB,
        "accepted": True,
        "status": "PROCESSING_APPROVED_SUBJECTS",
        "version": 4,
        "next_node_type": "PROCESS_APPROVED_BOX_LIST",
        "diff": {"kept": ["box_1"], "added": [], "deleted": []},
    }


def png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


class Script:
    """A MockTransport handler that plays a list of steps (a Response, an exception, or a callable) in order."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        request.read()
        if not self.steps:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        step = self.steps.pop(0)
        if callable(step) and not isinstance(step, httpx.Response):
            step = step(request)
        if isinstance(step, Exception):
            raise step
        return step


class Blocking:
    """An ``AsyncHitlClient`` called like a ``HitlClient``: coroutines run on ``loop``, async iterators are drained."""

    def __init__(self, client: AsyncHitlClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client, self._loop = client, loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if inspect.isawaitable(result):
                return self._loop.run_until_complete(result)
            if isinstance(result, AsyncIterator):
                return self._loop.run_until_complete(drain(result))
            return result

        return call


async def drain(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


ClientFactory = Callable[..., tuple[Any, list[float]]]


CLIENT_KINDS = ["sync", "async"]


def client_factory(kind: str) -> Iterator[ClientFactory]:
    """The body of each module's ``client_for`` fixture (``params=CLIENT_KINDS``): ``client_for(script, **kw)``
    → (a client on ``script``, the delays it slept), for each of the two clients."""
    loop = asyncio.new_event_loop()
    opened: list[AsyncHitlClient | HitlClient] = []

    def make(script: Script, **kw: Any) -> tuple[Any, list[float]]:
        kw.setdefault("retries", 5)
        sleeps: list[float] = []  # no real waiting; the delays are asserted instead
        if kind == "sync":
            c = HitlClient(BASE, "tok-123", transport=httpx.MockTransport(script), **kw)
            c._sleep = sleeps.append
            opened.append(c)
            return c, sleeps

        async def fake_sleep(seconds: float) -> None:
            sleeps.append(seconds)

        ac = AsyncHitlClient(BASE, "tok-123", transport=httpx.MockTransport(script), **kw)
        ac._sleep = fake_sleep
        opened.append(ac)
        return Blocking(ac, loop), sleeps

    yield make
    for c in opened:
        if isinstance(c, AsyncHitlClient):
            loop.run_until_complete(c.aclose())
        else:
            c.close()
    loop.close()


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def error_body(code: str, message: str = "m", **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **extra}


def frame(eid: int, etype: str, status: str = "DETECTING", **data: Any) -> str:
    ev = {
        "id": eid,
        "type": etype,
        "job_id": JOB,
        "version": eid,
        "at": f"2025-01-01T00:00:{eid:02d}.000Z",
        "data": {"status": status, **data},
    }
    return f"id: {eid}\nevent: {etype}\ndata: {json.dumps(ev, separators=(',', ':'))}\n\n"


class CutStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """Sends ``chunks``, then (optionally) breaks the connection, like a dropped proxy."""

    def __init__(self, chunks: list[str], error: Exception | None = None, pause: float = 0.0) -> None:
        self.chunks, self.error, self.pause = chunks, error, pause
        self.closed = False

    def __iter__(self):
        for c in self.chunks:
            if self.pause:
                time.sleep(self.pause)
            yield c.encode()
        if self.error is not None:
            raise self.error

    async def __aiter__(self):
        for c in self.chunks:
            if self.pause:
                await asyncio.sleep(self.pause)
            yield c.encode()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def sse_response(chunks: list[str], error: Exception | None = None, pause: float = 0.0) -> httpx.Response:
    return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=CutStream(chunks, error, pause))
