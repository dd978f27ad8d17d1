"""Identity (docs/protocol.md § Identity): bearer tokens mapped to a name and a role."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from hitl_review.statecore.errors import Forbidden, Unauthorized

log = logging.getLogger("hitl.auth")

Role = Literal["submitter", "reviewer", "admin", "executor"]
ROLES: tuple[str, ...] = ("submitter", "reviewer", "admin", "executor")
TOKEN_FILE = "api-token"


class Identity(BaseModel):
    name: str
    role: Role

    def can(self, *roles: str) -> bool:
        return self.role == "admin" or self.role in roles


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
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


class Authenticator:
    def __init__(self, tokens: dict[str, Identity]) -> None:
        if not tokens:
            raise ValueError("no API tokens configured")
        self._tokens = tokens

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
        raw = authorization.encode("utf-8", "surrogateescape") if isinstance(authorization, str) else authorization
        if not raw or raw[:7].lower() != b"bearer ":
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        given = raw[7:].strip()
        found: Identity | None = None
        for token, ident in self._tokens.items():
            if hmac.compare_digest(token.encode(), given):  # every token compared: no timing hint
                found = ident
        if found is None:
            raise Unauthorized("unknown token")
        return found

    @staticmethod
    def require(ident: Identity, *roles: str) -> Identity:
        """``ident`` when its role is one of ``roles`` (or admin); no roles at all refuses everyone."""
        if not roles:
            raise Forbidden("no role may call this route")
        if not ident.can(*roles):
            raise Forbidden(f"role {ident.role!r} may not do this (needs {' or '.join(roles)})")
        return ident
