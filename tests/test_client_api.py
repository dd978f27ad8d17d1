"""Client unit tests that need no server: retry policy, error mapping, SSE parsing and reconnects.

``httpx.MockTransport`` stands in for the network here and only here, to script
transport-level behaviour (a 503, a dropped connection, a stream cut mid-way)
that a real server cannot be made to produce on cue. Every test that talks
through a client runs twice, on ``HitlClient`` and on ``AsyncHitlClient`` (driven
from the test through ``Blocking``), so the two cannot drift apart. The real
control plane is exercised in ``test_client_integration.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from client import (
    ApiError,
    AsyncHitlClient,
    AuthError,
    ConflictError,
    ConnectionFailed,
    HitlClient,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    WaitTimeout,
    is_conflict,
)
from client.api import WaitCancelled, normalize_base_url
from client.core import ClientCore
from client.errors import error_from_response, parse_retry_after
from client.retry import MAX_RETRY_AFTER, RetryMode, RetryPolicy
from client.sse import EventCursor, SSEDecoder, to_event
from client.steps import Send, Sleep
from statecore.models import Event

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


@pytest.fixture(params=["sync", "async"])
def client_for(request: pytest.FixtureRequest) -> Iterator[ClientFactory]:
    """``client_for(script, **kw)`` → (a client on ``script``, the delays it slept), for each of the two clients."""
    loop = asyncio.new_event_loop()
    opened: list[AsyncHitlClient | HitlClient] = []

    def make(script: Script, **kw: Any) -> tuple[Any, list[float]]:
        kw.setdefault("retries", 5)
        sleeps: list[float] = []  # no real waiting; the delays are asserted instead
        if request.param == "sync":
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


# ---------------------------------------------------------------------- retry policy over the wire


def test_503_then_200_is_retried_with_the_same_request_id(client_for: ClientFactory):
    script = Script(json_response(503, error_body("UNAVAILABLE")), json_response(200, snapshot()))
    c, sleeps = client_for(script)
    snap = c.get_job(JOB)
    assert snap.job_id == JOB and snap.active_pause is not None
    assert len(script.requests) == 2 and len(sleeps) == 1
    r1, r2 = script.requests
    assert r1.headers["Authorization"] == "Bearer tok-123"
    assert r1.headers["X-Request-ID"] and r1.headers["X-Request-ID"] == r2.headers["X-Request-ID"]
    assert r1.url.path == f"/api/v1/jobs/{JOB}"


def test_each_call_gets_its_own_request_id(client_for: ClientFactory):
    script = Script(json_response(200, snapshot()), json_response(200, snapshot()))
    c, _ = client_for(script)
    c.get_job(JOB)
    c.get_job(JOB)
    assert script.requests[0].headers["X-Request-ID"] != script.requests[1].headers["X-Request-ID"]


@pytest.mark.parametrize("status", [502, 504])
def test_gateway_errors_are_retried(status: int, client_for: ClientFactory):
    script = Script(httpx.Response(status, text="<html>bad gateway</html>"), json_response(200, snapshot()))
    c, sleeps = client_for(script)
    assert c.get_job(JOB).version == 3
    assert len(sleeps) == 1


def test_409_is_never_retried_and_carries_the_snapshot(client_for: ClientFactory):
    body = error_body("VERSION_CONFLICT", "base_version 2 is not the job's version 3", snapshot=snapshot())
    script = Script(json_response(409, body))
    c, sleeps = client_for(script)
    with pytest.raises(ConflictError) as info:
        c.intervene(
            JOB,
            intervention_id="iv_1",
            pause_token="pause_x",
            base_version=2,
            subjects=[{"box_id": "box_1", "bbox": [10, 10, 100, 120]}],
        )
    err = info.value
    assert len(script.requests) == 1 and sleeps == []
    assert err.status_code == 409 and err.code == "VERSION_CONFLICT"
    assert err.message.startswith("base_version 2")
    assert err.snapshot == snapshot() and err.body["snapshot"] == snapshot()
    assert err.job_snapshot is not None and err.job_snapshot.version == 3
    assert err.is_conflict and is_conflict(err) and is_conflict(err, "VERSION_CONFLICT")
    assert not is_conflict(err, "PAUSE_TOKEN_MISMATCH") and not is_conflict(ValueError())


@pytest.mark.parametrize(
    "status,cls",
    [
        (400, InvalidRequestError),
        (401, AuthError),
        (403, AuthError),
        (404, NotFoundError),
        (413, InvalidRequestError),
        (415, InvalidRequestError),
        (500, ServerError),
    ],
)
def test_other_errors_are_not_retried(status: int, cls: type[ApiError], client_for: ClientFactory):
    script = Script(json_response(status, error_body("SOME_CODE")))
    c, sleeps = client_for(script)
    with pytest.raises(cls) as info:
        c.get_job(JOB)
    assert info.value.status_code == status and info.value.code == "SOME_CODE"
    assert len(script.requests) == 1 and sleeps == []


def test_429_honours_retry_after_seconds(client_for: ClientFactory):
    script = Script(
        json_response(429, error_body("RATE_LIMITED"), {"Retry-After": "7"}), json_response(200, snapshot())
    )
    c, sleeps = client_for(script)
    c.get_job(JOB)
    assert sleeps == [7.0]


def test_429_without_retry_after_backs_off_and_gives_up_as_rate_limited(client_for: ClientFactory):
    script = Script(*[json_response(429, error_body("RATE_LIMITED")) for _ in range(3)])
    c, sleeps = client_for(script, retries=2, backoff=0.1)
    with pytest.raises(RateLimitedError):
        c.get_job(JOB)
    assert len(script.requests) == 3 and len(sleeps) == 2


def test_connection_errors_are_retried(client_for: ClientFactory):
    script = Script(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), json_response(200, snapshot()))
    c, sleeps = client_for(script)
    assert c.get_job(JOB).status == "WAITING_USER_SELECTION"
    assert len(script.requests) == 3 and len(sleeps) == 2


def test_retries_are_bounded_and_backoff_is_capped(client_for: ClientFactory):
    script = Script(*[json_response(503, error_body("UNAVAILABLE")) for _ in range(7)])
    c, sleeps = client_for(script, retries=6, backoff=0.5, backoff_max=2.0)
    with pytest.raises(ServerError) as info:
        c.get_job(JOB)
    assert info.value.status_code == 503
    assert len(script.requests) == 7 and len(sleeps) == 6
    assert all(0 < d <= 2.0 for d in sleeps)
    assert sleeps[0] <= 0.5 and min(sleeps[3:]) >= 1.0  # grows, then sits at the cap (jitter in [d/2, d])


def test_connection_failure_after_retries_raises_connection_failed(client_for: ClientFactory):
    script = Script(*[httpx.ConnectError("refused") for _ in range(3)])
    c, _ = client_for(script, retries=2)
    with pytest.raises(ConnectionFailed) as info:
        c.get_job(JOB)
    assert info.value.attempts == 3 and isinstance(info.value.__cause__, httpx.ConnectError)


def test_submit_without_key_is_not_resent_once_it_may_have_arrived(client_for: ClientFactory):
    script = Script(httpx.ReadError("connection reset after upload"))
    c, sleeps = client_for(script)
    with pytest.raises(ConnectionFailed):
        c.submit(png_bytes())
    assert len(script.requests) == 1 and sleeps == []

    script = Script(json_response(503, error_body("UNAVAILABLE")))
    c, sleeps = client_for(script)
    with pytest.raises(ServerError):
        c.submit(png_bytes())
    assert len(script.requests) == 1 and sleeps == []


def test_submit_without_key_retries_a_connect_error(client_for: ClientFactory):
    script = Script(
        httpx.ConnectError("refused"),
        json_response(202, {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}),
    )
    c, sleeps = client_for(script)
    res = c.submit(png_bytes())
    assert res.job_id == JOB and res.status_code == 202 and not res.replayed
    assert len(script.requests) == 2 and "Idempotency-Key" not in script.requests[1].headers


def test_submit_with_key_is_retried_and_reports_the_replay(client_for: ClientFactory):
    accepted = {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}
    script = Script(
        httpx.ReadError("reset"),
        json_response(503, error_body("UNAVAILABLE")),
        json_response(200, accepted, {"Idempotent-Replayed": "true"}),
    )
    c, sleeps = client_for(script)
    data = png_bytes()
    res = c.submit(data, idempotency_key="default:abc")
    assert (res.job_id, res.status, res.version, res.replayed, res.status_code) == (JOB, "CREATED", 1, True, 200)
    assert len(script.requests) == 3
    assert {r.headers["Idempotency-Key"] for r in script.requests} == {"default:abc"}
    assert all(data in r.content for r in script.requests)  # the whole image re-sent every time


def test_submit_sends_the_image_as_multipart_field_image(tmp_path, client_for: ClientFactory):
    data = png_bytes()
    path = tmp_path / "shoe.png"
    path.write_bytes(data)
    accepted = {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}
    script = Script(json_response(202, accepted), json_response(202, accepted))
    c, _ = client_for(script)
    c.submit(path)
    c.submit(data)
    for req, name in zip(script.requests, ("shoe.png", "image.png"), strict=True):
        assert req.method == "POST" and req.url.path == "/api/v1/jobs"
        assert req.headers["Content-Type"].startswith("multipart/form-data")
        assert f'name="image"; filename="{name}"'.encode() in req.content
        assert b"Content-Type: image/png" in req.content and data in req.content


def test_intervention_is_retried_with_the_same_body_and_keeps_raw_bytes(client_for: ClientFactory):
    raw = json.dumps(intervention_response(), separators=(",", ":")).encode()
    script = Script(
        httpx.ReadError("reset"),
        httpx.Response(200, content=raw, headers={"Idempotent-Replayed": "true", "Content-Type": "application/json"}),
    )
    c, _ = client_for(script)
    res = c.intervene(
        JOB,
        intervention_id="iv_1",
        pause_token="pause_x",
        base_version=3,
        subjects=[{"box_id": "box_1", "bbox": [10, 10, 100, 120]}],
    )
    assert res.replayed and res.raw == raw and res.next_node_type == "PROCESS_APPROVED_BOX_LIST"
    assert res.diff.kept == ["box_1"]
    bodies = [json.loads(r.content) for r in script.requests]
    assert (
        bodies[0]
        == bodies[1]
        == {
            "intervention_id": "iv_1",
            "pause_token": "pause_x",
            "base_version": 3,
            "subjects": [{"box_id": "box_1", "bbox": [10, 10, 100, 120]}],
        }
    )
    assert script.requests[0].url.path == f"/api/v1/jobs/{JOB}/interventions"


def test_cancel_results_download_paths(client_for: ClientFactory):
    results = {"job_id": JOB, "status": "SUCCEEDED", "reason_code": None, "subjects": []}
    script = Script(
        json_response(200, snapshot("CANCELLED")),
        json_response(200, results),
        httpx.Response(200, content=b"PNG1"),
        httpx.Response(200, content=b"PNG2"),
    )
    c, _ = client_for(script)
    assert c.cancel(JOB).status == "CANCELLED"
    assert c.results(JOB).status == "SUCCEEDED"
    assert c.download("/api/v1/artifacts/mask_1.png") == b"PNG1"
    assert c.download("cut out#1.png") == b"PNG2"
    paths = [r.url.raw_path.decode() for r in script.requests]
    assert paths == [
        f"/api/v1/jobs/{JOB}/cancel",
        f"/api/v1/jobs/{JOB}/results",
        "/api/v1/artifacts/mask_1.png",
        "/api/v1/artifacts/cut%20out%231.png",
    ]
    assert script.requests[0].method == "POST"


def test_download_refuses_to_send_the_token_elsewhere(client_for: ClientFactory):
    c, _ = client_for(Script())
    with pytest.raises(ValueError):
        c.download("http://evil.example/api/v1/artifacts/x.png")


def test_list_and_iter_jobs_follow_the_cursor(client_for: ClientFactory):
    def summary(i: int) -> dict[str, Any]:
        return {
            "job_id": f"job_{i}",
            "status": "CREATED",
            "version": 1,
            "created_at": "t",
            "updated_at": "t",
            "submitter": "alice",
        }

    script = Script(
        json_response(200, {"jobs": [summary(1), summary(2)], "next_cursor": "1.5:job_2"}),
        json_response(200, {"jobs": [summary(3)], "next_cursor": None}),
    )
    c, _ = client_for(script)
    assert [j.job_id for j in c.iter_jobs("WAITING_USER_SELECTION", page_size=2)] == ["job_1", "job_2", "job_3"]
    q1, q2 = (dict(r.url.params) for r in script.requests)
    assert q1 == {"status": "WAITING_USER_SELECTION", "limit": "2"}
    assert q2 == {"status": "WAITING_USER_SELECTION", "limit": "2", "cursor": "1.5:job_2"}


def test_readyz_is_not_retried(client_for: ClientFactory):
    script = Script(json_response(503, {"ready": False, "redis": True}))
    c, sleeps = client_for(script)
    with pytest.raises(ServerError) as info:
        c.readyz()
    assert info.value.body == {"ready": False, "redis": True} and sleeps == []


# ---------------------------------------------------------------------- pure parts


def test_retry_policy_decisions():
    p = RetryPolicy(retries=3, backoff=0.2, backoff_max=5.0)
    assert p.after_status(0, 409, RetryMode.IDEMPOTENT) is None
    assert p.after_status(0, 400, RetryMode.IDEMPOTENT) is None
    assert p.after_status(0, 500, RetryMode.IDEMPOTENT) is None
    assert p.after_status(0, 503, RetryMode.CONNECT_ONLY) is None
    assert p.after_status(0, 429, RetryMode.IDEMPOTENT, retry_after=3.0) == 3.0
    assert p.after_status(0, 429, RetryMode.IDEMPOTENT, retry_after=10_000) == MAX_RETRY_AFTER
    assert p.after_status(3, 503, RetryMode.IDEMPOTENT) is None
    assert p.after_error(0, httpx.ConnectError("x"), RetryMode.CONNECT_ONLY) is not None
    assert p.after_error(0, httpx.ReadError("x"), RetryMode.CONNECT_ONLY) is None
    assert p.after_error(0, httpx.ReadError("x"), RetryMode.IDEMPOTENT) is not None
    assert p.after_error(0, httpx.ConnectError("x"), RetryMode.NEVER) is None
    assert p.after_error(0, httpx.UnsupportedProtocol("x"), RetryMode.IDEMPOTENT) is None
    for attempt in range(12):
        d = p.backoff_delay(attempt)
        full = min(5.0, 0.2 * 2**attempt)
        assert full / 2 <= d <= full


def test_parse_retry_after():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    from email.utils import formatdate

    assert 50 <= parse_retry_after(formatdate(time.time() + 60, usegmt=True)) <= 61


def test_error_mapping_of_odd_bodies():
    req = httpx.Request("GET", BASE + "/x", headers={"X-Request-ID": "rid1"})
    e = error_from_response(httpx.Response(502, text="<html>Bad Gateway</html>", request=req))
    assert isinstance(e, ServerError) and e.code == "HTTP_502" and "Bad Gateway" in e.message
    assert e.request_id == "rid1" and e.snapshot is None
    e = error_from_response(httpx.Response(422, json={"detail": [{"loc": ["body"], "msg": "bad"}]}, request=req))
    assert isinstance(e, InvalidRequestError) and e.code == "INVALID_REQUEST" and "bad" in e.message
    wrapped = {"detail": {"code": "JOB_TERMINAL", "message": "ended", "snapshot": snapshot("SUCCEEDED")}}
    e = error_from_response(httpx.Response(409, json=wrapped, request=req))
    assert isinstance(e, ConflictError) and e.code == "JOB_TERMINAL" and e.snapshot["status"] == "SUCCEEDED"
    e = error_from_response(httpx.Response(409, json=error_body("JOB_NOT_FINISHED", snapshot={"x": 1})))
    assert e.snapshot == {"x": 1} and e.job_snapshot is None and e.request_id is None


def test_base_url_normalisation():
    assert normalize_base_url("http://h:8000/") == "http://h:8000"
    assert normalize_base_url("http://h:8000/api/v1/") == "http://h:8000"
    assert normalize_base_url("h:8000") == "http://h:8000"


# ---------------------------------------------------------------------- SSE


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


def test_decoder_follows_the_event_stream_rules():
    d = SSEDecoder()
    lines = [
        ": stream open",
        "",
        "id: 7",
        "event: STATUS_CHANGED",
        'data: {"a":',
        "data: 1}",
        "retry: 2500",
        "",
        ":keep-alive",
        "",
        "data:no-space",
        "ignored-field: x",
        "\r",
        "id: 8\r",
        "event: X",
        "",
    ]
    out = [e for e in (d.decode(line) for line in lines) if e is not None]
    assert [(e.id, e.event, e.data, e.retry) for e in out] == [
        ("7", "STATUS_CHANGED", '{"a":\n1}', 2500),
        ("", "message", "no-space", None),
        ("8", "X", "", None),
    ]


def test_to_event_reads_the_server_frame_and_drops_id_less_messages():
    from httpx_sse import ServerSentEvent

    raw = frame(3, "PAUSE_OPENED", "WAITING_USER_SELECTION").split("\n")
    d = SSEDecoder()
    sse = [e for e in (d.decode(line) for line in raw + [""]) if e is not None][0]
    ev = to_event(sse, JOB)
    assert ev == Event(
        id=3,
        type="PAUSE_OPENED",
        job_id=JOB,
        version=3,
        at="2025-01-01T00:00:03.000Z",
        data={"status": "WAITING_USER_SELECTION"},
    )
    assert to_event(ServerSentEvent(event="X", data='{"no":"id"}'), JOB) is None
    bare = to_event(ServerSentEvent(event="NODE_STARTED", data='{"status":"DETECTING"}', id="12"), JOB)
    assert bare is not None and (bare.id, bare.type, bare.job_id, bare.data) == (
        12,
        "NODE_STARTED",
        JOB,
        {"status": "DETECTING"},
    )


def test_cursor_drops_repeats():
    cur = EventCursor(5)
    mk = lambda i, t="X": Event(id=i, type=t, job_id=JOB, version=i, at="")  # noqa: E731
    assert cur.headers() == {"Last-Event-ID": "5"}
    assert [cur.accept(mk(i)) for i in (4, 5, 6, 6, 7)] == [False, False, True, False, True]
    assert not cur.finished and cur.accept(mk(8, "JOB_FINISHED")) and cur.finished
    assert EventCursor().headers() == {}


def test_events_reconnect_with_last_event_id_and_never_repeat(client_for: ClientFactory):
    first = sse_response(
        [
            ": stream open\n\n",
            frame(1, "JOB_CREATED", "CREATED"),
            frame(2, "STATUS_CHANGED"),
            'id: 3\nevent: NODE_STARTED\ndata: {"id":3,',
        ],
        httpx.RemoteProtocolError("cut"),
    )
    # The server (or a confused proxy) replays id 2 again: the client must drop it.
    second = sse_response(
        [
            frame(2, "STATUS_CHANGED"),
            frame(3, "NODE_STARTED"),
            frame(4, "STATUS_CHANGED", "SUCCEEDED"),
            frame(5, "JOB_FINISHED", "SUCCEEDED"),
        ]
    )
    script = Script(first, second)
    c, sleeps = client_for(script)
    events = list(c.events(JOB))
    assert [(e.id, e.type) for e in events] == [
        (1, "JOB_CREATED"),
        (2, "STATUS_CHANGED"),
        (3, "NODE_STARTED"),
        (4, "STATUS_CHANGED"),
        (5, "JOB_FINISHED"),
    ]
    r1, r2 = script.requests
    assert "Last-Event-ID" not in r1.headers and r2.headers["Last-Event-ID"] == "2"
    assert r1.headers["Accept"] == "text/event-stream" and r1.url.path == f"/api/v1/jobs/{JOB}/events"
    assert len(sleeps) == 1  # one reconnect, and none after JOB_FINISHED


def test_events_start_after_the_given_id_and_reconnect_after_a_clean_close(client_for: ClientFactory):
    script = Script(
        sse_response([frame(11, "NODE_COMPLETED")]),  # closed without JOB_FINISHED
        sse_response([frame(11, "NODE_COMPLETED"), frame(12, "JOB_FINISHED", "FAILED")]),
    )
    c, _ = client_for(script)
    assert [e.id for e in c.events(JOB, last_event_id=10)] == [11, 12]
    assert [r.headers.get("Last-Event-ID") for r in script.requests] == ["10", "11"]


def test_events_without_stop_on_finish_read_to_the_end_and_do_not_reconnect(client_for: ClientFactory):
    script = Script(sse_response([frame(1, "JOB_FINISHED", "SUCCEEDED"), frame(2, "REPORT_IGNORED", "SUCCEEDED")]))
    c, _ = client_for(script)
    assert [e.type for e in c.events(JOB, stop_on_finish=False)] == ["JOB_FINISHED", "REPORT_IGNORED"]
    assert len(script.requests) == 1


def test_events_give_up_after_repeated_failures_without_data(client_for: ClientFactory):
    script = Script(
        httpx.ConnectError("refused"),
        json_response(503, error_body("UNAVAILABLE")),
        sse_response([]),
        httpx.ConnectError("refused"),
    )
    c, sleeps = client_for(script, retries=3)
    with pytest.raises(ConnectionFailed):
        list(c.events(JOB))
    assert len(script.requests) == 4 and len(sleeps) == 3


def test_events_failure_count_resets_when_data_arrives(client_for: ClientFactory):
    chunks = [[frame(i, "STATUS_CHANGED")] for i in range(1, 5)]
    steps: list[Any] = []
    for chunk in chunks:  # each connection delivers one event then breaks: progress, so never give up
        steps += [httpx.ConnectError("refused"), sse_response(chunk, httpx.ReadError("reset"))]
    steps.append(sse_response([frame(5, "JOB_FINISHED", "SUCCEEDED")]))
    c, _ = client_for(Script(*steps), retries=1)
    assert [e.id for e in c.events(JOB)] == [1, 2, 3, 4, 5]


def test_events_http_errors_other_than_retryable_are_raised(client_for: ClientFactory):
    script = Script(json_response(404, error_body("JOB_NOT_FOUND")))
    c, _ = client_for(script)
    with pytest.raises(NotFoundError):
        list(c.events(JOB))
    assert len(script.requests) == 1


def test_events_reject_a_non_sse_answer(client_for: ClientFactory):
    c, _ = client_for(Script(json_response(200, {"not": "sse"})))
    with pytest.raises(ConnectionFailed, match="text/event-stream"):
        list(c.events(JOB))


def test_events_reconnect_after_a_read_error_and_drop_the_replayed_history(client_for: ClientFactory):
    first = sse_response([frame(1, "JOB_CREATED", "CREATED"), frame(2, "STATUS_CHANGED")], httpx.ReadError("x"))
    second = sse_response(
        [frame(1, "JOB_CREATED", "CREATED"), frame(2, "STATUS_CHANGED"), frame(3, "JOB_FINISHED", "EMPTY_SELECTION")]
    )
    script = Script(first, second)
    c, sleeps = client_for(script)
    assert [e.id for e in c.events(JOB)] == [1, 2, 3]
    assert script.requests[1].headers["Last-Event-ID"] == "2" and len(sleeps) == 1


def test_server_retry_field_sets_the_reconnect_delay(client_for: ClientFactory):
    first = sse_response(["retry: 1500\n\n", frame(1, "STATUS_CHANGED")], httpx.ReadError("x"))
    script = Script(first, sse_response([frame(2, "JOB_FINISHED", "SUCCEEDED")]))
    c, sleeps = client_for(script)
    assert [e.id for e in c.events(JOB)] == [1, 2]
    assert sleeps == [1.5]


# ---------------------------------------------------------------------- wait_for


def test_wait_for_follows_the_stream_and_confirms_with_get(client_for: ClientFactory):
    stream = sse_response(
        [
            frame(1, "JOB_CREATED", "CREATED"),
            frame(2, "PAUSE_OPENED", "WAITING_USER_SELECTION"),
            frame(3, "STATUS_CHANGED", "PROCESSING_APPROVED_SUBJECTS"),
            frame(4, "STATUS_CHANGED", "SUCCEEDED"),
            frame(5, "JOB_FINISHED", "SUCCEEDED"),
        ]
    )
    script = Script(json_response(200, snapshot("DETECTING")), stream, json_response(200, snapshot("SUCCEEDED")))
    c, _ = client_for(script)
    seen: list[str] = []
    snap = c.wait_for(JOB, timeout=10, on_status=seen.append)
    assert snap.status == "SUCCEEDED"
    assert seen == ["DETECTING", "CREATED", "WAITING_USER_SELECTION", "PROCESSING_APPROVED_SUBJECTS", "SUCCEEDED"]
    assert [r.url.path.rsplit("/", 1)[-1] for r in script.requests] == [JOB, "events", JOB]


def test_wait_for_a_live_status_ignores_stale_history(client_for: ClientFactory):
    # The history shows a pause that is already consumed; only the GET decides.
    stream = sse_response(
        [
            frame(2, "PAUSE_OPENED", "WAITING_USER_SELECTION"),
            frame(3, "STATUS_CHANGED", "VALIDATING_MANUAL_BOXES"),
            frame(4, "PAUSE_OPENED", "WAITING_BOX_BATCH_REVISION"),
        ]
    )
    script = Script(
        json_response(200, snapshot("VALIDATING_MANUAL_BOXES")),
        stream,
        json_response(200, snapshot("VALIDATING_MANUAL_BOXES")),
        json_response(200, snapshot("WAITING_BOX_BATCH_REVISION")),
    )
    c, _ = client_for(script)
    snap = c.wait_for(JOB, {"WAITING_USER_SELECTION", "WAITING_BOX_BATCH_REVISION"}, timeout=10)
    assert snap.status == "WAITING_BOX_BATCH_REVISION"


def test_wait_for_returns_at_once_when_already_there(client_for: ClientFactory):
    script = Script(json_response(200, snapshot("EMPTY_SELECTION")))
    c, _ = client_for(script)
    assert c.wait_for(JOB).status == "EMPTY_SELECTION" and len(script.requests) == 1


def test_wait_for_falls_back_to_polling_when_the_stream_keeps_failing(client_for: ClientFactory):
    steps: list[Any] = [json_response(200, snapshot("DETECTING"))]
    steps += [json_response(503, error_body("UNAVAILABLE")) for _ in range(3)]
    steps += [json_response(200, snapshot("DETECTING")), json_response(200, snapshot("SUCCEEDED"))]
    script = Script(*steps)
    c, sleeps = client_for(script, retries=2)
    assert c.wait_for(JOB, timeout=30).status == "SUCCEEDED"
    assert [r.url.path.endswith("/events") for r in script.requests] == [False, True, True, True, False, False]


def test_wait_for_times_out_on_a_stream_of_keep_alives(client_for: ClientFactory):
    keepalives = sse_response([": keep-alive\n\n"] * 200, pause=0.01)
    script = Script(json_response(200, snapshot()), keepalives)
    c, _ = client_for(script)
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        c.wait_for(JOB, timeout=0.2)
    assert time.monotonic() - t0 < 1.5
    assert info.value.snapshot is not None and info.value.snapshot.status == "WAITING_USER_SELECTION"


def test_wait_for_rejects_names_that_are_no_status(client_for: ClientFactory):
    c, _ = client_for(Script())
    with pytest.raises(ValueError):
        c.wait_for(JOB, {"WAITING"})


def test_wait_for_retries_its_first_get(client_for: ClientFactory):
    stream = sse_response(
        [frame(1, "STATUS_CHANGED", "FINALIZING_RESULTS"), frame(2, "JOB_FINISHED", "PARTIAL_SUCCEEDED")]
    )
    script = Script(
        json_response(503, error_body("UNAVAILABLE")),
        json_response(200, snapshot("DETECTING")),
        stream,
        json_response(200, snapshot("PARTIAL_SUCCEEDED")),
    )
    c, sleeps = client_for(script, backoff=0.001)
    assert c.wait_for(JOB, timeout=10).status == "PARTIAL_SUCCEEDED"
    assert len(script.requests) == 4 and len(sleeps) == 1


def test_wait_for_closes_the_stream_it_stopped_reading(client_for: ClientFactory):
    body = CutStream([frame(1, "STATUS_CHANGED", "SUCCEEDED"), ": more to come\n\n"] * 3)
    stream = httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=body)
    script = Script(json_response(200, snapshot("DETECTING")), stream, json_response(200, snapshot("SUCCEEDED")))
    c, _ = client_for(script)
    assert c.wait_for(JOB, timeout=10).status == "SUCCEEDED"
    assert body.closed


def test_sync_wait_for_stops_when_cancelled():
    import threading

    cancel = threading.Event()
    cancel.set()
    script = Script(json_response(200, snapshot("DETECTING")), sse_response([": keep-alive\n\n"]))
    c = HitlClient(BASE, "t", transport=httpx.MockTransport(script))
    with pytest.raises(WaitCancelled):
        c.wait_for(JOB, timeout=10, cancel=cancel)


def test_async_submit_reads_a_file(tmp_path):
    path = tmp_path / "shoe.png"
    path.write_bytes(png_bytes())
    accepted = {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}
    script = Script(json_response(202, accepted))

    async def run() -> str:
        async with AsyncHitlClient(BASE, "t", transport=httpx.MockTransport(script)) as c:
            return (await c.submit(path, idempotency_key="k:1")).job_id

    assert asyncio.run(run()) == JOB
    assert b'filename="shoe.png"' in script.requests[0].content


# ---------------------------------------------------------------------- the core on its own


def test_a_plan_is_driven_by_hand_without_any_client():
    """The core decides and builds; whoever performs its steps only sends and sleeps."""
    core = ClientCore(
        BASE + "/api/v1/", "tok", timeout=5.0, policy=RetryPolicy(retries=2, backoff=0.1, backoff_max=1.0)
    )
    plan = core.get_job(JOB)
    step = next(plan)
    assert isinstance(step, Send) and not step.stream
    assert str(step.request.url) == f"{BASE}/api/v1/jobs/{JOB}"
    assert step.request.headers["Authorization"] == "Bearer tok"
    rid = step.request.headers["X-Request-ID"]
    step = plan.send(json_response(503, error_body("UNAVAILABLE")))
    assert isinstance(step, Sleep) and 0 < step.seconds <= 0.1
    step = plan.send(None)
    assert isinstance(step, Send) and step.request.headers["X-Request-ID"] == rid
    step = plan.throw(httpx.ConnectError("refused"))
    assert isinstance(step, Sleep)
    step = plan.send(None)
    with pytest.raises(StopIteration) as done:
        plan.send(json_response(200, snapshot("SUCCEEDED")))
    assert done.value.value.status == "SUCCEEDED"
