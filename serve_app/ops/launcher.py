"""`hitl up` / `hitl demo`: everything on one machine (or this driver on a joined Ray cluster).

Order (after ``serve_app.ops.preflight`` checked the flags, the model files and the Redis): lock the
data directory, start the embedded redis-server (AOF) unless REDIS_URL is given,
make the local token, start or join Ray (``serve_app.serving.ray_runtime``), run the Serve application,
wait until /readyz answers ready where the ingress really listens, start the UI, print READY.
SIGINT or SIGTERM, reaching this process alone or its whole process group, stops everything in
order in a few seconds, leaving no process behind (``serve_app.ops.stopping``); a signal during the
start-up abandons it the same way. A second `hitl up` on the same data directory (also after
SIGKILL) finds every job where it was: state is in Redis's AOF, blobs in the artifact store.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import httpx
from pydantic import ValidationError

from ..observability.logging_setup import BACKUPS, MAX_BYTES, rotate_file, setup_logging
from ..recovery.durability import appendfsync
from ..routes.auth import local_token
from ..serving import ray_runtime
from . import ports, preflight
from .config import ConfigError, Settings, load_config_file, save_deployment
from .redis_server import RedisServer
from .stopping import Stopper, descendants
from .webhook_flags import webhook_secret

log = logging.getLogger("hitl.up")


class DataDirLock:
    """One `hitl up` per data directory; the kernel drops the lock if the process dies."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "hitl.lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"hitl up: another `hitl up` is running on data directory {self.path.parent}; "
                "stop it first or pass another --data-dir"
            ) from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())


