"""Configuration of the control plane, in one serialisable object.

Set from `hitl up` flags, environment variables and an optional YAML/TOML file
(`--config`) that holds the model deployments' autoscaling settings.
"""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hitl_review.statecore.trusted_proxy import parse_networks
from hitl_review.statecore.webhooks import Webhook

# Environment variables a setting falls back to when it is not given (the first one set wins): read
# the same way by ``hitl up`` (``Settings.from_env``) and the Serve builder
# (``serve_app.application.AppArgs``).
ENV_FALLBACK: dict[str, tuple[str, ...]] = {
    "redis_url": ("HITL_REDIS_URL", "REDIS_URL"),
    "artifacts_root": ("HITL_ARTIFACTS",),
    "tokens": ("HITL_TOKENS",),
    "data_dir": ("HITL_DATA_DIR",),
    "webhook_secret": ("HITL_WEBHOOK_SECRET",),
}


def from_environment() -> dict[str, str]:
    """The settings of ``ENV_FALLBACK`` that the environment sets: {field: value}."""
    found = {
        field: next((os.environ[n] for n in names if os.environ.get(n)), None) for field, names in ENV_FALLBACK.items()
    }
    return {k: v for k, v in found.items() if v is not None}


class Settings(BaseModel):
    data_dir: Path = Path(".hitl")
    host: str = "127.0.0.1"
    api_port: int = 8000
    ui_port: int = 7860
    redis_url: str | None = None
    ray_address: str | None = None
    artifacts_root: str | None = None

    detector: str = "classical"
    validator: str | None = None  # default: follows the segmenter (sam -> sam, null -> null, else classical)
    segmenter: str = "classical"
    sam_checkpoint: str | None = None
    sam_model_type: str = "vit_b"
    detector_weights: str | None = None
    detector_arch: str = "fasterrcnn_resnet50_fpn"
    detector_delay_ms: int = 0
    segmenter_delay_ms: int = 0

    retention_s: int = 7 * 24 * 3600
    # Finished jobs are copied to the archive (SQLite in the data directory, or HITL_ARCHIVE_URL /
    # archive_url) before their retention starts (docs/protocol.md § Archive).
    archive: bool = True
    archive_url: str | None = None
    # The reviewer UI's label set; number keys 1-9 pick the first nine (ui/editor.py).
    labels: list[str] = Field(default_factory=list)
    node_timeout_s: float = 600.0  # a node's maximum execution time, counted from its start
    node_timeouts: dict[str, float] = Field(default_factory=dict)  # per node type (--node-timeout TYPE=N)
    heartbeat_s: float = 2.0  # the model replica renews a running node's heartbeat this often
    heartbeat_lapse_s: float = 15.0  # older than this: the node is re-dispatched (its executor is gone)
    inspector_period_s: float = 5.0
    max_attempts: int = 3  # starts of one node before a lost executor ends the job FAILED (EXECUTOR_LOST)
    retry_backoff_s: float = 1.0  # before a re-dispatch; doubles per attempt
    dispatcher_concurrency: int = 64
    reclaim_idle_ms: int = 60_000
    # A command delivered more often than this (its dispatchers died on it) becomes a dead letter
    # instead of running again (docs/protocol.md § Executors and the outbox).
    max_deliveries: int = Field(default=10, ge=1)

    # Redis unavailable, durability, admission control (docs/protocol.md § Error codes).
    store_timeout_s: float = 5.0  # Redis operation timeout: a down or hung Redis is a 503 within it
    durability: str = "fast"  # fast: AOF everysec; strict: appendfsync always + WAITAOF/WAIT
    allow_volatile_redis: bool = False  # an external Redis without persistence / with eviction: warn, not refuse
    max_backlog: int = 10_000  # POST /jobs answers 429 BACKLOG_FULL above this many commands not yet started
    # hitl_terminal_coverage_ratio covers the jobs submitted in this many seconds (whole minutes;
    # the counters keep 6 h of minute buckets: statecore.counters.HORIZON_S).
    coverage_window_s: float = Field(default=3600.0, ge=60, le=6 * 3600)
    # A reviewer's claim on a waiting job lapses unless renewed within this (docs/protocol.md § Claims).
    claim_ttl_s: float = Field(default=60.0, gt=0, le=24 * 3600)

    max_upload_bytes: int = 25 * 1024 * 1024
    max_pixels: int = 50_000_000

    tokens: str | None = None  # HITL_TOKENS="name:role:token,..."
    # /metrics and /docs, /redoc, /openapi.json without a token (--public-metrics, --public-docs): None
    # (the default) answers them openly only on a loopback host, where anyone who can connect can also
    # read <data-dir>/api-token; beyond loopback they need a token (metrics: role monitor or admin).
    public_metrics: bool | None = None
    public_docs: bool | None = None
    # An authenticating proxy's user (X-Forwarded-User, X-Auth-Request-User, X-Forwarded-Email) is
    # believed only from these peer addresses (hitl up --trusted-proxy CIDR; none by default), and
    # gets proxy_role (docs/protocol.md § Identity).
    trusted_proxies: list[str] = Field(default_factory=list)
    proxy_role: Literal["reviewer", "submitter", "admin"] = "reviewer"
    api_replicas: int = 1
    events_replicas: int = 1
    models: dict[str, Any] = Field(default_factory=dict)  # per-deployment overrides from --config
    # Made by each `hitl up` and answered by its Api replicas' /readyz, so READY is said only for
    # this launcher's own server, never for another one that answers on the same address.
    instance_id: str | None = None
    # How the control plane's lines are written (README § Logs): json (one object per line), text, or
    # auto: text on a terminal, json otherwise (hitl up resolves it, so its replicas write the same).
    log_format: Literal["auto", "json", "text"] = "auto"
    # hitl up --verbose: DEBUG in every process of the control plane (the replicas too), so a read's
    # line (serve_app.observability.request_log) shows wherever the request was served.
    verbose: bool = False
    # The quality gate on every mask (docs/protocol.md § Cut-out quality): its policy version, and how
    # many refinements a failing mask gets before it is kept with its FAIL verdict.
    quality_gate_policy: str = "gate-v1"
    # Which masks wait for a person in WAITING_MASK_REVIEW: review-failing (those the gate still fails
    # after their refinements), review-all, or off (the gate only records its verdict).
    quality_gate: Literal["review-failing", "review-all", "off"] = "review-failing"
    max_refinements: int = Field(default=2, ge=0, le=4)
    # The box auto-approve policy (docs/learning.md): off, shadow (records what it would decide) or on (it
    # approves; a --spot-check share of those still goes to a person). The file's text travels with the
    # settings, so a replica on another node needs no copy of it; checked before Ray starts (preflight).
    auto_approve: Literal["off", "shadow", "on"] = "off"
    auto_approve_policy: str | None = None
    auto_approve_policy_text: str | None = None
    spot_check: float = Field(default=0.05, ge=0, le=1)
    # The share of masks the gate passed that a person checks all the same, unmarked (statecore.gate_spot):
    # how the gate's recall on real work is measured (hitl learn report). 0: off.
    mask_spot_check: float = Field(default=0.0, ge=0, le=1)
    # Webhooks (docs/protocol.md § Webhooks): --webhook [TYPES=]URL, each delivery signed with the
    # secret (--webhook-secret-file, HITL_WEBHOOK_SECRET; a secret: never logged, never in deployment.json).
    webhooks: list[str] = Field(default_factory=list)
    webhook_secret: str | None = Field(default=None, repr=False)
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    webhook_concurrency: int = Field(default=8, ge=1, le=256)
    webhook_give_up_after_s: float = Field(default=24 * 3600.0, ge=0)

    @field_validator("webhooks")
    @classmethod
    def _webhook_specs(cls, v: list[str]) -> list[str]:
        for spec in v:
            Webhook.parse(spec)  # a ValueError naming the bad one
        return [spec.strip() for spec in v]

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, v: list[str]) -> list[str]:
        parse_networks(v)  # a ValueError naming the bad one
        return [c.strip() for c in v]

    @property
    def log_level(self) -> int:
        return logging.DEBUG if self.verbose else logging.INFO

    @property
    def artifacts(self) -> str:
        return self.artifacts_root or f"file://{self.data_dir.resolve() / 'artifacts'}"

    @property
    def validator_backend(self) -> str:
        if self.validator:
            return self.validator
        return self.segmenter if self.segmenter in ("sam", "null") else "classical"

    @property
    def loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1")

    @property
    def metrics_public(self) -> bool:
        return self.loopback if self.public_metrics is None else self.public_metrics

    @property
    def docs_public(self) -> bool:
        return self.loopback if self.public_docs is None else self.public_docs

    def backend_config(self) -> dict[str, Any]:
        """What the model side needs to build its backends (plain data, sent to Ray replicas)."""
        sam = {"checkpoint": self.sam_checkpoint, "model_type": self.sam_model_type}
        return {
            "artifacts": self.artifacts,
            "detector": {
                "name": self.detector,
                "delay_ms": self.detector_delay_ms,
                "weights": self.detector_weights,
                "arch": self.detector_arch,
                **sam,
            },
            # torchvision: the detector's weights name the boxes sent without a label (docs/protocol.md § Second round)
            "validator": {"name": self.validator_backend, **sam, **self._tv_weights()},
            # The key only when set: builders and config files without the knob see what they always saw.
            "segmenter": {"name": self.segmenter, **sam, **self._delay(self.segmenter_delay_ms)},
            "deployments": self.models,
            "quality": {"policy": self.quality_gate_policy, "max_refinements": self.max_refinements},
        }

    def _tv_weights(self) -> dict[str, Any]:
        return {"weights": self.detector_weights, "arch": self.detector_arch} if self.detector_weights else {}

    @staticmethod
    def _delay(ms: int) -> dict[str, int]:
        return {"delay_ms": ms} if ms else {}

    def backends(self) -> dict[str, str]:
        return {"detector": self.detector, "validator": self.validator_backend, "segmenter": self.segmenter}

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        values: dict[str, Any] = from_environment()
        if os.environ.get("RAY_ADDRESS"):
            values["ray_address"] = os.environ["RAY_ADDRESS"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


DEPLOYMENT_FILE = "deployment.json"  # in the data directory: the settings `hitl up` runs with


def save_deployment(settings: Settings) -> Path:
    """Write the settings a deployment runs with to ``<data-dir>/deployment.json`` (atomically;
    tokens and the webhook secret left out: they are secrets, and what builds from this file never
    authenticates anyone).
    What a standalone dispatcher and the admin tools build their store from
    (``load_deployment``), so they keep this deployment's retention, archive, timeouts and attempts."""
    path = settings.data_dir / DEPLOYMENT_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(settings.model_copy(update={"tokens": None, "webhook_secret": None}).model_dump_json(indent=2))
    os.replace(tmp, path)
    return path


def load_deployment(data_dir: str | Path) -> Settings | None:
    """The settings ``hitl up`` last ran with on ``data_dir``; None when it never ran there."""
    path = Path(data_dir) / DEPLOYMENT_FILE
    if not path.exists():
        return None
    return Settings.model_validate_json(path.read_text())


class DeploymentSection(BaseModel):
    """One deployment's section of the ``--config`` file (what ``deployments.serve`` reads): a key
    not here is a mistake, refused rather than ignored."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int | None = None
    max_replicas: int | None = None
    initial_replicas: int | None = None
    target_ongoing_requests: float | None = None
    upscale_delay_s: float | None = None
    downscale_delay_s: float | None = None
    metrics_interval_s: float | None = None
    look_back_period_s: float | None = None
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None
    autoscaling_config: dict[str, Any] | None = None
    num_replicas: int | None = None
    max_ongoing_requests: int | None = None
    num_gpus: float | None = None
    num_cpus: float | None = None
    ray_actor_options: dict[str, Any] | None = None
    max_batch_size: int | None = None
    batch_wait_timeout_s: float | None = None
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    graceful_shutdown_wait_loop_s: float | None = None
    graceful_shutdown_timeout_s: float | None = None
    options: dict[str, Any] | None = None  # the backend's own settings (e.g. the validator's threshold)


DeploymentName = Literal["Detector", "BoxValidator", "Segmenter", "detector", "validator", "segmenter"]


class ConfigFile(BaseModel):
    """The ``--config`` file: ``deployments`` (one section per deployment, by name or role) and ``labels``."""

    model_config = ConfigDict(extra="forbid")

    deployments: dict[DeploymentName, DeploymentSection] = Field(default_factory=dict)
    labels: list[str] | str | None = None


class ConfigError(ValueError):
    """A ``--config`` file that cannot be read or holds what ``hitl up`` does not know, in one line."""


def _problem(error: Any) -> str:
    """One pydantic error of the config file in words: where, what, and the likely key meant."""
    loc = [str(x) for x in error["loc"] if x != "[key]"]
    where = ".".join(loc) or "the top level"
    if error["type"] == "extra_forbidden":
        parent: type[BaseModel] = DeploymentSection if len(loc) > 1 else ConfigFile
        known = list(parent.model_fields)
        near = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"did you mean {near[0]}?" if near else f"known keys: {', '.join(known)}"
        return f"unknown key {where} ({hint})"
    if error["type"] == "literal_error" and loc[:1] == ["deployments"]:
        names = "Detector, BoxValidator, Segmenter, or by role: detector, validator, segmenter"
        return f"unknown deployment {where} ({names})"
    return f"{where}: {error['msg']}"


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read and check the `--config` file: YAML (.yaml/.yml) or TOML (.toml). FileNotFoundError
    when it is not there, ConfigError (one line) when it cannot be parsed or holds an unknown key."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config file {p} does not exist")
    text = p.read_text()
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        detail = " ".join(str(e).split())
        raise ConfigError(
            f"config file {p} is not valid {'TOML' if p.suffix == '.toml' else 'YAML'}: {detail}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    try:
        ConfigFile.model_validate(data)
    except ValidationError as e:
        problems = [_problem(err) for err in e.errors()]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(
            f"config file {p}: {problems[0]}{more}; its keys are listed in docs/scaling.md (The --config file)"
        ) from None
    return data
