"""What ``hitl up`` checks before it starts anything, and how it says what went wrong: one line on
stderr with what is wrong and what to do, exit status 2 for a usage error (a flag, the ``--config``
file, a model file, the Redis it is pointed at, a missing ``redis-server``), 1 for a start that
failed (a Serve deployment whose replica did not start: its own error is shown). No traceback.

The checks here run before the data directory is locked and before Redis or Ray start, so a refusal
costs about a second and leaves nothing behind (``tests/test_cli_errors.py``).
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import ports
from .config import ConfigError, Settings
from .redis_server import redis_binary

log = logging.getLogger("hitl.up")

USAGE = 2  # a usage error: what was asked cannot run; the line says what to change
FAILED = 1  # the start failed

# Settings fields whose flag is not ``--`` + the field's name with dashes, or that come from the environment.
FLAG_OF = {
    "retention_s": "--retention-days",
    "node_timeouts": "--node-timeout",
    "archive": "--no-archive",
    "models": "--config",
    "validator": "--validator",
    "artifacts_root": "HITL_ARTIFACTS",
    "tokens": "HITL_TOKENS",
    "webhooks": "--webhook",
}


class UpError(Exception):
    """``hitl up`` cannot start as asked: ``str()`` is one line saying what is wrong and what to do;
    ``code`` the exit status (``USAGE`` or ``FAILED``)."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(" ".join(message.split()))
        self.code = code


def flag_error(error: ValidationError) -> UpError:
    """A ``Settings`` validation error as the flag that was given and what it must be."""
    first = error.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else "settings"
    flag = FLAG_OF.get(field, "--" + field.replace("_", "-"))
    msg = str(first["msg"])
    msg = msg[:1].lower() + msg[1:]
    value = first.get("input")
    shown = f" {value}" if isinstance(value, str | int | float) and not isinstance(value, bool) else ""
    return UpError(f"{flag}{shown}: {msg} (see hitl up --help)")


def config_error(path: str, error: Exception) -> UpError:
    """The ``--config`` file missing, unparsable, or holding a key nobody reads."""
    if isinstance(error, FileNotFoundError):
        return UpError(f"--config {path}: the file does not exist; give the path of a YAML or TOML file (docs/config)")
    if isinstance(error, ConfigError):
        return UpError(f"--config: {error}")
    return UpError(f"--config {path}: {error}")


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``: what may be printed."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def check(settings: Settings) -> None:
    """Everything that can be refused before the start: tokens beyond loopback, the model files the
    chosen backends need, ``redis-server`` (embedded Redis) or the Redis at ``--redis-url``
    (reachable, persistent)."""
    if not settings.tokens and not settings.loopback:
        raise UpError(
            f"--host {settings.host} is beyond loopback: set HITL_TOKENS (name:role:token,...), or listen on 127.0.0.1"
        )
    check_values(settings)
    check_models(settings)
    check_quality_gate(settings)
    check_auto_approve(settings)
    check_webhooks(settings)
    if settings.redis_url:
        check_redis(settings)
    else:
        try:
            redis_binary()
        except RuntimeError as e:
            raise UpError(str(e)) from None


ARCHIVE_SCHEMES = ("sqlite:", "postgresql://", "postgres://", "postgresql+psycopg://")


def check_values(settings: Settings) -> None:
    """Values every flag's type lets through but nothing can run with: a negative retention, a port
    outside 1..65535, an archive in a database this build has no driver or dialect for."""
    if settings.retention_s < 0:
        days = settings.retention_s / 86400
        raise UpError(f"--retention-days {days:g}: must be 0 or more (days a finished job stays in Redis)")
    for flag, port, low in (("--api-port", settings.api_port, 1), ("--ui-port", settings.ui_port, 0)):
        if not low <= port <= 65535:  # --ui-port 0: any free port
            raise UpError(f"{flag} {port}: a TCP port is 1..65535")
    url = settings.archive_url
    if settings.archive and url and not url.startswith(ARCHIVE_SCHEMES):
        raise UpError(
            f"--archive-url {redact(url)}: the archive is PostgreSQL (postgresql://user:password@host/db) or "
            "SQLite (sqlite:///PATH); leave it out for <data-dir>/archive.sqlite3"
        )


