"""Decoding ``GET /jobs/{id}/events`` (docs/protocol.md § Events) for the tests, the load tests and
the benchmarks, on the client's own line decoder (``client.sse.SSEDecoder``).

Each message's ``data:`` is the job event as JSON: ``{id, type, job_id, version, at, data}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
from httpx_sse import ServerSentEvent

from hitl_review.client.sse import SSEDecoder

KEEPALIVE = {"type": ":"}


def messages(lines: Iterable[str | bytes]) -> Iterator[ServerSentEvent | None]:
    """The stream's messages; ``None`` for each comment line (the server's keep-alives)."""
    decoder = SSEDecoder()
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        if line.startswith(":"):
            yield None
            continue
        msg = decoder.decode(line)
        if msg is not None:
            yield msg


def event_of(msg: ServerSentEvent) -> dict[str, Any]:
    """The job event a message carries (data that is not JSON is kept under ``raw``)."""
    try:
        ev = json.loads(msg.data)
    except ValueError:
        ev = {"raw": msg.data}
    if not isinstance(ev, dict):
        ev = {"raw": msg.data}
    ev.setdefault("type", msg.event)
    return ev


def parse_sse(lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """The job events of a stream's lines; each comment yields ``{"type": ":"}``, so a reader
    waiting for an event can look at its deadline while the stream is quiet."""
    for msg in messages(lines):
        yield dict(KEEPALIVE) if msg is None else event_of(msg)


def read_events(
    client: httpx.Client,
    job_id: str,
    *,
    headers: dict[str, str] | None = None,
    last_event_id: int | None = None,
    until: str | None = None,
    limit: int | None = None,
    timeout: float | httpx.Timeout | None = None,
) -> list[dict[str, Any]]:
    """The job's events (history, then live ones) until one of type ``until``, ``limit`` events or the
    end of the stream. Checks the framing on the way: a 200 ``text/event-stream`` whose ``id:`` and
    ``event:`` lines agree with the event in ``data:``."""
    hdrs = dict(headers or {})
    if last_event_id is not None:
        hdrs["Last-Event-ID"] = str(last_event_id)
    extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    out: list[dict[str, Any]] = []
    with client.stream("GET", f"/api/v1/jobs/{job_id}/events", headers=hdrs, **extra) as r:
        if r.status_code != 200:
            raise AssertionError(f"GET /jobs/{job_id}/events answered {r.status_code}: {r.read()!r}")
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            raise AssertionError(f"events of {job_id} came as {r.headers.get('content-type')}")
        for msg in messages(r.iter_lines()):
            if msg is None:
                continue
            ev = event_of(msg)
            if str(ev.get("id")) != msg.id or ev["type"] != msg.event:
                raise AssertionError(
                    f"SSE frame id={msg.id} event={msg.event} carries event {ev.get('id')} {ev['type']}"
                )
            out.append(ev)
            if ev["type"] == until or (limit is not None and len(out) >= limit):
                break
    return out
