"""Dead letters: node reports and commands given up on after their retries
(docs/protocol.md § Executors and the outbox).

One HASH per partition (:func:`statecore.keys.dead_letters`), in the job's partition, so a dead
letter lives in the job's hash slot on a Redis Cluster. A record is
``{id, job_id, kind: "report" | "command", reason, at, payload}``; its id names the partition
(``dl_p17_<hex>``), so a replay finds it without a scan. Adding one counts it in the job's
partition (``dead_letters``, shown by ``/metrics``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel

from . import counters, errors, keys
from .ids import now_iso
from .models import NodeReport

Kind = Literal["report", "command"]
ID_RE = re.compile(r"^dl_p([0-9]{1,3})_[0-9a-f]{32}$")


class DeadLetter(BaseModel):
    id: str
    job_id: str
    kind: Kind
    reason: str
    at: str
    payload: dict[str, Any]


class ReplayResult(BaseModel):
    """What a replay did: ``APPLIED``, ``DUPLICATE`` or ``REPORT_IGNORED`` for a report (through the
    normal report path), ``REQUEUED`` for a command."""

    id: str
    job_id: str
    kind: Kind
    result: str


class DeadLetterNotFound(errors.HitlError):
    code = "DEAD_LETTER_NOT_FOUND"
    status = 404


def new_id(job_id: str) -> str:
    return f"dl_p{keys.partition_of(job_id)}_{uuid.uuid4().hex}"


def partition_of(dead_letter_id: str) -> int | None:
    m = ID_RE.match(dead_letter_id)
    if m is None or int(m.group(1)) >= keys.PARTITIONS:
        return None
    return int(m.group(1))


async def add(r: Any, *, job_id: str, kind: Kind, reason: str, payload: dict[str, Any]) -> DeadLetter:
    """Store a dead letter and count it (``dead_letters`` of the job's partition)."""
    letter = DeadLetter(id=new_id(job_id), job_id=job_id, kind=kind, reason=reason, at=now_iso(), payload=payload)
    await r.hset(keys.dead_letters(keys.partition_of(job_id)), letter.id, letter.model_dump_json())
    await counters.incr(r, job_id, "dead_letters")
    return letter


async def list_all(r: Any) -> list[DeadLetter]:
    """Every dead letter, oldest first: one HGETALL per partition, pipelined."""
    async with r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.hgetall(keys.dead_letters(p))
        res = await pipe.execute()
    out = [DeadLetter.model_validate_json(raw) for found in res for raw in found.values()]
    return sorted(out, key=lambda d: (d.at, d.id))


async def get(r: Any, dead_letter_id: str) -> DeadLetter:
    p = partition_of(dead_letter_id)
    raw = await r.hget(keys.dead_letters(p), dead_letter_id) if p is not None else None
    if raw is None:
        raise DeadLetterNotFound(f"dead letter {dead_letter_id} not found")
    return DeadLetter.model_validate_json(raw)


async def remove(r: Any, letter: DeadLetter) -> bool:
    """Delete it; False when another replay removed it first."""
    return bool(await r.hdel(keys.dead_letters(keys.partition_of(letter.job_id)), letter.id))


async def requeue_command(r: Any, letter: DeadLetter) -> str:
    """Put a dead-lettered command back into its job's outbox (its lane's stream), as the state scripts write one
    (fields ``job`` and ``cmd``): a dispatcher starts it only if it is still the job's current node."""
    entry_id: str = await r.xadd(
        keys.command_outbox(letter.job_id, str(letter.payload.get("node_type", ""))),
        {
            "job": letter.job_id,
            "cmd": json.dumps(letter.payload, separators=(",", ":")),
        },
    )
    return entry_id


async def replay(store: Any, dead_letter_id: str, actor: str = "admin") -> ReplayResult:
    """Apply a report dead letter through ``store.apply_report`` (a superseded or ended job gets
    ``REPORT_IGNORED``) or put a command one back into the outbox, and remove it. It is removed
    first, so two replays of one id act once; put back when acting fails (Redis went away)."""
    letter = await get(store.r, dead_letter_id)
    if not await remove(store.r, letter):
        raise DeadLetterNotFound(f"dead letter {dead_letter_id} not found (replayed meanwhile)")
    try:
        if letter.kind == "report":
            report = NodeReport.model_validate(letter.payload)
            applied = await store.apply_report(report, actor=actor, action="DEAD_LETTER_REPLAY")
            result = {"OK": "APPLIED", "IGNORED": "REPORT_IGNORED"}.get(applied, applied)
        else:
            await requeue_command(store.r, letter)
            result = "REQUEUED"
            await store.audit_only(letter.job_id, actor, "DEAD_LETTER_REPLAY", "REQUEUED")
    except BaseException:
        await store.r.hset(keys.dead_letters(keys.partition_of(letter.job_id)), letter.id, letter.model_dump_json())
        raise
    return ReplayResult(id=letter.id, job_id=letter.job_id, kind=letter.kind, result=result)
