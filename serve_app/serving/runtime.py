"""Builds the control plane's ``Runtime`` for the two ways it is served.

- ``local_runtime``: everything in one process (plain uvicorn): the dispatcher
  runs the models in threads, SSE comes from this process's EventHub. Used by
  the protocol tests and as the baseline of the Ray Serve benchmark.
- ``serve_app.application`` builds the Ray Serve variant from the same parts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from hitl_review.statecore.artifacts import ArtifactStore

from ..ops.config import Settings
from ..recovery import durability
from ..routes.api import Runtime, create_app
from ..routes.auth import Authenticator
from ..routes.events import EventHub, sse_lines
from ..work.archive_loop import archive_loop
from ..work.archiving import open_archive
from ..work.dispatcher import Dispatcher, LocalRunner, NodeRunner
from ..work.inspector import Confirm
from ..work.webhook_delivery import start_webhooks
from .stores import store_for

log = logging.getLogger("hitl.runtime")


def make_dispatcher(
    settings: Settings,
    store: Any,
    runner: NodeRunner,
    confirm: Confirm | None = None,
    **process: Any,
) -> Dispatcher:
    """A dispatcher as the deployment's settings make it: every dispatcher is built here (the API
    replicas', plain uvicorn's, a standalone one's). ``process``: what is this process's own
    (``consumer``, ``reclaim_every_s``)."""
    return Dispatcher(
        store,
        runner,
        concurrency=settings.dispatcher_concurrency,
        reclaim_idle_ms=settings.reclaim_idle_ms,
        redis_url=settings.redis_url,
        heartbeat_s=settings.heartbeat_s,
        heartbeat_lapse_s=settings.heartbeat_lapse_s,
        inspect_every_s=settings.inspector_period_s,
        data_dir=settings.data_dir,  # its spool/ keeps results Redis could not take yet
        max_deliveries=settings.max_deliveries,
        confirm=confirm,
        **process,
    )


def local_models(settings: Settings) -> Any:
    from hitl_review.deployments.executor import build_models

    return build_models(settings.backend_config())


async def local_runtime(
    settings: Settings, *, dispatchers: int = 1, models: Any = None, runner: NodeRunner | None = None
) -> Runtime:
    assert settings.redis_url, "local runtime needs a redis_url"
    store = store_for(settings, settings.redis_url)
    # The dispatchers block in XREADGROUP for up to 1 s: their store's timeout allows for it.
    background_store = store_for(settings, settings.redis_url, blocking_s=2.0)
    archive = await open_archive(settings)
    how = await durability.configure(store, settings.durability, settings.store_timeout_s, archive)
    log.info("durability %s", how)
    await durability.configure(background_store, settings.durability, settings.store_timeout_s, archive)
    await store.ensure_groups()
    artifacts = ArtifactStore(settings.artifacts)
    auth = Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback)
    hub = EventHub(store)

    def events(job_id: str, after: int) -> AsyncIterator[str]:
        return sse_lines(hub.batches(job_id, after))

    if runner is None:
        models = models if models is not None else await asyncio.to_thread(local_models, settings)
        runner = LocalRunner(models, artifacts)

    async def readiness() -> dict[str, Any]:
        return {"models_ready": True, "mode": "uvicorn", "backends": settings.backends()}

    async def model_stats() -> dict[str, Any]:
        return {"local": models.describe()} if models is not None and hasattr(models, "describe") else {}

    rt = Runtime(
        settings=settings,
        store=store,
        artifacts=artifacts,
        auth=auth,
        events=events,
        readiness=readiness,
        model_stats=model_stats,
        preview=getattr(runner, "preview", None),  # a runner without models (a test's) has none
        closing=[background_store],
        archive=archive,
    )
    for _ in range(dispatchers):
        d = make_dispatcher(settings, background_store, runner)
        rt.background.append(asyncio.create_task(d.run_forever()))
    # The archiver's own loop in this process, the one process of plain uvicorn (Ray Serve: the
    # Archiver deployment); without an archive it only starts the retention of copies queued earlier.
    rt.background.append(asyncio.create_task(archive_loop(settings, background_store, rt.archive).run_forever()))
    hooks = start_webhooks(settings, background_store)  # the webhooks' deliverer beside it (when any)
    if hooks is not None:
        rt.background.append(hooks)
    return rt


def local_app(settings: Settings, **kw: Any) -> FastAPI:
    async def build() -> Runtime:
        return await local_runtime(settings, **kw)

    return create_app(build)
