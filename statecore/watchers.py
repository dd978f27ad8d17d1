"""Who still watches a job (seed 000: alert on a pause's age and on whether anyone still follows
the job), kept in Redis so that it adds up whichever replica streams the events.

Every SSE server (``serve_app.routes.events.EventHub``) writes, every ``BEACON_S``, the jobs it streams
into their partition's ``watched`` ZSET with an expiry ``WATCH_TTL_S`` ahead, and its count of open
streams into one hash. A job is watched while an expiry lies ahead; a server that died stops
renewing, so its jobs count as unwatched within ``WATCH_TTL_S``. ``read`` gives the deployment's
figures: open streams, waiting jobs nobody watches, and the age of the oldest such pause, at a cost
in the partitions and the jobs watched now, not in the jobs waiting.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import keys

BEACON_S = 10.0
WATCH_TTL_S = 30.0


async def beacon(r: Any, server: str, job_ids: Iterable[str], streams: int, now_ms: int | None = None) -> None:
    """Renew ``job_ids`` as watched by ``server`` and record its open ``streams`` (one pipeline)."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    until = now + int(WATCH_TTL_S * 1000)
    by_part: dict[int, dict[str, int]] = {}
    for j in job_ids:
        by_part.setdefault(keys.partition_of(j), {})[j] = until
    async with r.pipeline(transaction=False) as pipe:
        for p, members in by_part.items():
            pipe.zadd(keys.watched(p), members, gt=True)
            pipe.zremrangebyscore(keys.watched(p), "-inf", now)
        pipe.hset(keys.STREAMS, server, f"{streams}:{now}")
        await pipe.execute()


async def leave(r: Any, server: str) -> None:
    """A server that stops: its streams no longer count (its jobs expire on their own)."""
    await r.hdel(keys.STREAMS, server)


@dataclass(frozen=True)
class Watch:
    streams: int  # SSE streams open on every live event server
    waiting_unwatched: int  # jobs waiting on a person whose events nobody follows
    oldest_unwatched_pause_age_s: float  # 0 when there is none


async def read(r: Any, now_ms: int | None = None) -> Watch:
    """The deployment's figures at a cost in the partitions and the watched jobs, never in the
    waiting ones (SPEC §9: a scrape costs the same with 10 or 10 million jobs).

    One pipelined round: per partition the waiting count (ZCARD), its oldest pause and the jobs
    watched now; then, only for partitions where someone watches, a second round: which of those
    are waiting (ZMSCORE) and the ``watched + 1`` oldest pauses, among which lies the oldest
    unwatched one. Nothing reads the whole review queue."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    async with r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.zcard(keys.waiting(p))
            pipe.zrange(keys.waiting(p), 0, 0, withscores=True)
            pipe.zrangebyscore(keys.watched(p), now, "+inf")
        pipe.hgetall(keys.STREAMS)
        *res, servers = await pipe.execute()
    unwatched, oldest = 0, None
    followed: dict[int, list[str]] = {}
    for p in range(keys.PARTITIONS):
        n, first, live = res[3 * p : 3 * p + 3]
        unwatched += int(n)
        if live:  # the second round's size follows the watched jobs alone
            followed[p] = live
        elif first:
            oldest = _older(oldest, first[0][1])
    if followed:
        async with r.pipeline(transaction=False) as pipe:
            for p, live in followed.items():
                pipe.zmscore(keys.waiting(p), live)
                pipe.zrange(keys.waiting(p), 0, len(live), withscores=True)
            more = await pipe.execute()
        for i, live in enumerate(followed.values()):
            scores, heads = more[2 * i : 2 * i + 2]
            unwatched -= sum(score is not None for score in scores)
            watched = set(live)
            since = next((score for job_id, score in heads if job_id not in watched), None)
            if since is not None:
                oldest = _older(oldest, since)
    fresh = now - int(3 * BEACON_S * 1000)
    streams = 0
    for value in servers.values():
        n, _, at = str(value).partition(":")
        if at.isdigit() and int(at) >= fresh:
            streams += int(n)
    age = max(0.0, (now - oldest) / 1000) if oldest is not None else 0.0
    return Watch(streams=streams, waiting_unwatched=unwatched, oldest_unwatched_pause_age_s=age)


def _older(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)
