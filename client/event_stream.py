"""A job's event stream as a plan: reconnecting with ``Last-Event-ID`` after a break, never handing
out an event twice (docs/protocol.md § Events). ``ClientCore.events`` and ``ClientCore.wait_for``
are built on ``follow_events``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx

from hitl_review.statecore.models import Event

from .calls import CallCore
from .errors import ConnectionFailed, error_from_response
from .retry import RetryMode
from .sse import EventCursor, SSEDecoder, to_event
from .steps import Close, Plan, ReadLine, Send, Sleep
from .wire import job_path, new_request_id

log = logging.getLogger(__name__)


def check_event_stream(resp: httpx.Response) -> None:
    ctype = resp.headers.get("content-type", "").partition(";")[0].strip()
    if ctype != "text/event-stream":
        raise ConnectionFailed(
            f"expected text/event-stream from {resp.request.url}, got {ctype or 'nothing'!r}",
            url=str(resp.request.url),
        )


def follow_events(
    core: CallCore,
    job_id: str,
    cursor: EventCursor,
    stop_on_finish: bool,
    deadline: float | None,
    handle: Callable[[Event | None], Plan[bool]],
) -> Plan[None]:
    """Reads the stream, reconnecting with ``Last-Event-ID``, and hands each new event to ``handle``.

    ``handle`` also gets None for every line that completes no new event
    (keep-alives, repeats), so a waiter can look at its clock; it returns
    True to stop. Never hands out an id twice; ends after ``JOB_FINISHED``
    (with ``stop_on_finish``; otherwise when the server closes the finished
    stream). Raises ``ConnectionFailed`` after ``retries`` reconnects in a
    row without data, and the ``ApiError`` of an answer not worth retrying.
    """
    path = job_path(job_id, "/events")
    failures = 0
    server_retry: float | None = None
    while True:
        got_data = False
        delay: float | None = None
        headers = {
            **cursor.headers(),
            "Accept": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Request-ID": new_request_id(),
        }
        try:
            resp = yield Send(
                core.request("GET", path, headers=headers, timeout=core.stream_timeout(deadline)), stream=True
            )
            if resp.status_code >= 400:
                err = error_from_response(resp)
                delay = core.policy.after_status(failures, resp.status_code, RetryMode.IDEMPOTENT, err.retry_after)
                if delay is None:
                    raise err
            else:
                check_event_stream(resp)
                decoder = SSEDecoder()
                while (line := (yield ReadLine())) is not None:
                    got_data = True
                    sse = decoder.decode(line)
                    if sse is not None and sse.retry is not None:
                        server_retry = sse.retry / 1000
                    event = to_event(sse, job_id) if sse is not None else None
                    fresh = event is not None and cursor.accept(event)
                    if (yield from handle(event if fresh else None)):
                        return
                    if fresh and cursor.finished and stop_on_finish:
                        return
                if cursor.finished:
                    return  # a finished job's stream ends; reconnecting would only wait
        except httpx.TransportError as exc:
            delay = core.policy.after_error(failures, exc, RetryMode.IDEMPOTENT)
            if delay is None and not got_data:
                raise ConnectionFailed(
                    f"event stream of {job_id} failed: {exc!r}", url=core.base_url + path, attempts=failures + 1
                ) from exc
            log.info("event stream of %s broke (%r); reconnecting after id %s", job_id, exc, cursor.last_id)
        yield Close()
        if got_data:
            failures, delay = 0, server_retry if server_retry is not None else core.policy.backoff_delay(0)
        else:
            if delay is None:
                delay = core.policy.after_error(
                    failures, httpx.ConnectError("stream closed without data"), RetryMode.IDEMPOTENT
                )
                if delay is None:
                    raise ConnectionFailed(
                        f"event stream of {job_id} keeps closing without data",
                        url=core.base_url + path,
                        attempts=failures + 1,
                    )
            failures += 1
        if deadline is not None:
            delay = min(delay, max(0.0, deadline - time.monotonic()))
            if delay <= 0 and (yield from handle(None)):
                return
        yield Sleep(delay)
