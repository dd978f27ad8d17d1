"""The Ray Serve application: API ingress, SSE deployment, model deployments.

- ``Api`` (ingress): the FastAPI app of ``serve_app.routes.api``; each replica also runs
  one outbox dispatcher, so two API replicas are two dispatchers on one
  consumer group. Its ``max_ongoing_requests`` is high and it is not autoscaled
  on requests: held SSE passthroughs must neither starve it nor scale it.
- ``Events``: serves every open SSE stream from one EventHub per replica
  (one blocking XREAD per partition, not one per stream); sized for thousands.
- ``Detector`` / ``BoxValidator`` / ``Segmenter``: ``deployments.serve``,
  autoscaled, on GPUs when present.
- ``Archiver`` (with archiving on): its own loop copies finished jobs into the
  archive, off the Api replicas' interpreters and apart from the dispatchers
  (``serve_app.work.archiver_deployment``).

The ingress builds its FastAPI app on the replica (``__serve_build_asgi_app__``)
so the app's lifespan can use the replica's own handles.

One deployment graph, three ways in (``build_application`` is the graph):

- ``hitl up`` calls ``build_application(settings)``;
- ``serve run serve_app.application:build_app redis_url=redis://…`` and a Serve config file
  whose ``import_path`` is ``serve_app.application:build_app``: Ray Serve validates the
  arguments (``args:``) into :class:`AppArgs`, the builder's annotated parameter;
- ``serve run serve_app.application:app`` / ``serve build serve_app.application:app``: the
  application bound from environment variables (:meth:`AppArgs.from_environment`).

No ``from __future__ import annotations`` here: Ray Serve reads the builder's annotation at run
time (``inspect.signature``) and converts ``args`` only when it is a class, not a string.
"""

import asyncio
import functools
import json
import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray
from fastapi import FastAPI
from pydantic import ConfigDict, model_validator
from ray import serve

from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.execution import RunSpec
from hitl_review.statecore.models import ImageRef, NodeCommand

from .observability.logging_setup import configure_component, drop_serve_access_lines
from .observability.process_metrics import RayExport
from .ops.config import ENV_FALLBACK, Settings
from .recovery import durability
from .routes.api import Runtime, create_app
from .routes.auth import Authenticator
from .routes.events import EventHub, sse_lines
from .serving.ray_runtime import reuse_ingress_address, shared_archive_problem
from .serving.runtime import make_dispatcher
from .serving.serve_options import CONTROL_PLANE
from .serving.stores import store_for
from .work.archive_loop import archive_loop
from .work.archiver_deployment import Archiver
from .work.archiving import open_archive
from .work.capacity import ServeCapacity
from .work.webhook_delivery import start_webhooks

log = logging.getLogger("hitl.application")

APP_NAME = "hitl"
NODE_DEPLOYMENT = {
    "DETECT_SUBJECTS": "Detector",
    "VALIDATE_MANUAL_BOX_LIST": "BoxValidator",
    "PROCESS_APPROVED_BOX_LIST": "Segmenter",
    "SEGMENT_SUBJECT": "Segmenter",
}


async def confirm_replica(store: Any, job_id: str, node_instance_id: str, timeout_s: float = 3.0) -> bool:
    """Status confirmation before a re-dispatch: the replica that recorded itself as running the
    node (it drops the record when the call ends) is asked, with its own short timeout,
    whether it is alive. A stopped or dead replica does not answer (re-dispatch); a busy one does
    (its heartbeats were only late: wait)."""
    name = await store.executor_of(job_id, node_instance_id)
    if not name:
        return False
    try:
        actor = await asyncio.to_thread(ray.get_actor, name, namespace="serve")
        await asyncio.wait_for(actor.check_health.remote(), timeout=timeout_s)
    except Exception as e:  # gone, stopped, or not a replica: not confirmed
        log.info("replica %s did not confirm node %s of job %s: %s", name, node_instance_id, job_id, type(e).__name__)
        return False
    return True