def _wait_ready(
    api_url: str, token: str | None, timeout: float, instance: str | None = None, foreign_s: float = 30.0
) -> dict[str, Any]:
    """/readyz's answer once it is ready, and (with ``instance``) it is this ``hitl up``'s own server:
    a ready answer naming another instance (or none: an older build) is another server on that
    address; it may be a predecessor's replica still draining, so it is waited out for ``foreign_s``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    foreign_since: float | None = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{api_url}/readyz", timeout=5)
            last = r.json()
            answered = last.get("instance") if isinstance(last, dict) else None
            if r.status_code == 200 and (instance is None or answered == instance):
                return last
            if r.status_code == 200:
                foreign_since = foreign_since or time.monotonic()
                if time.monotonic() - foreign_since >= foreign_s:
                    raise SystemExit(
                        f"hitl up: another server answers on {api_url} (its /readyz names instance {answered}, "
                        f"not this hitl up's {instance}): stop it, or pass another --api-port"
                    )
            else:
                foreign_since = None
        except (httpx.HTTPError, ValueError) as e:
            last = str(e)
        time.sleep(0.5)
    raise SystemExit(f"hitl up: the API did not become ready within {timeout:.0f}s (last answer: {last})")


class StopRequested(BaseException):
    """SIGINT or SIGTERM while starting: abandon the start-up and stop what is already running."""


def up(
    settings: Settings,
    *,
    ui: bool = True,
    dashboard: bool = True,
    dashboard_port: int | None = None,
    ready_timeout: float = 300,
    on_ready: Any = None,
    verbose: bool = False,
    ingress: str = "auto",
) -> int:
    """Run until SIGINT or SIGTERM, then stop everything (``serve_app.ops.stopping``); 0 on a clean stop.
    The caller has run ``preflight.check(settings)``; a start that fails raises ``preflight.UpError``
    or ``SystemExit`` with its line, after stopping what it started."""
    # Read when ray is first imported: a Ray call from a stop step still running after ray.shutdown
    # (serve_app.ops.stopping bounds each step) must fail, not start a new local cluster behind our back.
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    settings.data_dir = settings.data_dir.resolve()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Resolved here (a terminal: text; else json), so that the replicas write what this process writes.
    settings.log_format = setup_logging(settings.data_dir, verbose, settings.log_format)
    settings.verbose = verbose
    DataDirLock(settings.data_dir).acquire()
    stop = threading.Event()
    stopper = Stopper()
    serving = False  # past start-up: a signal only sets ``stop``
    stopping = False

    def _signal(signum: int, _frame: Any) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        if stopping:
            stopper.hurry.set()  # a second signal while stopping: kill what is left
            return
        stop.set()
        if not serving:
            raise StopRequested()

    def _own_signals() -> None:
        # Ray installs its own SIGTERM handler in the driver; ours must win so that Serve, Ray and
        # Redis are stopped in order.
        signal.signal(signal.SIGTERM, _signal)
        signal.signal(signal.SIGINT, _signal)

    _own_signals()
    redis: RedisServer | None = None
    ui_proc: subprocess.Popen | None = None
    ray_info: ray_runtime.RayInfo | None = None
    deployed = False
    app_name = ""
    ports.reserve(settings.api_port, settings.ui_port)  # not to be handed out for Ray's or Serve's own ports
    try:
        if not settings.ray_address:  # a joined cluster's proxies listen where that cluster says
            wanted = {"--api-port": settings.api_port}
            if ui and settings.ui_port:
                wanted["--ui-port"] = settings.ui_port
            ports.check(settings.host, wanted)
        if not settings.redis_url:  # an external one was checked by preflight.check_redis
            redis = RedisServer(settings.data_dir / "redis", appendfsync=appendfsync(settings.durability))
            try:
                redis.start()
            except RuntimeError as e:
                raise preflight.UpError(f"the embedded redis-server did not start: {e}", preflight.FAILED) from None
            settings.redis_url = redis.url
            log.info(
                "embedded redis-server on %s (AOF in %s, appendfsync %s)", redis.url, redis.data_dir, redis.appendfsync
            )
        settings.instance_id = settings.instance_id or uuid.uuid4().hex  # /readyz names it: READY for ours only
        # What a standalone dispatcher or an admin tool on this data directory builds its store from.
        save_deployment(settings)
        token = None
        if not settings.tokens:
            if not settings.loopback:
                raise SystemExit("hitl up: set HITL_TOKENS (name:role:token,...) to listen beyond loopback")
            token = local_token(settings.data_dir)
        if settings.trusted_proxies:  # the peer decides, never X-Forwarded-For: Serve's and Gradio's uvicorn
            os.environ["FORWARDED_ALLOW_IPS"] = ""  # must not rewrite it (read before Ray and the UI start)
        log.info("starting Ray (%s)", settings.ray_address or "local")
        ray_info = ray_runtime.start(
            settings, dashboard=dashboard, dashboard_port_requested=dashboard_port, ingress=ingress
        )
        _own_signals()
        if ray_info.joined:
            ray_runtime.check_joined_cluster(settings)
        from ray import serve

        from ..application import APP_NAME, build_application

        # Applied only when Serve is not running on the cluster yet; ray_runtime.ingress_url says where it is.
        # Without the proxies' line per request (each queue poll among them): the Api replica logs its
        # requests itself (serve_app.observability.request_log).
        serve.start(
            http_options=ray_runtime.serve_http_options(settings, ray_info), logging_config={"enable_access_log": False}
        )
        gpus = ray_runtime.cluster_gpus()  # the cluster's, not this machine's: they may be on other nodes
        log.info(
            "deploying the Serve application (detector=%s, validator=%s, segmenter=%s; %g GPU in the cluster)",
            settings.detector,
            settings.validator_backend,
            settings.segmenter,
            gpus,
        )
        app_name, deployed = APP_NAME, True
        try:
            serve.run(build_application(settings, gpu=gpus > 0), name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as e:  # "Deploying application hitl failed": say the replica's own error
            api_port = settings.api_port if ray_info.ingress == "direct" else None
            raise preflight.deploy_failure(APP_NAME, e, api_port=api_port) from None
        _own_signals()
        api_url = ray_runtime.ingress_url(settings, ray_info.ingress)
        info = _wait_ready(api_url, token, ready_timeout, instance=settings.instance_id)
        log.info("ready: %s", info)
        log.info("%s", ingress_line(ray_info, api_url))
        ui_url = None
        if ui:
            ui_proc, ui_url = _start_ui(settings, api_url, token)
        print(ready_line(api_url, ui_url, ray_info.dashboard_url), flush=True)
        if on_ready is not None:
            threading.Thread(target=on_ready, args=(api_url, token), daemon=True).start()
        serving = True
        if stop.is_set():  # a signal between the READY line and here
            return 0
        while not stop.wait(1.0):
            if redis is not None:
                supervise_redis(redis)
                redis.rotate_log()
            if ui_proc is not None and ui_proc.poll() is not None:
                log.error("the UI process exited with %s; restarting it", ui_proc.returncode)
                ui_proc, ui_url = _start_ui(settings, api_url, token, stop)
        return 0
    except StopRequested:
        log.info("stopped while starting")
        return 0
    finally:
        stopping = True
        stopper.begin(joined=bool(ray_info and ray_info.joined))
        log.info("shutting down")
        started = descendants()
        stopper.terminate_ui(ui_proc)
        stopper.stop_ray(app_name, serving=deployed, joined=bool(ray_info and ray_info.joined))
        stopper.stop_redis(redis)
        stopper.kill_stragglers(started)


def ingress_line(info: ray_runtime.RayInfo, api_url: str) -> str:
    """The startup log's word on the HTTP path (``--ingress``)."""
    if info.ingress == "direct":
        return (
            f"ingress: direct (the Api replica itself listens on {api_url}; Serve's head-node proxy, "
            f"unused, on port {info.proxy_port})"
        )
    return f"ingress: proxy (Serve's HTTP proxy listens on {api_url} and forwards to the Api replicas)"


