"""`hitl up` / `hitl demo`: everything on one machine, stopped cleanly on SIGTERM or Ctrl-C.

Order: lock the data directory, start the embedded redis-server (AOF) unless
REDIS_URL is given, make the local token, start or join Ray, run the Serve
application, wait until /readyz says ready, start the UI, print READY.
A second `hitl up` on the same data directory (also after SIGKILL) finds every
job where it was: state is in Redis's AOF, blobs in the artifact store.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from .auth import local_token
from .config import Settings, load_config_file
from .durability import appendfsync, check_external
from .redis_server import RedisServer, free_port

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


def setup_logging(data_dir: Path, verbose: bool = False) -> None:
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handlers: list[logging.Handler] = [
        logging.StreamHandler(sys.stderr),
        logging.FileHandler(data_dir / "logs" / "hitl.log"),
    ]
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=fmt, handlers=handlers, force=True)


def _wait_ready(api_url: str, token: str | None, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{api_url}/readyz", timeout=5)
            last = r.json()
            if r.status_code == 200:
                return last
        except (httpx.HTTPError, ValueError) as e:
            last = str(e)
        time.sleep(0.5)
    raise SystemExit(f"hitl up: the API did not become ready within {timeout:.0f}s (last answer: {last})")


def _start_ray(settings: Settings, dashboard: bool) -> None:
    import ray

    kwargs: dict[str, Any] = {
        "namespace": "hitl",
        "include_dashboard": dashboard,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if settings.ray_address:
        ray.init(address=settings.ray_address, **kwargs)
    else:
        # A local single-machine cluster: logical CPUs are resources, not cores; give the
        # control plane and three model deployments room even on a 2-core machine.
        ray.init(
            num_cpus=max(8, os.cpu_count() or 1),
            object_store_memory=256 * 1024 * 1024,
            _temp_dir=str(Path("/tmp") / f"hitl-ray-{os.getuid()}"),
            **kwargs,
        )


def up(
    settings: Settings,
    *,
    ui: bool = True,
    dashboard: bool = False,
    ready_timeout: float = 300,
    on_ready: Any = None,
    verbose: bool = False,
) -> int:
    settings.data_dir = settings.data_dir.resolve()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(settings.data_dir, verbose)
    DataDirLock(settings.data_dir).acquire()
    stop = threading.Event()

    def _signal(signum: int, _frame: Any) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)

    redis: RedisServer | None = None
    ui_proc: subprocess.Popen | None = None
    started_serve = False
    try:
        if not settings.redis_url:
            redis = RedisServer(settings.data_dir / "redis", appendfsync=appendfsync(settings.durability)).start()
            settings.redis_url = redis.url
            log.info(
                "embedded redis-server on %s (AOF in %s, appendfsync %s)", redis.url, redis.data_dir, redis.appendfsync
            )
        else:
            check_external(
                settings.redis_url,
                allow_volatile=settings.allow_volatile_redis,
                durability=settings.durability,
                timeout_s=settings.store_timeout_s,
            )
        token = None
        if not settings.tokens:
            if not settings.loopback:
                raise SystemExit("hitl up: set HITL_TOKENS (name:role:token,...) to listen beyond loopback")
            token = local_token(settings.data_dir)
        log.info("starting Ray (%s)", settings.ray_address or "local")
        _start_ray(settings, dashboard)
        from ray import serve

        from .application import APP_NAME, build_application

        serve.start(http_options={"host": settings.host, "port": settings.api_port}, detached=False)
        started_serve = True
        log.info(
            "deploying the Serve application (detector=%s, validator=%s, segmenter=%s)",
            settings.detector,
            settings.validator_backend,
            settings.segmenter,
        )
        serve.run(build_application(settings), name=APP_NAME, route_prefix="/", blocking=False)
        api_url = f"http://{settings.host}:{settings.api_port}"
        # Ray installs its own SIGTERM handler in the driver; ours must win so that
        # Serve, Ray and Redis are stopped in order.
        signal.signal(signal.SIGTERM, _signal)
        signal.signal(signal.SIGINT, _signal)
        info = _wait_ready(api_url, token, ready_timeout)
        log.info("ready: %s", info)
        ui_url = None
        if ui:
            ui_proc, ui_url = _start_ui(settings, api_url, token)
        print(f"READY api={api_url}" + (f" ui={ui_url}" if ui_url else ""), flush=True)
        if on_ready is not None:
            threading.Thread(target=on_ready, args=(api_url, token), daemon=True).start()
        while not stop.wait(1.0):
            if redis is not None:
                supervise_redis(redis)
            if ui_proc is not None and ui_proc.poll() is not None:
                log.error("the UI process exited with %s; restarting it", ui_proc.returncode)
                ui_proc, ui_url = _start_ui(settings, api_url, token)
        return 0
    finally:
        log.info("shutting down")
        if ui_proc is not None and ui_proc.poll() is None:
            ui_proc.terminate()
            try:
                ui_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ui_proc.kill()
        try:
            import ray

            if started_serve:
                from ray import serve

                serve.shutdown()
            if ray.is_initialized():
                ray.shutdown()
        except Exception as e:  # keep going: Redis must still be stopped
            log.warning("ray shutdown: %s", e)
        if redis is not None:
            redis.stop()
        log.info("stopped")


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


def _start_ui(settings: Settings, api_url: str, token: str | None) -> tuple[subprocess.Popen, str]:
    port = settings.ui_port or free_port()
    args = [sys.executable, "-m", "ui", "--api-url", api_url, "--host", settings.host, "--port", str(port)]
    env = dict(os.environ)
    if token:
        env["HITL_TOKEN"] = token
    if settings.tokens:
        args.append("--require-login")
    proc = subprocess.Popen(args, env=env)
    url = f"http://{settings.host}:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"hitl up: the UI failed to start (exit {proc.returncode})")
        time.sleep(0.5)
    raise SystemExit("hitl up: the UI did not answer within 120s")


def parse_node_timeouts(items: list[str] | None) -> dict[str, float] | None:
    """``["SEGMENT_SUBJECT=900", …]`` → {node type: seconds}; a bad item stops with a clear message."""
    if not items:
        return None
    from statecore.states import NodeType

    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in NodeType.__members__:
            raise SystemExit(
                f"hitl up: --node-timeout {item!r}: unknown node type (one of {', '.join(NodeType.__members__)})"
            )
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"hitl up: --node-timeout {item!r}: give TYPE=SECONDS") from None
    return out


def settings_from_args(args: Any) -> Settings:
    models: dict[str, Any] = {}
    if getattr(args, "config", None):
        models = load_config_file(args.config)
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
        models=models or None,
    )
