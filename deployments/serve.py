"""Ray Serve deployments for the three model roles: ``Detector``, ``BoxValidator``, ``Segmenter``.

Each wraps one backend of ``deployments.backends`` and serves ``run(node_type, input)``
through ``deployments.executor.run_node``, so Serve and the local runner execute the
same code. The control plane reaches them through DeploymentHandles
(``serve_app.application``) and binds what ``build_model_deployments`` returns.

- GPUs: ``ray_actor_options["num_gpus"]`` (fractions allowed) only for torch backends and
  only when the building process sees CUDA; a CPU-only cluster never waits for a GPU.
- Autoscaling on ongoing requests, per deployment, from the ``--config`` file.
- SAM: the image encoder goes through ``@serve.batch``: concurrent requests for different
  images on one replica share one encoder forward; the decoder then runs per request on
  the cached embedding.
- Blocking model calls run in a worker thread, so a replica keeps accepting (and
  batching) requests while one computes.
- Each replica exports its queue length, batch sizes, embedding-cache results and node run
  times with ``ray.serve.metrics`` (``deployments.metrics``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from ray import serve

from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.execution import RunSpec, not_started, run_started
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.nodes import image_to_read

from .backends.base import Role, make_backend
from .executor import Models, backend_kwargs, deployment_overrides, load_image, model_input, run_node
from .metrics import ModelMetrics
from .preview import preview_mask
from .quality.subject import QualityGate

log = logging.getLogger("hitl.deployments")

TORCH_BACKENDS = {"sam", "sam-auto", "torchvision"}
AUTOSCALING_KEYS = (
    "min_replicas",
    "max_replicas",
    "initial_replicas",
    "target_ongoing_requests",
    "upscale_delay_s",
    "downscale_delay_s",
    "metrics_interval_s",
    "look_back_period_s",
    "upscale_smoothing_factor",
    "downscale_smoothing_factor",
)
DEFAULT_AUTOSCALING: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 2,
    "initial_replicas": 1,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 5.0,
    "downscale_delay_s": 60.0,
}
DEFAULT_BATCH = {"max_batch_size": 4, "batch_wait_timeout_s": 0.02}
HEALTH_DEFAULTS = {
    "health_check_period_s": 2.0,
    "health_check_timeout_s": 5.0,
    "graceful_shutdown_wait_loop_s": 0.5,  # a stop looks every 0.5 s (Serve: 2 s) whether the work is done
    "graceful_shutdown_timeout_s": 5.0,
}
DEFAULT_GPU_FRACTION = 0.15  # three roles x two replicas fit one GPU; SAM ViT-H needs ~8 GB each


def replica_name() -> str:
    """This Serve replica's actor name (namespace ``serve``), or "" outside a replica."""
    try:
        return str(serve.get_replica_context().replica_id.to_full_id_str())
    except Exception:  # not in a replica (tests calling the class directly)
        return ""


