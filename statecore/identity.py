"""The store's identity, and what a process last saw in it: how a Redis that came back empty
(FLUSHALL, a failover to an empty replica, a restart without persistence) is noticed and what
it lost is reported (docs/protocol.md § Redis outages).

One key (:data:`statecore.keys.STORE_ID`) holds ``<uuid>|<created_at>``, written with ``SET NX``
by the first process that finds it missing. A process remembers the identity it first saw; when
it later finds another one, every job the store held before is gone.
"""

from __future__ import annotations

import uuid
from typing import Any

from . import counters, keys
from .ids import now_iso

LIVE_INDEXES = {"waiting": keys.waiting, "queued": keys.queued, "running": keys.running}


async def ensure(r: Any) -> str:
    """The store's identity, written now if it is missing."""
    mine = f"{uuid.uuid4().hex}|{now_iso()}"
    if await r.set(keys.STORE_ID, mine, nx=True):
        return mine
    found = await r.get(keys.STORE_ID)
    if found is None:  # removed between the two calls: try once more
        return await ensure(r)
    return found.decode() if isinstance(found, bytes) else str(found)


async def live_jobs(r: Any, cap: int = 10_000) -> tuple[dict[str, list[str]], bool]:
    """The ids of jobs waiting on a person, queued or running (from the partition indexes, each
    partition's oldest first), at most ``cap`` in all; and whether some were left out. Each index of
    each partition gives at most ``cap / partitions`` (rounded up): one look costs O(cap) whatever
    the backlog (a look every inspector pass read every live id: 100,000 waiting cost 151 ms of
    Redis CPU and 364 ms here per pass, to keep 10,000), and with fewer live jobs than that share in
    every partition, all of them."""
    per = -(-cap // keys.PARTITIONS)
    async with r.pipeline(transaction=False) as pipe:
        for index in LIVE_INDEXES.values():
            for p in range(keys.PARTITIONS):
                pipe.zrange(index(p), 0, per - 1)
                pipe.zcard(index(p))
        res = await pipe.execute()
    out: dict[str, list[str]] = {}
    total, truncated = 0, False
    for i, name in enumerate(LIVE_INDEXES):
        ids: dict[str, None] = {}  # a job cutting its subjects is there once per subject node: once here
        answers = res[i * 2 * keys.PARTITIONS : (i + 1) * 2 * keys.PARTITIONS]
        for chunk, held in zip(answers[0::2], answers[1::2], strict=True):
            truncated = truncated or int(held) > len(chunk)
            for raw in chunk:
                if total >= cap:
                    truncated = True
                    break
                job_id = keys.split_member(raw.decode() if isinstance(raw, bytes) else str(raw))[0]
                if job_id not in ids:
                    ids[job_id] = None
                    total += 1
        out[name] = list(ids)
    return out, truncated


async def seen(r: Any, cap: int = 10_000) -> dict[str, Any]:
    """What the store holds now, in the form a reset report keeps: jobs per status and the live
    jobs' ids."""
    statuses = await counters.read_statuses(r)
    live, truncated = await live_jobs(r, cap)
    return {
        "at": now_iso(),
        "jobs_by_status": {k: v for k, v in statuses.items() if v},
        "live_jobs": live,
        "live_jobs_truncated": truncated,
    }
