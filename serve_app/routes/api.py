"""The HTTP API (docs/protocol.md § Routes) as a FastAPI app.

The same app runs under Ray Serve (``serve_app.application``) and, for tests and
the uvicorn comparison benchmark, under plain uvicorn. What differs between the
two is injected through ``Runtime``: how node commands reach the models and
where SSE streams come from.

Why this module is long: every route's roles (``ROUTE_ROLES``), the app's lifespan, the job routes
and ``/metrics`` are here together; the other routes live in sibling modules (``*_routes.py``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from redis import exceptions as redis_errors
from starlette.exceptions import HTTPException as StarletteHTTPException

from hitl_review.statecore import deadletters, durable, errors, prelabelled
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import (
    CreateJobResponse,
    ImageRef,
    InterventionRequest,
    InterventionResponse,
    JobList,
    JobResults,
    JobSnapshot,
)
from hitl_review.statecore.states import JobStatus, is_terminal
from hitl_review.statecore.store import Reply, Store

from ..observability import metrics
from ..observability.request_log import RequestLog, log_intervention
from ..ops.config import Settings
from ..recovery import archived_writes
from ..recovery.archived_reads import archived, archived_events
from ..recovery.recovery import Recovery
from .admission import Admission
from .artifact_gc_routes import add_artifact_gc_route
from .audit_routes import add_audit_routes
from .auth import Authenticator, Identity
from .claim_routes import add_claim_routes
from .note_routes import CancelRequest, add_note_routes
from .preview_routes import Previewer, add_preview_route
from .reviewer_routes import REVIEWER_ROLES, add_reviewer_routes
from .uploads import UPLOAD_OPENAPI, check_image, read_upload
from .webhook_routes import add_webhook_routes

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive
    from hitl_review.archive.reads import ArchivedView

log = logging.getLogger("hitl.api")

API = "/api/v1"
CONTENT_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "npz": "application/octet-stream",
    "pt": "application/octet-stream",
}

PUBLIC = re.compile(r"^/(healthz|readyz)(/.*)?$")
# Open without a token only where the settings say so (Settings.metrics_public, docs_public); else by role.
METRICS_PATH = re.compile(r"^/metrics/?$")
DOCS_PATHS = re.compile(r"^/(docs|redoc|openapi\.json)(/.*)?$")
ANY_ROLE = ("submitter", "reviewer", "executor", "monitor")

# Who may call what. Checked by the auth middleware before anything else, so a
# request without a valid token gets 401 even when its body is malformed.
_READ = ("submitter", "reviewer")
ROUTE_ROLES: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    ("POST", re.compile(rf"^{API}/jobs/?$"), ("submitter",)),
    ("GET", re.compile(rf"^{API}/jobs/?$"), _READ),
    ("POST", re.compile(rf"^{API}/jobs/[^/]+/interventions/?$"), ("reviewer",)),
    ("POST", re.compile(rf"^{API}/jobs/[^/]+/cancel/?$"), ("reviewer",)),
    ("POST", re.compile(rf"^{API}/jobs/[^/]+/claim/?$"), ("reviewer",)),
    ("POST", re.compile(rf"^{API}/claims/next/?$"), ("reviewer",)),
    ("POST", re.compile(rf"^{API}/jobs/[^/]+/subjects/[^/]+/preview/?$"), ("reviewer",)),
    ("DELETE", re.compile(rf"^{API}/jobs/[^/]+/claim/?$"), ("reviewer",)),
    ("POST", re.compile(rf"^{API}/jobs/[^/]+/(flag|comments|skip)/?$"), ("reviewer",)),
    ("DELETE", re.compile(rf"^{API}/jobs/[^/]+/flag/?$"), ("reviewer",)),
    ("GET", re.compile(rf"^{API}/jobs/[^/]+(/events|/results|/audit)?/?$"), _READ),
    ("GET", re.compile(rf"^{API}/artifacts/[^/]+$"), _READ),
    ("GET", re.compile(rf"^{API}/whoami$"), ("submitter", "reviewer", "executor")),
    ("GET", re.compile(rf"^{API}/admin/dead-letters/?$"), ("admin",)),
    ("POST", re.compile(rf"^{API}/admin/dead-letters/[^/]+/replay/?$"), ("admin",)),
    ("GET", re.compile(rf"^{API}/admin/webhooks/log/?$"), ("admin",)),
    ("POST", re.compile(rf"^{API}/admin/reconcile/?$"), ("admin",)),
    ("GET", re.compile(rf"^{API}/admin/audit/verify/?$"), ("admin",)),
    ("POST", re.compile(rf"^{API}/admin/artifacts/gc/?$"), ("admin",)),
    *REVIEWER_ROLES,  # /admin/reviewers (hitl admin reviewers)
    ("GET", METRICS_PATH, ("monitor", "reviewer")),  # Prometheus; the reviewer page's stats (ui/stats.py)
    ("GET", DOCS_PATHS, ANY_ROLE),  # unless --public-docs
]


def roles_for(method: str, path: str) -> tuple[str, ...]:
    """The roles that may call ``method path`` (admin may call them all). Fails closed: a route
    missing from ROUTE_ROLES (or a path no route serves) is refused for every role, so a new
    route cannot ship reachable by any valid token by mistake."""
    for m, pattern, roles in ROUTE_ROLES:
        if m == method and pattern.match(path):
            return roles
    return ()


INTERVENTION_409 = (
    "IDEMPOTENCY_CONFLICT, JOB_CANCELLED, VERSION_CONFLICT, PAUSE_NOT_ACTIVE, PAUSE_TOKEN_MISMATCH, "
    "SNAPSHOT_MISMATCH or WORKFLOW_VERSION_INCOMPATIBLE (the job was re-offered: a new pause): "
    '{"code", "message", "snapshot", "rebase": {"base_version", "version", "base_found", "base_pause_token", '
    '"added", "removed", "moved", "relabelled"}} (docs/protocol.md § Rebase help)'
)
EVENT_ID_RE = re.compile(r"^[0-9]{1,15}$")  # ASCII digits: str.isdigit() also takes "²" and "٣"


EventSource = Callable[[str, int], AsyncIterator[str]]


@dataclass
class Runtime:
    """What the app needs besides HTTP: the store, blobs, identity, and the two injected parts."""

    settings: Settings
    store: Store
    artifacts: ArtifactStore
    auth: Authenticator
    events: EventSource
    readiness: Callable[[], Awaitable[dict[str, Any]]]
    model_stats: Callable[[], Awaitable[dict[str, Any]]] | None = None  # {deployment: describe()}
    preview: Previewer | None = None  # a reviewer's preview mask from the segmenter (preview_routes)
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    closing: list[Store] = field(default_factory=list)  # more stores to close on shutdown (background ones)
    admission: Admission | None = None  # built from settings.max_backlog when not given
    archive: Archive | None = None  # finished jobs, also those Redis no longer holds (docs/protocol.md § Archive)
    recovery: Recovery | None = None  # live jobs Redis lost, back from the archive's mirror (with an archive)


def _error(e: errors.HitlError, headers: dict[str, str] | None = None) -> JSONResponse:
    if e.retry_after_s is not None:
        headers = {**(headers or {}), "Retry-After": str(e.retry_after_s)}
    return JSONResponse(e.to_body(), status_code=e.status, headers=headers)


# What redis-py raises when Redis is down, hung past the operation timeout, loading its AOF,
# without a master for a slot, read-only (a replica after a failover), out of memory, refusing
# writes after a failed snapshot (MISCONF) or busy with a long script: all one 503
# STORE_UNAVAILABLE, mapped here and nowhere else; which errors those are is decided by
# ``statecore.durable.store_unavailable`` (the write-back spools on the same ones).


def store_unavailable(e: Exception) -> errors.StoreUnavailable:
    return errors.StoreUnavailable(f"the state store (Redis) is unavailable: {type(e).__name__}: {e}")


class AuthMiddleware:
    """Pure ASGI: 401/403 before routing, body parsing or anything else."""

    def __init__(self, app: Any, runtime_of: Callable[[], Runtime]) -> None:
        self.app = app
        self.runtime_of = runtime_of

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or PUBLIC.match(scope["path"]) or self.open_by_settings(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            rt = self.runtime_of()  # HITL_TOKENS, a reviewer account (Redis), or a trusted proxy's user
            ident = await rt.auth.authenticate(scope, rt.store.r, rt.settings)
            Authenticator.require(ident, *roles_for(scope["method"], scope["path"]))
        except errors.HitlError as e:
            await _error(e, {"WWW-Authenticate": "Bearer"} if e.status == 401 else None)(scope, receive, send)
            return
        scope.setdefault("state", {})["identity"] = ident
        await self.app(scope, receive, send)

    def open_by_settings(self, path: str) -> bool:
        """/metrics and the API's docs: open without a token where --public-metrics/--public-docs say."""
        if METRICS_PATH.match(path):
            return self.runtime_of().settings.metrics_public
        return bool(DOCS_PATHS.match(path)) and self.runtime_of().settings.docs_public


