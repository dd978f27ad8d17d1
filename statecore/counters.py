"""The counters behind ``/metrics`` (README, Operations), held in Redis.

Every state-changing script keeps them in the same atomic step as the job's state (``apply_plan``
in ``lua/_lib.lua``): per partition, one HASH (:func:`statecore.keys.counts`) with

- one field per status: the jobs stored in that status (finished ones until pruning drops them);
- cumulative totals: ``submitted``, ``finished``, ``user_cancelled``, ``node_starts``,
  ``node_retries`` (NODE_STARTED with attempt > 1), ``node_results`` (node results applied),
  and ``writeback_failures`` / ``dead_letters`` (incremented by the write-back path: :func:`incr`);
- coverage buckets ``<kind>:<minute>`` of the jobs *created* in that minute: ``sub`` submitted,
  ``term`` terminal (not cancelled), ``wait`` waiting on a person now, ``ucan`` cancelled by a user.
  Buckets older than :data:`HORIZON_S` are deleted as new minutes open.

So every API replica reads the same numbers, and a read costs O(partitions × window minutes)
whatever the number of stored jobs: nothing here walks the jobs. Nothing is kept per live job.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

from redis.asyncio.cluster import RedisCluster

from . import keys
from .states import TERMINAL, WAITING, JobStatus

STATUSES: tuple[str, ...] = tuple(s.value for s in JobStatus)
TOTALS: tuple[str, ...] = (
    "submitted",
    "finished",
    "user_cancelled",
    "node_starts",
    "node_retries",
    "node_results",
    "writeback_failures",
    "dead_letters",
)
BUCKET_KINDS: tuple[str, ...] = ("sub", "term", "wait", "ucan")
MINUTE_MS = 60_000
HORIZON_S = 6 * 3600  # = HORIZON minutes in _lib.lua: the longest coverage window
RUNNING_CANDIDATES = 4  # per partition, nearest deadlines read for the oldest running node

_LUA = resources.files("hitl_review.statecore") / "lua"
_PRUNE = (_LUA / "prune_finished.lua").read_text()
_READ = (_LUA / "read_counts.lua").read_text()


@dataclass(frozen=True)
class Coverage:
    """Jobs created in the last ``window_s`` seconds (whole minutes), and what became of them."""

    window_s: float
    submitted: int
    terminal: int  # terminal and not cancelled by a user
    waiting: int  # waiting on a person now
    user_cancelled: int

    @property
    def ratio(self) -> float:
        """terminal ÷ (submitted − waiting on a person − user-cancelled); 1.0 when that is 0."""
        denominator = self.submitted - self.waiting - self.user_cancelled
        return 1.0 if denominator <= 0 else self.terminal / denominator


@dataclass(frozen=True)
class Snapshot:
    by_status: dict[str, int]  # every status, zero included
    totals: dict[str, int]  # every name of TOTALS
    coverage: Coverage
    backlog: int  # node commands queued, not yet started (= Store.backlog()[0])
    oldest_queued_age_s: float
    oldest_pause_age_s: float
    oldest_running_age_s: float  # since the oldest running node started
    oldest_heartbeat_age_s: float  # the most lapsed heartbeat of a running node

    @property
    def waiting(self) -> int:
        return sum(self.by_status[s.value] for s in WAITING)


def window_minutes(window_s: float, now_ms: int) -> list[int]:
    """The minute buckets a coverage window reads: the current minute and the ones before it."""
    if not 60 <= window_s <= HORIZON_S:
        raise ValueError(f"coverage window must be 60..{HORIZON_S} s, got {window_s}")
    cur = now_ms // MINUTE_MS
    return list(range(cur - int(window_s // 60) + 1, cur + 1))


def _int(v: Any) -> int:
    return int(v) if v is not None else 0


def _age_s(now_ms: int, first: list[tuple[str, float]]) -> float:
    return max(0.0, (now_ms - first[0][1]) / 1000) if first else 0.0


async def read(r: Any, window_s: float = 3600.0, now_ms: int | None = None) -> Snapshot:
    """Everything ``/metrics`` shows from Redis: one pipelined round trip over the partitions
    (a read-only script per partition sums the window's buckets), and a second one for the start
    times of the few running nodes nearest their deadline, when any node runs."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    minutes = window_minutes(window_s, now_ms)
    fields = [*STATUSES, *TOTALS]
    read_counts = r.register_script(_READ)  # sums the window's buckets server-side
    script_args = [minutes[0], minutes[-1], *fields]
    # redis-py refuses scripts in a cluster pipeline: there, the 64 reads go concurrently instead.
    cluster = isinstance(r, RedisCluster)
    async with r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            if not cluster:
                await read_counts(keys=[keys.counts(p)], args=script_args, client=pipe)
            pipe.zcard(keys.queued(p))
            pipe.zrange(keys.queued(p), 0, 0, withscores=True)
            pipe.zrange(keys.waiting(p), 0, 0, withscores=True)
            pipe.zrange(keys.heartbeats(p), 0, 0, withscores=True)
            pipe.zrange(keys.running(p), 0, RUNNING_CANDIDATES - 1)
        if cluster:
            counts, res = await asyncio.gather(
                asyncio.gather(*(read_counts(keys=[keys.counts(p)], args=script_args) for p in range(keys.PARTITIONS))),
                pipe.execute(),
            )
            res = [x for p in range(keys.PARTITIONS) for x in (counts[p], *res[p * 5 : p * 5 + 5])]
        else:
            res = await pipe.execute()
    by_status = dict.fromkeys(STATUSES, 0)
    totals = dict.fromkeys(TOTALS, 0)
    window = dict.fromkeys(BUCKET_KINDS, 0)
    backlog, queued_age, pause_age, beat_age = 0, 0.0, 0.0, 0.0
    running: list[str] = []
    n_status, n_totals = len(STATUSES), len(TOTALS)
    for i in range(0, len(res), 6):
        values, n_queued, first_queued, first_waiting, first_beat, nearest = res[i : i + 6]
        for name, v in zip(STATUSES, values[:n_status], strict=True):
            by_status[name] += _int(v)
        for name, v in zip(TOTALS, values[n_status : n_status + n_totals], strict=True):
            totals[name] += _int(v)
        for kind, v in zip(BUCKET_KINDS, values[n_status + n_totals :], strict=True):
            window[kind] += _int(v)
        backlog += int(n_queued)
        queued_age = max(queued_age, _age_s(now_ms, first_queued))
        pause_age = max(pause_age, _age_s(now_ms, first_waiting))
        beat_age = max(beat_age, _age_s(now_ms, first_beat))
        running.extend(nearest)
    coverage = Coverage(window_s, window["sub"], window["term"], window["wait"], window["ucan"])
    return Snapshot(
        by_status=by_status,
        totals=totals,
        coverage=coverage,
        backlog=backlog,
        oldest_queued_age_s=queued_age,
        oldest_pause_age_s=pause_age,
        oldest_running_age_s=await _oldest_running_age_s(r, running, now_ms),
        oldest_heartbeat_age_s=beat_age,
    )


async def window_sums(r: Any, first_minute: int, last_minute: int) -> dict[str, int]:
    """The coverage buckets of the minutes ``first_minute..last_minute`` summed over the partitions, by kind
    (``BUCKET_KINDS``): summed server-side by the read script, so a partition answers four numbers whatever
    the window's length (the settled coverage of ``/metrics`` read each bucket field: ~220 per partition)."""
    read_counts = r.register_script(_READ)
    args = [first_minute, last_minute]
    if isinstance(r, RedisCluster):  # redis-py refuses scripts in a cluster pipeline
        res = await asyncio.gather(*(read_counts(keys=[keys.counts(p)], args=args) for p in range(keys.PARTITIONS)))
    else:
        async with r.pipeline(transaction=False) as pipe:
            for p in range(keys.PARTITIONS):
                await read_counts(keys=[keys.counts(p)], args=args, client=pipe)
            res = await pipe.execute()
    return {kind: sum(int(values[k]) for values in res) for k, kind in enumerate(BUCKET_KINDS)}


async def _oldest_running_age_s(r: Any, job_ids: list[str], now_ms: int) -> float:
    """Since the start of the oldest of these running nodes (their ``current_node.started_at``).
    The running index is ordered by deadline (start + the type's maximum execution time): with one
    maximum for every node type its first entry is the oldest start; with per-type maxima, the
    oldest of the first few per partition (a lower bound when the spread is wide)."""
    if not job_ids:
        return 0.0
    async with r.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(*keys.node_location(job_id))
        nodes = await pipe.execute()
    oldest = 0.0
    for raw in nodes:
        started = json.loads(raw).get("started_at") if raw else None
        if started:
            oldest = max(oldest, now_ms / 1000 - datetime.fromisoformat(started).timestamp())
    return oldest


async def read_statuses(r: Any) -> dict[str, int]:
    """Jobs stored per status (every status, zero included): one HMGET per partition, pipelined."""
    async with r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.hmget(keys.counts(p), list(STATUSES))
        res = await pipe.execute()
    return {name: sum(_int(values[i]) for values in res) for i, name in enumerate(STATUSES)}


async def incr(r: Any, job_id: str, field: str, n: int = 1) -> None:
    """Add ``n`` to a cumulative counter (``writeback_failures``, ``dead_letters``) of the job's
    partition: for the write-back path, which counts what it could not apply."""
    if field not in TOTALS:
        raise ValueError(f"unknown counter {field!r}")
    await r.hincrby(keys.counts(keys.partition_of(job_id)), field, n)


async def prune(r: Any, p: int, now_ms: int, batch: int) -> int:
    """Drop partition p's finished jobs whose retention passed from the ``jobs`` index and uncount
    their final status, atomically (two pruners never uncount a job twice). How many it dropped."""
    script = r.register_script(_PRUNE)
    keys_ = [keys.expiring(p), keys.jobs(p), keys.counts(p), keys.finished(p)]
    return int(await script(keys=keys_, args=[now_ms, batch]))


async def recount(r: Any, window_s: float = 3600.0, now_ms: int | None = None) -> tuple[dict[str, int], Coverage]:
    """The same numbers by walking every stored job (O(jobs)): what the counters must equal.
    For tests and the scrape-cost benchmark, never for ``/metrics``."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    minutes = set(window_minutes(window_s, now_ms))
    by_status = dict.fromkeys(STATUSES, 0)
    window = dict.fromkeys(BUCKET_KINDS, 0)
    for p in range(keys.PARTITIONS):
        for job_id, created_ms in await r.zrange(keys.jobs(p), 0, -1, withscores=True):
            status = await r.hget(keys.job(job_id).meta, "status") or await r.hget(keys.finished(p), job_id)
            if not status:
                continue
            by_status[status] += 1
            if int(created_ms) // MINUTE_MS in minutes:
                window["sub"] += 1
                window["wait"] += JobStatus(status) in WAITING
                window["ucan"] += status == JobStatus.CANCELLED
                window["term"] += JobStatus(status) in TERMINAL and status != JobStatus.CANCELLED
    return by_status, Coverage(window_s, window["sub"], window["term"], window["wait"], window["ucan"])
