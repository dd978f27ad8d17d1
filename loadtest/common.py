"""Pieces the locust scenarios, the invariant checker and the intervention benchmark share (the
token and the event stream come from ``harness.tokens`` and ``harness.sse``).

Kept free of locust and gevent imports so the checker and the benchmark can use
them from plain asyncio code.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPLAY_HEADER = "Idempotent-Replayed"


def request_id(prefix: str = "lt") -> str:
    """A value for ``X-Request-ID``: unique per request, greppable in server logs."""
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def outcome(status: int, replayed: bool, body: Mapping[str, Any] | None) -> str:
    """How the scenarios, the record and the benchmark name one answer:
    ``200``, ``202``, ``replay``, ``409 VERSION_CONFLICT``, ``400 INVALID_REQUEST``, ``error``."""
    if status == 0:
        return "error"
    if status < 300:
        return "replay" if replayed else str(status)
    code = body.get("code") if isinstance(body, Mapping) else None
    return f"{status} {code}" if code else str(status)


def is_replayed(headers: Mapping[str, str]) -> bool:
    return str(headers.get(REPLAY_HEADER, "")).lower() == "true"


class Recorder:
    """Appends one JSON object per line; safe from threads and greenlets.

    The checker reads it back to verify what clients saw against what Redis holds
    (replays byte-identical to the original, idempotent creation)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._fh = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", buffering=1)

    def write(self, **fields: Any) -> None:
        if self._fh is None:
            return
        fields.setdefault("t", round(time.time(), 4))
        line = json.dumps(fields, separators=(",", ":"), sort_keys=True)
        with self._lock:
            self._fh.write(line + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_records(path: str | Path | None) -> list[dict[str, Any]]:
    if not path or not Path(path).exists():
        return []
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON: {e}") from None
    return out


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def format_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain fixed-width table for terminals and CI logs."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
