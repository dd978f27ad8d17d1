"""HTTP + SSE client of the control plane (SPEC §4), sync and async with the same methods.

Both clients send ``Authorization: Bearer <token>`` and a fresh ``X-Request-ID``
per call (kept across that call's retries, so server logs show them as one),
retry only what is safe to send twice (see ``client.retry``), and map error
bodies to ``client.errors.ApiError``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from httpx_sse import aconnect_sse, connect_sse

from statecore.models import (Box, CreateJobResponse, Event, InterventionResponse, JobList, JobResults,
                              JobSnapshot, JobSummary, Subject)
from statecore.states import TERMINAL, JobStatus

from .config import DEFAULT_API_URL, ClientConfig
from .errors import ApiError, ConnectionFailed, HitlClientError, WaitTimeout, error_from_response
from statecore.media import CONTENT_TYPES, EXTENSIONS, sniff
from .retry import RetryMode, RetryPolicy
from .sse import EventCursor, SSEDecoder, to_event

log = logging.getLogger(__name__)

API = "/api/v1"
TERMINAL_STATUSES: frozenset[str] = frozenset(s.value for s in TERMINAL)
# The server sends a comment at least every 15 s; four silent intervals mean the stream is dead.
SSE_READ_TIMEOUT = 60.0
POLL_INTERVAL = 1.0
POLL_INTERVAL_MAX = 5.0

ImageInput = bytes | bytearray | memoryview | str | os.PathLike[str]
SubjectInput = dict[str, Any] | Subject | Box


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


def new_intervention_id() -> str:
    """A fresh id for one reviewer submission; reuse it when retrying that same submission."""
    return f"iv_{uuid.uuid4().hex}"


def normalize_base_url(base_url: str) -> str:
    """``http://host:8000/`` or ``http://host:8000/api/v1`` → ``http://host:8000``."""
    url = base_url.strip().rstrip("/")
    if url.endswith(API):
        url = url[: -len(API)].rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def _subject_dict(subject: SubjectInput) -> dict[str, Any]:
    if isinstance(subject, Box):
        return {"box_id": subject.box_id, "bbox": list(subject.bbox), "label": subject.label,
                "target_policy": subject.target_policy}
    if isinstance(subject, Subject):
        return subject.model_dump(mode="json", exclude_none=True)
    return dict(subject)


