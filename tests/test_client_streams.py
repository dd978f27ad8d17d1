"""Client unit tests of the event stream through both clients: reconnecting with ``Last-Event-ID``,
never repeating an event, giving up, and ``wait_for`` on top of it (stream, confirming GET, polling,
timeouts, cancelling). The network is scripted as in ``test_client_api.py``."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from hitl_review.client import (
    ConnectionFailed,
    HitlClient,
    NotFoundError,
    WaitTimeout,
)
from hitl_review.client.api import WaitCancelled
from tests.client_fakes import (
    BASE,
    JOB,
    ClientFactory,
    CutStream,
    Script,
    error_body,
    frame,
    json_response,
    snapshot,
    sse_response,
)

# ---------------------------------------------------------------------- events


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