def check_webhooks(settings: Settings) -> None:
    """Webhooks are signed, always: ``--webhook`` needs a secret (docs/protocol.md § Webhooks)."""
    if settings.webhooks and not settings.webhook_secret:
        raise UpError(
            "--webhook: give the signing secret with --webhook-secret-file FILE or HITL_WEBHOOK_SECRET "
            "(receivers check X-Hitl-Signature with it)"
        )


def check_auto_approve(settings: Settings) -> None:
    """``--auto-approve shadow|on`` needs a policy file that loads in that mode: in ``on``, one whose
    held-out evidence bounds its promise and whose hash matches its content (docs/learning.md)."""
    from hitl_review.statecore.autoapprove import PolicyRefused, load

    if settings.auto_approve == "off":
        return
    path = settings.auto_approve_policy
    if not path:
        mode = settings.auto_approve
        raise UpError(f"--auto-approve {mode} needs --auto-approve-policy FILE (hitl learn box-policy)")
    if settings.auto_approve_policy_text is None:
        try:
            settings.auto_approve_policy_text = Path(path).read_text()
        except OSError as e:
            raise UpError(f"--auto-approve-policy {path}: {e.strerror or e}") from None
    try:
        load(settings.auto_approve_policy_text, settings.auto_approve)
    except PolicyRefused as e:
        raise UpError(f"--auto-approve-policy {path}: {e}") from None


def check_quality_gate(settings: Settings) -> None:
    """An unknown ``--quality-gate-policy``, or one whose mask checker network cannot load here (gate-v5
    without torch, its weights missing), is refused here, not in the Segmenter replica."""
    from hitl_review.deployments.quality import gate_net
    from hitl_review.deployments.quality.gate import POLICIES, RETIRED, policy
    from hitl_review.deployments.quality.subject import QualityGate

    if settings.quality_gate_policy in RETIRED:
        raise UpError(
            f"--quality-gate-policy {settings.quality_gate_policy} is retired (the verdicts it wrote stay readable): "
            f"choose {' or '.join(sorted(POLICIES))}, or a file hitl learn gate wrote"
        )
    try:
        QualityGate(settings.quality_gate_policy, settings.max_refinements)
    except ValueError as e:
        raise UpError(f"--quality-gate-policy / --max-refinements: {e}") from None
    learned = policy(settings.quality_gate_policy).learned
    if learned is not None and set(gate_net.NET_FEATURES) & set(learned.features):
        try:
            gate_net.load()
        except ImportError as e:
            raise UpError(
                f"--quality-gate-policy {settings.quality_gate_policy} runs a network and needs torch ({e}): "
                "install the full set (make setup), or choose gate-v1"
            ) from None
        except (OSError, ValueError) as e:
            raise UpError(f"--quality-gate-policy {settings.quality_gate_policy}: {e}") from None


def _option_of(settings: Settings, role: str, key: str) -> Any:
    """``key`` from the ``options`` of ``role``'s section of the ``--config`` file (it overrides the flag)."""
    from hitl_review.deployments.executor import deployment_overrides

    name = {"detector": "Detector", "validator": "BoxValidator", "segmenter": "Segmenter"}[role]
    options = deployment_overrides({"deployments": settings.models}, role, name).get("options") or {}
    return options.get(key) if isinstance(options, dict) else None


def _need_file(path: Any, flag: str, asked: str, what: str, local: bool) -> None:
    if not path:
        raise UpError(f"{asked} needs {flag} FILE: {what}; or choose a backend without one (classical)")
    if local and not Path(str(path)).expanduser().is_file():
        raise UpError(f"{flag} {path}: the file does not exist ({asked}); give the path of {what}")


def check_models(settings: Settings) -> None:
    """The SAM checkpoint and the torchvision weights the chosen backends load: given, and on this
    machine a file (a joined cluster's nodes have their own disks: there only given)."""
    local = not settings.ray_address
    chosen = {"detector": settings.detector, "segmenter": settings.segmenter, "validator": settings.validator_backend}
    torch_needed = False
    for role, name in chosen.items():
        asked = f"--{role} {name}"
        if name in ("sam", "sam-auto"):
            torch_needed = True
            path = _option_of(settings, role, "checkpoint") or settings.sam_checkpoint
            what = "a Segment Anything checkpoint (.pth, e.g. sam_vit_b_01ec64.pth; nothing is downloaded)"
            _need_file(path, "--sam-checkpoint", asked, what, local)
        elif name == "torchvision":
            torch_needed = True
            path = _option_of(settings, role, "weights") or settings.detector_weights
            what = f"torchvision detection weights (.pth) for --detector-arch {settings.detector_arch}"
            _need_file(path, "--detector-weights", asked, what, local)
    if torch_needed and local and importlib.util.find_spec("torch") is None:
        raise UpError("the SAM and torchvision backends need torch: pip install 'hitl-review[models]'")


