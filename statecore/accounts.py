"""Reviewer accounts in Redis (``hitl admin reviewers``, docs/protocol.md § Reviewer accounts).

An account is a name, a role and the SHA-256 of its token: the token itself is shown once, when the
account is added, and never stored (tokens are 256 random bits, so one unsalted SHA-256 is enough
to make a leaked copy of Redis useless for signing in). One HASH (:data:`keys.REVIEWERS`) holds
``n:<name>`` -> token hash and ``t:<token hash>`` -> the account's JSON; a STREAM
(:data:`keys.REVIEWERS_LOG`) records each addition and removal, who made it and when. Both carry
one hash tag, and each change is one script (``lua/reviewer_add.lua``, ``lua/reviewer_remove.lua``),
so a name and its token come and go together, on a Redis Cluster too. The archive keeps a copy
(``archive.accounts``), written back by :func:`restore` when Redis comes back without the HASH.

Every API replica reads the same HASH: an account added or removed is in force on all of them as
soon as their short cache of looked-up tokens (``serve_app.routes.auth``) lets go of the old answer.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel

from . import durable, errors, keys
from .ids import now_iso

AccountRole = Literal["reviewer", "submitter", "admin"]
ACCOUNT_ROLES: tuple[str, ...] = ("reviewer", "submitter", "admin")
# Letters, digits and ``_ . @ + -`` (an e-mail address fits); no ``:`` or ``,`` (HITL_TOKENS' separators).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
LOG_MAX = 10_000  # account changes kept in the stream (approximately: MAXLEN ~)


class Account(BaseModel):
    """One account as ``GET /admin/reviewers`` lists it (no token, no hash)."""

    name: str
    role: AccountRole
    added_at: str
    added_by: str


class NameTaken(errors.Conflict):
    code = "NAME_TAKEN"


class AccountNotFound(errors.HitlError):
    code = "ACCOUNT_NOT_FOUND"
    status = 404


def token_hash(token: str | bytes) -> str:
    """What Redis keeps of a token: its SHA-256, hex."""
    raw = token.encode("utf-8", "surrogateescape") if isinstance(token, str) else token
    return hashlib.sha256(raw).hexdigest()


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe (43 characters), never starting with "-" (one in 64
    would: a command line reads ``--token -Xy…`` as another option, and argparse refuses it)."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise errors.InvalidRequest(
            "a reviewer's name is 1-64 letters, digits or _ . @ + - (starting with a letter or digit)", field="name"
        )
    return name


@cache
def _source(name: str) -> str:
    return (resources.files("hitl_review.statecore") / "lua" / f"{name}.lua").read_text()


def _script(store: Any, name: str) -> Any:
    """The script on the store's client, followed by its sync command under --durability strict."""
    return durable.synced(store, store.r.register_script(_source(name)))


def _account(raw: str | None) -> Account | None:
    if not raw:
        return None
    return Account.model_validate(json.loads(raw))


async def add(store: Any, name: str, role: str, by: str) -> tuple[Account, str]:
    """Add an account: (the account, its token, shown this once). 409 NAME_TAKEN when the name has one."""
    check_name(name)
    if role not in ACCOUNT_ROLES:
        raise errors.InvalidRequest(f"role must be one of {', '.join(ACCOUNT_ROLES)}", field="role")
    account = Account.model_validate({"name": name, "role": role, "added_at": now_iso(), "added_by": by})
    token = new_token()
    args = [name, token_hash(token), account.model_dump_json(), role, by, account.added_at, LOG_MAX]
    code = await _script(store, "reviewer_add")(keys=[keys.REVIEWERS, keys.REVIEWERS_LOG], args=args)
    if code == "NAME_TAKEN":
        raise NameTaken(f"an account named {name!r} exists: remove it first to give it a new token", name=name)
    if code != "OK":  # TOKEN_TAKEN: two equal 256-bit random tokens; never seen, refused all the same
        raise errors.StaleRead("the new token collided with an existing one; add the account again")
    return account, token


async def remove(store: Any, name: str, by: str) -> Account:
    """Remove the account named ``name`` (its token stops working); 404 ACCOUNT_NOT_FOUND without one."""
    check_name(name)
    args = [name, by, now_iso(), LOG_MAX]
    raw = await _script(store, "reviewer_remove")(keys=[keys.REVIEWERS, keys.REVIEWERS_LOG], args=args)
    found = _account(raw)
    if found is None:
        raise AccountNotFound(f"no reviewer account is named {name!r}", name=name)
    return found


async def restore(store: Any, kept: Iterable[Any]) -> int:
    """Write ``kept`` (``archive.accounts.KeptAccount``: name, role, token_hash, added_at, added_by) back
    to a Redis that lost every account; 0 and nothing written while Redis still has its accounts hash
    (``lua/reviewer_restore.lua``: an account removed since the archive was read stays removed)."""
    args: list[Any] = [now_iso(), LOG_MAX]
    for k in kept:
        account = Account.model_validate(
            {"name": k.name, "role": k.role, "added_at": k.added_at, "added_by": k.added_by}
        )
        args += [k.name, k.token_hash, account.model_dump_json(), k.role, k.added_by]
    if len(args) == 2:
        return 0
    return int(await _script(store, "reviewer_restore")(keys=[keys.REVIEWERS, keys.REVIEWERS_LOG], args=args))


async def lost(r: Any) -> bool:
    """Whether Redis has lost its accounts hash (emptied, or restored from nothing): one EXISTS."""
    return not await r.exists(keys.REVIEWERS)


async def list_all(r: Any) -> list[Account]:
    """Every account, by name."""
    fields = await r.hgetall(keys.REVIEWERS)
    found = [_account(v) for k, v in fields.items() if k.startswith("t:")]
    return sorted((a for a in found if a is not None), key=lambda a: a.name)


async def lookup(r: Any, hashed: str) -> Account | None:
    """The account whose token has the SHA-256 ``hashed``, if any (one HGET)."""
    return _account(await r.hget(keys.REVIEWERS, f"t:{hashed}"))


async def changes(r: Any, count: int = 100) -> list[dict[str, str]]:
    """The latest account changes, newest first: ``{id, action, name, role, by, at}``."""
    entries = await r.xrevrange(keys.REVIEWERS_LOG, count=count)
    return [{"id": entry_id, **fields} for entry_id, fields in entries]