def ready_line(api_url: str, ui_url: str | None, dashboard_url: str | None) -> str:
    """``READY api=<url> [ui=<url>] [dashboard=<url>]``: the one line scripts wait for."""
    parts = [f"api={api_url}"]
    if ui_url:
        parts.append(f"ui={ui_url}")
    if dashboard_url:
        parts.append(f"dashboard={dashboard_url}")
    return "READY " + " ".join(parts)


def supervise_redis(redis: RedisServer) -> bool:
    """Restart the embedded redis-server on its data directory and port if it died; True if it did.
    Meanwhile the API answers 503 STORE_UNAVAILABLE; its connections come back by themselves."""
    code = redis.exited()
    if code is None:
        return False
    log.error(
        "embedded redis-server (pid %s) exited with %s; restarting it on %s (data in %s)",
        redis.pid,
        code,
        redis.url,
        redis.data_dir,
    )
    try:
        redis.restart()
    except RuntimeError as e:  # e.g. the port was taken meanwhile: try again on the next tick
        log.error("restarting the embedded redis-server failed: %s; retrying", e)
        return False
    log.warning("embedded redis-server restarted (pid %s, restart #%d)", redis.pid, redis.restarts)
    return True


def _start_ui(
    settings: Settings, api_url: str, token: str | None, stop: threading.Event | None = None
) -> tuple[subprocess.Popen, str]:
    """Start the UI and wait until it answers; a stop meanwhile returns at once (it is stopped next)."""
    port = settings.ui_port or ports.quiet_port()
    args = [sys.executable, "-m", "hitl_review.ui", "--api-url", api_url, "--host", settings.host, "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its lines reach ui.log as they are written
    if token:
        env["HITL_TOKEN"] = token
    if settings.tokens or settings.trusted_proxies:  # each reviewer signs in: a token, or through the proxy
        args.append("--require-login")
    args += [f"--trusted-proxy={cidr}" for cidr in settings.trusted_proxies]
    if settings.labels:
        args += ["--labels", ",".join(settings.labels)]
    # A session of its own: a terminal's Ctrl-C reaches `hitl up`, which stops the UI in order; and
    # it dies with `hitl up` even when that is SIGKILLed.
    # Its output (Gradio's banner, its errors) goes to <data-dir>/logs/ui.log, not to this terminal.
    with ui_log(settings.data_dir) as out:
        proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
        )
    url = f"http://{settings.host}:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            return proc, url
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(
                f"hitl up: the UI failed to start (exit {proc.returncode}); see {settings.data_dir / 'logs' / 'ui.log'}"
            )
        time.sleep(0.5)
    raise SystemExit("hitl up: the UI did not answer within 120s")


