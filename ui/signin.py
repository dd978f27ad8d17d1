"""Signing in to the reviewer page (README § Reviewer accounts): a name and a token once per browser, or
the user an authenticating proxy names.

* The form takes a token (and, optionally, the reviewer's name, checked against the token's owner).
  The token goes to this server's sign-in route, which makes an API session and keeps its id in an
  ``HttpOnly`` cookie (``ui.cookie_signin``): the browser holds no token a script can read. A reload,
  or a later visit, signs in from the cookie without asking; "Sign out" ends the session. A session
  the API no longer accepts (expired, or the account was removed) shows the form again. The page's
  session acts on the API with the cookie and the session's CSRF token (``SESSION_HANDLE``), both
  kept in this process only.
* Behind an authenticating proxy (``--trusted-proxy``), a page whose connection comes from one of the
  proxy addresses and names a user (``X-Forwarded-User`` …) is signed in as that user, with no form;
  the app then passes the user on to the API in ``X-Forwarded-User``, so the API must trust the UI's
  own address as a proxy too. The session's "token" is then a handle, ``PROXY_HANDLE`` + the user:
  a per-process random prefix, so no token a person types can be taken for one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gradio as gr
import httpx

from hitl_review.client import ApiError, AsyncHitlClient, HitlClient
from hitl_review.client.config import tls_context
from hitl_review.statecore.trusted_proxy import TrustedProxies

from .cookie_signin import REVIEW_ROLES, SESSION, said, session_headers, session_id, unfit
from .session import ReviewerState

if TYPE_CHECKING:
    from .layout import Components

Update = dict[Any, Any]

PROXY_HANDLE = f"proxied:{secrets.token_hex(16)}:"
SESSION_HANDLE = f"session:{secrets.token_hex(16)}:"  # + the session's id, ":", its CSRF token
NO_COOKIE = (
    "Signed in, but this browser did not keep the session cookie: it is Secure off loopback, so open this "
    "page over HTTPS (or at localhost)."
)


def proxied_user(token: str | None) -> str | None:
    """The proxy's user a session handle stands for; None for a plain token."""
    if token and token.startswith(PROXY_HANDLE):
        return token[len(PROXY_HANDLE) :]
    return None


def _options(token: str | None) -> tuple[str | None, dict[str, str] | None]:
    user = proxied_user(token)
    if user is not None:
        return None, {"X-Forwarded-User": user}
    if token and token.startswith(SESSION_HANDLE):
        sid, _, csrf = token[len(SESSION_HANDLE) :].partition(":")
        return None, session_headers(sid, csrf)
    return token, None


def make_client(api_url: str, token: str | None) -> HitlClient:
    """A client acting for the session: with its token, or as the proxy's user."""
    tok, headers = _options(token)
    return HitlClient(api_url, tok, headers=headers)


def make_async_client(api_url: str, token: str | None) -> AsyncHitlClient:
    tok, headers = _options(token)
    return AsyncHitlClient(api_url, tok, headers=headers)


def refusal(exc: Exception, proxied: bool = False) -> str:
    """Why a sign-in failed, in words."""
    if isinstance(exc, ApiError) and exc.status_code == 401:
        if proxied:
            return "The API did not accept the proxy's user: start it with this UI's address in --trusted-proxy."
        return "The control plane did not accept this token (401): it is mistyped, or its account was removed."
    if isinstance(exc, ApiError):
        return f"{exc.message} ({exc.code})"
    return f"Could not reach the control plane: {exc}"


