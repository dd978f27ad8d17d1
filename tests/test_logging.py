"""Logs (README § Logs): structured lines (``--log-format json|text``), the client's X-Request-ID read,
logged and echoed, one line per intervention, rotation of hitl.log and redis.log, the UI's output in
a file, and no line per queue poll at INFO.

The API tests run the app over ASGI on the session's real redis-server (``tests.asgi_util``); jobs
reach their pause through the store (``tests.helpers``)."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from harness.tokens import auth
from hitl_review.statecore.store import StoreConfig

from .asgi_util import asgi_client
from .helpers import iv, keep, waiting_job


class Captured(logging.Handler):
    """Every record of the ``hitl`` loggers, DEBUG and up, as the real handlers see them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.stream = io.StringIO()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured() -> Iterator[Captured]:
    from hitl_review.serve_app.observability.logging_setup import RequestIdFilter

    handler = Captured()
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("hitl")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.fixture
async def api(store, redis_server, tmp_path):
    async with asgi_client(redis_server.url, tmp_path, StoreConfig(retention_s=3600, node_timeout_s=60)) as c:
        yield c


# ---------------------------------------------------------------------------------------- request id


async def test_the_clients_request_id_is_echoed_and_one_is_made_when_none_is_sent(api):
    r = await api.get("/api/v1/whoami", headers={**auth("rev1"), "X-Request-ID": "lt-0123abcd"})
    assert r.status_code == 200 and r.headers["X-Request-ID"] == "lt-0123abcd"
    made = (await api.get("/api/v1/whoami", headers=auth("rev1"))).headers.get("X-Request-ID")
    assert made and re.fullmatch(r"[0-9a-f]{32}", made)
    # Refused before routing (401) still carries it; a value that is not an id is replaced, not echoed.
    assert (await api.get("/api/v1/whoami", headers={"X-Request-ID": "r-401"})).headers["X-Request-ID"] == "r-401"
    odd = (await api.get("/api/v1/whoami", headers={**auth("rev1"), "X-Request-ID": "a b\tc"})).headers
    assert re.fullmatch(r"[0-9a-f]{32}", odd["X-Request-ID"])


async def test_an_intervention_is_one_line_with_job_reviewer_outcome_latency_and_request_id(
    api, store, image, captured
):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    body = iv(st, keep(st, 0, 1)).model_dump(mode="json")
    headers = {**auth("rev1"), "X-Request-ID": "rid-intervene-1"}
    r = await api.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["X-Request-ID"] == "rid-intervene-1"
    again = await api.post(
        f"/api/v1/jobs/{job_id}/interventions", json=body, headers={**auth("rev1"), "X-Request-ID": "rid-2"}
    )
    assert again.status_code == 200
    stale = {**body, "intervention_id": "iv_other"}
    conflict = await api.post(
        f"/api/v1/jobs/{job_id}/interventions", json=stale, headers={**auth("rev1"), "X-Request-ID": "rid-3"}
    )
    assert conflict.status_code == 409

    lines = [rec for rec in captured.records if getattr(rec, "outcome", None) is not None]
    assert [(rec.request_id, rec.outcome) for rec in lines] == [  # type: ignore[attr-defined]
        ("rid-intervene-1", "OK"),
        ("rid-2", "REPLAY"),
        ("rid-3", conflict.json()["code"]),
    ]
    first = lines[0]
    assert first.levelno == logging.INFO
    assert first.job_id == job_id and first.reviewer == "rev1"  # type: ignore[attr-defined]
    assert isinstance(first.latency_ms, float) and first.latency_ms >= 0  # type: ignore[attr-defined]
    assert first.intervention_id == body["intervention_id"]  # type: ignore[attr-defined]
    msg = first.getMessage()
    assert job_id in msg and "rev1" in msg and "OK" in msg

    # The JSON formatter writes every one of those fields.
    from hitl_review.serve_app.observability.logging_setup import JsonFormatter

    obj = json.loads(JsonFormatter().format(first))
    assert obj["request_id"] == "rid-intervene-1" and obj["job_id"] == job_id and obj["reviewer"] == "rev1"
    assert obj["outcome"] == "OK" and obj["latency_ms"] == first.latency_ms  # type: ignore[attr-defined]