def check_redis(settings: Settings) -> None:
    """The external Redis answers (address, password) and keeps what it is given
    (``serve_app.recovery.durability.check_external``: refused unless ``--allow-volatile-redis``)."""
    import redis

    from ..recovery.durability import check_external

    assert settings.redis_url
    shown = redact(settings.redis_url)
    try:
        check_external(
            settings.redis_url,
            allow_volatile=settings.allow_volatile_redis,
            durability=settings.durability,
            timeout_s=settings.store_timeout_s,
        )
    except redis.AuthenticationError as e:
        why = str(e).rstrip(".")
        raise UpError(
            f"cannot reach the Redis at {shown} (--redis-url): {why}; check the user name and password in the URL"
        ) from None
    except (redis.ConnectionError, redis.TimeoutError) as e:
        why = str(e).rstrip(".")
        raise UpError(
            f"cannot reach the Redis at {shown} (--redis-url): {why}; check the host and port and that it runs, "
            "or leave --redis-url (and HITL_REDIS_URL, REDIS_URL) out to start the embedded one"
        ) from None
    except redis.RedisError as e:
        raise UpError(f"the Redis at {shown} (--redis-url) refused the start-up checks: {e}") from None
    except ValueError as e:  # not a redis:// URL
        raise UpError(f"--redis-url {shown}: {e}") from None
    except SystemExit as e:  # persistence off or eviction: check_external's own line
        raise UpError(redact(str(e.code)).removeprefix("hitl up: ")) from None


def _last_error_line(message: str) -> str:
    """The replica's own error from Serve's status message (a traceback's summary): its last line
    that names an exception, else the last line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line) or re.match(r"^[\w.]+\(\w+\):", line):
            return line
    return lines[-1] if lines else ""


def logs_dir() -> str:
    """Where Ray keeps this session's logs (the replicas' own among them)."""
    try:
        import ray

        node = ray._private.worker._global_node
        if node is not None:
            return str(node.get_logs_dir_path())
    except Exception:  # a best effort: the message must still be said
        pass
    return "Ray's session directory (/tmp/hitl-ray-*/session_latest/logs)"


def deploy_failure(app_name: str, error: Exception, *, api_port: int | None = None) -> UpError:
    """``serve.run`` raised (``Deploying application … failed``): find the deployments that did not
    start and their replicas' own errors in Serve's status, and where Ray's logs are. Under direct
    ingress (``api_port`` given) a ``NoAvailablePortError`` means the Api replica could not bind
    the API port: who took it since the check before Ray started is said too."""
    parts: list[str] = []
    try:
        from ray import serve

        app = serve.status().applications.get(app_name)
        for name, dep in (app.deployments if app else {}).items():
            if str(dep.status) in ("HEALTHY", "DeploymentStatus.HEALTHY") or not dep.message:
                continue
            parts.append(f"{name}: {_last_error_line(dep.message).rstrip('.')}")
        if not parts and app is not None and app.message:
            parts.append(_last_error_line(app.message))
    except Exception as e:  # the status is a best effort: the error raised still says something
        log.debug("serve.status() after the failed deploy: %s", e)
    if not parts:
        parts.append(_last_error_line(str(error)))
    if api_port and any("NoAvailablePortError" in p for p in parts):
        who = ports.holder(api_port) or "nobody listens on it now"
        parts.append(f"the API port {api_port} could not be bound by the Api replica ({who})")
    return UpError(
        f"the Serve application did not start: {'; '.join(parts)}. The replicas' logs are in {logs_dir()}",
        code=FAILED,
    )


def exit_code_of(stop: SystemExit) -> int:
    """``SystemExit("hitl up: …")`` raised while starting: its line printed, its status returned."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, flush=True, file=sys.stderr)
    return FAILED
