"""Runs the control plane under uvicorn in a background thread (real Redis, real models in threads)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import uvicorn

from serve_app.config import Settings
from serve_app.redis_server import free_port
from serve_app.runtime import local_app


class LocalServer:
    def __init__(self, data_dir: Path, redis_url: str, *, tokens: str | None = None, dispatchers: int = 1,
                 **settings: object) -> None:
        self.port = free_port()
        self.settings = Settings(data_dir=data_dir, redis_url=redis_url, tokens=tokens, api_port=self.port,
                                 reclaim_idle_ms=3000, **settings)  # type: ignore[arg-type]
        self.app = local_app(self.settings, dispatchers=dispatchers)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> "LocalServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("control plane did not become ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