async def test_queue_polls_log_at_debug_and_writes_at_info(api, store, image, captured):
    job_id = await waiting_job(store, image)
    for _ in range(3):
        assert (await api.get("/api/v1/jobs?status=WAITING", headers=auth("rev1"))).status_code == 200
        assert (await api.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).status_code == 200
    assert (await api.get("/readyz")).status_code == 200
    polls = [rec for rec in captured.records if rec.name == "hitl.access"]
    assert len(polls) == 7, [rec.getMessage() for rec in polls]  # one line each, at DEBUG
    assert all(rec.levelno == logging.DEBUG for rec in polls)
    assert not [rec for rec in captured.records if rec.levelno >= logging.INFO]

    missing = await api.get("/api/v1/jobs/job_missing", headers={**auth("rev1"), "X-Request-ID": "rid-404"})
    assert missing.status_code == 404
    cancel = await api.post(f"/api/v1/jobs/{job_id}/cancel", headers={**auth("rev1"), "X-Request-ID": "rid-c"})
    assert cancel.status_code == 200
    loud = [rec for rec in captured.records if rec.name == "hitl.access" and rec.levelno >= logging.INFO]
    assert [(rec.method, rec.status, rec.request_id) for rec in loud] == [  # type: ignore[attr-defined]
        ("GET", 404, "rid-404"),
        ("POST", 200, "rid-c"),
    ]
    assert loud[1].path == f"/api/v1/jobs/{job_id}/cancel"  # type: ignore[attr-defined]


async def test_under_serves_http_server_the_id_is_echoed_once(redis_server, tmp_path, captured):
    """Ray Serve's HTTP server (proxy or direct ingress) reads X-Request-ID, makes one when none is
    sent and echoes it; the Api replica's app (``echo_request_id=False``) logs that same id and adds
    no second header."""
    http_util = pytest.importorskip("ray.serve._private.http_util")
    from harness.tokens import TOKENS_SPEC
    from hitl_review.serve_app.ops.config import Settings
    from hitl_review.serve_app.routes.api import Runtime, create_app
    from hitl_review.serve_app.routes.auth import Authenticator
    from hitl_review.statecore.artifacts import ArtifactStore
    from hitl_review.statecore.store import Store

    from .asgi_util import _no_events, _ready

    settings = Settings(data_dir=tmp_path, tokens=TOKENS_SPEC, redis_url=redis_server.url)

    async def build() -> Runtime:
        return Runtime(
            settings=settings,
            store=Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=60)),
            artifacts=ArtifactStore(settings.artifacts),
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=_no_events,
            readiness=_ready,
        )

    app = create_app(build, echo_request_id=False)
    served = http_util.RequestIdMiddleware(app)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=served)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as c:
            sent = await c.post("/api/v1/jobs/job_missing/cancel", headers={**auth("rev1"), "X-Request-ID": "rid-s"})
            made = await c.post("/api/v1/jobs/job_missing/cancel", headers=auth("rev1"))
    assert sent.headers.get_list("X-Request-ID") == ["rid-s"]
    [made_id] = made.headers.get_list("X-Request-ID")
    lines = [rec for rec in captured.records if rec.name == "hitl.access"]
    assert [rec.request_id for rec in lines] == ["rid-s", made_id]  # type: ignore[attr-defined]


def test_serves_own_access_line_is_dropped_in_the_api_replica():
    from hitl_review.serve_app.observability.logging_setup import drop_serve_access_lines

    serve_logger = logging.getLogger("ray.serve")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    serve_logger.addHandler(handler)
    try:
        drop_serve_access_lines()
        drop_serve_access_lines()  # once is enough: a second call adds nothing
        serve_logger.warning("GET /api/v1/jobs 200 1.0ms", extra={"serve_access_log": True})
        serve_logger.warning("replica started")
        assert seen == ["replica started"]
    finally:
        serve_logger.removeHandler(handler)
        for f in list(serve_logger.filters):
            serve_logger.removeFilter(f)


# ---------------------------------------------------------------------------------------- formats


def test_json_lines_carry_ts_level_logger_msg_extras_and_the_exception():
    from hitl_review.serve_app.observability.logging_setup import REQUEST_ID, RequestIdFilter, make_handler

    out = io.StringIO()
    handler = make_handler(logging.StreamHandler(out), "json")
    logger = logging.getLogger("hitl.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    token = REQUEST_ID.set("rid-json")
    try:
        logger.info("job created job=%s", "job_1", extra={"job_id": "job_1", "latency_ms": 1.5})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("it failed")
        logger.info("odd %s", object(), extra={"thing": {1, 2}})  # anything not JSON is written as text
    finally:
        REQUEST_ID.reset(token)
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    first, second, third = (json.loads(line) for line in lines)
    assert first["level"] == "INFO" and first["logger"] == "hitl.test.json" and first["msg"] == "job created job=job_1"
    assert first["job_id"] == "job_1" and first["latency_ms"] == 1.5 and first["request_id"] == "rid-json"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]
    assert isinstance(third["thing"], str)
    assert any(isinstance(f, RequestIdFilter) for f in handler.filters)


def test_text_lines_read_as_before_with_the_request_id_appended():
    from hitl_review.serve_app.observability.logging_setup import REQUEST_ID, make_handler

    out = io.StringIO()
    handler = make_handler(logging.StreamHandler(out), "text")
    logger = logging.getLogger("hitl.test.text")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        logger.info("outside a request")
        token = REQUEST_ID.set("rid-text")
        logger.info("inside one")
        REQUEST_ID.reset(token)
    finally:
        logger.removeHandler(handler)
    a, b = out.getvalue().splitlines()
    assert re.fullmatch(r"\S+ \S+ INFO hitl\.test\.text: outside a request", a)
    assert b.endswith("INFO hitl.test.text: inside one [request_id=rid-text]")