class _ModelDeployment:
    """What the three deployments share; ``ROLE`` picks the backend factory."""

    ROLE: Role = "detector"

    def __init__(
        self,
        backend: str,
        config: Mapping[str, Any],
        artifact_root: str,
        batch: Mapping[str, Any] | None = None,
        slots: int = 8,
        quality: Mapping[str, Any] | None = None,
    ) -> None:
        self.artifacts = ArtifactStore(artifact_root)
        # One thread per request slot (max_ongoing_requests): asyncio's default pool has cpu + 4
        # threads, so on a small machine two of eight admitted nodes would wait for a thread.
        self.threads = ThreadPoolExecutor(max_workers=max(1, slots), thread_name_prefix=f"hitl-{self.ROLE}")
        instance = make_backend(self.ROLE, backend, artifacts=self.artifacts, **dict(config))
        gate = QualityGate.from_config(quality) if self.ROLE == "segmenter" else None
        self.models = Models(**{self.ROLE: instance}, quality=gate)
        self.backend = instance
        # SAM backends expose their shared encoder; the encoder path is then batched.
        self.encoder: Any = getattr(instance, "encoder", None)
        self.metrics = ModelMetrics()
        b = {**DEFAULT_BATCH, **(batch or {})}
        self._embed.set_max_batch_size(int(b["max_batch_size"]))
        self._embed.set_batch_wait_timeout_s(float(b["batch_wait_timeout_s"]))
        log.info("%s deployment ready: %s", type(self).__name__, self.describe())

    def describe(self) -> dict[str, Any]:
        """Backend names (and the validator's policy) for /readyz and the logs."""
        info: dict[str, Any] = {"deployment": type(self).__name__, "role": self.ROLE, **self.models.describe()}
        info["metrics"] = self.metrics.describe()
        model = getattr(self.encoder, "model", None)
        if model is not None:
            info["model"] = model.describe
            info["embedding_cache"] = {
                "memory_hits": self.encoder.memory_hits,
                "store_hits": self.encoder.store_hits,
                "misses": self.encoder.misses,
                "encoder_forwards": self.encoder.encoder_forwards,
            }
        return info

    async def run(self, node_type: str, input: dict[str, Any], spec: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one node. This replica (the process doing the work) records the node's start when it
        begins it, not when the call was queued for it (statecore.execution), renews its heartbeat
        while it runs (a stopped or dead replica is noticed by the inspector) and stops at its
        deadline. ``spec`` None (a direct call, no store): the node is only computed."""
        inp = model_input(node_type, input)  # a bad command fails here, before any model work
        run = RunSpec.model_validate(spec) if spec else None
        if run is not None:  # this replica records itself: the inspector asks it before a re-dispatch
            run = run.model_copy(update={"executor": replica_name()})

        async def work() -> dict[str, Any]:
            image = None
            ref = image_to_read(inp)
            if self.encoder is not None and ref is not None:
                image = await asyncio.to_thread(load_image, self.artifacts, ref.url)
                await self._embed(image, ref.sha256 or hashlib.sha256(image.tobytes()).hexdigest())
            compute = functools.partial(run_node, node_type, inp, self.models, self.artifacts, image=image)
            out: dict[str, Any] = await asyncio.get_running_loop().run_in_executor(self.threads, compute)
            return out

        self.metrics.started()
        t0, outcome = time.perf_counter(), "error"
        try:
            out = await work() if run is None else await run_started(run, work)
            # A call whose node was not started (running elsewhere, superseded) computed nothing.
            outcome = "not_started" if not_started(out) else "ok"
            return out
        finally:
            if self.encoder is not None:  # the batch's lookups and the node's own (the decoder's)
                enc = self.encoder
                self.metrics.cache_counts(enc.memory_hits, enc.store_hits, enc.misses)
            self.metrics.finished(node_type, outcome, time.perf_counter() - t0)

    # Ray's stubs expect a batched method of one argument; this one takes two lists.
    @serve.batch(  # type: ignore[call-overload]  # two list arguments, see above
        max_batch_size=DEFAULT_BATCH["max_batch_size"], batch_wait_timeout_s=DEFAULT_BATCH["batch_wait_timeout_s"]
    )
    async def _embed(self, images: list[np.ndarray], shas: list[str]) -> list[None]:
        """Warm the embedding cache for a batch of requests with one encoder forward."""
        self.metrics.batch(len(images))
        await asyncio.to_thread(self.encoder.embed_batch, images, shas)
        return [None] * len(images)


@serve.deployment(name="Detector")
class Detector(_ModelDeployment):
    ROLE = "detector"


@serve.deployment(name="BoxValidator")
class BoxValidator(_ModelDeployment):
    ROLE = "validator"


@serve.deployment(name="Segmenter")
class Segmenter(_ModelDeployment):
    ROLE = "segmenter"

    async def preview(self, image: dict[str, Any], bbox: list[float], points: list[dict[str, Any]]) -> dict[str, Any]:
        """A reviewer's preview mask (``deployments.preview``): SAM's image embedding comes from this
        replica's cache (the batched encoder path warms it first), the verdict from its gate."""
        ref = ImageRef.model_validate(image)
        pixels = await asyncio.to_thread(load_image, self.artifacts, ref.url)
        if self.encoder is not None:
            await self._embed(pixels, ref.sha256 or hashlib.sha256(pixels.tobytes()).hexdigest())
        compute = functools.partial(preview_mask, self.models, self.artifacts, ref, bbox, points, pixels)
        result: dict[str, Any] = await asyncio.get_running_loop().run_in_executor(self.threads, compute)
        return result


MODEL_DEPLOYMENTS: tuple[tuple[Role, Any], ...] = (
    ("detector", Detector),
    ("validator", BoxValidator),
    ("segmenter", Segmenter),
)


def configured_max_ongoing(config: Mapping[str, Any]) -> dict[str, int]:
    """Each model deployment's ``max_ongoing_requests`` as ``build_model_deployments`` sets it: what a
    dispatcher assumes per replica until Serve's controller says (serve_app.work.capacity)."""
    out: dict[str, int] = {}
    for role, cls in MODEL_DEPLOYMENTS:
        overrides = deployment_overrides(config, role, cls.name)
        backend, _ = backend_kwargs(config.get(role) or {}, overrides)
        out[cls.name] = int(deployment_options(backend, overrides, gpu=False)["max_ongoing_requests"])
    return out


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def deployment_options(backend: str, overrides: Mapping[str, Any], gpu: bool) -> dict[str, Any]:
    """``.options()`` for one deployment: autoscaling (or a fixed ``num_replicas``), request
    limits and actor resources, defaults overlaid with the ``--config`` section."""
    opts: dict[str, Any] = {}
    batch = {**DEFAULT_BATCH, **{k: overrides[k] for k in DEFAULT_BATCH if k in overrides}}
    opts["max_ongoing_requests"] = int(overrides.get("max_ongoing_requests", max(8, 2 * int(batch["max_batch_size"]))))
    if "num_replicas" in overrides:
        opts["num_replicas"] = int(overrides["num_replicas"])
    else:
        auto = dict(DEFAULT_AUTOSCALING)
        auto.update({k: overrides[k] for k in AUTOSCALING_KEYS if k in overrides})
        auto.update(overrides.get("autoscaling_config") or {})
        auto["initial_replicas"] = max(
            int(auto["min_replicas"]), min(int(auto.get("initial_replicas", 1)), int(auto["max_replicas"]))
        )
        opts["autoscaling_config"] = auto
    actor: dict[str, Any] = {"num_cpus": float(overrides.get("num_cpus", 1))}
    if gpu and backend in TORCH_BACKENDS:
        actor["num_gpus"] = float(overrides.get("num_gpus", DEFAULT_GPU_FRACTION))
    actor.update(overrides.get("ray_actor_options") or {})
    if not gpu:
        actor.pop("num_gpus", None)  # never ask a GPU-less cluster for one
    opts["ray_actor_options"] = actor
    # A stopped (SIGSTOPped, wedged) replica is noticed and replaced in seconds, not Serve's default
    # ~90 s: the node it held is re-dispatched by the inspector once its heartbeat lapses, and that
    # attempt needs a healthy replica even when the hung one was the only one.
    for key, default in HEALTH_DEFAULTS.items():
        opts[key] = float(overrides.get(key, default))
    return opts


def build_model_deployments(config: Mapping[str, Any], gpu: bool | None = None) -> dict[str, Any]:
    """Bound ``Detector``, ``BoxValidator`` and ``Segmenter`` from ``Settings.backend_config()``.

    ``config["deployments"]`` (the ``--config`` file) may hold, per deployment name or role:
    ``min_replicas``, ``max_replicas``, ``initial_replicas``, ``target_ongoing_requests``,
    ``upscale_delay_s``, ``downscale_delay_s`` (or an ``autoscaling_config`` mapping),
    ``num_replicas``, ``max_ongoing_requests``, ``num_gpus``, ``num_cpus``,
    ``ray_actor_options``, ``max_batch_size``, ``batch_wait_timeout_s`` and ``options``
    (extra backend settings such as ``threshold`` or ``feather_px``).

    ``gpu``: whether torch backends ask Ray for GPUs; ``None`` asks only when the building
    process sees CUDA (on a cluster whose GPUs are on other nodes, say ``True``)."""
    if gpu is None:
        gpu = _cuda_available()
    artifact_root = str(config.get("artifacts") or "file://.hitl/artifacts")
    out: dict[str, Any] = {}
    for role, cls in MODEL_DEPLOYMENTS:
        name = cls.name
        overrides = deployment_overrides(config, role, name)
        backend, kwargs = backend_kwargs(config.get(role) or {}, overrides)
        if role == "validator":
            kwargs.pop("delay_ms", None)
        batch = {k: overrides[k] for k in DEFAULT_BATCH if k in overrides}
        opts = deployment_options(backend, overrides, gpu)
        log.info("%s: backend %s, %s", name, backend, opts)
        quality = config.get("quality") if role == "segmenter" else None  # the gate runs where the masks are made
        out[name] = cls.options(**opts).bind(
            backend, kwargs, artifact_root, batch, opts["max_ongoing_requests"], quality
        )
    return out
