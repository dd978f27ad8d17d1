"""A standalone dispatcher next to a running deployment (``hitl dispatcher``, or
``python -m hitl_review.serve_app.work.standalone``): for more dispatch capacity than the API replicas give, and for
the crash tests.

It is built like the deployment's own dispatchers, from the deployment's settings: the ones
``hitl up`` wrote to ``<data-dir>/deployment.json`` (``serve_app.ops.config.save_deployment``), so its
store keeps that deployment's retention, archive, node timeouts and attempts. Its store is the one
``store_for`` builds for everyone; under an archive it never starts a finished job's retention
without a copy (the archivers copy; the dispatcher does no archive work). Flags given on the
command line override single settings; without a ``deployment.json`` (no ``hitl up`` ran on that
data directory) the settings are the defaults plus the flags, and ``--redis-url`` is required.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server's modules are imported only when it runs: `hitl --help` stays light
    from ..ops.config import Settings

log = logging.getLogger("hitl.dispatcher")

# Flag -> the setting it overrides (None: not given, the deployment's value stands).
OVERRIDES = {
    "redis_url": "redis_url",
    "detector_delay_ms": "detector_delay_ms",
    "reclaim_idle_ms": "reclaim_idle_ms",
    "max_deliveries": "max_deliveries",
    "heartbeat_s": "heartbeat_s",
    "heartbeat_lapse_s": "heartbeat_lapse_s",
    "inspector_period_s": "inspector_period_s",
}


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``hitl dispatcher`` (the server is imported only when it runs)."""
    p.add_argument(
        "--data-dir",
        default=None,
        help="the deployment's data directory (deployment.json, artifacts/; default $HITL_DATA_DIR, else .hitl)",
    )
    p.add_argument(
        "--redis-url",
        default=None,
        help="default: $HITL_REDIS_URL, else $REDIS_URL, else the deployment's Redis",
    )
    p.add_argument("--consumer", default=None, help="consumer name in the outbox group (default host-pid-rand)")
    p.add_argument("--detector-delay-ms", type=int, default=None)
    p.add_argument("--reclaim-idle-ms", type=int, default=None)
    p.add_argument("--max-deliveries", type=int, default=None, help="a command delivered more often is a dead letter")
    p.add_argument(
        "--reclaim-every-s", type=float, default=5.0, help="look for silent dispatchers' commands this often"
    )
    p.add_argument("--heartbeat-s", type=float, default=None, help="renew a running node's heartbeat this often")
    p.add_argument("--heartbeat-lapse-s", type=float, default=None, help="a heartbeat older than this: executor lost")
    p.add_argument("--inspector-period-s", type=float, default=None)
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        default=None,
        help="json: one object per line; text; auto: text on a terminal (default: the deployment's)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return p


def parser() -> argparse.ArgumentParser:
    return add_arguments(
        argparse.ArgumentParser(prog="python -m hitl_review.serve_app.work.standalone", description=__doc__)
    )


def settings_for(args: argparse.Namespace) -> Settings:
    """The deployment's settings on ``--data-dir`` with the flags given applied."""
    from ..ops.config import ENV_FALLBACK, Settings, load_deployment

    data_dir = Path(args.data_dir or os.environ.get("HITL_DATA_DIR") or ".hitl").resolve()
    base = load_deployment(data_dir)
    given = {field: getattr(args, flag) for flag, field in OVERRIDES.items() if getattr(args, flag) is not None}
    env_url = next((os.environ[name] for name in ENV_FALLBACK["redis_url"] if os.environ.get(name)), None)
    if "redis_url" not in given and env_url:  # as `hitl up` and the Serve builder read it
        given["redis_url"] = env_url
    if base is None:
        if not given.get("redis_url"):
            raise SystemExit(
                f"hitl dispatcher: no deployment settings in {data_dir} (hitl up never ran there): "
                "pass --data-dir of the deployment, or --redis-url"
            )
        log.warning("no %s/deployment.json: default settings plus the flags given", data_dir)
        return Settings(data_dir=data_dir, **given)
    return base.model_copy(update={"data_dir": data_dir, **given})


def run(args: argparse.Namespace) -> int:
    """Run the dispatcher until Ctrl-C or SIGTERM."""
    from hitl_review.deployments.executor import build_models
    from hitl_review.statecore.artifacts import ArtifactStore

    from ..observability import metrics
    from ..observability.logging_setup import configure_component
    from ..serving.runtime import make_dispatcher
    from ..serving.stores import store_for
    from .dispatcher import LocalRunner

    settings = settings_for(args)
    if args.verbose:
        settings.verbose = True
    # The control plane's format (the deployment's, or --log-format), on stderr like a replica's.
    configure_component(args.log_format or settings.log_format, settings.log_level)
    log.debug("effective settings: %s", settings.model_dump_json(exclude={"tokens"}))
    assert settings.redis_url
    log.info(
        "standalone dispatcher on %s: archive %s, retention %ds, node timeout %gs, %d attempts",
        settings.redis_url,
        "on" if settings.archive else "off",
        settings.retention_s,
        settings.node_timeout_s,
        settings.max_attempts,
    )
    store = store_for(settings, settings.redis_url, blocking_s=2.0)  # XREADGROUP blocks up to 1 s
    runner = LocalRunner(build_models(settings.backend_config()), ArtifactStore(settings.artifacts))
    dispatcher = make_dispatcher(settings, store, runner, consumer=args.consumer, reclaim_every_s=args.reclaim_every_s)

    async def serve() -> None:  # its dispatch counters reach the deployment's totals in Redis
        await asyncio.gather(dispatcher.run_forever(), metrics.SHARED.flush_forever(store.r))

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
