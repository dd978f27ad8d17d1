"""What 1 M waiting jobs and 1 M jobs a day need on a Redis Cluster: Redis CPU, Redis memory and
control-plane cores, from per-operation costs measured on a real 3-master cluster (docs/scaling.md
§ Capacity).

Against ``harness.redis.RedisCluster`` (three redis-server masters joined by ``redis-cli --cluster
create``, as the tests' ``redis_cluster`` fixture), in one run:

1. **Per job**: the control plane under uvicorn (``harness.uvicorn.UvicornServer``, its dispatcher in
   the same process, ``--detector null --segmenter null``: no model cost) on the cluster, and
   ``--jobs`` two-subject jobs through it with automatic reviewers (``benchmarks.e2e.run_workload``:
   create, follow SSE, answer the box review, follow to JOB_FINISHED). Redis CPU per job = the
   masters' ``INFO cpu`` summed, less what the same seconds cost idle (the dispatcher's and SSE
   hub's polls, measured first); the server process's CPU per job likewise.
2. **Per waiting job**: jobs waiting for their box review made through the real scripts
   (``harness.bulk.bulk_waiting``: create_job, the detection's apply_report, the outbox drained) up
   to each of ``--points`` (at least two); at each, ``used_memory`` summed over the masters, each
   master's share, and ``MEMORY USAGE`` of a sample job's keys. Bytes per waiting job is the slope
   between the points (not one point over zero: the fixed cost of scripts, groups and indexes drops
   out), and Redis CPU per creation + detection report from the masters' ``INFO cpu`` while made.

Then the table for ``--waiting`` waiting jobs and ``--per-day`` jobs a day (and ``--peak`` times the
average rate): memory per master, Redis cores, control-plane cores. Prints it, writes JSON.

    .venv/bin/python benchmarks/capacity.py --points 20000,100000 --jobs 60 --json benchmarks/out/capacity.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis

from benchmarks.e2e import run_workload
from harness.bench import log
from harness.bulk import bulk_waiting
from harness.redis import RedisCluster
from harness.uvicorn import UvicornServer
from hitl_review.statecore import counters, keys
from hitl_review.statecore.store import Store, StoreConfig


def masters(cluster: RedisCluster) -> list[redis.Redis]:
    return [redis.Redis(port=n.port) for n in cluster.nodes]


def redis_cpu_s(nodes: list[redis.Redis]) -> float:
    """The masters' CPU seconds so far (user + system), summed."""
    return sum(float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in (r.info("cpu") for r in nodes))


def used_memory(nodes: list[redis.Redis]) -> list[int]:
    return [int(r.info("memory")["used_memory"]) for r in nodes]


