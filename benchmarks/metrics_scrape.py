"""What does a /metrics scrape cost with 1 000, 100 000 and 300 000 jobs waiting for review? (It
should be the same: SPEC §9 asks for a cost in the number of partitions.)

Against a redis-server of our own (AOF everysec): at each size, the jobs waiting for their box
review are made through the real scripts (``harness.bulk.bulk_waiting``: create_job, then the
detection's apply_report, pipelined; the outbox drained as a dispatcher leaves it), ``--watched`` of
them followed by an SSE server (``watchers.beacon``, as the Events replicas write it), and then R
timed scrapes of everything the /metrics route (``serve_app.routes.api``) reads from Redis, in its order:
``counters.read``, ``metrics.refresh_stuck`` (the running nodes, then ``watchers.read``), the
outbox's pending count, the shared counters' flush and refresh, and the render. Each part is timed
on its own too, and the Redis server's own CPU time per scrape is read from ``INFO cpu``.

``--redis-dir DIR`` keeps the data: a later run on the same directory starts from the jobs already
there and creates only what a size lacks (a size below what is there is skipped), so the code before
and after a change can be timed on the same 300 000 jobs without making them twice.

    .venv/bin/python benchmarks/metrics_scrape.py --json benchmarks/out/metrics_scrape.json
    .venv/bin/python benchmarks/metrics_scrape.py --sizes 300000 --redis-dir /tmp/scrape-300k
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness.bulk import bulk_waiting
from hitl_review.serve_app.observability import metrics
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.statecore import counters, keys, watchers, webhooks
from hitl_review.statecore.store import Store, StoreConfig

WINDOW_S = 3600.0


def parts(store: Store) -> dict[str, Callable[[], Awaitable[Any]]]:
    """The /metrics route's Redis reads (serve_app/routes/api.py ``prometheus``), one callable each."""
    r = store.r

    async def shared() -> None:
        await metrics.SHARED.flush(r)
        await metrics.SHARED.refresh(r)

    return {
        "counters_read": lambda: counters.read(r, WINDOW_S),
        "read_stuck": lambda: metrics.read_stuck(r, WINDOW_S),
        "watchers_read": lambda: watchers.read(r),
        "outbox_pending": store.outbox_pending,
        "webhooks_pending": lambda: webhooks.pending(r),
        "shared": shared,
    }


async def scrape(store: Store) -> bytes:
    """One whole scrape as the route runs it: the reads, the gauges updated, the page rendered."""
    await metrics.refresh_from_store(store, WINDOW_S)
    return metrics.render()


def summary(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "median_ms": statistics.median(samples),
        "p95_ms": samples[int(0.95 * (len(samples) - 1))],
        "min_ms": samples[0],
    }


async def redis_usec(store: Store) -> int:
    """The Redis server's CPU time so far (user + system), µs: a script's own commands are in it
    once (``INFO commandstats`` would count them in the script's time and again on their own)."""
    cpu = await store.r.info("cpu")
    return int(1e6 * (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])))


class Watching:
    """Keeps ``ids`` watched while a measure runs (the beacon's TTL is 30 s): renewed between timed
    calls every few seconds, its own Redis time counted apart."""

    def __init__(self, store: Store, ids: list[str]) -> None:
        self.store, self.ids, self.at, self.redis_usec = store, ids, 0.0, 0

    async def renew(self) -> None:
        if time.monotonic() - self.at < 5:
            return
        before = await redis_usec(self.store)
        await watchers.beacon(self.store.r, "bench-events", self.ids, streams=len(self.ids))
        self.redis_usec += await redis_usec(self.store) - before
        self.at = time.monotonic()


