"""Webhooks (docs/protocol.md § Webhooks): what is delivered, how it is signed, and its queue.

A delivery is queued by the script that records the event, in the same atomic step as the change
(``queue_webhook`` in ``lua/_lib.lua``; a policy's drop to shadow in ``lua/policy_mode.lua``), in a
STREAM of the job's partition (the policy's slot for its events), and only while that stream exists:
a deliverer creates it with its consumer group (:func:`ensure_group`), so a deployment without
webhooks queues nothing. The deliverers (``serve_app.work.webhook_delivery``) read the streams
through one group (``keys.WEBHOOK_GROUP``), post each entry to every webhook that wants its type,
and acknowledge (and delete) it once each has answered 2xx or been given up: at least once, with the
event's id in ``X-Hitl-Event-Id`` for the receiver to deduplicate on.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from . import keys
from .outbox import create_groups

EVENT_TYPES = ("review.waiting", "job.finished", "policy.shadow")
SIGNATURE_HEADER = "X-Hitl-Signature"  # t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
ID_HEADER = "X-Hitl-Event-Id"
TYPE_HEADER = "X-Hitl-Event"
ATTEMPT_HEADER = "X-Hitl-Delivery-Attempt"
TOLERANCE_S = 300  # how old a signature's timestamp a receiver accepts (replay window)
LOG_CAP = 1000  # the delivery log keeps about this many entries (MAXLEN ~)

_EVENTS_PART = re.compile(r"^(\*|[a-z.]+(,[a-z.]+)*)$")
_TYPES = ", ".join(EVENT_TYPES)


@dataclass(frozen=True)
class Webhook:
    """One ``--webhook [EVENTS=]URL``: where to post, and which event types (all when none named)."""

    url: str
    events: frozenset[str] = frozenset(EVENT_TYPES)

    @classmethod
    def parse(cls, spec: str) -> Webhook:
        """``URL`` (every type) or ``TYPE[,TYPE...]=URL``; ValueError names what is wrong."""
        spec = spec.strip()
        head, sep, rest = spec.partition("=")
        events: frozenset[str] = frozenset(EVENT_TYPES)
        url = spec
        if sep and "/" not in head and ":" not in head:
            if not _EVENTS_PART.match(head):
                raise ValueError(f"webhook {spec!r}: the part before '=' must be event types ({_TYPES})")
            if head != "*":
                named = set(head.split(","))
                unknown = sorted(named - set(EVENT_TYPES))
                if unknown:
                    raise ValueError(f"webhook {spec!r}: unknown event {unknown[0]!r} (one of {_TYPES})")
                events = frozenset(named)
            url = rest
        if not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"webhook {spec!r}: the URL must start with http:// or https:// and name a host")
        return cls(url, events)

    def wants(self, event_type: str) -> bool:
        return event_type in self.events


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The signature header's value: ``t=<timestamp>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``
    (the timestamp is signed with the body: a replay after ``TOLERANCE_S`` is refused)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, body: bytes, header: str, now: float | None = None, tolerance_s: int = TOLERANCE_S) -> bool:
    """What a receiver checks: the header parses, its timestamp is within ``tolerance_s`` of now, and
    one of its ``v1`` signatures matches (compared in constant time)."""
    parts = [p.partition("=") for p in header.split(",")]
    stamps = [v for k, _, v in parts if k.strip() == "t"]
    sigs = [v for k, _, v in parts if k.strip() == "v1"]
    if len(stamps) != 1 or not stamps[0].isdigit() or not sigs:
        return False
    t = int(stamps[0])
    if abs((time.time() if now is None else now) - t) > tolerance_s:
        return False
    want = sign(secret, body, t).partition(",v1=")[2]
    return any(hmac.compare_digest(want, s) for s in sigs)


@dataclass
class Delivery:
    """One queued event: its stream entry, its id and type, and the JSON body every webhook gets."""

    stream: str
    entry_id: str
    event_id: str
    type: str
    body: bytes
    deliveries: int = 1
    done: set[str] = field(default_factory=set)  # the webhooks (URLs) that took it or were given up

    @classmethod
    def from_entry(cls, stream: str, entry_id: str, f: dict[str, str]) -> Delivery:
        kind = f.get("type", "")
        doc: dict[str, Any] = {"type": kind, "created_at": f.get("at")}
        if kind == "policy.shadow":
            doc |= {"id": f"policy:{entry_id}", "policy": f.get("policy"), "reason": f.get("reason")}
        else:
            doc |= {
                "id": f"{f.get('job')}:{f.get('event')}",
                "job_id": f.get("job"),
                "event_id": int(f.get("event") or 0),
                "status": f.get("status"),
                "version": int(f.get("version") or 0),
                "data": json.loads(f.get("data") or "{}"),
            }
        body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return cls(stream, entry_id, str(doc["id"]), kind, body)


def _deliveries(stream: str, entries: list[Any]) -> list[Delivery]:
    # An entry trimmed away while pending comes back without fields: nothing left to deliver.
    return [Delivery.from_entry(stream, eid, f) for eid, f in entries if f and f.get("type")]


async def ensure_group(r: Any) -> None:
    """Create the deliverers' group, and with it every webhook stream: from now on the scripts queue
    deliveries (idempotent; after Redis came back empty, the streams come back with it)."""
    await create_groups(r, keys.all_webhook_streams(), keys.WEBHOOK_GROUP)


async def read(r: Any, consumer: str, count: int, block_ms: int = 1000, cluster: bool = False) -> list[Delivery]:
    """Up to ``count`` new deliveries for this deliverer (each entry goes to one deliverer)."""
    if count <= 0:
        return []
    streams = keys.all_webhook_streams()
    out: list[Delivery] = []
    if not cluster:
        every = {s: ">" for s in streams}
        res = await r.xreadgroup(keys.WEBHOOK_GROUP, consumer, every, count=count, block=block_ms or None)
        for stream, entries in res or []:
            out += _deliveries(stream, entries)
        return out  # COUNT applies per stream: a few more than asked, held until done
    for s in streams:  # a multi-stream XREADGROUP would be CROSSSLOT on a cluster: each in turn
        for stream, entries in await r.xreadgroup(keys.WEBHOOK_GROUP, consumer, {s: ">"}, count=count - len(out)) or []:
            out += _deliveries(stream, entries)
        if len(out) >= count:
            break
    if not out and block_ms:
        await asyncio.sleep(min(block_ms, 200) / 1000)
    return out


async def reclaim(r: Any, consumer: str, min_idle_ms: int, count: int = 64) -> list[Delivery]:
    """Deliveries another deliverer held for ``min_idle_ms`` without acknowledging them (it died
    mid-delivery): now this one's, to post again to every webhook (hence: at least once)."""
    streams = keys.all_webhook_streams()
    async with r.pipeline(transaction=False) as pipe:
        for s in streams:
            pipe.xautoclaim(s, keys.WEBHOOK_GROUP, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count)
        claimed = await pipe.execute(raise_on_error=False)
    out: list[Delivery] = []
    for s, res in zip(streams, claimed, strict=True):
        if isinstance(res, ResponseError):
            continue  # NOGROUP: the read re-creates the groups
        if isinstance(res, Exception):
            raise res
        for d in _deliveries(s, res[1]):
            d.deliveries = 2
            out.append(d)
    return out