def proc_cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def per_job(cluster: RedisCluster, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Redis CPU and control-plane CPU per two-subject job through the whole lifecycle on the cluster."""
    nodes = masters(cluster)
    uv = UvicornServer(
        tmp / "uv", cluster.url, dispatchers=1, detector="null", segmenter="null", log_path=tmp / "uv.log"
    ).start()
    try:
        assert uv.pid is not None
        await run_workload(uv.api_url, uv.token, 8, 4, 10_000)  # warm: connections, scripts loaded
        await asyncio.sleep(2)
        c0, r0 = proc_cpu_s(uv.pid), redis_cpu_s(nodes)
        await asyncio.sleep(args.idle_s)
        idle_cp, idle_redis = (proc_cpu_s(uv.pid) - c0) / args.idle_s, (redis_cpu_s(nodes) - r0) / args.idle_s
        c0, r0, t0 = proc_cpu_s(uv.pid), redis_cpu_s(nodes), time.perf_counter()
        res = await run_workload(uv.api_url, uv.token, args.jobs, args.concurrency, 0)
        span = time.perf_counter() - t0
        cp, red = proc_cpu_s(uv.pid) - c0, redis_cpu_s(nodes) - r0
    finally:
        uv.stop()
    return {
        "jobs": args.jobs,
        "final_statuses": res["final_statuses"],
        "jobs_per_s": res["jobs_per_s"],
        "idle_redis_cpu_ms_per_s": round(idle_redis * 1000, 2),
        "idle_control_plane_cpu_ms_per_s": round(idle_cp * 1000, 2),
        "redis_cpu_ms_per_job": round(red / args.jobs * 1000, 2),
        "redis_cpu_ms_per_job_less_idle": round((red - idle_redis * span) / args.jobs * 1000, 2),
        "control_plane_cpu_ms_per_job": round(cp / args.jobs * 1000, 1),
        "control_plane_cpu_ms_per_job_less_idle": round((cp - idle_cp * span) / args.jobs * 1000, 1),
    }


async def sample_job_bytes(store: Store, nodes: list[redis.Redis], job_id: str) -> int:
    """MEMORY USAGE of a waiting job's own keys (those naming it: its index entries and the partition's
    shared keys are in the slope, not here)."""
    total = 0
    for key in (k for k in keys.job(job_id).for_script() if job_id in k):
        for r in nodes:
            try:
                got = r.memory_usage(key, samples=0)
            except redis.ResponseError:  # MOVED: another master holds the slot
                continue
            if got:
                total += int(got)
                break
    return total


async def waiting_points(cluster: RedisCluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    nodes = masters(cluster)
    store = Store.from_url(cluster.url, StoreConfig(), cluster=True)
    rows: list[dict[str, Any]] = []
    try:
        await store.ensure_groups()
        made: list[str] = []
        for point in args.points:
            have = int((await counters.read(store.r, 3600.0)).waiting)
            cpu0, t0 = redis_cpu_s(nodes), time.perf_counter()
            made += await bulk_waiting(store, point - have)
            cpu, wall = redis_cpu_s(nodes) - cpu0, time.perf_counter() - t0
            mem = used_memory(nodes)
            waiting = int((await counters.read(store.r, 3600.0)).waiting)
            row = {
                "waiting": waiting,
                "used_memory_bytes": sum(mem),
                "used_memory_per_master": mem,
                "made": point - have,
                "made_s": round(wall, 1),
                "redis_cpu_ms_per_waiting_job_made": round(cpu / max(1, point - have) * 1000, 3),
                "sample_job_keys_bytes": await sample_job_bytes(store, nodes, made[-1]),
            }
            rows.append(row)
            log(
                f"{waiting} waiting: {sum(mem) / 2**20:.1f} MiB over 3 masters "
                f"({', '.join(f'{m / 2**20:.0f}' for m in mem)}), made in {wall:.0f} s, "
                f"Redis {row['redis_cpu_ms_per_waiting_job_made']} ms per job made"
            )
    finally:
        await store.close()
    return rows


def table(per: dict[str, Any], rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Extrapolate: memory from the slope between the first and last point, CPU from per job."""
    a, b = rows[0], rows[-1]
    slope = (b["used_memory_bytes"] - a["used_memory_bytes"]) / (b["waiting"] - a["waiting"])
    fixed = a["used_memory_bytes"] - slope * a["waiting"]
    mem = fixed + slope * args.waiting
    rate = args.per_day / 86400
    # Less idle is the jobs' own cost; where the idle polls of the same seconds outweigh it (a slow,
    # loaded run) it is not measurable, and the raw figure (polls included) is the upper bound used.
    redis_ms = per["redis_cpu_ms_per_job_less_idle"]
    redis_ms = redis_ms if redis_ms > 0 else per["redis_cpu_ms_per_job"]
    cp_ms = per["control_plane_cpu_ms_per_job_less_idle"]
    cp_ms = cp_ms if cp_ms > 0 else per["control_plane_cpu_ms_per_job"]
    return {
        "redis_ms_per_job_used": redis_ms,
        "control_plane_ms_per_job_used": cp_ms,
        "bytes_per_waiting_job": round(slope),
        "fixed_bytes": round(fixed),
        "memory_for_waiting_gib": round(mem / 2**30, 2),
        "memory_per_master_gib": round(mem / 3 / 2**30, 2),
        "jobs_per_s_average": round(rate, 2),
        "jobs_per_s_peak": round(rate * args.peak, 2),
        "redis_cores_average": round(rate * redis_ms / 1000 + per["idle_redis_cpu_ms_per_s"] / 1000, 3),
        "redis_cores_peak": round(rate * args.peak * redis_ms / 1000 + per["idle_redis_cpu_ms_per_s"] / 1000, 3),
        "control_plane_cores_average": round(rate * cp_ms / 1000, 2),
        "control_plane_cores_peak": round(rate * args.peak * cp_ms / 1000, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="20000,100000", help="waiting jobs at each memory point (two or more)")
    ap.add_argument("--jobs", type=int, default=60, help="whole-lifecycle jobs for the per-job costs")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--waiting", type=int, default=1_000_000)
    ap.add_argument("--per-day", type=int, default=1_000_000)
    ap.add_argument("--peak", type=float, default=10.0, help="peak rate as a multiple of the day's average")
    ap.add_argument("--json", default="benchmarks/out/capacity.json")
    args = ap.parse_args()
    args.points = [int(p) for p in args.points.split(",")]
    if len(args.points) < 2:
        ap.error("--points needs two or more sizes: the slope, not one point over zero")
    tmp = Path(tempfile.mkdtemp(prefix="hitl-capacity-"))
    out: dict[str, Any] = {
        "config": vars(args),
        "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
    }
    cluster = RedisCluster(tmp / "cluster").start()
    try:
        log(f"3-master cluster up; {args.jobs} whole-lifecycle jobs through uvicorn, null models")
        out["per_job"] = asyncio.run(per_job(cluster, tmp, args))
        log(f"per job: {out['per_job']}")
        # the lifecycle's jobs are finished, not waiting: the memory points count waiting jobs only
        out["points"] = asyncio.run(waiting_points(cluster, args))
        out["capacity"] = table(out["per_job"], out["points"], args)
    finally:
        cluster.stop()
    out["machine"]["load_after"] = os.getloadavg()
    c, p = out["capacity"], out["per_job"]
    print(f"\n{'measure':<52}{'value':>14}")
    print("-" * 66)
    for label, value in (
        ("Redis CPU per two-subject job, ms (less idle)", p["redis_cpu_ms_per_job_less_idle"]),
        ("  used below (raw where less idle is not > 0)", c["redis_ms_per_job_used"]),
        ("Redis CPU idle, ms per s (3 masters)", p["idle_redis_cpu_ms_per_s"]),
        ("control plane CPU per job, ms (uvicorn, less idle)", p["control_plane_cpu_ms_per_job_less_idle"]),
        ("bytes per waiting job (slope)", c["bytes_per_waiting_job"]),
        (f"Redis memory, {args.waiting:,} waiting, GiB", c["memory_for_waiting_gib"]),
        ("  per master (3), GiB", c["memory_per_master_gib"]),
        (f"{args.per_day:,} jobs/day: average jobs/s", c["jobs_per_s_average"]),
        ("  Redis cores, average / peak", f"{c['redis_cores_average']} / {c['redis_cores_peak']}"),
        (
            "  control-plane cores, average / peak",
            f"{c['control_plane_cores_average']} / {c['control_plane_cores_peak']}",
        ),
    ):
        print(f"{label:<52}{value!s:>14}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
