"""Sign-in sessions over the API (docs/protocol.md § Sessions): ``POST /session`` with a bearer token makes
one and sets its cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` off loopback); ``GET /session``
says whom a cookie signs in as and the CSRF token its writes need; ``DELETE /session`` signs out. People
sign in so (the reviewer page's server does it for them: ``ui.cookie_signin``); programs keep their
bearer tokens. How a cookie is checked on every other route is ``serve_app.routes.auth``'s."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

from hitl_review.statecore import accounts, errors, sessions

if TYPE_CHECKING:
    from hitl_review.statecore.store import Store

    from .auth import Identity

API = "/api/v1"
_PEOPLE = ("submitter", "reviewer")  # and admin; an executor is a program: no session
SESSION_ROLES: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    (method, re.compile(rf"^{API}/session/?$"), _PEOPLE) for method in ("POST", "GET", "DELETE")
]


class SessionView(BaseModel):
    name: str
    role: str
    csrf_token: str  # sent back in X-CSRF-Token by every write the cookie signs in
    expires_at: str


class SessionEnded(BaseModel):
    ended: bool


def _view(found: sessions.Session) -> SessionView:
    return SessionView(name=found.name, role=found.role, csrf_token=found.csrf, expires_at=found.expires_at)


def add_session_routes(
    app: FastAPI, store_of: Callable[[], Store], identity: Callable[[Request], Identity], ttl_s: Callable[[], float]
) -> None:
    @app.post(f"{API}/session", status_code=201, response_model=SessionView, responses={401: {}})
    async def sign_in(request: Request, response: Response) -> SessionView:
        """A session for the bearer token's owner; its id goes in the cookie only."""
        token = _bearer(request.headers.get("authorization"))
        if token is None:
            raise errors.Unauthorized("a session is made with a bearer token: send 'Authorization: Bearer <token>'")
        who = identity(request)
        sid, found = await sessions.create(store_of().r, who.name, who.role, accounts.token_hash(token), ttl_s())
        response.set_cookie(sessions.COOKIE, sid, **sessions.cookie_attributes(request.headers.get("host"), ttl_s()))
        return _view(found)

    @app.get(f"{API}/session", response_model=SessionView, responses={401: {}})
    async def current(request: Request) -> SessionView:
        """The session the cookie names (after a reload, the page's server learns its CSRF token here)."""
        return _view(await _session_of(request, store_of))

    @app.delete(f"{API}/session", response_model=SessionEnded, responses={401: {}, 403: {}})
    async def sign_out(request: Request, response: Response) -> SessionEnded:
        """End the cookie's session on every replica at once, and drop the cookie."""
        sid = request.cookies.get(sessions.COOKIE)
        if sid is None:
            raise errors.InvalidRequest("no session cookie: nothing to sign out of", field=sessions.COOKIE)
        ended = await sessions.end(store_of().r, sid)
        attributes: dict[str, Any] = sessions.cookie_attributes(request.headers.get("host"), 0)
        response.delete_cookie(sessions.COOKIE, **{k: v for k, v in attributes.items() if k != "max_age"})
        return SessionEnded(ended=ended)


async def _session_of(request: Request, store_of: Callable[[], Store]) -> sessions.Session:
    sid = request.cookies.get(sessions.COOKIE)
    found = await sessions.lookup(store_of().r, sid) if sid else None
    if found is None:
        raise errors.Unauthorized("no session: sign in with POST /session")
    return found


def _bearer(header: str | None) -> str | None:
    if not header or header[:7].lower() != "bearer ":
        return None
    return header[7:].strip() or None