async def renew(r: Any, consumer: str, held: list[Delivery]) -> None:
    """Keep the idle time of the deliveries still being retried here short: no other deliverer
    reclaims a delivery that is only waiting for its next attempt."""
    if not held:
        return
    async with r.pipeline(transaction=False) as pipe:
        for d in held:
            pipe.xclaim(d.stream, keys.WEBHOOK_GROUP, consumer, 0, [d.entry_id], justid=True)
        await pipe.execute(raise_on_error=False)


async def ack(r: Any, d: Delivery) -> None:
    """Acknowledge and delete: the streams hold only deliveries still to make."""
    async with r.pipeline(transaction=False) as pipe:
        pipe.xack(d.stream, keys.WEBHOOK_GROUP, d.entry_id)
        pipe.xdel(d.stream, d.entry_id)
        await pipe.execute()


async def pending(r: Any) -> int:
    """Deliveries not yet made (queued or being retried): the streams' lengths, one round trip."""
    async with r.pipeline(transaction=False) as pipe:
        for s in keys.all_webhook_streams():
            pipe.xlen(s)
        return sum(int(n or 0) for n in await pipe.execute())


async def log_attempt(r: Any, record: dict[str, Any]) -> None:
    """One line of the delivery log (``hitl admin webhooks``; ``GET /admin/webhooks/log``): a
    bounded stream, the newest ``LOG_CAP`` or so attempts. Never a secret or a signature."""
    fields = {k: "" if v is None else str(v) for k, v in record.items()}
    await r.xadd(keys.WEBHOOK_LOG, fields, maxlen=LOG_CAP, approximate=True)


async def read_log(r: Any, count: int = 100) -> list[dict[str, str]]:
    """The newest ``count`` attempts, newest first."""
    rows = await r.xrevrange(keys.WEBHOOK_LOG, count=count)
    return [{"log_id": eid, **f} for eid, f in rows]