def test_the_default_format_is_json_off_a_terminal_and_text_on_one():
    from hitl_review.serve_app.observability.logging_setup import resolve_format

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_format(None, io.StringIO()) == "json"
    assert resolve_format("auto", io.StringIO()) == "json"
    assert resolve_format(None, Tty()) == "text"
    assert resolve_format("json", Tty()) == "json" and resolve_format("text", io.StringIO()) == "text"
    with pytest.raises(ValueError, match="json or text"):
        resolve_format("xml", io.StringIO())


def test_hitl_up_takes_log_format():
    from hitl_review.serve_app.cli import build_parser
    from hitl_review.serve_app.ops.launcher import settings_from_args

    args = build_parser().parse_args(["up", "--log-format", "json"])
    assert args.log_format == "json" and settings_from_args(args).log_format == "json"
    assert settings_from_args(build_parser().parse_args(["up"])).log_format == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--log-format", "xml"])


# ---------------------------------------------------------------------------------------- files


@pytest.fixture
def root_logging() -> Iterator[None]:
    root, httpx_logger = logging.getLogger(), logging.getLogger("httpx")
    saved = (root.handlers[:], root.level, httpx_logger.level)
    yield
    httpx_logger.setLevel(saved[2])
    for h in root.handlers:
        if h not in saved[0]:
            h.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_hitl_log_rotates(tmp_path: Path, root_logging):
    from hitl_review.serve_app.observability.logging_setup import setup_logging

    assert setup_logging(tmp_path, log_format="json", max_bytes=2000, backups=2, stream=io.StringIO()) == "json"
    assert logging.getLogger("httpx").level == logging.WARNING  # not a line per poll of /readyz
    log = logging.getLogger("hitl.test.rotate")
    for i in range(100):
        log.info("line %d %s", i, "x" * 50)
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["hitl.log", "hitl.log.1", "hitl.log.2"]
    assert all(p.stat().st_size <= 2000 for p in logs.iterdir())
    last = json.loads((logs / "hitl.log").read_text().splitlines()[-1])
    assert last["msg"].startswith("line 99 ")


def test_rotate_file_keeps_n_backups_and_leaves_a_small_file(tmp_path: Path):
    from hitl_review.serve_app.observability.logging_setup import rotate_file

    path = tmp_path / "redis.log"
    assert rotate_file(path, max_bytes=10, backups=2) is False  # not there: nothing to do
    path.write_text("small")
    assert rotate_file(path, max_bytes=10, backups=2) is False and path.read_text() == "small"
    for n in range(3):
        path.write_text(f"generation {n} " + "x" * 20)
        assert rotate_file(path, max_bytes=10, backups=2) is True
        assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["redis.log.1", "redis.log.2"]
    assert (tmp_path / "redis.log.1").read_text().startswith("generation 2")
    assert (tmp_path / "redis.log.2").read_text().startswith("generation 1")


def test_redis_log_is_rotated_while_redis_runs(tmp_path: Path):
    """redis-server opens its logfile for every line, so a renamed redis.log is followed by a new one."""
    from harness.ci import require_binary
    from hitl_review.serve_app.ops.redis_server import RedisServer

    require_binary("redis-server")
    server = RedisServer(tmp_path / "redis", log_max_bytes=1, log_backups=3).start()
    try:
        log = server.data_dir / "redis.log"
        assert log.stat().st_size > 0  # the start-up banner
        assert server.rotate_log() is True
        assert not log.exists() and (server.data_dir / "redis.log.1").exists()
        client = redis.Redis.from_url(server.url)
        client.execute_command("BGREWRITEAOF")  # redis logs it
        client.close()
        deadline = time.monotonic() + 10
        while not log.exists():
            assert time.monotonic() < deadline, "redis-server wrote no new redis.log"
            time.sleep(0.05)
    finally:
        server.stop()
    # A restart starts on a fresh file when the old one is over the cap.
    server.start()
    try:
        assert (server.data_dir / "redis.log.2").exists()
    finally:
        server.stop()


def test_ui_output_goes_to_a_file(tmp_path: Path):
    from hitl_review.serve_app.ops.launcher import ui_log

    first = ui_log(tmp_path)
    first.write(b"Running on local URL\n")
    first.close()
    assert (tmp_path / "logs" / "ui.log").read_bytes() == b"Running on local URL\n"
    second = ui_log(tmp_path, max_bytes=5)  # a restart: the old output is kept beside it
    second.write(b"again\n")
    second.close()
    assert (tmp_path / "logs" / "ui.log.1").read_bytes() == b"Running on local URL\n"
    assert (tmp_path / "logs" / "ui.log").read_bytes() == b"again\n"
