"""The client's protocol without I/O: what ``HitlClient`` and ``AsyncHitlClient`` both do.

Every operation is a *plan*, a generator that yields the I/O it needs (the
steps of ``client.steps``) and receives each outcome, then returns the
operation's result. The two clients only perform those steps, blocking or with
``await`` (``Driver`` keeps the bookkeeping), so request building, response and
error mapping, retries, stream resumption and waiting are decided once, in
these modules:

* ``client.steps``: the steps and ``Driver``;
* ``client.wire``: paths, ids, the image upload, request bodies, reply models;
* ``client.calls``: request building and one call with its retries (``CallCore``);
* ``client.event_stream``: the event stream, resumed with ``Last-Event-ID``;
* ``client.waiting``: the bookkeeping of ``wait_for``;
* here: ``ClientCore``, every operation as a plan.

The protocol itself is described in docs/protocol.md § Routes and § Events.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from hitl_review.statecore.models import (
    Claim,
    ClaimedJob,
    ClaimReleased,
    CreateJobResponse,
    Event,
    InterventionResponse,
    JobList,
    JobResults,
    JobSnapshot,
    JobSummary,
)

from .calls import SSE_READ_TIMEOUT, CallCore
from .errors import ApiError, ConnectionFailed
from .event_stream import follow_events
from .retry import RetryMode
from .sse import EventCursor
from .steps import Close, Driver, Emit, Plan, ReadLine, Send, Sleep, Step, emit_result
from .waiting import POLL_INTERVAL, POLL_INTERVAL_MAX, TERMINAL_STATUSES, WaitCancelled, Waiter, wanted_statuses
from .wire import (
    API,
    USER_AGENT,
    DeadLetter,
    ImageInput,
    InterventionResult,
    ReplayResult,
    SubjectInput,
    SubmitResult,
    dead_letter_path,
    job_path,
    new_intervention_id,
    new_request_id,
    normalize_base_url,
    read_image,
    subject_dict,
    was_replayed,
)

__all__ = [
    "API",
    "POLL_INTERVAL",
    "POLL_INTERVAL_MAX",
    "SSE_READ_TIMEOUT",
    "TERMINAL_STATUSES",
    "USER_AGENT",
    "CallCore",
    "ClientCore",
    "Close",
    "Driver",
    "Emit",
    "ImageInput",
    "InterventionResult",
    "Plan",
    "ReadLine",
    "Send",
    "Sleep",
    "Step",
    "SubjectInput",
    "SubmitResult",
    "WaitCancelled",
    "emit_result",
    "new_intervention_id",
    "new_request_id",
    "normalize_base_url",
    "read_image",
    "wanted_statuses",
]

log = logging.getLogger(__name__)


class ClientCore(CallCore):
    """Every operation as a plan, on ``CallCore``'s configuration, request building and retried calls."""

    # ------------------------------------------------------------------ jobs

    def submit(
        self,
        image: tuple[bytes, str, str],
        idempotency_key: str | None,
        review_quorum: int = 1,
        quorum_policy: str = "all",
        boxes: list[dict[str, Any]] | None = None,
    ) -> Plan[SubmitResult]:
        """POST /jobs with ``image`` as ``read_image`` gives it; ``review_quorum`` ≥ 2: each pause
        needs that many distinct reviewers, decided by ``quorum_policy`` (all, majority or any;
        docs/protocol.md § Quorum); ``boxes``: a pre-labelled job's proposal, no detector called
        (docs/protocol.md § Pre-labelled jobs)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        # Without a key a second send could create a second job: retry only what never left.
        mode = RetryMode.IDEMPOTENT if idempotency_key else RetryMode.CONNECT_ONLY
        data, name, ctype = image
        params: dict[str, Any] | None = {"review_quorum": review_quorum} if review_quorum > 1 else None
        if params is not None and quorum_policy != "all":
            params["quorum_policy"] = quorum_policy
        resp = yield from self.call(
            "POST",
            f"{API}/jobs",
            mode=mode,
            headers=headers,
            params=params,
            files={"image": (name, data, ctype)},
            data=None if boxes is None else {"boxes": json.dumps(boxes)},
        )
        parsed = CreateJobResponse.model_validate_json(resp.content)
        return SubmitResult(**parsed.model_dump(), replayed=was_replayed(resp), status_code=resp.status_code)

    def get_job(self, job_id: str) -> Plan[JobSnapshot]:
        resp = yield from self.call("GET", job_path(job_id))
        return JobSnapshot.model_validate_json(resp.content)

    def list_jobs(self, status: str | None, limit: int, cursor: str | None, unclaimed: bool = False) -> Plan[JobList]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        if unclaimed:
            params["unclaimed"] = "true"
        resp = yield from self.call("GET", f"{API}/jobs", params=params)
        return JobList.model_validate_json(resp.content)

    def next_job(self, exclude: Iterable[str], page_size: int = 20) -> Plan[JobSummary | None]:
        """The oldest waiting job no other reviewer has claimed, leaving out ``exclude`` (the job on
        screen): GET /jobs?status=WAITING&unclaimed=true (docs/protocol.md § Claims). Claim it next;
        a 409 ``CLAIMED_BY_OTHER`` means another reviewer took it in between: ask again."""
        skip = set(exclude)
        cursor: str | None = None
        while True:
            page = yield from self.list_jobs("WAITING", page_size, cursor, unclaimed=True)
            found = next((j for j in page.jobs if j.job_id not in skip), None)
            if found is not None or not page.next_cursor:
                return found
            cursor = page.next_cursor

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
        snapshot_id: str | None = None,
    ) -> Plan[InterventionResult]:
        listed = [subject_dict(s) for s in subjects]
        return (
            yield from self.answer_pause(
                job_id, intervention_id, pause_token, base_version, snapshot_id, subjects=listed
            )
        )

    def answer_pause(
        self,
        job_id: str,
        intervention_id: str,
        pause_token: str,
        base_version: int,
        snapshot_id: str | None,
        **answer: list[dict[str, Any]],
    ) -> Plan[InterventionResult]:
        """POST an intervention whose ``answer`` is ``subjects`` (a box stage) or ``decisions`` (a mask review)."""
        body: dict[str, Any] = {
            "intervention_id": intervention_id,
            "pause_token": pause_token,
            "base_version": base_version,
            **answer,
        }
        if snapshot_id is not None:
            body["snapshot_id"] = snapshot_id
        resp = yield from self.call("POST", job_path(job_id, "/interventions"), json=body)
        parsed = InterventionResponse.model_validate_json(resp.content)
        return InterventionResult(**parsed.model_dump(), replayed=was_replayed(resp), raw=resp.content)

    def decide_masks(
        self,
        job_id: str,
        intervention_id: str,
        pause_token: str,
        base_version: int,
        decisions: Iterable[dict[str, Any]],
        snapshot_id: str | None = None,
    ) -> Plan[InterventionResult]:
        """A mask review's submission (docs/protocol.md § Cut-out quality): one decision per listed
        subject, ``{"box_id", "decision": ACCEPT|REJECT|REFINE, "reason", "points"}``. Retried like
        ``intervene``: the server replays an ``intervention_id`` it has seen."""
        decided = [dict(d) for d in decisions]
        return (
            yield from self.answer_pause(
                job_id, intervention_id, pause_token, base_version, snapshot_id, decisions=decided
            )
        )

    def preview(self, job_id: str, box_id: str, points: Iterable[dict[str, Any]]) -> Plan[dict[str, Any]]:
        """POST /jobs/{id}/subjects/{box_id}/preview: ``{"box_id", "mask_png_base64", "area", "quality", "ms"}``.
        Never retried: a 429 (``RATE_LIMITED``) or 503 (``PREVIEW_UNAVAILABLE``) is the caller's to show."""
        body = {"points": [{"x": p["x"], "y": p["y"], "positive": p["positive"]} for p in points]}
        path = job_path(job_id, f"/subjects/{box_id}/preview")
        resp = yield from self.call("POST", path, mode=RetryMode.NEVER, json=body)
        answer: dict[str, Any] = resp.json()
        return answer

    def cancel(self, job_id: str, reason: str | None = None) -> Plan[JobSnapshot]:
        """POST /jobs/{id}/cancel; ``reason``: kept in the job's audit entry (docs/protocol.md § Audit)."""
        body = {"reason": reason} if reason else None
        resp = yield from self.call("POST", job_path(job_id, "/cancel"), json=body)
        return JobSnapshot.model_validate_json(resp.content)

    def claim(self, job_id: str, force: bool, snapshot: bool = False) -> Plan[Claim]:
        """POST /jobs/{id}/claim: take or renew the caller's claim (a second send renews it); with
        ``snapshot`` a ``ClaimedJob`` that carries the job's snapshot too (one round trip)."""
        params = {"force": "true"} if force else {}
        if snapshot:
            params["snapshot"] = "true"
        resp = yield from self.call("POST", job_path(job_id, "/claim"), params=params)
        return (ClaimedJob if snapshot else Claim).model_validate_json(resp.content)

    def claim_next(self, exclude: Iterable[str]) -> Plan[ClaimedJob | None]:
        """POST /claims/next: claim the oldest waiting job no other reviewer has claimed, other than
        ``exclude``, with its snapshot (one round trip however many reviewers race); None when none
        is left. A retry after a lost answer renews the claim taken (the caller's own claim does not
        hide a job), so it does not take a second job."""
        resp = yield from self.call("POST", f"{API}/claims/next", json={"exclude": list(exclude)})
        return None if resp.status_code == 204 else ClaimedJob.model_validate_json(resp.content)

    def release(self, job_id: str) -> Plan[bool]:
        """DELETE /jobs/{id}/claim: True when the caller held a claim (idempotent)."""
        resp = yield from self.call("DELETE", job_path(job_id, "/claim"))
        return ClaimReleased.model_validate_json(resp.content).released

    def results(self, job_id: str) -> Plan[JobResults]:
        resp = yield from self.call("GET", job_path(job_id, "/results"))
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

    # ------------------------------------------------------------------ admin: dead letters

    def dead_letters(self) -> Plan[list[DeadLetter]]:
        """GET /admin/dead-letters (admin): results and commands given up on, oldest first."""
        resp = yield from self.call("GET", f"{API}/admin/dead-letters")
        return [DeadLetter.model_validate(d) for d in resp.json()]

    def replay_dead_letter(self, dead_letter_id: str) -> Plan[ReplayResult]:
        """POST /admin/dead-letters/{id}/replay (admin). A second send would find it gone (404):
        only a request that never left is retried."""
        resp = yield from self.call("POST", dead_letter_path(dead_letter_id, "/replay"), mode=RetryMode.CONNECT_ONLY)
        return ReplayResult.model_validate_json(resp.content)

    def webhook_log(self, limit: int = 100) -> Plan[dict[str, Any]]:
        """GET /admin/webhooks/log (admin): the newest delivery attempts, newest first, and the pending count."""
        resp = yield from self.call("GET", f"{API}/admin/webhooks/log", params={"limit": limit})
        result: dict[str, Any] = resp.json()
        return result

    def reconcile(self) -> Plan[dict[str, Any]]:
        """POST /admin/reconcile (admin): restore the live jobs Redis lost from the archive's mirror.
        Safe to send again (a job Redis holds is left alone), but only a request that never left is
        retried: a second run is the operator's choice."""
        resp = yield from self.call("POST", f"{API}/admin/reconcile", mode=RetryMode.CONNECT_ONLY)
        result: dict[str, Any] = resp.json()
        return result

    def audit(self, job_id: str) -> Plan[dict[str, Any]]:
        """GET /jobs/{id}/audit: the job's hash-chained audit log (docs/protocol.md § Audit)."""
        resp = yield from self.call("GET", job_path(job_id, "/audit"))
        result: dict[str, Any] = resp.json()
        return result

    def artifact_gc(self, older_than_days: float, dry_run: bool) -> Plan[dict[str, Any]]:
        """POST /admin/artifacts/gc (admin): delete (or list) the blobs of old archived jobs that
        no other job uses. Not retried once sent: a second run is the operator's choice."""
        params = {"older_than_days": older_than_days, "dry_run": "true" if dry_run else "false"}
        resp = yield from self.call("POST", f"{API}/admin/artifacts/gc", params=params, mode=RetryMode.CONNECT_ONLY)
        result: dict[str, Any] = resp.json()
        return result

    def verify_audit(self, job_ids: Iterable[str], everything: bool) -> Plan[dict[str, Any]]:
        """GET /admin/audit/verify (admin): the named jobs' chains, or (``everything``) every job's,
        page by page; the findings of all pages together."""
        total: dict[str, Any] = {"checked": 0, "copies": 0, "broken": []}
        after = ""
        while True:
            params: dict[str, Any] = {"all": "true", "after": after} if everything else {"job_id": list(job_ids)}
            resp = yield from self.call("GET", f"{API}/admin/audit/verify", params=params)
            page = resp.json()
            total["checked"] += page["checked"]
            total["copies"] += page["copies"]
            total["broken"].extend(page["broken"])
            after = page.get("next_after") or ""
            if not everything or not after:
                return total

    # ------------------------------------------------------------------ identity and reviewer accounts

    def whoami(self) -> Plan[dict[str, Any]]:
        """GET /whoami: ``{"name", "role"}`` of this client's token (or of the proxy's user)."""
        resp = yield from self.call("GET", f"{API}/whoami")
        result: dict[str, Any] = resp.json()
        return result

    def reviewers(self) -> Plan[dict[str, Any]]:
        """GET /admin/reviewers (admin): ``{"accounts": [...], "static": [...]}``."""
        resp = yield from self.call("GET", f"{API}/admin/reviewers")
        result: dict[str, Any] = resp.json()
        return result

    def add_reviewer(self, name: str, role: str) -> Plan[dict[str, Any]]:
        """POST /admin/reviewers (admin): the new account with its token, shown this once. Only a
        request that never left is retried (a second one would find the name taken: 409)."""
        body = {"name": name, "role": role}
        resp = yield from self.call("POST", f"{API}/admin/reviewers", json=body, mode=RetryMode.CONNECT_ONLY)
        result: dict[str, Any] = resp.json()
        return result

    def remove_reviewer(self, name: str) -> Plan[dict[str, Any]]:
        """DELETE /admin/reviewers/{name} (admin): ``{"removed": account}``."""
        path = f"{API}/admin/reviewers/{quote(name, safe='')}"
        resp = yield from self.call("DELETE", path, mode=RetryMode.CONNECT_ONLY)
        result: dict[str, Any] = resp.json()
        return result

    # ------------------------------------------------------------------ events

    def events(self, job_id: str, last_event_id: int | None, stop_on_finish: bool) -> Plan[None]:
        """Emits the job's events: history after ``last_event_id`` (all without it), then live ones."""

        def emit(event: Event | None) -> Plan[bool]:
            if event is not None:
                yield Emit(event)
            return False

        yield from follow_events(self, job_id, EventCursor(last_event_id), stop_on_finish, None, emit)

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
        waiter = Waiter(job_id, wanted_statuses(statuses), timeout, on_status, cancelled)
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
            yield from follow_events(self, job_id, EventCursor(), True, waiter.deadline, look)
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