def _read_image(image: ImageInput, filename: str | None) -> tuple[bytes, str, str]:
    """(bytes, file name, content type) for the multipart ``image`` field."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data, name = bytes(image), filename or "image"
    else:
        path = Path(image)
        data, name = path.read_bytes(), filename or path.name
    kind = sniff(data[:16])
    if kind and not Path(name).suffix:
        name += EXTENSIONS[kind]
    return data, name, CONTENT_TYPES.get(kind or "", "application/octet-stream")


def _wanted(statuses: Iterable[str] | None) -> frozenset[str]:
    if statuses is None:
        return TERMINAL_STATUSES
    return frozenset(str(JobStatus(s)) for s in statuses)  # ValueError on a name that is no status


class _Core:
    """What the sync and async clients share: configuration, URLs, headers, response parsing."""

    def __init__(self, base_url: str, token: str | None, *, timeout: float, retries: int, backoff: float,
                 backoff_max: float) -> None:
        self.base_url = normalize_base_url(base_url)
        self.token = token
        self.timeout = timeout
        self.policy = RetryPolicy(retries=retries, backoff=backoff, backoff_max=backoff_max)

    def _default_headers(self) -> dict[str, str]:
        headers = {"User-Agent": "hitl-client/0.1", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    @staticmethod
    def _job_path(job_id: str, suffix: str = "") -> str:
        return f"{API}/jobs/{quote(job_id, safe='')}{suffix}"

    def _artifact_path(self, url_or_name: str) -> str:
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

    def _stream_timeout(self, deadline: float | None) -> httpx.Timeout:
        read = SSE_READ_TIMEOUT
        if deadline is not None:
            read = max(0.5, min(read, deadline - time.monotonic() + 1.0))
        return httpx.Timeout(self.timeout, read=read)

    @staticmethod
    def _submit_request(image: ImageInput, idempotency_key: str | None,
                        filename: str | None) -> tuple[dict[str, Any], dict[str, str], RetryMode]:
        data, name, ctype = _read_image(image, filename)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        # Without a key a second send could create a second job: retry only what never left.
        mode = RetryMode.IDEMPOTENT if idempotency_key else RetryMode.CONNECT_ONLY
        return {"image": (name, data, ctype)}, headers, mode

    @staticmethod
    def _submit_result(resp: httpx.Response) -> SubmitResult:
        body = resp.json()
        return SubmitResult(**CreateJobResponse.model_validate(body).model_dump(),
                            replayed=_replayed(resp), status_code=resp.status_code)

    @staticmethod
    def _intervention_body(intervention_id: str, pause_token: str, base_version: int,
                           subjects: Iterable[SubjectInput]) -> dict[str, Any]:
        return {"intervention_id": intervention_id, "pause_token": pause_token, "base_version": base_version,
                "subjects": [_subject_dict(s) for s in subjects]}

    @staticmethod
    def _intervention_result(resp: httpx.Response) -> InterventionResult:
        parsed = InterventionResponse.model_validate_json(resp.content)
        return InterventionResult(**parsed.model_dump(), replayed=_replayed(resp), raw=resp.content)

    @staticmethod
    def _list_params(status: str | None, limit: int, cursor: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        return params

    @staticmethod
    def _check_event_stream(resp: httpx.Response) -> None:
        ctype = resp.headers.get("content-type", "").partition(";")[0].strip()
        if ctype != "text/event-stream":
            raise ConnectionFailed(f"expected text/event-stream from {resp.request.url}, got {ctype or 'nothing'!r}",
                                   url=str(resp.request.url))


def _replayed(resp: httpx.Response) -> bool:
    return resp.headers.get("Idempotent-Replayed", "").strip().lower() == "true"


def _new_request_id() -> str:
    return uuid.uuid4().hex


class HitlClient(_Core):
    """Blocking client (``httpx.Client``). Thread-safe: the batch CLI shares one across worker threads."""

    def __init__(self, base_url: str = DEFAULT_API_URL, token: str | None = None, *, timeout: float = 30.0,
                 retries: int = 5, backoff: float = 0.2, backoff_max: float = 5.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(base_url, token, timeout=timeout, retries=retries, backoff=backoff,
                         backoff_max=backoff_max)
        self._http = httpx.Client(base_url=self.base_url, headers=self._default_headers(), timeout=timeout,
                                  transport=transport)
        self._sleep: Callable[[float], None] = time.sleep

    @classmethod
    def from_config(cls, config: ClientConfig, **kwargs: Any) -> HitlClient:
        return cls(config.api_url, config.token, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HitlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _request(self, method: str, path: str, *, mode: RetryMode = RetryMode.IDEMPOTENT,
                 headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
        headers = {**(headers or {}), "X-Request-ID": _new_request_id()}
        attempt = 0
        while True:
            try:
                resp = self._http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                delay = self.policy.after_error(attempt, exc, mode)
                if delay is None:
                    raise ConnectionFailed(f"{method} {self.base_url}{path} failed: {exc!r}",
                                           url=self.base_url + path, attempts=attempt + 1) from exc
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
            self._sleep(delay)

    # ------------------------------------------------------------------ jobs

    def submit(self, image: ImageInput, *, idempotency_key: str | None = None,
               filename: str | None = None) -> SubmitResult:
        """POST /jobs. With ``idempotency_key`` a rerun returns the original job (``replayed``)."""
        files, headers, mode = self._submit_request(image, idempotency_key, filename)
        return self._submit_result(self._request("POST", f"{API}/jobs", mode=mode, headers=headers, files=files))

    def get_job(self, job_id: str) -> JobSnapshot:
        return JobSnapshot.model_validate_json(self._request("GET", self._job_path(job_id)).content)

    def list_jobs(self, status: str | None = None, limit: int = 50, cursor: str | None = None) -> JobList:
        resp = self._request("GET", f"{API}/jobs", params=self._list_params(status, limit, cursor))
        return JobList.model_validate_json(resp.content)

    def iter_jobs(self, status: str | None = None, *, page_size: int = 100) -> Iterator[JobSummary]:
        """Every job (or the queue for ``status``), page by page through ``next_cursor``."""
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            page = self.list_jobs(status, page_size, cursor)
            yield from page.jobs
            if not page.next_cursor or page.next_cursor in seen or not page.jobs:
                return
            seen.add(page.next_cursor)
            cursor = page.next_cursor

    def intervene(self, job_id: str, *, intervention_id: str, pause_token: str, base_version: int,
                  subjects: Iterable[SubjectInput]) -> InterventionResult:
        """POST an intervention. Safe to retry: the server replays an ``intervention_id`` it has seen."""
        body = self._intervention_body(intervention_id, pause_token, base_version, subjects)
        return self._intervention_result(self._request("POST", self._job_path(job_id, "/interventions"), json=body))

    def cancel(self, job_id: str) -> JobSnapshot:
        return JobSnapshot.model_validate_json(self._request("POST", self._job_path(job_id, "/cancel")).content)

    def results(self, job_id: str) -> JobResults:
        """GET results; raises ``ConflictError`` (``JOB_NOT_FINISHED``) before a terminal state."""
        return JobResults.model_validate_json(self._request("GET", self._job_path(job_id, "/results")).content)

    def download(self, url_or_name: str) -> bytes:
        """An artifact's bytes, from ``/api/v1/artifacts/<name>`` (as results give it) or a bare name."""
        return self._request("GET", self._artifact_path(url_or_name)).content

    def healthz(self) -> dict[str, Any]:
        return self._request("GET", "/healthz", mode=RetryMode.NEVER).json()

    def readyz(self) -> dict[str, Any]:
        """The readiness body; a not-ready server raises ``ServerError`` (503) carrying it in ``.body``."""
        return self._request("GET", "/readyz", mode=RetryMode.NEVER).json()

    def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.5) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.readyz()
            except (ApiError, ConnectionFailed):
                if time.monotonic() + interval > deadline:
                    raise
            self._sleep(interval)

    # ------------------------------------------------------------------ events

    def events(self, job_id: str, last_event_id: int | None = None, *,
               stop_on_finish: bool = True) -> Iterator[Event]:
        """The job's events: history after ``last_event_id`` (all without it), then live ones.

        Reconnects by itself with ``Last-Event-ID`` of the last event yielded and
        never yields an id twice. Ends after ``JOB_FINISHED`` (with
        ``stop_on_finish``; otherwise when the server closes the finished stream).
        Raises ``ConnectionFailed`` after ``retries`` reconnects in a row without data.
        """
        for event in self._event_stream(job_id, EventCursor(last_event_id), stop_on_finish):
            if event is not None:
                yield event

    def _event_stream(self, job_id: str, cursor: EventCursor, stop_on_finish: bool,
                      deadline: float | None = None) -> Iterator[Event | None]:
        """Events, and None for every line that completes none (keep-alives), so a waiter can look at its clock."""
        path = self._job_path(job_id, "/events")
        failures = 0
        server_retry: float | None = None
        while True:
            got_data = False
            delay: float | None = None
            try:
                with connect_sse(self._http, "GET", path, timeout=self._stream_timeout(deadline),
                                 headers={**cursor.headers(), "X-Request-ID": _new_request_id()}) as source:
                    resp = source.response
                    if resp.status_code >= 400:
                        resp.read()
                        err = error_from_response(resp)
                        delay = self.policy.after_status(failures, resp.status_code, RetryMode.IDEMPOTENT,
                                                         err.retry_after)
                        if delay is None:
                            raise err
                    else:
                        self._check_event_stream(resp)
                        decoder = SSEDecoder()
                        for line in resp.iter_lines():
                            got_data = True
                            sse = decoder.decode(line)
                            if sse is not None and sse.retry is not None:
                                server_retry = sse.retry / 1000
                            event = to_event(sse, job_id) if sse is not None else None
                            if event is None or not cursor.accept(event):
                                yield None
                                continue
                            yield event
                            if cursor.finished and stop_on_finish:
                                return
                        if cursor.finished:
                            return  # a finished job's stream ends; reconnecting would only wait
            except httpx.TransportError as exc:
                delay = self.policy.after_error(failures, exc, RetryMode.IDEMPOTENT)
                if delay is None and not got_data:
                    raise ConnectionFailed(f"event stream of {job_id} failed: {exc!r}",
                                           url=self.base_url + path, attempts=failures + 1) from exc
                log.info("event stream of %s broke (%r); reconnecting after id %s", job_id, exc, cursor.last_id)
            if got_data:
                failures, delay = 0, server_retry if server_retry is not None else self.policy.backoff_delay(0)
            else:
                if delay is None:
                    delay = self.policy.after_error(failures, httpx.ConnectError("stream closed without data"),
                                                    RetryMode.IDEMPOTENT)
                    if delay is None:
                        raise ConnectionFailed(f"event stream of {job_id} keeps closing without data",
                                               url=self.base_url + path, attempts=failures + 1)
                failures += 1
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - time.monotonic()))
                if delay <= 0:
                    yield None
            self._sleep(delay)

    # ------------------------------------------------------------------ waiting

    def wait_for(self, job_id: str, statuses: Iterable[str] | None = None, timeout: float = 300.0, *,
                 on_status: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> JobSnapshot:
        """Block until the job's status is in ``statuses`` (default: any terminal one) and return its snapshot.

        Follows the event stream and confirms with a GET; if the stream fails
        repeatedly it polls GET instead. A job that ends in a status outside
        ``statuses`` is returned too (it will never change again): check ``.status``.
        ``on_status`` is called with each new status seen. Raises ``WaitTimeout``,
        or ``WaitCancelled`` once ``cancel`` is set.
        """
        wanted = _wanted(statuses)
        waiter = _Waiter(wanted, timeout, on_status)
        snap = self.get_job(job_id)
        if waiter.done(snap):
            return snap
        try:
            stream = self._event_stream(job_id, EventCursor(), stop_on_finish=True, deadline=waiter.deadline)
            try:
                for event in stream:
                    waiter.check(job_id, snap, cancel)
                    if event is None:
                        continue
                    status = event.data.get("status")
                    if isinstance(status, str):
                        waiter.saw(status)
                    if event.type == "JOB_FINISHED" or status in wanted or status in TERMINAL_STATUSES:
                        snap = self.get_job(job_id)
                        if waiter.done(snap):
                            return snap
            finally:
                stream.close()
        except (ConnectionFailed, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status_code < 500 and exc.status_code != 429:
                raise
            log.warning("event stream of %s unusable (%s); polling instead", job_id, exc)
        interval = POLL_INTERVAL
        while True:
            snap = self.get_job(job_id)
            if waiter.done(snap):
                return snap
            waiter.check(job_id, snap, cancel)
            self._sleep(min(interval, max(0.01, waiter.deadline - time.monotonic())))
            interval = min(POLL_INTERVAL_MAX, interval * 1.5)


class _Waiter:
    """The deadline and status bookkeeping of one ``wait_for``."""

    def __init__(self, wanted: frozenset[str], timeout: float,
                 on_status: Callable[[str], None] | None) -> None:
        self.wanted = wanted
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.on_status = on_status
        self.last_status: str | None = None

    def saw(self, status: str) -> None:
        if status != self.last_status:
            self.last_status = status
            if self.on_status is not None:
                self.on_status(status)

    def done(self, snap: JobSnapshot) -> bool:
        self.saw(str(snap.status))
        return snap.status in self.wanted or snap.status in TERMINAL_STATUSES

    def check(self, job_id: str, snap: JobSnapshot | None, cancel: threading.Event | None = None) -> None:
        if cancel is not None and cancel.is_set():
            raise WaitCancelled(f"stopped waiting for job {job_id}")
        if time.monotonic() >= self.deadline:
            raise WaitTimeout(job_id, self.timeout, snap)


class AsyncHitlClient(_Core):
    """The same methods as ``HitlClient``, on ``httpx.AsyncClient``; ``events`` is an async iterator."""

    def __init__(self, base_url: str = DEFAULT_API_URL, token: str | None = None, *, timeout: float = 30.0,
                 retries: int = 5, backoff: float = 0.2, backoff_max: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(base_url, token, timeout=timeout, retries=retries, backoff=backoff,
                         backoff_max=backoff_max)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._default_headers(), timeout=timeout,
                                       transport=transport)
        self._sleep: Callable[[float], Any] = asyncio.sleep

    @classmethod
    def from_config(cls, config: ClientConfig, **kwargs: Any) -> AsyncHitlClient:
        return cls(config.api_url, config.token, **kwargs)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHitlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, *, mode: RetryMode = RetryMode.IDEMPOTENT,
                       headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
        headers = {**(headers or {}), "X-Request-ID": _new_request_id()}
        attempt = 0
        while True:
            try:
                resp = await self._http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                delay = self.policy.after_error(attempt, exc, mode)
                if delay is None:
                    raise ConnectionFailed(f"{method} {self.base_url}{path} failed: {exc!r}",
                                           url=self.base_url + path, attempts=attempt + 1) from exc
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
            await self._sleep(delay)

    async def submit(self, image: ImageInput, *, idempotency_key: str | None = None,
                     filename: str | None = None) -> SubmitResult:
        files, headers, mode = self._submit_request(image, idempotency_key, filename)
        return self._submit_result(await self._request("POST", f"{API}/jobs", mode=mode, headers=headers,
                                                       files=files))

    async def get_job(self, job_id: str) -> JobSnapshot:
        return JobSnapshot.model_validate_json((await self._request("GET", self._job_path(job_id))).content)

    async def list_jobs(self, status: str | None = None, limit: int = 50, cursor: str | None = None) -> JobList:
        resp = await self._request("GET", f"{API}/jobs", params=self._list_params(status, limit, cursor))
        return JobList.model_validate_json(resp.content)

    async def iter_jobs(self, status: str | None = None, *, page_size: int = 100) -> AsyncIterator[JobSummary]:
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            page = await self.list_jobs(status, page_size, cursor)
            for job in page.jobs:
                yield job
            if not page.next_cursor or page.next_cursor in seen or not page.jobs:
                return
            seen.add(page.next_cursor)
            cursor = page.next_cursor

    async def intervene(self, job_id: str, *, intervention_id: str, pause_token: str, base_version: int,
                        subjects: Iterable[SubjectInput]) -> InterventionResult:
        body = self._intervention_body(intervention_id, pause_token, base_version, subjects)
        resp = await self._request("POST", self._job_path(job_id, "/interventions"), json=body)
        return self._intervention_result(resp)

    async def cancel(self, job_id: str) -> JobSnapshot:
        resp = await self._request("POST", self._job_path(job_id, "/cancel"))
        return JobSnapshot.model_validate_json(resp.content)

    async def results(self, job_id: str) -> JobResults:
        resp = await self._request("GET", self._job_path(job_id, "/results"))
        return JobResults.model_validate_json(resp.content)

    async def download(self, url_or_name: str) -> bytes:
        return (await self._request("GET", self._artifact_path(url_or_name))).content

    async def healthz(self) -> dict[str, Any]:
        return (await self._request("GET", "/healthz", mode=RetryMode.NEVER)).json()

    async def readyz(self) -> dict[str, Any]:
        return (await self._request("GET", "/readyz", mode=RetryMode.NEVER)).json()

    async def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.5) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await self.readyz()
            except (ApiError, ConnectionFailed):
                if time.monotonic() + interval > deadline:
                    raise
            await self._sleep(interval)

    async def events(self, job_id: str, last_event_id: int | None = None, *,
                     stop_on_finish: bool = True) -> AsyncIterator[Event]:
        """See ``HitlClient.events``."""
        stream = self._event_stream(job_id, EventCursor(last_event_id), stop_on_finish)
        try:
            async for event in stream:
                if event is not None:
                    yield event
        finally:
            await stream.aclose()

    async def _event_stream(self, job_id: str, cursor: EventCursor, stop_on_finish: bool,
                            deadline: float | None = None) -> AsyncIterator[Event | None]:
        path = self._job_path(job_id, "/events")
        failures = 0
        server_retry: float | None = None
        while True:
            got_data = False
            delay: float | None = None
            try:
                async with aconnect_sse(self._http, "GET", path, timeout=self._stream_timeout(deadline),
                                        headers={**cursor.headers(), "X-Request-ID": _new_request_id()}) as source:
                    resp = source.response
                    if resp.status_code >= 400:
                        await resp.aread()
                        err = error_from_response(resp)
                        delay = self.policy.after_status(failures, resp.status_code, RetryMode.IDEMPOTENT,
                                                         err.retry_after)
                        if delay is None:
                            raise err
                    else:
                        self._check_event_stream(resp)
                        decoder = SSEDecoder()
                        async for line in resp.aiter_lines():
                            got_data = True
                            sse = decoder.decode(line)
                            if sse is not None and sse.retry is not None:
                                server_retry = sse.retry / 1000
                            event = to_event(sse, job_id) if sse is not None else None
                            if event is None or not cursor.accept(event):
                                yield None
                                continue
                            yield event
                            if cursor.finished and stop_on_finish:
                                return
                        if cursor.finished:
                            return
            except httpx.TransportError as exc:
                delay = self.policy.after_error(failures, exc, RetryMode.IDEMPOTENT)
                if delay is None and not got_data:
                    raise ConnectionFailed(f"event stream of {job_id} failed: {exc!r}",
                                           url=self.base_url + path, attempts=failures + 1) from exc
                log.info("event stream of %s broke (%r); reconnecting after id %s", job_id, exc, cursor.last_id)
            if got_data:
                failures, delay = 0, server_retry if server_retry is not None else self.policy.backoff_delay(0)
            else:
                if delay is None:
                    delay = self.policy.after_error(failures, httpx.ConnectError("stream closed without data"),
                                                    RetryMode.IDEMPOTENT)
                    if delay is None:
                        raise ConnectionFailed(f"event stream of {job_id} keeps closing without data",
                                               url=self.base_url + path, attempts=failures + 1)
                failures += 1
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - time.monotonic()))
                if delay <= 0:
                    yield None
            await self._sleep(delay)

    async def wait_for(self, job_id: str, statuses: Iterable[str] | None = None, timeout: float = 300.0, *,
                       on_status: Callable[[str], None] | None = None) -> JobSnapshot:
        """See ``HitlClient.wait_for``; cancel by cancelling the task."""
        wanted = _wanted(statuses)
        waiter = _Waiter(wanted, timeout, on_status)
        snap = await self.get_job(job_id)
        if waiter.done(snap):
            return snap
        try:
            stream = self._event_stream(job_id, EventCursor(), stop_on_finish=True, deadline=waiter.deadline)
            try:
                async for event in stream:
                    waiter.check(job_id, snap)
                    if event is None:
                        continue
                    status = event.data.get("status")
                    if isinstance(status, str):
                        waiter.saw(status)
                    if event.type == "JOB_FINISHED" or status in wanted or status in TERMINAL_STATUSES:
                        snap = await self.get_job(job_id)
                        if waiter.done(snap):
                            return snap
            finally:
                await stream.aclose()
        except (ConnectionFailed, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status_code < 500 and exc.status_code != 429:
                raise
            log.warning("event stream of %s unusable (%s); polling instead", job_id, exc)
        interval = POLL_INTERVAL
        while True:
            snap = await self.get_job(job_id)
            if waiter.done(snap):
                return snap
            waiter.check(job_id, snap)
            await self._sleep(min(interval, max(0.01, waiter.deadline - time.monotonic())))
            interval = min(POLL_INTERVAL_MAX, interval * 1.5)
