"""Small helpers the benchmark scripts share: a timestamped progress line, a percentile over a
list, the server's ISO timestamps as epoch seconds, and SIGTERM taken as Ctrl-C."""

from __future__ import annotations

import signal
import time
from datetime import datetime


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, ``timeout``) as Ctrl-C: the script's ``finally`` blocks stop the ``hitl up`` it
    started. By default SIGTERM ends Python at once and leaves that stack, its Redis and its Ray running."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0–1) of ``values`` by nearest rank; NaN for none."""
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def parse_at(at: str) -> float:
    """An event's ``at`` (``…Z``) as epoch seconds."""
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
