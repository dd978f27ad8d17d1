"""Each request's id, line and timing (README § Logs), outermost of the API's middlewares.

The client sends ``X-Request-ID`` with every call (``client.wire.new_request_id``; the load tests
too): it is read here (one is made when none is sent, or when what was sent is not an id), set as
``serve_app.observability.logging_setup.REQUEST_ID`` for every line logged while the request is served, and
echoed in the answer, a 401 included. Every request gets one ``hitl.access`` line (method, path,
status, latency_ms): at INFO for writes and errors, at DEBUG for reads, so a reviewer UI polling the
queue writes nothing at the default level. ``hitl_http_request_duration_seconds`` is observed here
as well (the time to the response's headers, per route and status).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from . import metrics
from .logging_setup import REQUEST_ID

access = logging.getLogger("hitl.access")
interventions = logging.getLogger("hitl.api")

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
READS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_id_of(scope: dict[str, Any], trusted: bool = False) -> str:
    """The request's ``X-Request-ID`` when it is an id (letters, digits, ``.:_-``, at most 128), or
    (``trusted``: the server in front already echoed it) whatever it is; else a new one."""
    for k, v in scope.get("headers", []):
        if k.lower() == b"x-request-id":
            sent = v.decode("latin-1")
            if trusted and sent:
                return sent[:200]
            if REQUEST_ID_RE.match(sent):
                return sent
            break
    return uuid.uuid4().hex


class RequestLog:
    """Pure ASGI (a streamed answer, SSE, passes through untouched). ``echo=False`` under Ray Serve:
    its HTTP server (the proxy's, or the Api replica's own under direct ingress) reads the header,
    adds one when none was sent and echoes it (``ray.serve._private.http_util.RequestIdMiddleware``);
    a second echo would double the header."""

    def __init__(self, app: Any, echo: bool = True) -> None:
        self.app = app
        self.echo = echo

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope, trusted=not self.echo)
        token = REQUEST_ID.set(rid)
        t0 = time.perf_counter()
        status, elapsed = 500, None  # an exception before the answer: the server's 500

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status, elapsed
            if message["type"] == "http.response.start":
                status, elapsed = message["status"], time.perf_counter() - t0
                if self.echo:
                    message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = elapsed if elapsed is not None else time.perf_counter() - t0
            route = getattr(scope.get("route"), "path", "unmatched")
            metrics.HTTP_SECONDS.labels(route, str(status)).observe(seconds)
            method = scope["method"]
            level = logging.DEBUG if method in READS and status < 400 else logging.INFO
            if status >= 500:
                level = logging.WARNING
            if access.isEnabledFor(level):
                latency_ms = round(seconds * 1000, 1)
                access.log(
                    level,
                    "%s %s %d %.1fms",
                    method,
                    scope["path"],
                    status,
                    latency_ms,
                    extra={"method": method, "path": scope["path"], "status": status, "latency_ms": latency_ms},
                )
            REQUEST_ID.reset(token)


def log_intervention(job_id: str, reviewer: str, outcome: str, t0: float, intervention_id: str) -> None:
    """The line of one intervention: job, reviewer, outcome (OK, REPLAY or the error code), latency
    since ``t0`` (``time.perf_counter()``), and the intervention's id; the request id is added."""
    latency_ms = round((time.perf_counter() - t0) * 1000, 1)
    interventions.info(
        "intervention job=%s reviewer=%s outcome=%s latency_ms=%.1f intervention=%s",
        job_id,
        reviewer,
        outcome,
        latency_ms,
        intervention_id,
        extra={
            "job_id": job_id,
            "reviewer": reviewer,
            "outcome": outcome,
            "latency_ms": latency_ms,
            "intervention_id": intervention_id,
        },
    )
