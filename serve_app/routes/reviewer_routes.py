"""Reviewer accounts over the API (admin; ``hitl admin reviewers``, docs/protocol.md § Reviewer accounts):
``GET /admin/reviewers`` lists them, ``POST /admin/reviewers`` adds one and answers its token (this once),
``DELETE /admin/reviewers/{name}`` removes one. Accounts live in Redis (``statecore.accounts``), so every
API replica honours a change without a restart; each change is logged here and recorded in Redis's
stream of account changes, with the admin who made it."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from pydantic import BaseModel

from hitl_review.archive import accounts as kept_accounts
from hitl_review.archive.accounts import KeptAccount
from hitl_review.statecore import accounts, errors, sessions

from .session_routes import SESSION_ROLES, add_session_routes

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive
    from hitl_review.statecore.store import Store

    from .auth import Authenticator

log = logging.getLogger("hitl.api")

API = "/api/v1"
# serve_app.routes.api.ROUTE_ROLES: only an admin manages accounts.
REVIEWER_ROLES: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    ("GET", re.compile(rf"^{API}/admin/reviewers/?$"), ("admin",)),
    ("POST", re.compile(rf"^{API}/admin/reviewers/?$"), ("admin",)),
    ("DELETE", re.compile(rf"^{API}/admin/reviewers/[^/]+/?$"), ("admin",)),
    *SESSION_ROLES,  # the page's sign-in sessions (serve_app.routes.session_routes)
]


class NewReviewer(BaseModel):
    name: str
    role: accounts.AccountRole = "reviewer"


class AddedReviewer(accounts.Account):
    token: str  # shown this once: Redis keeps only its SHA-256


class StaticIdentity(BaseModel):
    name: str
    role: str


class ReviewerList(BaseModel):
    accounts: list[accounts.Account]  # added with hitl admin reviewers add, by name
    static: list[StaticIdentity]  # HITL_TOKENS (or the local token): changed only by a restart


class RemovedReviewer(BaseModel):
    removed: accounts.Account


def add_reviewer_routes(
    app: FastAPI,
    store_of: Callable[[], Store],
    auth_of: Callable[[], Authenticator],
    archive_of: Callable[[], Archive | None],
    who: Callable[[Request], str],
) -> None:
    @app.get(f"{API}/admin/reviewers", response_model=ReviewerList)
    async def list_reviewers() -> ReviewerList:
        """The reviewer accounts, and the identities ``HITL_TOKENS`` configures."""
        static = [StaticIdentity(name=n, role=r) for n, r in sorted(auth_of().static_names().items())]
        return ReviewerList(accounts=await accounts.list_all(store_of().r), static=static)

    @app.post(f"{API}/admin/reviewers", status_code=201, response_model=AddedReviewer, responses={400: {}, 409: {}})
    async def add_reviewer(request: Request, body: NewReviewer) -> AddedReviewer:
        """Add an account; the answer holds its token, which is not kept anywhere else: pass it on now."""
        accounts.check_name(body.name)
        if body.name in auth_of().static_names():
            raise accounts.NameTaken(f"{body.name!r} is configured in HITL_TOKENS; choose another name", name=body.name)
        by = who(request)
        account, token = await accounts.add(store_of(), body.name, body.role, by)
        archive = archive_of()
        if archive is not None:  # the copy a Redis that came back empty gets it from (serve_app.recovery.recovery)
            kept = KeptAccount(account.name, account.role, accounts.token_hash(token), account.added_at, by)
            try:
                await asyncio.to_thread(kept_accounts.save, archive, kept)
            except Exception as e:
                await accounts.remove(store_of(), account.name, by)  # not half-added: Redis alone would lose it
                log.error("reviewer account %s not added: the archive could not keep it: %s", account.name, e)
                raise errors.StoreUnavailable(
                    f"the account was not added: the archive could not keep it ({type(e).__name__}); add it again"
                ) from e
        log.warning("reviewer account %s (%s) added by %s", account.name, account.role, by)
        return AddedReviewer(**account.model_dump(), token=token)

    @app.delete(f"{API}/admin/reviewers/{{name}}", response_model=RemovedReviewer, responses={400: {}, 404: {}})
    async def remove_reviewer(request: Request, name: str) -> RemovedReviewer:
        """Remove an account: its token is refused by every replica within a few seconds."""
        if name in auth_of().static_names():
            raise errors.InvalidRequest(
                f"{name!r} is configured in HITL_TOKENS, not an account: remove it there (and restart)", field="name"
            )
        by = who(request)
        archive = archive_of()
        if archive is not None:  # first, so that a restore never brings a removed account back
            try:
                await asyncio.to_thread(kept_accounts.forget, archive, accounts.check_name(name))
            except errors.HitlError:
                raise
            except Exception as e:
                raise errors.StoreUnavailable(
                    f"the account was not removed: the archive could not forget it ({type(e).__name__}); "
                    "remove it again"
                ) from e
        removed = await accounts.remove(store_of(), name, by)
        auth_of().forget_accounts()  # at once on this replica; the others within ACCOUNT_CACHE_S
        ended = await sessions.end_all(store_of().r, removed.name)  # its signed-in pages, on every replica at once
        log.warning("reviewer account %s (%s) removed by %s", removed.name, removed.role, by)
        log.info("%d session(s) of %s ended", ended, removed.name)
        return RemovedReviewer(removed=removed)

    add_session_routes(app, store_of, lambda r: r.state.identity, lambda: sessions.TTL_S)
