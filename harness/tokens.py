"""Tokens: the fixed identities the test control plane is started with, and the loopback admin
token a server writes to ``<data-dir>/api-token`` (read with the client's own rules)."""

from __future__ import annotations

import os
from pathlib import Path

from hitl_review.client.config import TOKEN_FILE, read_token_file, resolve_config

# name -> (role, token) of the control plane the API and client tests talk to.
IDENTITIES = {
    "admin": ("admin", "tok-admin"),
    "rev1": ("reviewer", "tok-rev1"),
    "rev2": ("reviewer", "tok-rev2"),
    "sub1": ("submitter", "tok-sub1"),
    "sub2": ("submitter", "tok-sub2"),
    "exec": ("executor", "tok-exec"),
}
TOKENS = {name: token for name, (_role, token) in IDENTITIES.items()}
# The same, as HITL_TOKENS spells it.
TOKENS_SPEC = ",".join(f"{name}:{role}:{token}" for name, (role, token) in IDENTITIES.items())


def auth(name: str) -> dict[str, str]:
    """The Authorization header of one of the test identities."""
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def token_file(data_dir: str | os.PathLike[str]) -> str:
    """The admin token a loopback server keeps in ``<data-dir>/api-token``."""
    path = Path(data_dir) / TOKEN_FILE
    token = read_token_file(path)
    if token is None:
        raise FileNotFoundError(f"no token in {path}: has the server started?")
    return token


def resolve_token(token: str | None = None, data_dir: str | os.PathLike[str] | None = None) -> str:
    """The token as the client resolves it: ``token``, else ``HITL_TOKEN``, else the token file of
    ``data_dir`` (``HITL_DATA_DIR``, ``.hitl``)."""
    cfg = resolve_config(token=token, data_dir=data_dir)
    if not cfg.token:
        raise SystemExit(f"no token: set HITL_TOKEN or start the server so that {cfg.data_dir / TOKEN_FILE} exists")
    return cfg.token
