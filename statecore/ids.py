"""Identifiers, clocks and canonical hashing, in one place."""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import orjson


def new_id(prefix: str) -> str:
    """``prefix_`` + 20 hex chars (80 random bits)."""
    return f"{prefix}_{secrets.token_hex(10)}"


def now_iso(ts: float | None = None) -> str:
    dt = datetime.fromtimestamp(time.time() if ts is None else ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8. Used for hashing and for stored bytes.

    orjson (several times faster than json on this hot path); non-finite floats never reach it:
    every bbox is checked finite before planning."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


def payload_hash(body: Any, identity: str) -> str:
    """Canonical hash of a request body together with the caller's identity.

    The identity is part of the hash so that the same intervention id reused by
    another reviewer is a conflict, never a replay.
    """
    return hashlib.sha256(canonical_json({"body": body, "identity": identity}).encode()).hexdigest()


def batch_of(idem_key: str | None) -> str | None:
    """``hitl submit`` keys a file ``<batch>:<sha256>`` (client.batch): the batch name, if any."""
    if not idem_key or ":" not in idem_key:
        return None
    return idem_key.rsplit(":", 1)[0]
