"""The Ray Serve application: API ingress, SSE deployment, model deployments.

- ``Api`` (ingress): the FastAPI app of ``serve_app.api``; each replica also runs
  one outbox dispatcher, so two API replicas are two dispatchers on one
  consumer group. Its ``max_ongoing_requests`` is high and it is not autoscaled
  on requests: held SSE passthroughs must neither starve it nor scale it.
- ``Events``: serves every open SSE stream from one EventHub per replica
  (one blocking XREAD per partition, not one per stream); sized for thousands.
- ``Detector`` / ``BoxValidator`` / ``Segmenter``: ``deployments.serve``,
  autoscaled, on GPUs when present.

The ingress builds its FastAPI app on the replica (``__serve_build_asgi_app__``)
so the app's lifespan can use the replica's own handles.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve

from statecore.artifacts import ArtifactStore
from statecore.heartbeat import HeartbeatSpec
from statecore.models import NodeCommand

from . import durability
from .api import Runtime, create_app, store_for
from .auth import Authenticator
from .config import Settings
from .events import EventHub, sse_lines
from .runtime import make_dispatcher

log = logging.getLogger("hitl.application")

APP_NAME = "hitl"
NODE_DEPLOYMENT = {
    "DETECT_SUBJECTS": "Detector",
    "VALIDATE_MANUAL_BOX_LIST": "BoxValidator",
    "PROCESS_APPROVED_BOX_LIST": "Segmenter",
}


async def confirm_replica(store: Any, job_id: str, node_instance_id: str, timeout_s: float = 3.0) -> bool:
    """Status confirmation before a re-dispatch: the replica that recorded itself as running the
    job's node (it drops the record when the call ends) is asked, with its own short timeout,
    whether it is alive. A stopped or dead replica does not answer (re-dispatch); a busy one does
    (its heartbeats were only late: wait)."""
    name = await store.executor_of(job_id)
    if not name:
        return False
    try:
        actor = await asyncio.to_thread(ray.get_actor, name, namespace="serve")
        await asyncio.wait_for(actor.check_health.remote(), timeout=timeout_s)
    except Exception as e:  # gone, stopped, or not a replica: not confirmed
        log.info("replica %s did not confirm node %s of job %s: %s", name, node_instance_id, job_id, type(e).__name__)
        return False
    return True


class ServeRunner:
    """Sends a node command to its model deployment through a DeploymentHandle."""

    def __init__(self, handles: dict[str, Any]) -> None:
        self.handles = handles

    async def run(self, cmd: NodeCommand, heartbeat: HeartbeatSpec | None = None) -> dict[str, Any]:
        from statecore.errors import NodeExecutionError

        name = NODE_DEPLOYMENT.get(cmd.node_type)
        if name is None:
            raise NodeExecutionError(
                f"unsupported workflow node type: {cmd.node_type}", code="UNSUPPORTED_NODE_TYPE", retryable=False
            )
        beat = heartbeat.model_dump() if heartbeat is not None else None
        return await self.handles[name].run.remote(cmd.node_type, cmd.input, beat)

    async def describe(self) -> dict[str, Any]:
        return {name: await h.describe.remote() for name, h in self.handles.items()}


@serve.deployment(name="Api", max_ongoing_requests=4096, graceful_shutdown_timeout_s=5)
@serve.ingress()
class Api:
    """Ingress: the HTTP API, plus this replica's outbox dispatcher."""

    def __init__(self, settings_json: str, events: Any, detector: Any, validator: Any, segmenter: Any) -> None:
        self.settings = Settings.model_validate_json(settings_json)
        self.events_handle = events
        self.runner = ServeRunner({"Detector": detector, "BoxValidator": validator, "Segmenter": segmenter})

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self._runtime)

    async def _runtime(self) -> Runtime:
        settings = self.settings
        assert settings.redis_url
        store = store_for(settings, settings.redis_url)
        # The dispatcher blocks in XREADGROUP for up to 1 s: its store's timeout allows for it.
        background_store = store_for(settings, settings.redis_url, blocking_s=2.0)
        log.info("durability %s", await durability.configure(store, settings.durability, settings.store_timeout_s))
        await durability.configure(background_store, settings.durability, settings.store_timeout_s)
        await store.ensure_groups()
        events_handle = self.events_handle

        async def events(job_id: str, after: int) -> AsyncIterator[str]:
            gen = events_handle.options(stream=True).stream.remote(job_id, after)
            try:
                async for chunk in gen:
                    yield chunk
            finally:
                gen.cancel()

        async def readiness() -> dict[str, Any]:
            return {
                "models_ready": True,
                "mode": "ray-serve",
                "backends": settings.backends(),
                "deployments": await self.runner.describe(),
            }

        rt = Runtime(
            settings=settings,
            store=store,
            artifacts=ArtifactStore(settings.artifacts),
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=events,
            readiness=readiness,
            model_stats=self.runner.describe,
            closing=[background_store],
        )
        confirm = functools.partial(confirm_replica, background_store)
        rt.background.append(
            asyncio.create_task(make_dispatcher(settings, background_store, self.runner, confirm).run_forever())
        )
        return rt


@serve.deployment(name="Events", max_ongoing_requests=20000, graceful_shutdown_timeout_s=5)
class Events:
    """Every open SSE stream of this replica shares one EventHub."""

    def __init__(self, settings_json: str) -> None:
        settings = Settings.model_validate_json(settings_json)
        assert settings.redis_url
        self.hub = EventHub(store_for(settings, settings.redis_url))

    async def stream(self, job_id: str, after: int) -> AsyncIterator[str]:
        async for line in sse_lines(self.hub.stream(job_id, after)):
            yield line


def build_application(settings: Settings) -> Any:
    """The whole application, bound; run it with ``serve.run(app, name=APP_NAME, route_prefix="/")``."""
    from deployments.serve import build_model_deployments

    cfg = settings.model_dump_json()
    models = build_model_deployments(settings.backend_config())
    events_d: Any = Events  # a serve Deployment at run time; mypy sees the undecorated class
    api_d: Any = Api
    events = events_d.options(num_replicas=settings.events_replicas, ray_actor_options={"num_cpus": 0}).bind(cfg)
    return api_d.options(num_replicas=settings.api_replicas, ray_actor_options={"num_cpus": 0}).bind(
        cfg, events, models["Detector"], models["BoxValidator"], models["Segmenter"]
    )