async def refuse_volatile_redis(settings: Settings) -> None:
    """What ``hitl up`` checks for an external Redis, done by the API replica itself, since
    ``serve run``/``serve deploy`` start no launcher: a Redis with persistence off or an evicting
    ``maxmemory-policy`` fails the replica's start (the deploy then says why), unless
    ``allow_volatile_redis``. A Redis that does not answer is left to the store's own errors."""
    import redis

    assert settings.redis_url
    try:
        problems = await asyncio.to_thread(
            durability.external_problems, settings.redis_url, settings.durability, settings.store_timeout_s
        )
    except redis.RedisError as e:
        log.warning("could not check the Redis at %s for persistence: %s", settings.redis_url, e)
        return
    if not problems:
        return
    text = "; ".join(problems)
    if settings.allow_volatile_redis:
        log.warning("VOLATILE REDIS (allow_volatile_redis): %s. Acknowledged jobs may be lost.", text)
        return
    raise RuntimeError(
        f"refusing the Redis at {settings.redis_url}: {text}. Turn on AOF (appendonly yes) or RDB, set "
        "maxmemory-policy noeviction, or pass allow_volatile_redis=true to run anyway and risk losing jobs."
    )


class ServeRunner:
    """Sends a node command to its model deployment through a DeploymentHandle."""

    def __init__(self, handles: dict[str, Any], capacity: ServeCapacity | None = None) -> None:
        self.handles = handles
        self.capacity = capacity

    def deployment_of(self, node_type: str) -> str | None:
        return NODE_DEPLOYMENT.get(node_type)

    def limits(self) -> dict[str, int]:
        """Calls this dispatcher may have outstanding per deployment (serve_app.work.capacity)."""
        return self.capacity.limits() if self.capacity is not None else {}

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        from hitl_review.statecore.errors import NodeExecutionError

        name = NODE_DEPLOYMENT.get(cmd.node_type)
        if name is None:
            raise NodeExecutionError(
                f"unsupported workflow node type: {cmd.node_type}", code="UNSUPPORTED_NODE_TYPE", retryable=False
            )
        response = self.handles[name].run.remote(cmd.node_type, cmd.input, spec.model_dump())
        try:
            result: dict[str, Any] = await response
        except asyncio.CancelledError:  # the dispatcher gave up on it: Serve drops it, queued or running
            response.cancel()
            raise
        return result

    async def describe(self) -> dict[str, Any]:
        """Each model deployment's own description, asked of all at once (``/readyz`` waits for the
        slowest, not the sum: one after another they took past its 5 s on a loaded host)."""
        names = list(self.handles)
        found = await asyncio.gather(*(self.handles[n].describe.remote() for n in names))
        return dict(zip(names, found, strict=True))

    async def preview(self, image: ImageRef, bbox: list[float], points: list[dict[str, Any]]) -> dict[str, Any]:
        """A reviewer's preview mask, from a Segmenter replica (its embedding cache, its gate)."""
        result: dict[str, Any] = await self.handles["Segmenter"].preview.remote(image.model_dump(), bbox, points)
        return result


