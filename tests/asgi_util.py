"""The control plane's FastAPI app in this process over ASGI (no uvicorn, no Ray, no models), on the
test's redis-server, with the identities of ``harness.tokens``: fast protocol tests of routes whose
jobs the test drives through the store (tests.helpers) instead of through the models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from harness.tokens import TOKENS_SPEC
from hitl_review.archive.db import Archive
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.routes.api import Runtime, create_app
from hitl_review.serve_app.routes.auth import Authenticator
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.store import Store, StoreConfig

BASE_URL = "http://asgi"


async def _no_events(_job_id: str, _after: int) -> AsyncIterator[str]:
    if False:  # an async generator that yields nothing: these tests read events from the store
        yield ""


async def _ready() -> dict[str, Any]:
    return {"models_ready": True}


@asynccontextmanager
async def asgi_client(
    url: str, data_dir: Path, config: StoreConfig | None = None, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the app; the app's store is its own, on ``url``, configured by ``config``;
    ``settings``: more of the app's Settings (``trusted_proxies``: the client's address is 127.0.0.1)."""
    async with asgi_transport(url, data_dir, config, **settings) as transport:
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=30) as client:
            yield client


@asynccontextmanager
async def asgi_transport(
    url: str,
    data_dir: Path,
    config: StoreConfig | None = None,
    *,
    store: Store | None = None,
    archive: Archive | None = None,
    **more: Any,
) -> AsyncIterator[httpx.ASGITransport]:
    """The app, started (its lifespan entered), as an httpx transport: for the project's own client.
    ``store``: the test's own (it drives reports through it), else one on ``url`` configured by
    ``config``; ``archive``: the app's archive (its read-through recovery and archived answers)."""
    settings = Settings(data_dir=data_dir, tokens=TOKENS_SPEC, redis_url=url, **more)

    async def build() -> Runtime:
        return Runtime(
            settings=settings,
            store=store or Store.from_url(url, config or StoreConfig(retention_s=3600, node_timeout_s=60)),
            artifacts=ArtifactStore(settings.artifacts),
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=_no_events,
            readiness=_ready,
            archive=archive,
        )

    app = create_app(build)
    async with app.router.lifespan_context(app):
        yield httpx.ASGITransport(app=app)
