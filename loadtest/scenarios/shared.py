"""What every scenario shares: the run's configuration, its generated images, the jobs and keys
users hand to each other, and the counters behind the summary (one ``SH`` per locust process)."""

from __future__ import annotations

import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from loadtest.common import Recorder

API = "/api/v1"
SCENARIOS = ("Submitter", "Reviewer", "DoubleClicker", "RivalReviewers", "StaleTab", "Canceller")
DEFAULT_WEIGHTS = {
    "Submitter": 2,
    "Reviewer": 3,
    "DoubleClicker": 1,
    "RivalReviewers": 1,
    "StaleTab": 1,
    "Canceller": 1,
}
LOSING_409 = {"409 VERSION_CONFLICT", "409 PAUSE_NOT_ACTIVE", "409 PAUSE_TOKEN_MISMATCH"}


# --------------------------------------------------------------------------- shared state


@dataclass
class Image:
    png: bytes
    boxes: list[list[int]]  # true object boxes, for plausible manual boxes
    size: tuple[int, int]


@dataclass
class JobRef:
    job_id: str
    image: int


@dataclass
class Shared:
    """What the users of one locust process share: the job pool, images, tallies."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    token: str = ""
    images: list[Image] = field(default_factory=list)
    pool: deque[JobRef] = field(default_factory=lambda: deque(maxlen=500))
    keys: deque[tuple[str, int, str, bytes]] = field(default_factory=lambda: deque(maxlen=300))
    recorder: Recorder = field(default_factory=lambda: Recorder(None))
    names: Counter[str] = field(default_factory=Counter)
    status_codes: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)
    checks: dict[str, Counter[str]] = field(default_factory=dict)
    summary_path: str = ""
    repeat: float = 0.15
    key_conflict: float = 0.03
    stream_timeout: float = 30.0
    rivals: int = 3
    started: float = 0.0


SH = Shared()


def pairs(spec: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        name, _, value = item.partition("=")
        if name not in SCENARIOS or not value.strip().isdigit():
            raise SystemExit(f"bad entry {item!r}: want Class=integer with Class one of {', '.join(SCENARIOS)}")
        out[name] = int(value)
    return out


def json_body(resp: Any) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