@serve.deployment(name="Api", max_ongoing_requests=4096, **CONTROL_PLANE)
@serve.ingress()
class Api:
    """Ingress: the HTTP API, plus this replica's outbox dispatcher."""

    def __init__(
        self, settings_json: str, events: Any, detector: Any, validator: Any, segmenter: Any, archiver: Any = None
    ) -> None:
        self.settings = Settings.model_validate_json(settings_json)
        configure_component(self.settings.log_format, self.settings.log_level)  # as the launcher writes
        drop_serve_access_lines()  # serve_app.observability.request_log writes the line of each request instead
        self.events_handle = events
        reuse_ingress_address()  # the API port again at once after a crash (before Serve binds it)
        # The Archiver deployment runs its own loop; bound here so Serve deploys it. None: --no-archive.
        self.archiver = archiver
        from hitl_review.deployments.serve import configured_max_ongoing

        # Outstanding calls per model deployment follow what Serve can start now (serve_app.work.capacity).
        capacity = ServeCapacity(
            APP_NAME, configured_max_ongoing(self.settings.backend_config()), share=self.settings.api_replicas
        )
        handles = {"Detector": detector, "BoxValidator": validator, "Segmenter": segmenter}
        self.runner = ServeRunner(handles, capacity)
        self.background: list[asyncio.Task[Any]] = []  # the runtime's loops, once its lifespan started them

    async def check_health(self) -> None:
        """Serve's health check: a replica whose dispatcher (which also runs the inspector's sweeps) or
        archive loop has ended, crashed or not, takes no more work from the outbox; failing here makes
        Serve replace it."""
        for task in self.background:
            if task.done():
                error = None if task.cancelled() else task.exception()
                raise RuntimeError(f"a background loop of this Api replica has ended ({task.get_name()}): {error!r}")

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self._runtime, echo_request_id=False)  # Serve's HTTP server echoes X-Request-ID

    async def _runtime(self) -> Runtime:
        settings = self.settings
        assert settings.redis_url
        await refuse_volatile_redis(settings)
        store = store_for(settings, settings.redis_url)
        # The dispatcher blocks in XREADGROUP for up to 1 s: its store's timeout allows for it.
        background_store = store_for(settings, settings.redis_url, blocking_s=2.0)
        archive = await open_archive(settings)
        how = await durability.configure(store, settings.durability, settings.store_timeout_s, archive)
        log.info("durability %s", how)
        await durability.configure(background_store, settings.durability, settings.store_timeout_s, archive)
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
                "instance": settings.instance_id,  # hitl up says READY only for its own instance
            }

        rt = Runtime(
            settings=settings,
            store=store,
            artifacts=ArtifactStore(settings.artifacts),
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=events,
            readiness=readiness,
            model_stats=self.runner.describe,
            preview=self.runner.preview,
            closing=[background_store],
            archive=archive,
        )
        # This replica's own series (its spool, its dispatcher's calls), tagged with the replica on Ray's port.
        rt.background.append(asyncio.create_task(RayExport().run_forever(), name="ray metrics export"))
        confirm = functools.partial(confirm_replica, background_store)
        dispatcher = make_dispatcher(settings, background_store, self.runner, confirm)
        rt.background.append(asyncio.create_task(dispatcher.run_forever(), name="dispatcher"))
        if self.archiver is None:  # --no-archive: copies queued earlier only get their retention started
            loop = archive_loop(settings, background_store, None)
            rt.background.append(asyncio.create_task(loop.run_forever(), name="archive loop"))
            hooks = start_webhooks(settings, background_store)  # and the webhooks' deliverer, when any
            if hooks is not None:
                rt.background.append(hooks)
        self.background = rt.background
        return rt


@serve.deployment(name="Events", max_ongoing_requests=20000, **CONTROL_PLANE)
class Events:
    """Every open SSE stream of this replica shares one EventHub."""

    def __init__(self, settings_json: str) -> None:
        settings = Settings.model_validate_json(settings_json)
        configure_component(settings.log_format, settings.log_level)
        assert settings.redis_url
        self.hub = EventHub(store_for(settings, settings.redis_url))

    async def stream(self, job_id: str, after: int) -> AsyncIterator[str]:
        async for line in sse_lines(self.hub.batches(job_id, after)):
            yield line


def build_application(settings: Settings, gpu: bool | None = None) -> Any:
    """The whole application, bound; run it with ``serve.run(app, name=APP_NAME, route_prefix="/")``.
    ``gpu``: see ``deployments.serve.build_model_deployments``."""
    from hitl_review.deployments.serve import build_model_deployments

    cfg = settings.model_dump_json()
    models = build_model_deployments(settings.backend_config(), gpu=gpu)
    events_d: Any = Events  # a serve Deployment at run time; mypy sees the undecorated class
    api_d: Any = Api
    events = events_d.options(num_replicas=settings.events_replicas, ray_actor_options={"num_cpus": 0}).bind(cfg)
    archiver = None
    if settings.archive:
        archiver_d: Any = Archiver
        archiver = archiver_d.options(num_replicas=1, ray_actor_options={"num_cpus": 0}).bind(cfg)
    return api_d.options(num_replicas=settings.api_replicas, ray_actor_options={"num_cpus": 0}).bind(
        cfg, events, models["Detector"], models["BoxValidator"], models["Segmenter"], archiver
    )


# ENV_FALLBACK (serve_app.ops.config): the environment variables an argument falls back to when it is not
# given (first one set wins), the same table ``hitl up`` reads them by.
# ``${NAME}`` in these arguments is replaced by the environment variable NAME of the building process
# (a Secret on KubeRay), so a config file can name a Redis that requires a password without holding it.
ENV_EXPANDED = ("redis_url", "archive_url")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# ``hitl up`` options with no meaning inside a Serve application, and where that setting lives.
LAUNCHER_ONLY = {
    "api_port": "http_options.port of the Serve config (serve run: --port is not an app argument)",
    "ui_port": "the reviewer UI is started by `hitl up`, or `python -m hitl_review.ui --api-url …`",
    "ray_address": "serve run/deploy --address, or RAY_ADDRESS",
}


