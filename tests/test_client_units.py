"""Client unit tests of the pure parts, no client and no network: the retry policy's decisions,
``Retry-After`` and error-body mapping, URL normalisation, SSE decoding and the event cursor, and a
plan of the core driven by hand."""

from __future__ import annotations

import time

import httpx
import pytest

from hitl_review.client import (
    ConflictError,
    InvalidRequestError,
    ServerError,
)
from hitl_review.client.api import normalize_base_url
from hitl_review.client.core import ClientCore
from hitl_review.client.errors import error_from_response, parse_retry_after
from hitl_review.client.retry import MAX_RETRY_AFTER, RetryMode, RetryPolicy
from hitl_review.client.sse import EventCursor, SSEDecoder, to_event
from hitl_review.client.steps import Send, Sleep
from hitl_review.statecore.models import Event
from tests.client_fakes import (
    BASE,
    JOB,
    error_body,
    frame,
    json_response,
    snapshot,
)

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

    def mk(i: int, t: str = "X") -> Event:
        return Event(id=i, type=t, job_id=JOB, version=i, at="")

    assert cur.headers() == {"Last-Event-ID": "5"}
    assert [cur.accept(mk(i)) for i in (4, 5, 6, 6, 7)] == [False, False, True, False, True]
    assert not cur.finished and cur.accept(mk(8, "JOB_FINISHED")) and cur.finished
    assert EventCursor().headers() == {}


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
