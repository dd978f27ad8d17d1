"""Sign-in sessions of the reviewer page (docs/protocol.md § Sessions): people sign in once with their
token and their browser then holds only an ``HttpOnly`` cookie naming a session kept here, so no script
in the page can read a credential; programs keep sending their bearer token.

A session id is 256 random bits (the cookie's value). Redis keeps, under the SHA-256 of the id (a
leaked copy of Redis signs nobody in), the session's JSON with a TTL: the name and role it acts as, the
SHA-256 of the token it was made with (re-checked on use: a session is never worth more than its
token), and its CSRF token, which the page's server gets in the answer's body, never in a cookie. A
session ends when its TTL runs out, at sign-out, or when its account is removed (:func:`end_all`).
Every API replica reads the same keys, so a session made on one works on all of them. Sessions are not
archived: a Redis that comes back empty has lost them, and people sign in again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from . import keys

COOKIE = "hitl_session"  # the cookie's name, on the API's origin and on the reviewer page's
CSRF_HEADER = "X-CSRF-Token"  # a cookie-authenticated write carries the session's CSRF token in it
TTL_S = 12 * 3600  # a working day: a session lasts this long from its sign-in, not extended by use


class Session(BaseModel):
    name: str
    role: str
    token_hash: str  # the SHA-256 of the token the session was made with
    csrf: str
    created_at: str
    expires_at: str


def id_hash(session_id: str | bytes) -> str:
    raw = session_id.encode("utf-8", "surrogateescape") if isinstance(session_id, str) else session_id
    return hashlib.sha256(raw).hexdigest()


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def create(r: Any, name: str, role: str, token_hash: str, ttl_s: float = TTL_S) -> tuple[str, Session]:
    """A new session for ``name``: (its id, for the cookie alone, and the session)."""
    now = datetime.now(UTC)
    sid = secrets.token_urlsafe(32)
    found = Session(
        name=name,
        role=role,
        token_hash=token_hash,
        csrf=secrets.token_urlsafe(32),
        created_at=_iso(now),
        expires_at=_iso(now + timedelta(seconds=ttl_s)),
    )
    hashed, ttl_ms = id_hash(sid), max(1, int(ttl_s * 1000))
    await r.set(keys.session(hashed), found.model_dump_json(), px=ttl_ms)
    await r.sadd(keys.sessions_of(name), hashed)
    await r.pexpire(keys.sessions_of(name), ttl_ms)  # every session has the same TTL: the newest outlives the rest
    return sid, found


async def lookup(r: Any, session_id: str | bytes) -> Session | None:
    """The live session ``session_id`` names, if any (one GET)."""
    raw = await r.get(keys.session(id_hash(session_id)))
    return Session.model_validate(json.loads(raw)) if raw else None


def csrf_matches(found: Session, given: str | bytes | None) -> bool:
    """Whether ``given`` (a request's CSRF header) is the session's CSRF token (compared in constant time)."""
    if not given:
        return False
    raw = given.encode("utf-8", "surrogateescape") if isinstance(given, str) else given
    return hmac.compare_digest(found.csrf.encode(), raw)


async def end(r: Any, session_id: str | bytes) -> bool:
    """Sign out: the session is gone on every replica at once; whether there was one."""
    hashed = id_hash(session_id)
    found = await lookup(r, session_id)
    gone = bool(await r.delete(keys.session(hashed)))
    if found is not None:
        await r.srem(keys.sessions_of(found.name), hashed)
    return gone


async def end_all(r: Any, name: str) -> int:
    """End every session of ``name`` (their account was removed); how many there were."""
    hashed = await r.smembers(keys.sessions_of(name))
    n = 0
    for h in hashed:
        n += int(await r.delete(keys.session(h)))
    await r.delete(keys.sessions_of(name))
    return n


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def _hostname(host: str) -> str:
    """``host[:port]`` → host (an IPv6 literal keeps its brackets)."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def on_loopback(host: str | None) -> bool:
    """Whether the browser reached us at a loopback name (its ``Host``): plain HTTP, so no ``Secure`` cookie."""
    name = _hostname((host or "").strip().lower())
    return name in LOOPBACK_HOSTS or name.endswith(".localhost")


def cookie_attributes(host: str | None, max_age_s: float) -> dict[str, Any]:
    """The cookie's flags (Starlette's ``set_cookie`` keywords): ``HttpOnly`` (no script reads it),
    ``SameSite=Strict`` (no other site's page sends it: no cross-site request is ever signed in), and
    ``Secure`` except on loopback, where the page is served over plain HTTP."""
    return {
        "max_age": max(0, int(max_age_s)),
        "path": "/",
        "httponly": True,
        "samesite": "strict",
        "secure": not on_loopback(host),
    }


def same_origin(origin: str | None, host: str | None, forwarded_host: str | None = None) -> bool:
    """Whether a request's ``Origin`` (absent: not a browser's cross-origin write) names the host it was sent
    to (``Host``, or the ``X-Forwarded-Host`` of a proxy in front); ``null`` never does."""
    if origin is None:
        return True
    netloc = origin.strip().lower().partition("://")[2].rstrip("/")
    if not netloc:
        return False
    hosts = {h.strip().lower() for h in (host, forwarded_host) if h}
    return netloc in hosts or _default_port(origin) in hosts


def _default_port(origin: str) -> str:
    """``https://h`` → ``h:443``, ``http://h`` → ``h:80`` (a ``Host`` may spell the default port)."""
    scheme, _, netloc = origin.strip().lower().partition("://")
    port = {"https": "443", "http": "80"}.get(scheme)
    return f"{netloc.rstrip('/')}:{port}" if port and ":" not in netloc.replace("[::1]", "") else ""