async def measure(store: Store, reps: int, watching: Watching) -> dict[str, Any]:
    await scrape(store)  # warm: connections, scripts loaded
    row: dict[str, Any] = {}
    for name, call in parts(store).items():
        samples = []
        for _ in range(max(3, reps // 2)):
            await watching.renew()
            t0 = time.perf_counter()
            await call()
            samples.append((time.perf_counter() - t0) * 1000)
        row[name] = summary(samples)
    samples = []
    watching.redis_usec = 0
    before = await redis_usec(store)
    cpu_s = 0.0  # this process's CPU per scrape: what a shared machine's load does not stretch
    for _ in range(reps):
        await watching.renew()
        t0, c0 = time.perf_counter(), time.process_time()
        page = await scrape(store)
        samples.append((time.perf_counter() - t0) * 1000)
        cpu_s += time.process_time() - c0
    row["client_cpu_ms_per_scrape"] = cpu_s / reps * 1000
    # The INFO calls themselves are counted too, a few µs each.
    row["redis_cpu_ms_per_scrape"] = (await redis_usec(store) - before - watching.redis_usec) / reps / 1000
    row["scrape"] = summary(samples)
    row["page_bytes"] = len(page)
    return row


async def waiting_now(store: Store) -> int:
    return int((await counters.read(store.r, WINDOW_S)).waiting)


async def follow(store: Store, n: int) -> Watching:
    """``n`` waiting jobs (the oldest of each partition in turn) followed by one SSE server, as its
    beacon writes them, while the measure runs."""
    async with store.r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.zrange(keys.waiting(p), 0, n // keys.PARTITIONS)
        heads = await pipe.execute()
    ids = [head[k] for k in range(n // keys.PARTITIONS + 1) for head in heads if k < len(head)][:n]
    return Watching(store, ids)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = args.redis_dir or Path(tempfile.mkdtemp(prefix="hitl-bench-metrics-"))
    server = RedisServer(Path(tmp) / "redis").start(timeout=600 if args.redis_dir else 15)  # loading kept data
    store = Store.from_url(server.url, StoreConfig())
    rows = []
    try:
        await store.ensure_groups()
        for size in args.sizes:
            have = await waiting_now(store)
            if have > size:
                print(f"{size} waiting: skipped, {have} already there")
                continue
            t0 = time.perf_counter()
            await bulk_waiting(store, size - have)
            created_s = time.perf_counter() - t0
            watching = await follow(store, args.watched)
            waiting = await waiting_now(store)
            row = {"waiting": waiting, "created_s": created_s, **await measure(store, args.reps, watching)}
            row["used_memory_mb"] = (await store.r.info("memory"))["used_memory"] / 2**20
            watching.at = 0
            await watching.renew()
            w = await watchers.read(store.r)
            row["waiting_unwatched"] = w.waiting_unwatched
            rows.append(row)
            print_row(row)
        return {
            "python": platform.python_version(),
            "redis": (await store.r.info("server"))["redis_version"],
            "partitions": keys.PARTITIONS,
            "reps": args.reps,
            "watched": args.watched,
            "rows": rows,
        }
    finally:
        await store.close()
        server.stop()


def print_row(row: dict[str, Any]) -> None:
    s = row["scrape"]
    each = ", ".join(f"{k} {row[k]['median_ms']:.2f}" for k in parts_names())
    print(
        f"{row['waiting']:>8} waiting | scrape median {s['median_ms']:.2f} ms, p95 {s['p95_ms']:.2f}, "
        f"min {s['min_ms']:.2f} | Redis CPU {row['redis_cpu_ms_per_scrape']:.2f} ms/scrape, "
        f"client CPU {row.get('client_cpu_ms_per_scrape', float('nan')):.2f} | {each} "
        f"| unwatched {row['waiting_unwatched']} | made in {row['created_s']:.0f} s, {row['used_memory_mb']:.0f} MiB",
        flush=True,
    )


def parts_names() -> tuple[str, ...]:
    return ("counters_read", "read_stuck", "watchers_read", "outbox_pending", "webhooks_pending", "shared")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,100000", help="waiting jobs at each measure, ascending")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--watched", type=int, default=100, help="of the jobs made, this many followed by an SSE server")
    ap.add_argument("--redis-dir", type=Path, default=None, help="keep (and reuse) the Redis data here")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    result = asyncio.run(main_async(args))
    if len(result["rows"]) > 1:
        first, last = result["rows"][0], result["rows"][-1]
        ratio = last["scrape"]["median_ms"] / first["scrape"]["median_ms"]
        print(f"ratio (median scrape, {last['waiting']} / {first['waiting']} waiting): {ratio:.2f}  (target: 1)")
        result["ratio_last_over_first"] = ratio
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