def ui_log(data_dir: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> BinaryIO:
    """``<data-dir>/logs/ui.log``, opened for the UI's output. The UI holds it open, so it is
    rotated when the UI (re)starts: once it reached ``max_bytes``, it becomes ui.log.1."""
    path = data_dir / "logs" / "ui.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    rotate_file(path, max_bytes, backups)
    return open(path, "ab")  # the caller closes it once the child has it


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux's PR_SET_PDEATHSIG)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def parse_node_timeouts(items: list[str] | None) -> dict[str, float] | None:
    """``["SEGMENT_SUBJECT=900", …]`` → {node type: seconds}; a bad item stops with a clear message."""
    if not items:
        return None
    from hitl_review.statecore.states import NodeType

    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in NodeType.__members__:
            raise preflight.UpError(
                f"--node-timeout {item}: unknown node type (one of {', '.join(NodeType.__members__)})"
            )
        try:
            out[name] = float(value)
        except ValueError:
            raise preflight.UpError(f"--node-timeout {item}: give TYPE=SECONDS") from None
    return out


def settings_from_args(args: Any) -> Settings:
    """The settings of ``hitl up ARGS`` (flags, then the environment, then the defaults); a flag or a
    ``--config`` file that cannot be used is a ``preflight.UpError`` saying which and why."""
    try:
        return _settings_from_args(args)
    except ValidationError as e:
        raise preflight.flag_error(e) from None


def _settings_from_args(args: Any) -> Settings:
    models: dict[str, Any] = {}
    if getattr(args, "config", None):
        try:
            models = load_config_file(args.config)
        except (FileNotFoundError, ConfigError) as e:
            raise preflight.config_error(args.config, e) from None
    labels = getattr(args, "labels", None) or models.pop("labels", None)  # the flag, then the config file's
    if isinstance(labels, str):
        labels = [s.strip() for s in labels.split(",") if s.strip()]
    days = getattr(args, "retention_days", None)
    return Settings.from_env(
        data_dir=Path(args.data_dir) if args.data_dir else None,
        host=args.host,
        api_port=args.api_port,
        ui_port=args.ui_port,
        redis_url=args.redis_url,
        ray_address=args.ray_address,
        detector=args.detector,
        segmenter=args.segmenter,
        validator=args.validator,
        sam_checkpoint=args.sam_checkpoint,
        sam_model_type=args.sam_model_type,
        detector_weights=args.detector_weights,
        detector_arch=args.detector_arch,
        detector_delay_ms=args.detector_delay_ms,
        segmenter_delay_ms=getattr(args, "segmenter_delay_ms", None),
        quality_gate_policy=getattr(args, "quality_gate_policy", None),
        max_refinements=getattr(args, "max_refinements", None),
        quality_gate=getattr(args, "quality_gate", None),
        auto_approve=getattr(args, "auto_approve", None),
        auto_approve_policy=getattr(args, "auto_approve_policy", None),
        spot_check=getattr(args, "spot_check", None),
        mask_spot_check=getattr(args, "mask_spot_check", None),
        api_replicas=args.api_replicas,
        store_timeout_s=getattr(args, "store_timeout_s", None),
        durability=getattr(args, "durability", None),
        allow_volatile_redis=getattr(args, "allow_volatile_redis", None) or None,
        max_backlog=getattr(args, "max_backlog", None),
        coverage_window_s=getattr(args, "coverage_window_s", None),
        node_timeout_s=getattr(args, "node_timeout_s", None),
        node_timeouts=parse_node_timeouts(getattr(args, "node_timeout", None)),
        heartbeat_s=getattr(args, "heartbeat_s", None),
        heartbeat_lapse_s=getattr(args, "heartbeat_lapse_s", None),
        max_attempts=getattr(args, "max_attempts", None),
        max_deliveries=getattr(args, "max_deliveries", None),
        inspector_period_s=getattr(args, "inspector_period_s", None),
        claim_ttl_s=getattr(args, "claim_ttl_s", None),
        labels=labels or None,
        archive=False if getattr(args, "no_archive", False) else None,
        archive_url=getattr(args, "archive_url", None),
        retention_s=int(days * 86400) if days is not None else None,
        log_format=getattr(args, "log_format", None),
        models=models or None,
        trusted_proxies=getattr(args, "trusted_proxy", None),
        proxy_role=getattr(args, "proxy_role", None),
        public_metrics=getattr(args, "public_metrics", None),
        public_docs=getattr(args, "public_docs", None),
        webhooks=getattr(args, "webhook", None),
        webhook_secret=webhook_secret(getattr(args, "webhook_secret_file", None)),
        webhook_timeout_s=getattr(args, "webhook_timeout_s", None),
        webhook_give_up_after_s=getattr(args, "webhook_give_up_after_s", None),
    )