class SignInHandlers:
    """Sign-in, a kept sign-in, and the proxy's user; ``Callbacks`` provides the rest."""

    c: Components
    api_url: str
    proxies: TrustedProxies = TrustedProxies()

    queue_update: Callable[[ReviewerState], Update]  # ui.callbacks.Callbacks'
    open_job: Callable[[ReviewerState, str | None], Update]
    release_claim: Callable[..., None]  # ui.claims.ClaimHandlers'

    def _check(self, token: str, name: str = "", proxied: bool = False) -> dict[str, Any]:
        """Who ``token`` signs in as; ValueError saying why it cannot sign in to review."""
        try:
            with make_client(self.api_url, token) as probe:
                who = probe.whoami()
        except Exception as exc:
            raise ValueError(refusal(exc, proxied)) from None
        if name and name != who["name"]:
            raise ValueError(f"This token is not {name}'s. Check both, or leave the name empty.")
        if who["role"] not in REVIEW_ROLES:
            raise ValueError(f"This token is a {who['role']}'s; reviewing needs a reviewer or admin token.")
        return who

    def _signed_in(self, st: ReviewerState, token: str, who: dict[str, Any], *, can_sign_out: bool) -> Update:
        """Mark the session signed in; the page's parts to show (the queue is filled by the caller)."""
        with st.lock:
            st.token, st.signed_in, st.reviewer = token, True, who["name"]
        c = self.c
        return {
            **c.login_col.update(False),
            **c.main_row.update(True),  # hidden until now (ui.shown)
            c.login_msg: "",
            c.login_token: "",
            **c.account_row.update(True),
            c.who_md: f"Signed in as **{who['name']}** ({who['role']})",
            c.signout_btn: gr.update(visible=can_sign_out),
        }

    def _session(self, sid: str) -> tuple[str, dict[str, Any]]:
        """The session a cookie names: (its handle, who it is); ValueError saying why it cannot review."""
        try:
            with httpx.Client(base_url=self.api_url, timeout=30, verify=tls_context()) as api:
                r = api.get(SESSION, headers=session_headers(sid))
        except httpx.HTTPError as e:
            raise ValueError(f"Could not reach the control plane: {e}") from None
        if r.status_code == 401:
            raise ValueError("Your sign-in has ended (401: it expired, or your account was removed): sign in again.")
        if r.status_code != 200:
            raise ValueError(said(r))
        who = r.json()
        problem = unfit(who, "")
        if problem:
            raise ValueError(problem)
        return f"{SESSION_HANDLE}{sid}:{who['csrf_token']}", who

    def on_login(self, st: ReviewerState, said_now: str, request: gr.Request) -> Update:
        """After the form's sign-in (``ui.cookie_signin.SIGN_IN_JS``, which said ``said_now`` when it failed):
        sign in from the cookie it set, and open the job the address asked for."""
        if said_now:
            return {self.c.login_msg: gr.skip()}  # the form says why already
        sid = session_id(request.headers if request is not None else None)
        if sid is None:  # signed in, but the browser did not keep the cookie: a Secure one over plain HTTP
            return {self.c.login_msg: NO_COOKIE}
        try:
            handle, who = self._session(sid)
        except ValueError as e:
            return {self.c.login_msg: str(e)}
        with st.lock:
            pending, st.job_id = st.job_id, None
        out = self._signed_in(st, handle, who, can_sign_out=True)
        out.update(self.queue_update(st))
        if pending:
            # Drawn in this one step, as N draws: the main row and the canvas' column are mounted from the
            # start, hidden by their style element (ui.shown). Drawn by ``after_open`` after an emptied canvas, the
            # canvas sometimes stayed empty (1 sign-in at ``?job=`` in ~4 runs of tests/test_notes_browser.py).
            out.update(self.open_job(st, pending))
        return out

    def on_restore(self, st: ReviewerState, request: gr.Request) -> Update:
        """On page load, before ``on_load``: the proxy's user, or the session this browser's cookie names."""
        if st.signed_in:
            return {self.c.login_msg: gr.skip()}  # a dict must name a component: {} fails the page load
        peer = request.client.host if request is not None and request.client is not None else None
        try:
            user = self.proxies.user(peer, request.headers.items()) if request is not None else None
        except ValueError as e:
            return {self.c.login_msg: f"The proxy's sign-in is unusable: {e}"}
        if user is not None:
            handle = PROXY_HANDLE + user
            try:
                who = self._check(handle, user, proxied=True)
            except ValueError as e:
                return {self.c.login_msg: str(e)}
            return self._signed_in(st, handle, who, can_sign_out=False)
        sid = session_id(request.headers if request is not None else None)
        if not sid:
            return {self.c.login_msg: gr.skip()}
        try:
            handle, who = self._session(sid)
        except ValueError as e:
            return {self.c.login_msg: str(e)}
        return self._signed_in(st, handle, who, can_sign_out=True)

    def on_sign_out(self, st: ReviewerState) -> None:
        """Before the session ends (``ui.cookie_signin.SIGN_OUT_JS``): release this page's claim while the
        session can still do it (leaving the page afterwards could not)."""
        self.release_claim(st)

    def restore_outputs(self) -> list[Any]:
        """What ``on_restore`` and ``on_login`` may change (``on_login`` the queue and the panel as well)."""
        c = self.c
        parts = [c.login_col.style, c.main_row.style, c.login_msg, c.login_token, c.login_name, c.account_row.style]
        parts.append(c.who_md)
        return [*parts, c.signout_btn]
