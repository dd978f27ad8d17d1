"""Identity (docs/protocol.md § Identity): bearer tokens mapped to a name and a role."""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from redis import exceptions as redis_errors
from starlette.requests import cookie_parser

from hitl_review.statecore import accounts, durable, sessions
from hitl_review.statecore.errors import CsrfFailed, Forbidden, StoreUnavailable, Unauthorized
from hitl_review.statecore.trusted_proxy import TrustedProxies

log = logging.getLogger("hitl.auth")

Role = Literal["submitter", "reviewer", "admin", "executor", "monitor"]  # monitor: /metrics only
ROLES: tuple[str, ...] = ("submitter", "reviewer", "admin", "executor", "monitor")
TOKEN_FILE = "api-token"
# How long a replica believes what Redis said about an account's token (the account, or that there
# is none): an account removed is refused by every replica within this, an added one works at once.
ACCOUNT_CACHE_S = 2.0
ACCOUNT_CACHE_MAX = 10_000  # tokens remembered at most (then forgotten all at once)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # what a session cookie may do without its CSRF token


class Identity(BaseModel):
    name: str
    role: Role
    # The user a trusted authenticating proxy named for this request (docs/protocol.md § An
    # authenticating proxy), whether or not a token won over it: what the audit records beside the
    # name (§ Audit). Not part of the identity's answer (``GET /whoami``).
    proxy_user: str | None = Field(default=None, exclude=True)

    def can(self, *roles: str) -> bool:
        return self.role == "admin" or self.role in roles

    def audited(self) -> dict[str, str]:
        """What an action's audit entry records of the caller besides the name (docs/protocol.md § Audit)."""
        return {"role": self.role, "proxy_user": self.proxy_user or ""}


def parse_tokens(spec: str) -> dict[str, Identity]:
    """``name:role:token,…`` → {token: Identity}. Raises ValueError with the bad entry."""
    out: dict[str, Identity] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        parts = entry.split(":", 2)
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"HITL_TOKENS entry {entry!r} is not name:role:token")
        name, role, token = parts
        if role not in ROLES:
            raise ValueError(f"HITL_TOKENS entry for {name!r} has unknown role {role!r} (one of {', '.join(ROLES)})")
        out[token] = Identity.model_validate({"name": name, "role": role})
    return out


def local_token(data_dir: Path) -> str:
    """The loopback-only admin token in ``<data-dir>/api-token`` (mode 0600, kept across restarts)."""
    path = data_dir / TOKEN_FILE
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    token = accounts.new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


