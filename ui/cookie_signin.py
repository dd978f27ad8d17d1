"""The sign-in a browser keeps (ui.signin): an ``HttpOnly`` session cookie, never a token a script can read.

The form's token goes once, by ``fetch``, to this server's ``POST /hitl-signin``, which asks the API for a
session (``POST /api/v1/session``, docs/protocol.md § Sessions) and sets its id in a cookie on the page's
origin: ``HttpOnly``, ``SameSite=Strict``, ``Secure`` unless the page is on loopback. Nothing of it is
in ``localStorage``, ``sessionStorage`` or ``document.cookie``. The page's handlers run here, so the
cookie is read here (``ui.signin``: on load and after the form) and the session's CSRF token, which the
API's writes need, is learnt here from ``GET /api/v1/session`` and kept in this process's memory only.
``POST /hitl-signout`` ends the session on the API and drops the cookie. Any cross-origin write to this
server (a Gradio event, a sign-in) is refused (:class:`OriginCheck`); ``SameSite=Strict`` already keeps
another site's requests from carrying the cookie. Every UI replica reads the same sessions through the API.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.requests import Request, cookie_parser
from starlette.responses import JSONResponse
from starlette.routing import Route

from hitl_review.client.config import tls_context
from hitl_review.statecore import sessions

SIGN_IN_PATH = "/hitl-signin"
SIGN_OUT_PATH = "/hitl-signout"
REVIEW_ROLES = ("reviewer", "admin")
SESSION = "/api/v1/session"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

# The form: the token goes to this server's sign-in route only (never into a Gradio event, nor the browser's
# storage); the answer's message goes to the form, the token field is emptied. ``ui.signin.on_login`` follows.
_HERE = "window.location.href.split(/[?#]/)[0].replace(/\\/?$/, '/')"
SIGN_IN_JS = f"""async (name, token) => {{
  try {{
    const r = await fetch(new URL({SIGN_IN_PATH[1:]!r}, {_HERE}), {{
      method: "POST", credentials: "same-origin", headers: {{"Content-Type": "application/json"}},
      body: JSON.stringify({{name: name || "", token: token || ""}}),
    }});
    const said = await r.json().catch(() => ({{}}));
    return [r.ok ? "" : (said.message || `Sign-in failed (${{r.status}}).`), r.ok ? "" : token];
  }} catch (e) {{
    return [`Could not reach the reviewer page's server: ${{e}}`, token];
  }}
}}"""
# Sign out: end the session and open the page afresh (without ?job=); leaving the page releases this
# session's claim (demo.unload).
SIGN_OUT_JS = f"""async () => {{
  try {{ await fetch(new URL({SIGN_OUT_PATH[1:]!r}, {_HERE}), {{method: "POST", credentials: "same-origin"}}); }}
  finally {{ window.location.href = window.location.pathname; }}
}}"""


def session_id(headers: Any) -> str | None:
    """The session cookie of a request's headers (a mapping, or Gradio's request headers)."""
    raw = headers.get("cookie") if headers is not None else None
    return cookie_parser(raw).get(sessions.COOKIE) or None if raw else None


def session_headers(sid: str, csrf: str | None = None) -> dict[str, str]:
    """What a request to the API carries to act for session ``sid`` (a write: with its CSRF token)."""
    out = {"Cookie": f"{sessions.COOKIE}={sid}"}
    if csrf:
        out[sessions.CSRF_HEADER] = csrf
    return out


def said(r: httpx.Response) -> str:
    """What an API refusal says, in the form's words."""
    if r.status_code == 401:
        return "The control plane did not accept this token (401): it is mistyped, or its account was removed."
    try:
        body = r.json()
        return f"{body['message']} ({body['code']})"
    except (ValueError, KeyError, TypeError):
        return f"The control plane answered {r.status_code}."