class AppArgs(Settings):
    """The application's arguments: every ``Settings`` field a Serve application uses, plus ``gpus``.

    Unknown names are refused (a typo in a config's ``args:`` fails the deploy instead of being
    ignored). ``redis_url``, ``artifacts_root``, ``tokens`` and ``data_dir`` fall back to
    ``HITL_REDIS_URL`` (or ``REDIS_URL``), ``HITL_ARTIFACTS``, ``HITL_TOKENS`` and ``HITL_DATA_DIR``
    in the process that builds the application (on a cluster: the config's ``runtime_env.env_vars``
    or the nodes' environment). ``host`` is the address the API is reached on (Serve's
    ``http_options.host`` decides where it listens): beyond loopback ``HITL_TOKENS`` is required,
    on loopback without it the API writes an admin token to ``<data_dir>/api-token``. ``${NAME}`` in
    ``redis_url`` or ``archive_url`` is NAME from that environment (a password kept in a Secret).
    Built on a cluster of several machines (``serve deploy``, KubeRay), a SQLite archive is refused:
    the replicas that share it may run on any node (``ray_runtime.shared_archive_problem``)."""

    model_config = ConfigDict(extra="forbid")

    # Whether torch backends ask Ray for GPUs (``num_gpus``). None: only when the building process
    # sees CUDA, right on one machine; on a cluster the GPUs are on other nodes, so say true.
    gpus: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_environment(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        wrong = sorted(set(data) & set(LAUNCHER_ONLY))
        if wrong:
            raise ValueError("; ".join(f"{k} is not an application argument: use {LAUNCHER_ONLY[k]}" for k in wrong))
        values = dict(data)
        for field, names in ENV_FALLBACK.items():
            if values.get(field) is None:
                found = next((os.environ[n] for n in names if os.environ.get(n)), None)
                if found is not None:
                    values[field] = found
        for field in ENV_EXPANDED:
            if isinstance(values.get(field), str):  # unset names are left as written
                values[field] = _ENV_REFERENCE.sub(lambda m: os.environ.get(m[1], m[0]), values[field])
        return values

    @model_validator(mode="after")
    def _complete(self) -> "AppArgs":
        if not self.redis_url:
            raise ValueError(
                "no Redis: pass redis_url (serve run hitl_review.serve_app.application:build_app "
                "redis_url=redis://HOST:6379/0, or args.redis_url in the Serve config) or set HITL_REDIS_URL"
            )
        if not self.tokens and not self.loopback:
            raise ValueError(f"host {self.host} is beyond loopback: set HITL_TOKENS (name:role:token,...)")
        problem = shared_archive_problem(self)  # built on a cluster of several machines: no SQLite
        if problem:
            raise ValueError(problem)
        return self

    @classmethod
    def from_environment(cls) -> "AppArgs":
        """Arguments from the environment only: ``HITL_APP_ARGS`` (a JSON object of arguments,
        optional) and the fallbacks of ``ENV_FALLBACK``."""
        raw = os.environ.get("HITL_APP_ARGS") or "{}"
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"HITL_APP_ARGS is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError("HITL_APP_ARGS must be a JSON object of application arguments")
        return cls.model_validate(data)

    def settings(self) -> Settings:
        """The ``Settings`` the replicas get; relative paths are resolved here, in the building process."""
        values = self.model_dump(exclude={"gpus"})
        values["data_dir"] = Path(values["data_dir"]).resolve()
        return Settings.model_validate(values)


def build_app(args: AppArgs) -> Any:
    """The application builder for Ray's CLI and config files (``import_path:
    serve_app.application:build_app`` with ``args:``): Serve validates ``args`` into ``AppArgs``."""
    if not isinstance(args, AppArgs):  # called directly with a mapping (or by an older Serve)
        args = AppArgs.model_validate(args)
    return build_application(args.settings(), gpu=args.gpus)


def __getattr__(name: str) -> Any:
    """``serve_app.application:app``: the application bound from the environment
    (``AppArgs.from_environment``), built when it is asked for, so importing this module builds nothing."""
    if name == "app":
        return build_app(AppArgs.from_environment())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
