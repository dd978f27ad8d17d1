"""The client's protocol without I/O: what ``HitlClient`` and ``AsyncHitlClient`` both do.

Every operation is a *plan*: a generator that yields the I/O it needs as small
values and receives each outcome, then returns the operation's result:

* ``Send(request, stream=False)``: send an ``httpx.Request``; the reply is the
  ``httpx.Response`` (with ``stream=True`` only its head, plus the body when the
  status is an error), or an ``httpx.TransportError`` thrown into the plan;
* ``ReadLine()``: the next line of the open stream, or None at its end;
* ``Close()``: close the open stream;
* ``Sleep(seconds)``;
* ``Emit(value)``: hand a value to the caller (an event, a job of a listing).

The two clients only perform those steps, blocking or with ``await``
(``Driver`` keeps the bookkeeping), so request building, response and error
mapping, retries, stream resumption and waiting are decided here, once. The
protocol itself is described in docs/protocol.md § Routes and § Events.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import httpx

from statecore.media import CONTENT_TYPES, EXTENSIONS, sniff
from statecore.models import (
    Box,
    CreateJobResponse,
    Event,
    InterventionResponse,
    JobList,
    JobResults,
    JobSnapshot,
    Subject,
)
from statecore.states import TERMINAL, JobStatus

from .errors import ApiError, ConnectionFailed, HitlClientError, WaitTimeout, error_from_response
from .retry import RetryMode, RetryPolicy
from .sse import EventCursor, SSEDecoder, to_event

log = logging.getLogger(__name__)

T = TypeVar("T")

API = "/api/v1"
USER_AGENT = "hitl-client/0.1"
TERMINAL_STATUSES: frozenset[str] = frozenset(s.value for s in TERMINAL)
# The server sends a comment at least every 15 s; four silent intervals mean the stream is dead.
SSE_READ_TIMEOUT = 60.0
POLL_INTERVAL = 1.0
POLL_INTERVAL_MAX = 5.0

ImageInput = bytes | bytearray | memoryview | str | os.PathLike[str]
SubjectInput = dict[str, Any] | Subject | Box


# ---------------------------------------------------------------------- results and errors


class SubmitResult(CreateJobResponse):
    """The POST /jobs answer, plus whether it was an idempotent replay and the HTTP status (202 or 200)."""

    replayed: bool = False
    status_code: int = 202


class InterventionResult(InterventionResponse):
    """The intervention answer, plus whether it was a replay and the exact bytes the server sent."""

    replayed: bool = False
    raw: bytes = b""


class WaitCancelled(HitlClientError):
    """``wait_for`` was told to stop through its ``cancel`` event."""


# ---------------------------------------------------------------------- the steps a plan yields


@dataclass(frozen=True)
class Send:
    request: httpx.Request
    stream: bool = False


@dataclass(frozen=True)
class ReadLine:
    pass


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Emit:
    value: Any


Step: TypeAlias = Send | ReadLine | Close | Sleep | Emit
Plan: TypeAlias = Generator[Step, Any, T]


def emit_result(plan: Plan[T]) -> Plan[None]:
    """``plan`` with its result handed out as its one ``Emit``, so one driver serves calls and iterators."""
    result = yield from plan
    yield Emit(result)


class Driver:
    """Steps one plan: iterating gives its steps; each I/O step's outcome goes back through ``settle``."""

    def __init__(self, plan: Plan[None]) -> None:
        self._plan = plan
        self._reply: Any = None
        self._error: httpx.TransportError | None = None

    def __iter__(self) -> Iterator[Step]:
        while True:
            reply, error = self._reply, self._error
            self._reply, self._error = None, None
            try:
                yield self._plan.throw(error) if error is not None else self._plan.send(reply)
            except StopIteration:
                return

    def settle(self, perform: Callable[[], Any]) -> None:
        """Run one blocking I/O step; its result, or its transport error, is what the plan receives next."""
        try:
            self._reply = perform()
        except httpx.TransportError as exc:
            self._error = exc

    async def asettle(self, performing: Awaitable[Any]) -> None:
        """``settle`` for an awaitable I/O step."""
        try:
            self._reply = await performing
        except httpx.TransportError as exc:
            self._error = exc

    def close(self) -> None:
        self._plan.close()


# ---------------------------------------------------------------------- pure helpers


def new_intervention_id() -> str:
    """A fresh id for one reviewer submission; reuse it when retrying that same submission."""
    return f"iv_{uuid.uuid4().hex}"