def _set_cookie_value(r: httpx.Response) -> str | None:
    for line in r.headers.get_list("set-cookie"):
        name, _, rest = line.partition("=")
        if name.strip() == sessions.COOKIE:
            return rest.split(";", 1)[0].strip() or None
    return None


def _seconds_until(iso: str) -> float:
    try:
        return (datetime.fromisoformat(iso.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()
    except ValueError:
        return float(sessions.TTL_S)


def routes(api_url: str) -> list[Route]:
    """The sign-in and sign-out routes of the page's server (Gradio's app takes them in ``app_kwargs``)."""

    async def sign_in(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body() or b"{}")
            name, token = str(body.get("name") or "").strip(), str(body.get("token") or "").strip()
        except (ValueError, AttributeError):
            return JSONResponse({"message": "The sign-in was not JSON."}, status_code=400)
        if not token:
            return JSONResponse({"message": "Paste your API token."}, status_code=400)
        try:
            async with httpx.AsyncClient(base_url=api_url, timeout=30, verify=tls_context()) as api:
                r = await api.post(SESSION, headers={"Authorization": f"Bearer {token}"})
                sid = _set_cookie_value(r)
                if r.status_code != 201 or sid is None:
                    return JSONResponse({"message": said(r)}, status_code=401 if r.status_code == 401 else 400)
                who = r.json()
                problem = unfit(who, name)
                if problem:  # the session is not kept: nobody would use it
                    await api.delete(SESSION, headers=session_headers(sid, who["csrf_token"]))
                    return JSONResponse({"message": problem}, status_code=403)
        except httpx.HTTPError as e:
            return JSONResponse({"message": f"Could not reach the control plane: {e}"}, status_code=502)
        out = JSONResponse({"name": who["name"], "role": who["role"]})
        attributes = sessions.cookie_attributes(request.headers.get("host"), _seconds_until(who["expires_at"]))
        out.set_cookie(sessions.COOKIE, sid, **attributes)
        return out

    async def sign_out(request: Request) -> JSONResponse:
        sid = session_id(request.headers)
        ended = False
        if sid:
            try:
                async with httpx.AsyncClient(base_url=api_url, timeout=30, verify=tls_context()) as api:
                    r = await api.get(SESSION, headers=session_headers(sid))
                    if r.status_code == 200:
                        gone = await api.delete(SESSION, headers=session_headers(sid, r.json()["csrf_token"]))
                        ended = gone.status_code == 200
            except httpx.HTTPError:
                pass  # the cookie goes all the same; the session ends at its expiry
        out = JSONResponse({"ended": ended})
        attributes = sessions.cookie_attributes(request.headers.get("host"), 0)
        out.delete_cookie(sessions.COOKIE, **{k: v for k, v in attributes.items() if k != "max_age"})
        return out

    return [Route(SIGN_IN_PATH, sign_in, methods=["POST"]), Route(SIGN_OUT_PATH, sign_out, methods=["POST"])]


def unfit(who: dict[str, Any], name: str) -> str | None:
    """Why a session of ``who`` may not sign in to review as ``name`` (empty: any name); None when it may."""
    if name and name != who["name"]:
        return f"This token is not {name}'s. Check both, or leave the name empty."
    if who["role"] not in REVIEW_ROLES:
        return f"This token is a {who['role']}'s; reviewing needs a reviewer or admin token."
    return None


class OriginCheck:
    """Pure ASGI, around the page's whole server: a write (any method but GET, HEAD, OPTIONS) whose
    ``Origin`` is another site's is refused, 403 ``CSRF_FAILED`` (a browser sends ``Origin`` with every
    cross-origin write; programs and same-origin pages pass)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method", "GET") not in _SAFE:
            headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if not sessions.same_origin(headers.get(b"origin"), headers.get(b"host"), headers.get(b"x-forwarded-host")):
                body = {"code": "CSRF_FAILED", "message": "a write from another origin is refused"}
                await JSONResponse(body, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)
