"""Configuration of the control plane, in one serialisable object.

Set from `hitl up` flags, environment variables and an optional YAML/TOML file
(`--config`) that holds the model deployments' autoscaling settings.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field


class Settings(BaseModel):
    data_dir: Path = Path(".hitl")
    host: str = "127.0.0.1"
    api_port: int = 8000
    ui_port: int = 7860
    redis_url: str | None = None
    ray_address: str | None = None
    artifacts_root: str | None = None

    detector: str = "classical"
    validator: str | None = None  # default: follows the segmenter (sam -> sam, else classical)
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
    api_replicas: int = 1
    events_replicas: int = 1
    models: dict[str, Any] = Field(default_factory=dict)  # per-deployment overrides from --config

    @property
    def artifacts(self) -> str:
        return self.artifacts_root or f"file://{self.data_dir.resolve() / 'artifacts'}"

    @property
    def validator_backend(self) -> str:
        if self.validator:
            return self.validator
        return "sam" if self.segmenter == "sam" else "classical"

    @property
    def loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1")

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
            "validator": {"name": self.validator_backend, **sam},
            # The key only when set: builders and config files without the knob see what they always saw.
            "segmenter": {"name": self.segmenter, **sam, **self._delay(self.segmenter_delay_ms)},
            "deployments": self.models,
        }

    @staticmethod
    def _delay(ms: int) -> dict[str, int]:
        return {"delay_ms": ms} if ms else {}

    def backends(self) -> dict[str, str]:
        return {"detector": self.detector, "validator": self.validator_backend, "segmenter": self.segmenter}

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        env = {
            "redis_url": os.environ.get("REDIS_URL"),
            "tokens": os.environ.get("HITL_TOKENS"),
            "data_dir": os.environ.get("HITL_DATA_DIR"),
            "artifacts_root": os.environ.get("HITL_ARTIFACTS"),
            "ray_address": os.environ.get("RAY_ADDRESS"),
        }
        values = {k: v for k, v in env.items() if v}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


DEPLOYMENT_FILE = "deployment.json"  # in the data directory: the settings `hitl up` runs with


def save_deployment(settings: Settings) -> Path:
    """Write the settings a deployment runs with to ``<data-dir>/deployment.json`` (atomically;
    tokens left out: they are secrets, and what builds from this file never authenticates anyone).
    What a standalone dispatcher and the admin tools build their store from
    (``load_deployment``), so they keep this deployment's retention, archive, timeouts and attempts."""
    path = settings.data_dir / DEPLOYMENT_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(settings.model_copy(update={"tokens": None}).model_dump_json(indent=2))
    os.replace(tmp, path)
    return path


def load_deployment(data_dir: str | Path) -> Settings | None:
    """The settings ``hitl up`` last ran with on ``data_dir``; None when it never ran there."""
    path = Path(data_dir) / DEPLOYMENT_FILE
    if not path.exists():
        return None
    return Settings.model_validate_json(path.read_text())


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read the `--config` file: YAML (.yaml/.yml) or TOML (.toml)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config file {p} does not exist")
    text = p.read_text()
    data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a mapping at the top level")
    return data