def create_app(build_runtime: Callable[[], Awaitable[Runtime]], echo_request_id: bool = True) -> FastAPI:
    """``build_runtime`` runs in the app's lifespan, inside the serving process. ``echo_request_id``:
    False under Ray Serve, whose HTTP server echoes X-Request-ID itself (``serve_app.observability.request_log``)."""
    holder: dict[str, Runtime] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        holder["rt"] = await build_runtime()
        rt = holder["rt"]
        if rt.admission is None:
            rt.admission = Admission(rt.store, rt.settings.max_backlog)
        if rt.archive is not None and rt.recovery is None:  # a job Redis lost is restored when asked for
            rt.recovery = Recovery(rt.store, rt.archive, data_dir=rt.settings.data_dir)
            rt.store.on_missing = rt.recovery.restore_missing
            rt.auth.restore_accounts = rt.recovery.restore_accounts  # and the accounts it lost, on an unknown token
        # This process's counters reach the deployment's totals in Redis (serve_app.observability.shared_metrics).
        rt.background.append(asyncio.create_task(metrics.SHARED.flush_forever(rt.store.r)))
        log.info(
            "control plane ready: detector=%s validator=%s segmenter=%s redis=%s",
            rt.settings.detector,
            rt.settings.validator_backend,
            rt.settings.segmenter,
            "external" if rt.settings.redis_url else "embedded",
        )
        try:
            yield
        finally:
            for t in rt.background:
                t.cancel()
            await asyncio.gather(*rt.background, return_exceptions=True)
            for extra in rt.closing:
                await extra.close()
            await rt.store.close()
            if rt.archive is not None:
                rt.archive.close()

    def rt() -> Runtime:
        return holder["rt"]

    app = FastAPI(
        title="hitl-review control plane",
        version="1.0",
        description="Human-in-the-loop review for image cut-out. The protocol: docs/protocol.md in the repository.",
        lifespan=lifespan,
    )
    app.add_middleware(AuthMiddleware, runtime_of=rt)
    app.add_middleware(RequestLog, echo=echo_request_id)  # outside the auth: a 401 is logged and echoed too

    @app.exception_handler(errors.HitlError)
    async def _hitl_error(_req: Request, e: errors.HitlError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(redis_errors.RedisError)
    async def _store_unavailable(_req: Request, e: redis_errors.RedisError) -> JSONResponse:
        if not durable.store_unavailable(e):
            raise e  # a bug, not an outage: the server's 500, as for any other exception
        log.warning("503 STORE_UNAVAILABLE: %s: %s", type(e).__name__, e)
        return _error(store_unavailable(e))

    @app.exception_handler(RuntimeError)
    async def _closed_socket(_req: Request, e: RuntimeError) -> JSONResponse:
        if not durable.closed_transport(e):
            raise e  # a bug: the server's 500
        log.warning("503 STORE_UNAVAILABLE: the connection to Redis closed under a command: %s", e)
        return _error(store_unavailable(e))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, e: RequestValidationError) -> JSONResponse:
        problems = [{"loc": [str(x) for x in err.get("loc", ())], "msg": err.get("msg", "")} for err in e.errors()[:20]]
        first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
        msg = f"{'.'.join(first['loc'][1:] or first['loc'])}: {first['msg']}"
        return _error(errors.InvalidRequest(msg, errors=problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(e.status_code, "HTTP_ERROR")
        return JSONResponse({"code": code, "message": str(e.detail)}, status_code=e.status_code)

    def identity(request: Request) -> Identity:
        return request.state.identity

    async def visible_job(request: Request, job_id: str) -> JobSnapshot:
        return (await located(request, job_id))[0]

    async def located(request: Request, job_id: str) -> tuple[JobSnapshot, ArchivedView | None]:
        """The job from Redis, or from the archive once Redis no longer holds it (with the view
        the other reads answer from). A submitter sees only its own jobs: another's is 404."""
        ident = identity(request)
        try:
            state = await rt().store.get(job_id)
        except errors.JobNotFound:
            view = await archived(rt().archive, job_id)
            if view is None or (ident.role == "submitter" and view.submitter != ident.name):
                raise
            return view.snapshot, view
        if ident.role == "submitter" and state.submitter != ident.name:
            raise errors.JobNotFound(f"job {job_id} not found", job_id=job_id)
        if state.version > state.mirrored:  # strict: nothing is read that a store loss would take back
            await rt().store.journal_behind(job_id)
        return await rt().store.snapshot_of(state), None

    def replayable(reply: Reply) -> Response:
        headers = {"Idempotent-Replayed": "true"} if reply.replayed else {}
        return Response(reply.body, status_code=reply.status_code, media_type="application/json", headers=headers)

    # ------------------------------------------------------------------ jobs

    @app.post(
        f"{API}/jobs",
        status_code=202,
        response_model=CreateJobResponse,
        openapi_extra=UPLOAD_OPENAPI,
        responses={200: {"model": CreateJobResponse}, 400: {}, 409: {}, 413: {}},
    )
    async def create_job(
        request: Request,
        idempotency_key: str | None = Header(default=None, max_length=200),
        review_quorum: int = Query(default=1, ge=1, le=10, description="distinct reviewers each pause needs"),
        quorum_policy: str = Query(default="all", pattern="^(all|majority|any)$", description="what decides a pause"),
    ) -> Response:
        s, admission, who = rt().settings, rt().admission, identity(request).name
        if admission is not None and not idempotency_key:
            await admission.admit_job()  # 429 BACKLOG_FULL before the upload is even read
        upload = await read_upload(request, field="image", max_bytes=s.max_upload_bytes, text_fields=("boxes",))
        checked = await asyncio.to_thread(
            check_image, upload.data, max_bytes=s.max_upload_bytes, max_pixels=s.max_pixels, filename=upload.filename
        )
        raw_boxes = upload.fields.get("boxes")  # a pre-labelled job: checked before anything is written
        boxes = None if raw_boxes is None else prelabelled.parse(raw_boxes, checked.width, checked.height)
        if idempotency_key:  # a replay is answered before admission control, also once Redis forgot it
            args = (rt().archive, admission, who, idempotency_key, checked.sha256, review_quorum, quorum_policy, boxes)
            if (replay := await archived_writes.keyed_creation(rt().store, *args)) is not None:
                return replayable(replay)
        name = await asyncio.to_thread(rt().artifacts.put, "image", checked.data, checked.ext)
        ref = ImageRef(sha256=checked.sha256, width=checked.width, height=checked.height, url=ArtifactStore.url(name))
        reply = await rt().store.create_job(who, ref, idempotency_key or None, review_quorum, quorum_policy, boxes)
        if not reply.replayed:
            metrics.JOBS_CREATED.inc()
            log.info(
                "job created job=%s submitter=%s image=%dx%d%s",
                reply.job_id,
                who,
                checked.width,
                checked.height,
                " (uprighted by its EXIF orientation)" if checked.rotated else "",
            )
        await rt().store.journal_behind(reply.job_id)
        return replayable(reply)

    @app.get(f"{API}/jobs", response_model=JobList)
    async def list_jobs(
        request: Request,
        status: str | None = Query(default=None),
        limit: int = Query(default=50, ge=1, le=500),
        cursor: str | None = Query(default=None, max_length=200),
        unclaimed: bool = Query(
            default=False,
            description="leave out jobs another reviewer has claimed, and quorum jobs the caller already voted on "
            "(status=WAITING: the next job to review first), and jobs the caller skipped a moment ago",
        ),
        flagged: bool | None = Query(default=None, description="only flagged jobs (true) or only unflagged (false)"),
    ) -> JobList:
        if status is not None and status != "WAITING" and status not in JobStatus.__members__:
            raise errors.InvalidRequest(f"unknown status {status!r}", field="status")
        ident = identity(request)
        jobs, nxt = await rt().store.list_jobs(
            submitter=ident.name if ident.role == "submitter" else None,
            status=status,
            limit=limit,
            cursor=cursor,
            unclaimed_for=ident.name if unclaimed else None,
            flagged=flagged,
        )
        return JobList(jobs=jobs, next_cursor=nxt)

    @app.get(f"{API}/jobs/{{job_id}}", response_model=JobSnapshot)
    async def get_job(request: Request, job_id: str) -> JobSnapshot:
        return await visible_job(request, job_id)

    @app.post(
        f"{API}/jobs/{{job_id}}/interventions",
        response_model=InterventionResponse,
        responses={400: {}, 404: {}, 409: {"description": INTERVENTION_409}},
    )
    async def intervene(request: Request, job_id: str, body: InterventionRequest) -> Response:
        t0, ident = time.perf_counter(), identity(request)
        who = ident.name
        try:
            reply = await archived_writes.intervene(rt().store, rt().archive, job_id, body, who, **ident.audited())
        except errors.HitlError as e:
            metrics.INTERVENTIONS.labels(e.code).inc()
            log_intervention(job_id, who, e.code, t0, body.intervention_id)
            raise
        metrics.INTERVENTIONS.labels("REPLAY" if reply.replayed else "OK").inc()
        await rt().store.journal_behind(job_id)
        log_intervention(job_id, who, "REPLAY" if reply.replayed else "OK", t0, body.intervention_id)
        return replayable(reply)

    @app.post(f"{API}/jobs/{{job_id}}/cancel", response_model=JobSnapshot, responses={404: {}, 409: {}})
    async def cancel(request: Request, job_id: str, body: CancelRequest | None = None) -> JobSnapshot:
        ident, why = identity(request), (body.reason if body else None) or ""  # the reason: in the audit entry
        snap = await archived_writes.cancel(rt().store, rt().archive, job_id, ident.name, **ident.audited(), reason=why)
        await rt().store.journal_behind(job_id)
        log.info("job cancelled job=%s by=%s reason=%r", job_id, ident.name, why)
        return snap

    add_claim_routes(app, lambda: rt().store)
    add_note_routes(app, lambda: rt().store)
    add_webhook_routes(app, lambda: rt().store)  # /admin/webhooks/log
    add_preview_route(app, located, lambda: rt().preview)
    add_audit_routes(app, lambda: rt().store, lambda: rt().archive, located)
    add_artifact_gc_route(
        app, lambda: rt().store, lambda: rt().archive, lambda: rt().artifacts, lambda r: identity(r).name
    )
    add_reviewer_routes(app, lambda: rt().store, lambda: rt().auth, lambda: rt().archive, lambda r: identity(r).name)

    @app.get(
        f"{API}/jobs/{{job_id}}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def events(
        request: Request,
        job_id: str,
        last_event_id: str | None = Query(default=None, max_length=20),
        last_event_id_header: str | None = Header(default=None, alias="Last-Event-ID"),
    ) -> Response:
        _snap, view = await located(request, job_id)
        after = last_event_id_header or last_event_id or "0"
        if not EVENT_ID_RE.match(after):
            raise errors.InvalidRequest(
                "Last-Event-ID must be an event id: digits 0-9 only, as the stream sent them", field="Last-Event-ID"
            )
        archive = rt().archive
        return StreamingResponse(
            rt().events(job_id, int(after))
            if view is None or archive is None
            else archived_events(archive, job_id, int(after)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get(f"{API}/jobs/{{job_id}}/results", response_model=JobResults, responses={404: {}, 409: {}})
    async def results(request: Request, job_id: str) -> JobResults:
        snap, view = await located(request, job_id)
        if view is not None and view.results is not None:
            return view.results
        if not is_terminal(snap.status):
            raise errors.JobNotFinished(
                f"job is {snap.status}; results exist once it ends",
                job_id=job_id,
                snapshot=snap.model_dump(mode="json"),
            )
        state = await rt().store.get(job_id)
        return JobResults(job_id=job_id, status=state.status, reason_code=state.reason_code, subjects=state.results)

    @app.get(
        f"{API}/artifacts/{{name}}", response_class=Response, responses={200: {"content": {"image/png": {}}}, 404: {}}
    )
    async def artifact(name: str) -> Response:
        a = rt().artifacts
        if not await asyncio.to_thread(a.exists, name):
            raise errors.ArtifactNotFound(f"artifact {name} not found")
        data = await asyncio.to_thread(a.get, name)
        return Response(
            data,
            media_type=CONTENT_TYPES.get(name.rsplit(".", 1)[-1], "application/octet-stream"),
            headers={"Cache-Control": "private, max-age=31536000, immutable"},
        )

    @app.get(f"{API}/whoami", response_model=Identity)
    async def whoami(request: Request) -> Identity:
        return identity(request)

    # ------------------------------------------------------------------ admin: dead letters

    @app.get(f"{API}/admin/dead-letters", response_model=list[deadletters.DeadLetter])
    async def dead_letters() -> list[deadletters.DeadLetter]:
        return await deadletters.list_all(rt().store.r)

    @app.post(
        f"{API}/admin/dead-letters/{{dead_letter_id}}/replay",
        response_model=deadletters.ReplayResult,
        responses={404: {}},
    )
    async def replay_dead_letter(request: Request, dead_letter_id: str) -> deadletters.ReplayResult:
        done = await deadletters.replay(rt().store, dead_letter_id, identity(request).name)
        log.warning("dead letter %s replayed by %s: %s", done.id, identity(request).name, done.result)
        return done

    @app.post(f"{API}/admin/reconcile", responses={400: {}})
    async def reconcile(request: Request) -> dict[str, Any]:
        """Restore the live jobs Redis lost from the archive's live mirror (docs/protocol.md § Reconcile)."""
        archive = rt().archive
        if archive is None:
            raise errors.InvalidRequest("archiving is off (--no-archive): there is no live mirror to restore from")
        from hitl_review.archive.mirror import reconcile as run

        done = await run(rt().store, archive)
        log.warning("reconcile by %s: %s", identity(request).name, done["counts"])
        return done

    # ------------------------------------------------------------------ operations

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        info: dict[str, Any] = {"redis": False}
        try:
            info["redis"] = await asyncio.wait_for(rt().store.ping(), 2)
            info.update(await asyncio.wait_for(rt().readiness(), 5))
        except Exception as e:  # readiness reports, it does not raise
            info["error"] = f"{type(e).__name__}: {e}"  # a timeout's own text is empty
        ok = bool(info.get("redis")) and bool(info.get("models_ready", True)) and "error" not in info
        return JSONResponse(
            {"ready": ok, **info}, status_code=200 if ok else 503, headers=None if ok else {"Retry-After": "1"}
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        store = rt().store
        # This process's own series only where it answers every scrape: one Api replica (several behind a
        # balancer would alternate inside one series); every Ray Api replica also exports them to Ray's port.
        one_process = rt().settings.api_replicas == 1
        try:
            # From the counters in Redis: the same on every replica, O(partitions) per scrape.
            await metrics.refresh_from_store(store, rt().settings.coverage_window_s)
            model_stats = rt().model_stats
            if model_stats is not None:
                for deployment, info in (await asyncio.wait_for(model_stats(), 5)).items():
                    for kind, n in (info or {}).get("embedding_cache", {}).items():
                        metrics.EMBEDDING_CACHE.labels(deployment, kind).set(n)
        except Exception as e:
            log.warning("metrics refresh failed: %s", e)
        return Response(metrics.render(one_process), media_type="text/plain; version=0.0.4")

    return app
