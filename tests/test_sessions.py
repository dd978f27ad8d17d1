"""Sign-in sessions (docs/protocol.md § Sessions) against a real redis-server and two API replicas: a person
signs in once with a token and gets an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` off loopback)
naming a session Redis keeps with its expiry; the cookie signs in on every replica; a write it signs in
needs the session's CSRF token and no foreign ``Origin`` (403 ``CSRF_FAILED``); sign-out, expiry and the
account's removal end it; bearer tokens work as before, beside it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from harness.tokens import TOKENS, auth
from hitl_review.statecore import accounts, keys, sessions
from hitl_review.statecore.store import Store

from .test_reviewer_accounts import _add, _redis_text, replica

API = "/api/v1"
ADMIN = auth("admin")


def cookie(sid: str, **more: str) -> dict[str, str]:
    return {"Cookie": f"{sessions.COOKIE}={sid}", **more}


async def sign_in(c: httpx.AsyncClient, token: str, host: str | None = None) -> tuple[str, dict[str, Any], str]:
    """(the session id of the cookie, the answer's body, the Set-Cookie header)."""
    headers = {"Authorization": f"Bearer {token}", **({"Host": host} if host else {})}
    r = await c.post(f"{API}/session", headers=headers)
    assert r.status_code == 201, r.text
    set_cookie = r.headers["set-cookie"]
    sid = set_cookie.split(";")[0].partition("=")[2]
    return sid, r.json(), set_cookie


def flags(set_cookie: str) -> set[str]:
    return {part.strip().lower() for part in set_cookie.split(";")[1:]}


async def test_a_session_signs_in_on_every_replica_and_its_writes_need_the_csrf_token(
    store: Store, redis_server: Any, tmp_path: Path
) -> None:
    async with replica(redis_server.url, tmp_path / "a") as on_a, replica(redis_server.url, tmp_path / "b") as on_b:
        async with on_a() as a, on_b() as b:
            token = (await _add(a, "carol"))["token"]
            sid, body, set_cookie = await sign_in(a, token)
            assert body["name"] == "carol" and body["role"] == "reviewer" and len(body["csrf_token"]) >= 40
            assert {"httponly", "samesite=strict", "secure", "path=/"} <= flags(set_cookie)  # Host: asgi
            assert f"max-age={sessions.TTL_S}" in flags(set_cookie)
            assert body["csrf_token"] not in set_cookie and sid not in str(body)
            everything = await _redis_text(store)
            assert sid not in everything and sessions.id_hash(sid) in everything  # Redis keeps the id's hash

            # The other replica knows the cookie: reads need nothing more.
            who = await b.get(f"{API}/whoami", headers=cookie(sid))
            assert who.status_code == 200 and who.json() == {"name": "carol", "role": "reviewer"}
            assert (await b.get(f"{API}/session", headers=cookie(sid))).json()["csrf_token"] == body["csrf_token"]
            assert (await b.get(f"{API}/jobs", headers=cookie(sid))).status_code == 200

            # A write: without the CSRF token, with another, or from another origin, 403 CSRF_FAILED.
            csrf = {sessions.CSRF_HEADER: body["csrf_token"]}
            for headers in (
                cookie(sid),
                cookie(sid, **{sessions.CSRF_HEADER: "x" * 43}),
                cookie(sid, Origin="https://evil.example", **csrf),
                cookie(sid, Origin="null", **csrf),
            ):
                r = await b.post(f"{API}/claims/next", json={}, headers=headers)
                assert r.status_code == 403 and r.json()["code"] == "CSRF_FAILED", (headers, r.text)
            for headers in (cookie(sid, **csrf), cookie(sid, Origin="http://asgi", **csrf)):
                r = await b.post(f"{API}/claims/next", json={}, headers=headers)
                assert r.status_code in (200, 204), r.text

            # Programs keep their bearer tokens: no CSRF token needed, and a bearer token wins over a cookie.
            assert (await b.post(f"{API}/claims/next", json={}, headers=auth("rev1"))).status_code in (200, 204)
            r = await b.get(f"{API}/whoami", headers={**auth("rev1"), **cookie(sid)})
            assert r.json()["name"] == "rev1"
            # A HITL_TOKENS person signs in too; an executor (a program) gets no session; nor does a cookie.
            assert (await sign_in(b, TOKENS["rev2"], host="127.0.0.1:8000"))[1]["name"] == "rev2"
            assert (await b.post(f"{API}/session", headers=auth("exec"))).status_code == 403
            r = await b.post(f"{API}/session", headers=cookie(sid, **csrf))
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"


async def test_the_cookie_is_secure_except_on_loopback(redis_server: Any, tmp_path: Path) -> None:
    async with replica(redis_server.url, tmp_path) as on, on() as c:
        for host in ("127.0.0.1:8000", "localhost:7860", "[::1]:8000", "ui.localhost"):
            assert "secure" not in flags((await sign_in(c, TOKENS["rev1"], host=host))[2]), host
        for host in ("review.example.com", "10.0.0.5:8000", "127.0.0.1.nip.io"):
            set_cookie = (await sign_in(c, TOKENS["rev1"], host=host))[2]
            assert {"secure", "httponly", "samesite=strict"} <= flags(set_cookie), host


async def test_sign_out_and_expiry_end_a_session(store: Store, redis_server: Any, tmp_path: Path) -> None:
    async with replica(redis_server.url, tmp_path / "a") as on_a, replica(redis_server.url, tmp_path / "b") as on_b:
        async with on_a() as a, on_b() as b:
            sid, body, _ = await sign_in(a, TOKENS["rev1"])
            csrf = {sessions.CSRF_HEADER: body["csrf_token"]}
            assert (await b.delete(f"{API}/session", headers=cookie(sid))).json()["code"] == "CSRF_FAILED"
            r = await a.delete(f"{API}/session", headers=cookie(sid, **csrf))
            assert r.status_code == 200 and r.json() == {"ended": True}
            assert f"{sessions.COOKIE}=" in r.headers["set-cookie"] and "max-age=0" in flags(r.headers["set-cookie"])
            for c in (a, b):  # ended on every replica at once
                r = await c.get(f"{API}/whoami", headers=cookie(sid))
                assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"

            # A session lasts its TTL (Redis expires it), not one moment more.
            sid, _found = await sessions.create(store.r, "rev1", "reviewer", accounts.token_hash(TOKENS["rev1"]), 0.4)
            assert (await b.get(f"{API}/whoami", headers=cookie(sid))).status_code == 200
            await asyncio.sleep(0.6)
            assert (await b.get(f"{API}/whoami", headers=cookie(sid))).status_code == 401
            assert await store.r.get(keys.session(sessions.id_hash(sid))) is None


async def test_a_removed_reviewers_sessions_end(store: Store, redis_server: Any, tmp_path: Path) -> None:
    async with replica(redis_server.url, tmp_path / "a") as on_a, replica(redis_server.url, tmp_path / "b") as on_b:
        async with on_a() as a, on_b() as b:
            token = (await _add(a, "dave"))["token"]
            first, _, _ = await sign_in(a, token)
            second, _, _ = await sign_in(b, token)
            assert (await b.get(f"{API}/whoami", headers=cookie(first))).status_code == 200
            assert (await a.delete(f"{API}/admin/reviewers/dave", headers=ADMIN)).status_code == 200
            for c in (a, b):  # both sessions, on both replicas, at once (not after the account cache)
                for sid in (first, second):
                    assert (await c.get(f"{API}/whoami", headers=cookie(sid))).status_code == 401
            assert not await store.r.exists(keys.sessions_of("dave"))

            # A session is never worth more than its token: one whose token no longer signs in is refused.
            orphan, _ = await sessions.create(store.r, "erin", "reviewer", accounts.token_hash("no-such-token"))
            r = await b.get(f"{API}/whoami", headers=cookie(orphan))
            assert r.status_code == 401 and "removed" in r.json()["message"]