def new_request_id() -> str:
    return uuid.uuid4().hex


def normalize_base_url(base_url: str) -> str:
    """``http://host:8000/`` or ``http://host:8000/api/v1`` → ``http://host:8000``."""
    url = base_url.strip().rstrip("/")
    if url.endswith(API):
        url = url[: -len(API)].rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def read_image(image: ImageInput, filename: str | None = None) -> tuple[bytes, str, str]:
    """(bytes, file name, content type) for the multipart ``image`` field; reads a path from disk."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data, name = bytes(image), filename or "image"
    else:
        path = Path(image)
        data, name = path.read_bytes(), filename or path.name
    kind = sniff(data[:16])
    if kind and not Path(name).suffix:
        name += EXTENSIONS[kind]
    return data, name, CONTENT_TYPES.get(kind or "", "application/octet-stream")


def wanted_statuses(statuses: Iterable[str] | None) -> frozenset[str]:
    """The statuses ``wait_for`` stops at (default: the terminal ones); ValueError on a name that is no status."""
    if statuses is None:
        return TERMINAL_STATUSES
    return frozenset(str(JobStatus(s)) for s in statuses)


def _subject_dict(subject: SubjectInput) -> dict[str, Any]:
    if isinstance(subject, Box):
        return {
            "box_id": subject.box_id,
            "bbox": list(subject.bbox),
            "label": subject.label,
            "target_policy": subject.target_policy,
        }
    if isinstance(subject, Subject):
        return subject.model_dump(mode="json", exclude_none=True)
    return dict(subject)


def _replayed(resp: httpx.Response) -> bool:
    return str(resp.headers.get("Idempotent-Replayed", "")).strip().lower() == "true"


def _job_path(job_id: str, suffix: str = "") -> str:
    return f"{API}/jobs/{quote(job_id, safe='')}{suffix}"


def _check_event_stream(resp: httpx.Response) -> None:
    ctype = resp.headers.get("content-type", "").partition(";")[0].strip()
    if ctype != "text/event-stream":
        raise ConnectionFailed(
            f"expected text/event-stream from {resp.request.url}, got {ctype or 'nothing'!r}",
            url=str(resp.request.url),
        )


class _Waiter:
    """The deadline and status bookkeeping of one ``wait_for``."""

    def __init__(
        self,
        job_id: str,
        wanted: frozenset[str],
        timeout: float,
        on_status: Callable[[str], None] | None,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        self.job_id = job_id
        self.wanted = wanted
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.on_status = on_status
        self.cancelled = cancelled
        self.last_status: str | None = None

    def saw(self, status: str) -> None:
        if status != self.last_status:
            self.last_status = status
            if self.on_status is not None:
                self.on_status(status)

    def done(self, snap: JobSnapshot) -> bool:
        """True when ``snap`` is wanted, or terminal (it will never change again)."""
        self.saw(str(snap.status))
        return snap.status in self.wanted or snap.status in TERMINAL_STATUSES

    def check(self, snap: JobSnapshot | None) -> None:
        if self.cancelled is not None and self.cancelled():
            raise WaitCancelled(f"stopped waiting for job {self.job_id}")
        if time.monotonic() >= self.deadline:
            raise WaitTimeout(self.job_id, self.timeout, snap)

    def worth_a_look(self, event: Event) -> bool:
        """Whether ``event`` may mean the wait is over (a GET then decides: history can be stale)."""
        status = event.data.get("status")
        if isinstance(status, str):
            self.saw(status)
        return event.type == "JOB_FINISHED" or status in self.wanted or status in TERMINAL_STATUSES


# ---------------------------------------------------------------------- the core


class ClientCore:
    """Configuration, request building and every operation as a plan."""

    def __init__(self, base_url: str, token: str | None, *, timeout: float, policy: RetryPolicy) -> None:
        self.base_url = normalize_base_url(base_url)
        self.token = token
        self.timeout = timeout
        self.policy = policy

    # ------------------------------------------------------------------ requests

    def headers(self) -> dict[str, str]:
        """Headers every request carries."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        **kwargs: Any,
    ) -> httpx.Request:
        """A complete request (URL, headers, timeouts): the clients send it as it is."""
        t = timeout or httpx.Timeout(self.timeout)
        return httpx.Request(
            method,
            self.base_url + path,
            headers={**self.headers(), **(headers or {})},
            extensions={"timeout": t.as_dict()},
            **kwargs,
        )

    def artifact_path(self, url_or_name: str) -> str:
        """The path of an artifact given as results give it, as a root-relative URL, or as a bare name."""
        ref = url_or_name.strip()
        if ref.startswith(("http://", "https://")):
            url, base = httpx.URL(ref), httpx.URL(self.base_url)
            if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
                raise ValueError(f"refusing to send the API token to another origin: {ref}")
            return url.raw_path.decode("ascii")
        if ref.startswith("/"):
            return ref
        if ref.startswith(API.lstrip("/") + "/"):
            return "/" + ref
        return f"{API}/artifacts/{quote(ref, safe='')}"

    def stream_timeout(self, deadline: float | None) -> httpx.Timeout:
        read = SSE_READ_TIMEOUT
        if deadline is not None:
            read = max(0.5, min(read, deadline - time.monotonic() + 1.0))
        return httpx.Timeout(self.timeout, read=read)

    # ------------------------------------------------------------------ one call, with retries

    def call(
        self,
        method: str,
        path: str,
        *,
        mode: RetryMode = RetryMode.IDEMPOTENT,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Plan[httpx.Response]:
        """Send until a success (returned), a final error (raised as ``ApiError``) or the retries run out.

        Every attempt carries the same ``X-Request-ID``, so server logs show one call.
        """
        headers = {**(headers or {}), "X-Request-ID": new_request_id()}
        attempt = 0
        while True:
            try:
                resp: httpx.Response = yield Send(self.request(method, path, headers=headers, **kwargs))
            except httpx.TransportError as exc:
                delay = self.policy.after_error(attempt, exc, mode)
                if delay is None:
                    raise ConnectionFailed(
                        f"{method} {self.base_url}{path} failed: {exc!r}",
                        url=self.base_url + path,
                        attempts=attempt + 1,
                    ) from exc
                log.info("retrying %s %s in %.2fs after %r", method, path, delay, exc)
            else:
                if resp.status_code < 400:
                    return resp
                err = error_from_response(resp)
                delay = self.policy.after_status(attempt, resp.status_code, mode, err.retry_after)
                if delay is None:
                    raise err
                log.info("retrying %s %s in %.2fs after %s", method, path, delay, resp.status_code)
            attempt += 1
            yield Sleep(delay)

    # ------------------------------------------------------------------ jobs

    def submit(self, image: tuple[bytes, str, str], idempotency_key: str | None) -> Plan[SubmitResult]:
        """POST /jobs with ``image`` as ``read_image`` gives it."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        # Without a key a second send could create a second job: retry only what never left.
        mode = RetryMode.IDEMPOTENT if idempotency_key else RetryMode.CONNECT_ONLY
        data, name, ctype = image
        resp = yield from self.call(
            "POST", f"{API}/jobs", mode=mode, headers=headers, files={"image": (name, data, ctype)}
        )
        parsed = CreateJobResponse.model_validate_json(resp.content)
        return SubmitResult(**parsed.model_dump(), replayed=_replayed(resp), status_code=resp.status_code)

    def get_job(self, job_id: str) -> Plan[JobSnapshot]:
        resp = yield from self.call("GET", _job_path(job_id))
        return JobSnapshot.model_validate_json(resp.content)

    def list_jobs(self, status: str | None, limit: int, cursor: str | None) -> Plan[JobList]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        resp = yield from self.call("GET", f"{API}/jobs", params=params)
        return JobList.model_validate_json(resp.content)

    def iter_jobs(self, status: str | None, page_size: int) -> Plan[None]:
        """Emits every ``JobSummary``, page by page through ``next_cursor``."""
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            page = yield from self.list_jobs(status, page_size, cursor)
            for job in page.jobs:
                yield Emit(job)
            if not page.next_cursor or page.next_cursor in seen or not page.jobs:
                return
            seen.add(page.next_cursor)
            cursor = page.next_cursor

    def intervene(
        self,
        job_id: str,
        intervention_id: str,
        pause_token: str,
        base_version: int,
        subjects: Iterable[SubjectInput],
    ) -> Plan[InterventionResult]:
        body = {
            "intervention_id": intervention_id,
            "pause_token": pause_token,
            "base_version": base_version,
            "subjects": [_subject_dict(s) for s in subjects],
        }
        resp = yield from self.call("POST", _job_path(job_id, "/interventions"), json=body)
        parsed = InterventionResponse.model_validate_json(resp.content)
        return InterventionResult(**parsed.model_dump(), replayed=_replayed(resp), raw=resp.content)

    def cancel(self, job_id: str) -> Plan[JobSnapshot]:
        resp = yield from self.call("POST", _job_path(job_id, "/cancel"))
        return JobSnapshot.model_validate_json(resp.content)

    def results(self, job_id: str) -> Plan[JobResults]:
        resp = yield from self.call("GET", _job_path(job_id, "/results"))
        return JobResults.model_validate_json(resp.content)

    def download(self, url_or_name: str) -> Plan[bytes]:
        resp = yield from self.call("GET", self.artifact_path(url_or_name))
        return resp.content

    def probe(self, path: str) -> Plan[dict[str, Any]]:
        """/healthz or /readyz: never retried, the answer itself is the information."""
        resp = yield from self.call("GET", path, mode=RetryMode.NEVER)
        body: dict[str, Any] = resp.json()
        return body

    def wait_until_ready(self, timeout: float, interval: float) -> Plan[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return (yield from self.probe("/readyz"))
            except (ApiError, ConnectionFailed):
                if time.monotonic() + interval > deadline:
                    raise
            yield Sleep(interval)

    # ------------------------------------------------------------------ events

    def events(self, job_id: str, last_event_id: int | None, stop_on_finish: bool) -> Plan[None]:
        """Emits the job's events: history after ``last_event_id`` (all without it), then live ones."""

        def emit(event: Event | None) -> Plan[bool]:
            if event is not None:
                yield Emit(event)
            return False

        yield from self._event_stream(job_id, EventCursor(last_event_id), stop_on_finish, None, emit)

    def _event_stream(
        self,
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
        path = _job_path(job_id, "/events")
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
                    self.request("GET", path, headers=headers, timeout=self.stream_timeout(deadline)), stream=True
                )
                if resp.status_code >= 400:
                    err = error_from_response(resp)
                    delay = self.policy.after_status(failures, resp.status_code, RetryMode.IDEMPOTENT, err.retry_after)
                    if delay is None:
                        raise err
                else:
                    _check_event_stream(resp)
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
                delay = self.policy.after_error(failures, exc, RetryMode.IDEMPOTENT)
                if delay is None and not got_data:
                    raise ConnectionFailed(
                        f"event stream of {job_id} failed: {exc!r}", url=self.base_url + path, attempts=failures + 1
                    ) from exc
                log.info("event stream of %s broke (%r); reconnecting after id %s", job_id, exc, cursor.last_id)
            yield Close()
            if got_data:
                failures, delay = 0, server_retry if server_retry is not None else self.policy.backoff_delay(0)
            else:
                if delay is None:
                    delay = self.policy.after_error(
                        failures, httpx.ConnectError("stream closed without data"), RetryMode.IDEMPOTENT
                    )
                    if delay is None:
                        raise ConnectionFailed(
                            f"event stream of {job_id} keeps closing without data",
                            url=self.base_url + path,
                            attempts=failures + 1,
                        )
                failures += 1
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - time.monotonic()))
                if delay <= 0 and (yield from handle(None)):
                    return
            yield Sleep(delay)

    # ------------------------------------------------------------------ waiting

    def wait_for(
        self,
        job_id: str,
        statuses: Iterable[str] | None,
        timeout: float,
        on_status: Callable[[str], None] | None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Plan[JobSnapshot]:
        """Follows the event stream and confirms with a GET; polls GET when the stream is unusable.

        Returns the snapshot once its status is wanted or terminal; raises
        ``WaitTimeout``, or ``WaitCancelled`` once ``cancelled()`` is true.
        """
        waiter = _Waiter(job_id, wanted_statuses(statuses), timeout, on_status, cancelled)
        snap = yield from self.get_job(job_id)
        if waiter.done(snap):
            return snap

        def look(event: Event | None) -> Plan[bool]:
            nonlocal snap
            waiter.check(snap)
            if event is None or not waiter.worth_a_look(event):
                return False
            snap = yield from self.get_job(job_id)
            return waiter.done(snap)

        try:
            yield from self._event_stream(job_id, EventCursor(), True, waiter.deadline, look)
            if waiter.done(snap):
                return snap
        except (ConnectionFailed, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status_code < 500 and exc.status_code != 429:
                raise
            log.warning("event stream of %s unusable (%s); polling instead", job_id, exc)
        yield Close()
        interval = POLL_INTERVAL
        while True:
            snap = yield from self.get_job(job_id)
            if waiter.done(snap):
                return snap
            waiter.check(snap)
            yield Sleep(min(interval, max(0.01, waiter.deadline - time.monotonic())))
            interval = min(POLL_INTERVAL_MAX, interval * 1.5)
