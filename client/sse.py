"""SSE decoding for the job event stream.

httpx-sse opens the stream (``connect_sse``) and supplies the event model; the
lines are decoded here because its ``iter_sse`` swallows comment lines, and the
server's keep-alive comments (one at least every 15 s) are what lets a waiter
look at its deadline while a job sits in review for hours.
"""

from __future__ import annotations

import json
import logging

from httpx_sse import ServerSentEvent
from pydantic import ValidationError

from hitl_review.statecore.models import Event

log = logging.getLogger(__name__)


class SSEDecoder:
    """Line-by-line decoder following the WHATWG event-stream rules."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None

    def decode(self, line: str) -> ServerSentEvent | None:
        """Feed one line (without its line break); returns an event when a blank line completes one."""
        line = line.rstrip("\r\n")
        if not line:
            if not self._event and not self._data and self._id is None and self._retry is None:
                return None
            # Each message keeps only its own id: the client tracks the last one itself.
            sse = ServerSentEvent(
                event=self._event or "message", data="\n".join(self._data), id=self._id, retry=self._retry
            )
            self._event, self._data, self._id, self._retry = "", [], None, None
            return sse
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry" and value.isdigit():
            self._retry = int(value)
        return None


def to_event(sse: ServerSentEvent, job_id: str) -> Event | None:
    """The job ``Event`` an SSE message carries, or None when it has no usable id.

    The server's ``data:`` is the Event JSON; the SSE ``id:``/``event:`` fields
    win over it when present. A message without a numeric id cannot be
    de-duplicated across reconnects and is dropped.
    """
    if not sse.data and not sse.id:
        return None  # e.g. a bare "retry:" message
    try:
        payload = json.loads(sse.data) if sse.data else {}
    except ValueError:
        payload = {"raw": sse.data}
    if not isinstance(payload, dict):
        payload = {"value": payload}
    sse_id = sse.id.strip() if sse.id else ""
    raw_id = sse_id if sse_id else payload.get("id")
    try:
        event_id = int(str(raw_id))  # "None", "" and junk fail the int() like a bad id
    except (TypeError, ValueError):
        log.warning("dropping SSE message without a numeric id: event=%s id=%r", sse.event, raw_id)
        return None
    if {"type", "job_id", "version", "at"} <= payload.keys():
        try:
            return Event.model_validate(
                {**payload, "id": event_id, "type": sse.event if sse.event != "message" else payload["type"]}
            )
        except ValidationError:
            pass
    data = payload.get("data") if isinstance(payload.get("data"), dict) else payload
    return Event(
        id=event_id,
        type=payload.get("type") or sse.event,
        job_id=payload.get("job_id") or job_id,
        version=int(payload.get("version") or 0),
        at=str(payload.get("at") or ""),
        data=data,
    )


class EventCursor:
    """The reconnect bookkeeping: the last id handed out, and which messages are new."""

    def __init__(self, last_event_id: int | None = None) -> None:
        self.last_id = last_event_id
        self.finished = False

    def headers(self) -> dict[str, str]:
        return {} if self.last_id is None else {"Last-Event-ID": str(self.last_id)}

    def accept(self, event: Event) -> bool:
        """True (and advance) when ``event`` is newer than anything handed out before."""
        if self.last_id is not None and event.id <= self.last_id:
            return False
        self.last_id = event.id
        if event.type == "JOB_FINISHED":
            self.finished = True
        return True
