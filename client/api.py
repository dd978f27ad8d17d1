"""HTTP + SSE client of the control plane, sync and async with the same methods (docs/protocol.md § Routes).

Both clients send ``Authorization: Bearer <token>`` and a fresh ``X-Request-ID`` per call (kept across
that call's retries, so server logs show them as one), retry only what is safe to send twice (see
``client.retry``), and map error bodies to ``client.errors.ApiError``. All of that is decided once, in
``client.core``; the classes here only perform its steps, on ``httpx.Client`` or ``httpx.AsyncClient``.
Why this module is long: the two clients have every method each, one line of ``client.core`` apiece.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from functools import partial
from typing import Any, Generic, Self, TypeVar, cast

import httpx

from hitl_review.statecore.models import Claim, ClaimedJob, Event, JobList, JobResults, JobSnapshot, JobSummary

from .account_calls import AccountCalls
from .approve_calls import ApproveCalls
from .config import DEFAULT_API_URL, ClientConfig, tls_context
from .core import ClientCore
from .note_calls import NoteCalls
from .retry import RetryPolicy
from .steps import Close, Driver, Emit, Plan, ReadLine, Send, Sleep, Step, emit_result
from .waiting import TERMINAL_STATUSES, WaitCancelled
from .wire import (
    API,
    DeadLetter,
    ImageInput,
    InterventionResult,
    ReplayResult,
    SubjectInput,
    SubmitResult,
    new_intervention_id,
    normalize_base_url,
    read_image,
)

__all__ = [
    "API",
    "TERMINAL_STATUSES",
    "AsyncHitlClient",
    "HitlClient",
    "ImageInput",
    "InterventionResult",
    "SubjectInput",
    "SubmitResult",
    "WaitCancelled",
    "new_intervention_id",
    "normalize_base_url",
]

T = TypeVar("T")
TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)


class _Client(Generic[TransportT]):
    """The constructor and configuration of both clients; each subclass opens its own ``httpx`` client."""

    def __init__(
        self,
        base_url: str = DEFAULT_API_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.2,
        backoff_max: float = 5.0,
        transport: TransportT | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """``headers``: sent with every request besides the token (the reviewer UI passes on the
        user an authenticating proxy named: docs/protocol.md § Identity)."""
        policy = RetryPolicy(retries=retries, backoff=backoff, backoff_max=backoff_max)
        self._core = ClientCore(base_url, token, timeout=timeout, policy=policy, extra_headers=headers)
        self._connect(transport)

    def _connect(self, transport: TransportT | None) -> None:
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: ClientConfig, **kwargs: Any) -> Self:
        return cls(config.api_url, config.token, **kwargs)

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def token(self) -> str | None:
        return self._core.token

    @property
    def policy(self) -> RetryPolicy:
        return self._core.policy

    def headers(self) -> dict[str, str]:
        """What every request of this client carries (its token or session): for a page it reads itself."""
        return self._core.headers()


class HitlClient(_Client[httpx.BaseTransport], AccountCalls, NoteCalls, ApproveCalls):
    """Blocking client (``httpx.Client``). Thread-safe: the batch CLI shares one across worker threads."""

    def _connect(self, transport: httpx.BaseTransport | None) -> None:
        self._http = httpx.Client(transport=transport, verify=tls_context())
        self._sleep: Callable[[float], None] = time.sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HitlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ performing the core's steps

    def _iterate(self, plan: Plan[None]) -> Iterator[Any]:
        driver, stream = Driver(plan), _Stream()
        try:
            for step in driver:
                if isinstance(step, Emit):
                    yield step.value
                else:
                    driver.settle(partial(self._perform, step, stream))
        finally:
            driver.close()
            stream.close()

    def _run(self, plan: Plan[T]) -> T:
        (result,) = self._iterate(emit_result(plan))
        return cast(T, result)

    def _perform(self, step: Step, stream: _Stream) -> Any:
        if isinstance(step, Send):
            if not step.stream:
                return self._http.send(step.request)
            stream.close()
            stream.response = self._http.send(step.request, stream=True)
            if stream.response.status_code >= 400:
                stream.response.read()  # the error body is what the core maps
            stream.lines = stream.response.iter_lines()
            return stream.response
        if isinstance(step, ReadLine):
            return next(stream.lines, None)
        if isinstance(step, Close):
            stream.close()
        elif isinstance(step, Sleep):
            self._sleep(step.seconds)
        return None

    # ------------------------------------------------------------------ jobs

    def submit(
        self,
        image: ImageInput,
        *,
        idempotency_key: str | None = None,
        filename: str | None = None,
        review_quorum: int = 1,
        quorum_policy: str = "all",
        boxes: list[dict[str, Any]] | None = None,
    ) -> SubmitResult:
        """POST /jobs. With ``idempotency_key`` a rerun returns the original job (``replayed``); ``review_quorum``
        ≥ 2: that many distinct reviewers, of whom all, a majority or any one decide (``quorum_policy``);
        ``boxes`` (pixel ``[{"bbox": [x1, y1, x2, y2], "label", "score"}]``, ``client.prelabels``): no detector."""
        data = read_image(image, filename)
        return self._run(self._core.submit(data, idempotency_key, review_quorum, quorum_policy, boxes))

    def get_job(self, job_id: str) -> JobSnapshot:
        return self._run(self._core.get_job(job_id))

    def list_jobs(
        self, status: str | None = None, limit: int = 50, cursor: str | None = None, *, unclaimed: bool = False
    ) -> JobList:  # unclaimed: leave out jobs another reviewer has claimed (docs/protocol.md § Claims)
        return self._run(self._core.list_jobs(status, limit, cursor, unclaimed))

    def next_job(self, exclude: Iterable[str] = ()) -> JobSummary | None:
        """The oldest waiting job no other reviewer has claimed, other than ``exclude``; None when none."""
        return self._run(self._core.next_job(exclude))

    def claim(self, job_id: str, *, force: bool = False, snapshot: bool = False) -> Claim:
        """Take or renew this reviewer's claim on a waiting job (renew it every few seconds while the
        panel is open); ``force`` takes over another reviewer's; ``snapshot``: a ``ClaimedJob`` with the
        job's snapshot. ``ConflictError`` with ``claim`` (``CLAIMED_BY_OTHER``) when another holds it."""
        return self._run(self._core.claim(job_id, force, snapshot))

    def claim_next(self, exclude: Iterable[str] = ()) -> ClaimedJob | None:
        """Claim the oldest waiting job nobody else claimed, but ``exclude``: a ``ClaimedJob``, None if none."""
        return self._run(self._core.claim_next(exclude))

    def release(self, job_id: str) -> bool:
        """Release this reviewer's claim; False when there was none (submitting or cancelling releases it)."""
        return self._run(self._core.release(job_id))

    def iter_jobs(self, status: str | None = None, *, page_size: int = 100) -> Iterator[JobSummary]:
        """Every job (or the queue for ``status``), page by page through ``next_cursor``."""
        return self._iterate(self._core.iter_jobs(status, page_size))

    def intervene(
        self,
        job_id: str,
        *,
        intervention_id: str,
        pause_token: str,
        base_version: int,
        subjects: Iterable[SubjectInput],
        snapshot_id: str | None = None,
    ) -> InterventionResult:
        """POST an intervention. Safe to retry: the server replays an ``intervention_id`` it has seen.
        ``snapshot_id``: the pause's, as shown to the reviewer (409 ``SNAPSHOT_MISMATCH`` if it is not
        the waiting pause's). Every 409 (``ConflictError``) carries ``snapshot`` and ``rebase``."""
        return self._run(
            self._core.intervene(job_id, intervention_id, pause_token, base_version, subjects, snapshot_id)
        )

    def decide_masks(
        self,
        job_id: str,
        *,
        intervention_id: str,
        pause_token: str,
        base_version: int,
        decisions: Iterable[dict[str, Any]],
        snapshot_id: str | None = None,
    ) -> InterventionResult:
        """Submit a mask review's decisions (stage WAITING_MASK_REVIEW): one per listed subject,
        ``{"box_id", "decision": "ACCEPT"|"REJECT"|"REFINE", "reason", "points": [{"x", "y", "positive"}]}``.
        Safe to retry (replayed by ``intervention_id``); 409s as for ``intervene``."""
        return self._run(
            self._core.decide_masks(job_id, intervention_id, pause_token, base_version, decisions, snapshot_id)
        )

    def preview(self, job_id: str, box_id: str, points: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """POST .../subjects/{box_id}/preview with ``points``; nothing is written, never retried (429, 503)."""
        return self._run(self._core.preview(job_id, box_id, points))

    def cancel(self, job_id: str, reason: str | None = None) -> JobSnapshot:  # reason: in the audit entry
        return self._run(self._core.cancel(job_id, reason))

    def results(self, job_id: str) -> JobResults:
        """GET results; raises ``ConflictError`` (``JOB_NOT_FINISHED``) before a terminal state."""
        return self._run(self._core.results(job_id))

    def download(self, url_or_name: str) -> bytes:
        """An artifact's bytes, from ``/api/v1/artifacts/<name>`` (as results give it) or a bare name."""
        return self._run(self._core.download(url_or_name))

    def healthz(self) -> dict[str, Any]:
        return self._run(self._core.probe("/healthz"))

    def readyz(self) -> dict[str, Any]:
        """The readiness body; a not-ready server raises ``ServerError`` (503) carrying it in ``.body``."""
        return self._run(self._core.probe("/readyz"))

    def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.5) -> dict[str, Any]:
        return self._run(self._core.wait_until_ready(timeout, interval))

    def dead_letters(self) -> list[DeadLetter]:
        """The dead letters (admin token), oldest first."""
        return self._run(self._core.dead_letters())

    def replay_dead_letter(self, dead_letter_id: str) -> ReplayResult:
        """Replay one dead letter (admin token): a report through the normal report path, a command re-queued."""
        return self._run(self._core.replay_dead_letter(dead_letter_id))

    def webhook_log(self, limit: int = 100) -> dict[str, Any]:
        """The webhooks' newest delivery attempts and how many deliveries wait (admin token)."""
        return self._run(self._core.webhook_log(limit))

    def reconcile(self) -> dict[str, Any]:
        """Restore the live jobs Redis lost from the archive's live mirror (admin token)."""
        return self._run(self._core.reconcile())

    def audit(self, job_id: str) -> dict[str, Any]:
        """The job's audit log ``{"job_id", "entries", "head"}``, oldest entry first."""
        return self._run(self._core.audit(job_id))

    def artifact_gc(self, older_than_days: float, *, dry_run: bool = False) -> dict[str, Any]:
        """Delete (``dry_run``: list) the blobs only archived jobs older than the age refer to (admin token)."""
        return self._run(self._core.artifact_gc(older_than_days, dry_run))

    def verify_audit(self, job_ids: Iterable[str] = (), *, everything: bool = False) -> dict[str, Any]:
        """Verify the audit chains of ``job_ids`` (or of every job) in Redis and the archive (admin
        token): ``{"checked", "copies", "broken": [{"job_id", "source", "position", "seq", "reason"}]}``."""
        return self._run(self._core.verify_audit(job_ids, everything))

    # ------------------------------------------------------------------ events and waiting

    def events(self, job_id: str, last_event_id: int | None = None, *, stop_on_finish: bool = True) -> Iterator[Event]:
        """The job's events: history after ``last_event_id`` (all without it), then live ones.

        Reconnects by itself with ``Last-Event-ID`` of the last event yielded and
        never yields an id twice. Ends after ``JOB_FINISHED`` (with
        ``stop_on_finish``; otherwise when the server closes the finished stream).
        Raises ``ConnectionFailed`` after ``retries`` reconnects in a row without data.
        """
        return self._iterate(self._core.events(job_id, last_event_id, stop_on_finish))

    def wait_for(
        self,
        job_id: str,
        statuses: Iterable[str] | None = None,
        timeout: float = 300.0,
        *,
        on_status: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> JobSnapshot:
        """Block until the job's status is in ``statuses`` (default: any terminal one) and return its snapshot.

        Follows the event stream and confirms with a GET; if the stream fails
        repeatedly it polls GET instead. A job that ends in a status outside
        ``statuses`` is returned too (it will never change again): check ``.status``.
        ``on_status`` is called with each new status seen. Raises ``WaitTimeout``,
        or ``WaitCancelled`` once ``cancel`` is set.
        """
        cancelled = cancel.is_set if cancel is not None else None
        return self._run(self._core.wait_for(job_id, statuses, timeout, on_status, cancelled))


class AsyncHitlClient(_Client[httpx.AsyncBaseTransport]):
    """The same methods as ``HitlClient``, on ``httpx.AsyncClient``; ``events`` is an async iterator."""

    def _connect(self, transport: httpx.AsyncBaseTransport | None) -> None:
        self._http = httpx.AsyncClient(transport=transport, verify=tls_context())
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHitlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ performing the core's steps

    async def _iterate(self, plan: Plan[None]) -> AsyncIterator[Any]:
        driver, stream = Driver(plan), _AsyncStream()
        try:
            for step in driver:
                if isinstance(step, Emit):
                    yield step.value
                else:
                    await driver.asettle(self._perform(step, stream))
        finally:
            driver.close()
            await stream.aclose()

    async def _run(self, plan: Plan[T]) -> T:
        [result] = [value async for value in self._iterate(emit_result(plan))]
        return cast(T, result)

    async def _perform(self, step: Step, stream: _AsyncStream) -> Any:
        if isinstance(step, Send):
            if not step.stream:
                return await self._http.send(step.request)
            await stream.aclose()
            stream.response = await self._http.send(step.request, stream=True)
            if stream.response.status_code >= 400:
                await stream.response.aread()  # the error body is what the core maps
            stream.lines = stream.response.aiter_lines()
            return stream.response
        if isinstance(step, ReadLine):
            return await anext(stream.lines, None)
        if isinstance(step, Close):
            await stream.aclose()
        elif isinstance(step, Sleep):
            await self._sleep(step.seconds)
        return None

    # ------------------------------------------------------------------ jobs

    async def submit(
        self,
        image: ImageInput,
        *,
        idempotency_key: str | None = None,
        filename: str | None = None,
        review_quorum: int = 1,
        quorum_policy: str = "all",
        boxes: list[dict[str, Any]] | None = None,
    ) -> SubmitResult:
        """See ``HitlClient.submit``; a file is read in a worker thread."""
        data = await asyncio.to_thread(read_image, image, filename)
        return await self._run(self._core.submit(data, idempotency_key, review_quorum, quorum_policy, boxes))

    async def get_job(self, job_id: str) -> JobSnapshot:
        return await self._run(self._core.get_job(job_id))

    async def list_jobs(
        self, status: str | None = None, limit: int = 50, cursor: str | None = None, *, unclaimed: bool = False
    ) -> JobList:
        return await self._run(self._core.list_jobs(status, limit, cursor, unclaimed))

    async def next_job(self, exclude: Iterable[str] = ()) -> JobSummary | None:
        return await self._run(self._core.next_job(exclude))

    async def claim(self, job_id: str, *, force: bool = False, snapshot: bool = False) -> Claim:
        return await self._run(self._core.claim(job_id, force, snapshot))

    async def claim_next(self, exclude: Iterable[str] = ()) -> ClaimedJob | None:
        return await self._run(self._core.claim_next(exclude))

    async def release(self, job_id: str) -> bool:
        return await self._run(self._core.release(job_id))

    def iter_jobs(self, status: str | None = None, *, page_size: int = 100) -> AsyncIterator[JobSummary]:
        """See ``HitlClient.iter_jobs``."""
        return self._iterate(self._core.iter_jobs(status, page_size))

    async def intervene(
        self,
        job_id: str,
        *,
        intervention_id: str,
        pause_token: str,
        base_version: int,
        subjects: Iterable[SubjectInput],
        snapshot_id: str | None = None,
    ) -> InterventionResult:
        return await self._run(
            self._core.intervene(job_id, intervention_id, pause_token, base_version, subjects, snapshot_id)
        )

    async def decide_masks(
        self,
        job_id: str,
        *,
        intervention_id: str,
        pause_token: str,
        base_version: int,
        decisions: Iterable[dict[str, Any]],
        snapshot_id: str | None = None,
    ) -> InterventionResult:
        return await self._run(
            self._core.decide_masks(job_id, intervention_id, pause_token, base_version, decisions, snapshot_id)
        )

    async def cancel(self, job_id: str, reason: str | None = None) -> JobSnapshot:  # reason: in the audit entry
        return await self._run(self._core.cancel(job_id, reason))

    async def results(self, job_id: str) -> JobResults:
        return await self._run(self._core.results(job_id))

    async def download(self, url_or_name: str) -> bytes:
        return await self._run(self._core.download(url_or_name))

    async def healthz(self) -> dict[str, Any]:
        return await self._run(self._core.probe("/healthz"))

    async def readyz(self) -> dict[str, Any]:
        return await self._run(self._core.probe("/readyz"))

    async def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.5) -> dict[str, Any]:
        return await self._run(self._core.wait_until_ready(timeout, interval))

    async def dead_letters(self) -> list[DeadLetter]:
        return await self._run(self._core.dead_letters())

    async def replay_dead_letter(self, dead_letter_id: str) -> ReplayResult:
        return await self._run(self._core.replay_dead_letter(dead_letter_id))

    async def webhook_log(self, limit: int = 100) -> dict[str, Any]:
        return await self._run(self._core.webhook_log(limit))

    async def reconcile(self) -> dict[str, Any]:
        return await self._run(self._core.reconcile())

    async def audit(self, job_id: str) -> dict[str, Any]:
        return await self._run(self._core.audit(job_id))

    async def artifact_gc(self, older_than_days: float, *, dry_run: bool = False) -> dict[str, Any]:
        return await self._run(self._core.artifact_gc(older_than_days, dry_run))

    async def verify_audit(self, job_ids: Iterable[str] = (), *, everything: bool = False) -> dict[str, Any]:
        return await self._run(self._core.verify_audit(job_ids, everything))

    # ------------------------------------------------------------------ events and waiting

    def events(
        self, job_id: str, last_event_id: int | None = None, *, stop_on_finish: bool = True
    ) -> AsyncIterator[Event]:
        """See ``HitlClient.events``."""
        return self._iterate(self._core.events(job_id, last_event_id, stop_on_finish))

    async def wait_for(
        self,
        job_id: str,
        statuses: Iterable[str] | None = None,
        timeout: float = 300.0,
        *,
        on_status: Callable[[str], None] | None = None,
    ) -> JobSnapshot:
        """See ``HitlClient.wait_for``; cancel by cancelling the task."""
        return await self._run(self._core.wait_for(job_id, statuses, timeout, on_status))


class _Stream:
    """The one event stream a sync plan has open."""

    def __init__(self) -> None:
        self.response: httpx.Response | None = None
        self.lines: Iterator[str] = iter(())

    def close(self) -> None:
        if self.response is not None:
            self.response.close()
        self.response, self.lines = None, iter(())


class _AsyncStream:
    """The one event stream an async plan has open."""

    def __init__(self) -> None:
        self.response: httpx.Response | None = None
        self.lines: AsyncIterator[str] = _no_lines()

    async def aclose(self) -> None:
        if self.response is not None:
            await self.response.aclose()
        self.response, self.lines = None, _no_lines()


async def _no_lines() -> AsyncIterator[str]:
    return
    yield
