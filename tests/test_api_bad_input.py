"""Bad input at the edges of the protocol is a 4xx with a code from docs/protocol.md § Error codes,
never a 500 — sent as raw bytes over a socket to the real control plane (uvicorn, real Redis), so
header bytes no HTTP client library would produce reach the app as they are."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.tokens import TOKENS

from .api_util import auth, blank_with_product, submit, wait_status

ADMIN = TOKENS["admin"].encode()


def raw_request(
    url: str, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> tuple[int, bytes]:
    """One HTTP/1.1 request with exactly these header bytes; (status, body). A server that refuses
    the bytes at the protocol layer answers 400 and that is what is returned."""
    host, port = url.removeprefix("http://").split(":")
    head = [f"{method} {path} HTTP/1.1".encode(), f"Host: {host}:{port}".encode(), b"Connection: close"]
    head += [name + b": " + value for name, value in headers]
    if body or method == "POST":
        head.append(f"Content-Length: {len(body)}".encode())
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            chunks.append(data)
            if b"text/event-stream" in chunks[0]:
                break  # a stream that opened is a success; do not wait for it to end
    raw = b"".join(chunks)
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    status = int(raw[9:12])
    return status, raw.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in raw else b""


def code_of(body: bytes) -> str:
    return json.loads(body)["code"]


@pytest.fixture(scope="module")
def job(api_server):
    with httpx.Client(base_url=api_server.url, timeout=30) as c:
        r = submit(c, blank_with_product(seed=3))
        assert r.status_code == 202, r.text
        return wait_status(c, r.json()["job_id"], {"WAITING_USER_SELECTION"})


@pytest.mark.parametrize(
    "value",
    ["Bearer tök".encode(), "Bearer 令牌".encode(), b"Bearer \xff\xfe\xfd", b"\xc3\x28", b"Bearer " + ADMIN + b"\xe9"],
)
def test_a_non_ascii_or_non_utf8_bearer_token_is_401(api_server, value):
    status, body = raw_request(api_server.url, "GET", "/api/v1/jobs", [(b"Authorization", value)])
    assert status == 401 and code_of(body) == "UNAUTHORIZED"


def test_non_utf8_bytes_in_another_header_do_not_matter(api_server):
    status, body = raw_request(
        api_server.url, "GET", "/api/v1/jobs", [(b"Authorization", b"Bearer " + ADMIN), (b"X-Note", b"caf\xe9 \xff")]
    )
    assert status == 200, body


@pytest.mark.parametrize("value", ["²", "１２", "٣", "-1", "1.5", "99999999999999999999999", "0x10"])
def test_a_last_event_id_that_is_not_a_plain_event_id_is_400(api_server, job, value):
    path = f"/api/v1/jobs/{job['job_id']}/events"
    status, body = raw_request(
        api_server.url, "GET", path, [(b"Authorization", b"Bearer " + ADMIN), (b"Last-Event-ID", value.encode())]
    )
    assert status == 400 and code_of(body) == "INVALID_REQUEST", (value, body)
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        r = c.get(path, params={"last_event_id": value}, headers=auth("admin"))
        assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST", (value, r.text)


@pytest.mark.parametrize("cursor", ["1.2.3:x", "1e400:job_a", "-5:job_a", "nan:job_a", "9" * 30 + ":job_a"])
def test_a_malformed_cursor_is_400(api_server, cursor):
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        r = c.get("/api/v1/jobs", params={"cursor": cursor, "status": "WAITING"}, headers=auth("rev1"))
        assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST", r.text


@pytest.mark.parametrize("base_version", [2**64, 2**63, -(2**64), 10**30])
def test_a_base_version_beyond_64_bits_is_400_and_changes_nothing(api_server, job, base_version):
    body = {
        "intervention_id": "iv_big",
        "pause_token": job["active_pause"]["pause_token"],
        "base_version": base_version,
        "subjects": [],
    }
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        r = c.post(f"/api/v1/jobs/{job['job_id']}/interventions", json=body, headers=auth("rev1"))
        assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST", r.text
        after = c.get(f"/api/v1/jobs/{job['job_id']}", headers=auth("rev1")).json()
        assert after["version"] == job["version"] and after["active_pause"] == job["active_pause"]


# Header values: any bytes a client could put on the wire (no CR, LF or NUL, which end the line).
VALUE = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\0", b""))
NAME = st.sampled_from(
    [
        b"Authorization",
        b"Last-Event-ID",
        b"Idempotency-Key",
        b"Content-Type",
        b"Accept",
        b"Cookie",
        b"X-Request-ID",
        b"If-None-Match",
        b"Origin",
    ]
)
ROUTES = st.sampled_from(
    [
        ("GET", "/api/v1/jobs"),
        ("GET", "/api/v1/jobs/{job}"),
        ("GET", "/api/v1/jobs/{job}/events"),
        ("POST", "/api/v1/jobs/{job}/interventions"),
        ("POST", "/api/v1/jobs/{job}/cancel"),
        ("GET", "/api/v1/jobs/{job}/results"),
        ("GET", "/readyz"),
        ("GET", "/api/v1/whoami"),
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=ROUTES,
    headers=st.lists(st.tuples(NAME, VALUE), max_size=4),
    with_token=st.booleans(),
    prefix=st.sampled_from([b"Bearer ", b"bearer ", b"", b"Basic "]),
)
def test_fuzzed_header_bytes_never_give_a_5xx(api_server, job, route, headers, with_token, prefix):
    """Hypothesis over raw header bytes (not only the OpenAPI schema): no combination is a 5xx.
    Cancel is sent for a job id that does not exist, so the shared waiting job is never moved."""
    method, path = route
    path = path.replace("{job}", "job_doesnotexist" if "cancel" in path else job["job_id"])
    sent = list(headers)
    if with_token:
        sent.insert(0, (b"Authorization", prefix + ADMIN))
    body = b"{}" if method == "POST" else b""
    sent = (
        [(n, v) for n, v in sent if n != b"Content-Type"] + [(b"Content-Type", b"application/json")]
        if method == "POST"
        else sent
    )
    status, resp = raw_request(api_server.url, method, path, sent, body)
    assert status < 500, (status, sent, resp[:300])
