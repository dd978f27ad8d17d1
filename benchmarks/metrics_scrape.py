"""What does a /metrics scrape cost with 100 and with 100 000 stored jobs? (It should be the same.)

Against a redis-server of our own (AOF everysec) in a temporary directory:

1. 100 jobs created through ``Store.create_job``; then R timed reads of ``statecore.counters.read``,
   exactly what the /metrics route runs against Redis (one pipelined round trip over the 64
   partitions, plus one for the running nodes' start times when any run), and, for contrast, one
   timed walk of every job (``counters.recount``: what ``count_by_status`` did before the counters).
2. 99 900 more jobs created through the same create_job script (the store's plan, keys and ARGV,
   pipelined in batches: no shortcut around the Lua), then the same R reads and one walk.

The counters are checked against the walk at both sizes. Prints a table, writes JSON.

    .venv/bin/python benchmarks/metrics_scrape.py --json benchmarks/out/metrics_scrape.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hitl_review.serve_app.redis_server import RedisServer
from hitl_review.statecore import counters, decide, keys, scripts
from hitl_review.statecore.ids import now_iso
from hitl_review.statecore.models import CreateJobResponse, ImageRef
from hitl_review.statecore.store import Store, StoreConfig

IMAGE = ImageRef(sha256="b" * 64, width=640, height=480, url="/api/v1/artifacts/img_bench.png")


async def bulk_create(store: Store, n: int, batch: int = 2000) -> float:
    """``n`` jobs through the create_job script, ``batch`` per pipeline; seconds taken."""
    script = store.r.register_script(scripts.source("create_job"))
    t0 = time.perf_counter()
    done = 0
    while done < n:
        async with store.r.pipeline(transaction=False) as pipe:
            for _ in range(min(batch, n - done)):
                job_id = keys.new_job_id()
                now, now_ms = now_iso(), int(time.time() * 1000)
                plan, _cmd = decide.plan_create(job_id, "bench", IMAGE, None, now, now_ms)
                body = CreateJobResponse(job_id=job_id, status=plan.status, version=1).model_dump_json()
                args = [*store._args(job_id, now, "bench"), plan.to_json(now), IMAGE.sha256, body, now_ms]
                await script(keys=keys.job(job_id).for_script(), args=args, client=pipe)
            res = await pipe.execute()
        assert all(r[0] == "OK" for r in res), res[:3]
        done += len(res)
    return time.perf_counter() - t0


async def time_reads(store: Store, reps: int) -> dict[str, float]:
    await counters.read(store.r)  # warm: connections, parser
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await counters.read(store.r)
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {
        "median_ms": statistics.median(samples),
        "p95_ms": samples[int(0.95 * (len(samples) - 1))],
        "min_ms": samples[0],
    }


async def measure(store: Store, jobs: int, reps: int, walk: bool) -> dict[str, Any]:
    reads = await time_reads(store, reps)
    snap = await counters.read(store.r)
    row: dict[str, Any] = {"jobs": jobs, "counters_read": reads, "stored_by_counters": sum(snap.by_status.values())}
    if walk:
        t0 = time.perf_counter()
        by_status, coverage = await counters.recount(store.r)
        row["walk_ms"] = (time.perf_counter() - t0) * 1000
        row["counters_equal_walk"] = (snap.by_status, snap.coverage) == (by_status, coverage)
    return row


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hitl-bench-metrics-"))
    server = RedisServer(tmp / "redis").start()
    store = Store.from_url(server.url, StoreConfig())
    try:
        await store.ensure_groups()
        for _ in range(args.small):
            await store.create_job("bench", IMAGE)
        small = await measure(store, args.small, args.reps, walk=True)
        created_s = await bulk_create(store, args.large - args.small)
        large = await measure(store, args.large, args.reps, walk=not args.no_walk)
        info = await store.r.info("memory")
        return {
            "python": platform.python_version(),
            "redis": (await store.r.info("server"))["redis_version"],
            "reps": args.reps,
            "small": small,
            "large": large,
            "bulk_create_s": created_s,
            "used_memory_mb": info["used_memory"] / 2**20,
            "ratio_large_over_small": large["counters_read"]["median_ms"] / small["counters_read"]["median_ms"],
        }
    finally:
        await store.close()
        server.stop()


def print_table(result: dict[str, Any]) -> None:
    print(f"metrics scrape cost (statecore.counters.read, {result['reps']} reads each; Redis {result['redis']})")
    print(f"{'stored jobs':>12} | {'median ms':>9} | {'p95 ms':>7} | {'min ms':>7} | {'walk every job ms':>17} | equal")
    for row in (result["small"], result["large"]):
        r = row["counters_read"]
        walk = f"{row['walk_ms']:.0f}" if "walk_ms" in row else "-"
        print(
            f"{row['jobs']:>12} | {r['median_ms']:>9.2f} | {r['p95_ms']:>7.2f} | {r['min_ms']:>7.2f} | "
            f"{walk:>17} | {row.get('counters_equal_walk', '-')}"
        )
    print(f"ratio (median, large / small): {result['ratio_large_over_small']:.2f}  (target: 1 within noise)")
    print(f"bulk create: {result['bulk_create_s']:.1f} s; Redis used_memory {result['used_memory_mb']:.0f} MiB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--large", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--no-walk", action="store_true", help="skip the O(jobs) walk at the large size")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = asyncio.run(main_async(args))
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
    for row in (result["small"], result["large"]):
        if row.get("counters_equal_walk") is False:
            print(f"counters differ from the walk at {row['jobs']} jobs")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
