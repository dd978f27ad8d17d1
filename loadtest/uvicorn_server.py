"""The control plane's FastAPI app (``serve_app.runtime.local_app``) under plain uvicorn, alone in
its process: the uvicorn column of the intervention benchmark, and a Ray-free server for quick
load runs (``python -m loadtest.run --server uvicorn``).

With ``--dispatchers 0`` it serves HTTP only and loads no model: node commands stay in the outbox
for whichever dispatcher shares the Redis (the benchmark measures the intervention path alone).
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import uvicorn

from serve_app.config import Settings
from serve_app.runtime import local_app
from statecore.models import NodeCommand


class NoRunner:
    """Stands in for the model runner when this process dispatches nothing."""

    async def run(self, cmd: NodeCommand) -> dict[str, Any]:
        raise RuntimeError("this server runs no dispatcher")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.uvicorn_server", description=__doc__)
    ap.add_argument("--data-dir", required=True, help="data directory (its api-token is the admin token)")
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dispatchers", type=int, default=0, help="outbox dispatchers in this process (default 0)")
    ap.add_argument("--detector-delay-ms", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings(data_dir=Path(args.data_dir), redis_url=args.redis_url, api_port=args.port,
                        detector_delay_ms=args.detector_delay_ms, reclaim_idle_ms=5000)
    app = local_app(settings, dispatchers=args.dispatchers, runner=None if args.dispatchers else NoRunner())
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