class Authenticator:
    def __init__(self, tokens: dict[str, Identity]) -> None:
        if not tokens:
            raise ValueError("no API tokens configured")
        self._tokens = tokens
        self._static_hashes = {accounts.token_hash(t): i for t, i in tokens.items()}  # a session's token, re-checked
        self._seen: dict[str, tuple[float, Identity | None]] = {}  # token hash -> (until, account's identity)
        # Set where an archive keeps the accounts (serve_app.routes.api): an unknown token first has the accounts a
        # Redis that came back empty lost written back (serve_app.recovery.recovery); how many were.
        self.restore_accounts: Callable[[], Awaitable[int]] | None = None
        self._proxies: tuple[tuple[tuple[str, ...], str], TrustedProxies] | None = None

    @classmethod
    def from_settings(cls, tokens_spec: str | None, data_dir: Path, loopback: bool) -> Authenticator:
        if tokens_spec:
            return cls(parse_tokens(tokens_spec))
        if not loopback:
            raise ValueError("HITL_TOKENS must be set when the API listens beyond loopback")
        return cls({local_token(data_dir): Identity(name="local", role="admin")})

    def identify(self, authorization: str | bytes | None) -> Identity:
        """The identity of an ``Authorization`` header, given as it came off the wire.

        Compared as bytes, so a token with non-ASCII or non-UTF-8 bytes is just an unknown
        token (401), never an error inside the comparison."""
        given = _bearer(authorization)
        if given is None:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        found = self._static(given)
        if found is None:
            raise Unauthorized("unknown token")
        return found

    def _static(self, given: bytes) -> Identity | None:
        found: Identity | None = None
        for token, ident in self._tokens.items():
            if hmac.compare_digest(token.encode(), given):  # every token compared: no timing hint
                found = ident
        return found

    def static_names(self) -> dict[str, str]:
        """The identities of ``HITL_TOKENS`` (or the local token): {name: role}."""
        return {i.name: i.role for i in self._tokens.values()}

    async def authenticate(self, scope: dict[str, Any], r: Any, settings: Any) -> Identity:
        """The identity of a request (its ASGI ``scope``): a ``HITL_TOKENS`` token, else a reviewer
        account's token (looked up in Redis ``r``, remembered ``ACCOUNT_CACHE_S``), else the user an
        authenticating proxy names, when the connection comes from one of ``settings.trusted_proxies``."""
        headers = scope.get("headers", [])
        given = _bearer(next((v for k, v in headers if k.lower() == b"authorization"), None))
        proxies = self._trusted(settings)
        peer = (scope.get("client") or (None,))[0]
        if given is not None:
            found = self._static(given)
            if found is None:
                found = await self._account(r, accounts.token_hash(given))
            if found is not None:
                try:  # the token wins; the user a trusted proxy names beside it is recorded all the same
                    named = proxies.user(peer, headers) if proxies else None
                except ValueError:
                    named = None
                return found.model_copy(update={"proxy_user": named}) if named else found
        cookie = _header(headers, b"cookie")
        sid = cookie_parser(cookie).get(sessions.COOKIE) if given is None and cookie else None
        if sid:  # a person signed in on the reviewer page (docs/protocol.md § Sessions)
            return await self._session(scope, r, sid)
        try:
            user = proxies.user(peer, headers) if proxies else None
        except ValueError as e:
            raise Unauthorized(str(e)) from None
        if user is not None:
            return Identity.model_validate({"name": user, "role": proxies.role, "proxy_user": user})
        if given is None:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        raise Unauthorized("unknown token")

    async def _session(self, scope: dict[str, Any], r: Any, sid: str) -> Identity:
        """The identity of a session cookie: the session live in Redis, the token it was made with still
        valid; a write also needs the session's CSRF token and no other origin."""
        try:
            found = await sessions.lookup(r, sid)
        except (redis_errors.RedisError, RuntimeError) as e:  # RuntimeError: durable.closed_transport
            raise _unavailable(e) from None
        if found is None:
            raise Unauthorized("the session has ended (expired, signed out, or its account removed): sign in again")
        ident = self._static_hashes.get(found.token_hash) or await self._account(r, found.token_hash)
        if ident is None:
            raise Unauthorized("the session's account was removed: sign in again")
        if scope.get("method", "GET") not in SAFE_METHODS:
            headers = scope.get("headers", [])
            origin, host = _header(headers, b"origin"), _header(headers, b"host")
            if not sessions.same_origin(origin, host, _header(headers, b"x-forwarded-host")):
                raise CsrfFailed(f"a write from another origin ({origin}) is not signed in by a session cookie")
            if not sessions.csrf_matches(found, _header(headers, sessions.CSRF_HEADER.lower().encode())):
                raise CsrfFailed(
                    f"a write signed in by a session cookie needs the session's CSRF token in {sessions.CSRF_HEADER} "
                    "(GET /api/v1/session answers it)"
                )
        return ident

    async def _account(self, r: Any, hashed: str) -> Identity | None:
        now = time.monotonic()
        seen = self._seen.get(hashed)
        if seen is not None and seen[0] > now:
            return seen[1]
        try:
            account = await accounts.lookup(r, hashed)
            if account is None and self.restore_accounts is not None and await self.restore_accounts():
                account = await accounts.lookup(r, hashed)
        except (redis_errors.RedisError, RuntimeError) as e:  # RuntimeError: durable.closed_transport
            raise _unavailable(e) from None
        ident = None if account is None else Identity(name=account.name, role=account.role)
        if len(self._seen) >= ACCOUNT_CACHE_MAX:
            self._seen.clear()
        self._seen[hashed] = (now + ACCOUNT_CACHE_S, ident)
        return ident

    def forget_accounts(self) -> None:
        """Drop what this replica remembers of accounts (after an account was removed here)."""
        self._seen.clear()

    def _trusted(self, settings: Any) -> TrustedProxies:
        """``settings``' trusted proxies, parsed once per configuration."""
        key = (tuple(getattr(settings, "trusted_proxies", ()) or ()), str(getattr(settings, "proxy_role", "reviewer")))
        if self._proxies is None or self._proxies[0] != key:
            self._proxies = (key, TrustedProxies(key[0], key[1]))
        return self._proxies[1]

    @staticmethod
    def require(ident: Identity, *roles: str) -> Identity:
        """``ident`` when its role is one of ``roles`` (or admin); no roles at all refuses everyone."""
        if not roles:
            raise Forbidden("no role may call this route")
        if not ident.can(*roles):
            raise Forbidden(f"role {ident.role!r} may not do this (needs {' or '.join(roles)})")
        return ident


def _unavailable(e: Exception) -> Exception:
    """Redis down: 503 STORE_UNAVAILABLE; anything else is a bug, raised as it is."""
    if not durable.store_unavailable(e):
        return e
    return StoreUnavailable(f"the state store (Redis) is unavailable: {type(e).__name__}: {e}")


def _header(headers: Any, name: bytes) -> str | None:
    """A request header's value (the first), as text; None without one."""
    raw = next((v for k, v in headers if k.lower() == name), None)
    return None if raw is None else raw.decode("latin-1")


def _bearer(authorization: str | bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer …`` header, as bytes; None without one."""
    raw = authorization.encode("utf-8", "surrogateescape") if isinstance(authorization, str) else authorization
    if not raw or raw[:7].lower() != b"bearer ":
        return None
    return raw[7:].strip() or None
