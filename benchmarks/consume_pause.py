"""How fast can reviewers' submissions be consumed, and what does a waiting job cost in Redis?

Three measurements against a redis-server of our own (AOF, appendfsync everysec) in a
temporary directory:

1. ``python``: ``Store.intervene`` end to end (HGETALL, pure planning, EVALSHA of the
   consume_pause script) from N concurrent asyncio clients on one pool, each consuming a
   different pre-created waiting job per call, for S seconds. This is exactly what the
   intervention route runs.
2. ``redis-benchmark``: the ceiling. The same consume_pause script (same text, SCRIPT LOAD,
   EVALSHA) with the same KEYS and ARGV sizes, with the same N connections, against a real
   waiting job. redis-benchmark can only repeat one fixed command, and a consumed pause cannot
   be consumed again, so the ceiling runs the full check path: the idempotency lookup (a miss),
   the cancel, version, pause and token checks all pass, and the script returns at the last
   check (ARGV[12], a 400 found while planning) just before it would write. It is therefore an
   upper bound: the real call also pays the writes, which item 3 prices.
3. ``server cost``: Redis's own CPU time per call during run 1 (INFO commandstats), i.e. the
   real consume including its writes, and the single-threaded rate that cost allows.

Then Redis memory per waiting job: 10 000 jobs with three detected boxes each, measured both
as the used_memory delta and as the sum of MEMORY USAGE over every key of those jobs plus the
partition indexes and outbox streams they occupy. Target: under 4096 bytes per job.

    .venv/bin/python benchmarks/consume_pause.py --seconds 5 --clients 50 --json benchmarks/out/consume_pause.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import redis

from harness.executor import report
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.statecore import decide, keys, scripts
from hitl_review.statecore.ids import now_iso, payload_hash
from hitl_review.statecore.models import ImageRef, InterventionRequest, NodeReport
from hitl_review.statecore.outbox import OutboxEntry
from hitl_review.statecore.store import Store, StoreConfig

Job = tuple[str, InterventionRequest]  # a waiting job and the submission a reviewer would send

IMAGE = ImageRef(sha256="b" * 64, width=1024, height=768, url="/api/v1/artifacts/img_" + "b" * 16 + ".png")
THREE_BOXES = [
    {"bbox": [10, 10, 300, 420], "label": "shoe", "score": 0.93},
    {"bbox": [320, 40, 620, 500], "label": "shoe", "score": 0.88},
    {"bbox": [650, 100, 900, 700], "label": "bag", "score": 0.61},
]
MEMORY_TARGET = 4096


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


# --------------------------------------------------------------------------- preparing jobs


async def waiting_job(store: Store) -> tuple[str, InterventionRequest]:
    """Create a job, apply its detection (three boxes) and return the submission a reviewer would send."""
    reply = await store.create_job("bench", IMAGE)
    job_id = reply.job_id
    res = await report(store, job_id, {"boxes": THREE_BOXES})
    assert res == "OK", res
    st = await store.get(job_id)
    subjects = [{"box_id": b.box_id, "bbox": list(b.bbox)} for b in st.box_list[:2]]
    assert st.active_pause is not None, "a detection with boxes opens a pause"
    req = InterventionRequest(
        intervention_id=f"iv_{job_id}",
        pause_token=st.active_pause.pause_token,
        base_version=st.version,
        subjects=subjects,
    )
    return job_id, req


async def prepare_dispatched(store: Store, n: int, concurrency: int = 12, label: str = "memory jobs") -> None:
    """``n`` waiting jobs exactly as production leaves them: created, each DETECT_SUBJECTS command
    taken from the outbox by a dispatcher (NODE_STARTED), its report applied, the command
    acknowledged (and so deleted from the stream)."""
    t0 = time.monotonic()
    sem = asyncio.Semaphore(concurrency)

    async def create() -> None:
        async with sem:
            await store.create_job("bench", IMAGE)

    async def dispatch(entry: OutboxEntry) -> None:
        async with sem:
            cmd = entry.command
            assert await store.node_started(cmd) == "OK"
            res = await store.apply_report(
                NodeReport(
                    node_instance_id=cmd.node_instance_id,
                    node_type=cmd.node_type,
                    job_id=cmd.job_id,
                    outcome="SUCCEEDED",
                    output={"boxes": THREE_BOXES},
                )
            )
            assert res == "OK", res
            await store.outbox_ack(entry)

    await asyncio.gather(*(create() for _ in range(n)))
    done = 0
    while done < n:
        entries = await store.outbox_read("bench-dispatcher", count=1000, block_ms=100)
        await asyncio.gather(*(dispatch(e) for e in entries))
        done += len(entries)
        log(f"  {label}: {done}/{n}")
    log(f"  {label}: {n} ready in {time.monotonic() - t0:.1f}s")


async def prepare(store: Store, n: int, concurrency: int = 64, label: str = "waiting jobs") -> list[Job]:
    out: list[Job] = []
    next_report = time.monotonic() + 2
    t0 = time.monotonic()

    async def worker(count: int) -> None:
        nonlocal next_report
        for _ in range(count):
            out.append(await waiting_job(store))
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + 2
                log(f"  {label}: {len(out)}/{n}")

    share = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
    await asyncio.gather(*(worker(c) for c in share if c))
    log(f"  {label}: {len(out)} ready in {time.monotonic() - t0:.1f}s")
    return out


# --------------------------------------------------------------------------- 1. python end to end


async def consume(store: Store, jobs: deque[Job], clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    consumed: list[str] = []
    errors: dict[str, int] = {}
    ran_out = False
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal ran_out
        while time.perf_counter() < deadline:
            try:
                job_id, req = jobs.popleft()
            except IndexError:
                ran_out = True
                return
            t0 = time.perf_counter()
            try:
                reply = await store.intervene(job_id, req, "bench-reviewer")
            except Exception as e:  # counted and reported, never hidden
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                continue
            latencies.append(time.perf_counter() - t0)
            if reply.status_code != 200 or reply.replayed:
                errors["unexpected_reply"] = errors.get("unexpected_reply", 0) + 1
            consumed.append(job_id)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    lat = sorted(latencies)
    return {
        "ops": len(lat),
        "seconds": round(elapsed, 3),
        "rate": len(lat) / elapsed if elapsed else 0.0,
        "p50_ms": pct(lat, 0.50) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
        "max_ms": (lat[-1] * 1000 if lat else 0),
        # This process's CPU per consume: what the Python side costs, less sensitive than the rate to
        # other work on the machine taking the cores away.
        "cpu_us_per_op": cpu / len(lat) * 1e6 if lat else None,
        "errors": errors,
        "ran_out_of_jobs": ran_out,
        "consumed": consumed,
    }


def commandstats(sync: redis.Redis) -> dict[str, dict[str, Any]]:
    raw = sync.info("commandstats")
    return {k.removeprefix("cmdstat_"): v for k, v in raw.items()}


# --------------------------------------------------------------------------- 2. redis-benchmark ceiling


async def ceiling_command(store: Store, job_id: str, req: InterventionRequest) -> tuple[list[str], str]:
    """The exact KEYS/ARGV ``Store.intervene`` would send for this job, with ARGV[12] set so that the
    script returns after its last check instead of applying the plan (it appends the refusal's audit
    entry, as every answered submission does). Returns (EVALSHA argv, sha)."""
    state = await store.get(job_id)
    now = now_iso()
    ip = decide.plan_intervention(state, req, "bench-reviewer", now, int(time.time() * 1000))
    assert ip.plan is not None and ip.response is not None
    ks = keys.job(job_id).for_script()
    pause = state.active_pause
    args = [
        *(str(a) for a in store._args(job_id, now, "bench-reviewer")),  # job, now, retention, the audit's actor
        req.intervention_id,
        payload_hash(req.model_dump(mode="json"), "bench-reviewer"),
        str(req.base_version),
        req.pause_token,
        str(state.version),
        ip.plan.to_json(now),
        ip.response.model_dump_json(),
        "ceiling: every check passed; stop before the writes",
        "",  # no snapshot gate verdict
        pause.snapshot_id if pause is not None else "",
        *("", "", "", "", ""),  # no quorum
    ]
    sha = await store.r.script_load(scripts.source("consume_pause"))
    return ["EVALSHA", sha, str(len(ks)), *ks, *args], sha


def redis_benchmark(port: int, clients: int, requests: int, command: list[str]) -> dict[str, Any]:
    exe = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    proc = subprocess.run(
        [exe, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-n", str(requests), "--csv", *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    # --csv quotes the test name (our command, JSON included) without escaping it: read the seven
    # numeric columns from the right of the last line.
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        raise RuntimeError(f"redis-benchmark printed no result: {proc.stdout!r} {proc.stderr!r}")
    header = [h.strip('"') for h in lines[0].split(",")]
    values = [v.strip('"') for v in lines[-1].rsplit(",", len(header) - 1)[1:]]
    row = dict(zip(header[1:], values, strict=False))
    return {
        "rps": float(row["rps"]),
        "p50_ms": float(row["p50_latency_ms"]),
        "p99_ms": float(row["p99_latency_ms"]),
        "avg_ms": float(row["avg_latency_ms"]),
        "requests": requests,
    }


# --------------------------------------------------------------------------- 3. memory per waiting job


async def memory_per_job(store: Store, sync: Any, n: int) -> dict[str, Any]:
    sync.flushall(asynchronous=False)
    await store.ensure_groups()
    await store.r.script_load(scripts.source("create_job"))  # scripts cached before the baseline
    await prepare_dispatched(store, 8, label="warm-up")
    sync.flushall(asynchronous=False)
    await store.ensure_groups()
    base = int(sync.info("memory")["used_memory"])
    await prepare_dispatched(store, n)
    used = int(sync.info("memory")["used_memory"]) - base

    job_bytes: dict[str, int] = {"meta": 0, "pauses": 0, "events": 0, "idem": 0, "reports": 0, "audit": 0}
    pipe = sync.pipeline(transaction=False)
    order: list[str] = []
    job_ids = [j for p in range(keys.PARTITIONS) for j in sync.zrange(keys.jobs(p), 0, -1)]
    assert len(job_ids) == n, (len(job_ids), n)
    for job_id in job_ids:
        jk = keys.job(job_id)
        for kind in job_bytes:
            pipe.execute_command("MEMORY", "USAGE", getattr(jk, kind), "SAMPLES", "0")
            order.append(kind)
    for kind, b in zip(order, pipe.execute(), strict=True):
        job_bytes[kind] += int(b or 0)
    shared = {
        "waiting_index": [keys.waiting(p) for p in range(keys.PARTITIONS)],
        "jobs_index": [keys.jobs(p) for p in range(keys.PARTITIONS)],
        "running_index": [keys.running(p) for p in range(keys.PARTITIONS)],
        "outbox_streams": keys.all_outboxes(),
    }
    shared_bytes: dict[str, int] = {}
    for kind, names in shared.items():
        for name in names:
            pipe.execute_command("MEMORY", "USAGE", name, "SAMPLES", "0")
        shared_bytes[kind] = sum(int(b or 0) for b in pipe.execute())
    # The per-partition keys exist (empty streams with their consumer group) before any job: count
    # only what the jobs added to them.
    sync.delete("bench:probe:outbox")
    sync.xgroup_create("bench:probe:outbox", keys.OUTBOX_GROUP, id="0", mkstream=True)
    empty_outbox = int(sync.execute_command("MEMORY", "USAGE", "bench:probe:outbox", "SAMPLES", "0"))
    sync.delete("bench:probe:outbox")
    shared_bytes["outbox_streams"] -= empty_outbox * len(keys.all_outboxes())  # one per lane and partition
    key_sum = sum(job_bytes.values()) + sum(shared_bytes.values())
    per_key = {k: round(v / n, 1) for k, v in {**job_bytes, **shared_bytes}.items()}
    return {
        "jobs": n,
        "boxes_per_job": 3,
        "used_memory_delta_bytes": used,
        "bytes_per_job_used_memory": round(used / n, 1),
        "bytes_per_job_key_sum": round(key_sum / n, 1),
        "per_job_by_key": per_key,
        "target_bytes": MEMORY_TARGET,
        "under_target": max(used, key_sum) / n < MEMORY_TARGET,
    }


# --------------------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hitl-bench-"))
    extra = shlex.split(args.redis_args)
    server = RedisServer(tmp / "redis", extra=extra).start()
    log(f"redis-server {server.url} (AOF everysec{', ' + ' '.join(extra) if extra else ''}) in {tmp}")
    store = Store.from_url(
        server.url, StoreConfig(retention_s=7 * 24 * 3600, node_timeout_s=600), max_connections=args.clients + 16
    )
    sync = redis.Redis(port=server.port, decode_responses=True)
    try:
        await store.ensure_groups()
        result: dict[str, Any] = {
            "config": {
                "seconds": args.seconds,
                "clients": args.clients,
                "memory_jobs": args.memory_jobs,
                "redis_args": extra,
                "redis": sync.info("server")["redis_version"],
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "note": "client, redis-server and redis-benchmark share this machine's CPUs",
            }
        }

        # 1. python end to end ------------------------------------------------------------------
        log("calibrating the Python consume rate")
        calib = deque(await prepare(store, max(300, args.clients * 4), label="calibration jobs"))
        c = await consume(store, calib, args.clients, 1.0)
        need = int(c["rate"] * args.seconds * 1.5) + args.clients * 4
        need = min(need, args.max_jobs)
        log(f"  ~{c['rate']:.0f} consumes/s; preparing {need} waiting jobs for a {args.seconds}s run")
        jobs = deque(await prepare(store, need))
        sync.config_resetstat()
        log(f"consuming with {args.clients} concurrent clients for {args.seconds}s")
        py = await consume(store, jobs, args.clients, args.seconds)
        stats = commandstats(sync)
        log(
            f"  {py['ops']} consumes in {py['seconds']}s: {py['rate']:.0f}/s, p50 {py['p50_ms']:.2f} ms, "
            f"p99 {py['p99_ms']:.2f} ms, errors {py['errors'] or 'none'}"
        )
        if py["ran_out_of_jobs"]:
            log("  (ran out of prepared jobs before the time was up: the rate is over the shorter run)")
        evalsha, hgetall = stats.get("evalsha", {}), stats.get("hgetall", {})
        server_us = float(evalsha.get("usec_per_call", 0)) + float(hgetall.get("usec_per_call", 0))
        server_cost = {
            "evalsha_calls": int(evalsha.get("calls", 0)),
            "evalsha_usec_per_call": float(evalsha.get("usec_per_call", 0)),
            "hgetall_usec_per_call": float(hgetall.get("usec_per_call", 0)),
            "server_bound_rate": (1e6 / server_us) if server_us else None,
            "what": "Redis CPU per real consume (HGETALL + EVALSHA consume_pause with its writes), "
            "from INFO commandstats during the Python run",
        }
        # The consumed jobs really moved on, each with one new command per approved subject in its outbox.
        consumed = py.pop("consumed")
        for job_id in consumed[:: max(1, len(consumed) // 200)]:
            st = await store.get(job_id)
            cmds = await store.outbox_commands(job_id)
            assert st.status.value == "PROCESSING_APPROVED_SUBJECTS" and st.version == 3, (job_id, st.status)
            assert [c.node_type for c in cmds] == ["DETECT_SUBJECTS"] + ["SEGMENT_SUBJECT"] * 2, job_id
        calib_consumed = c.pop("consumed")
        result["calibration"] = c | {"consumed_jobs": len(calib_consumed)}

        # 2. redis-benchmark ceiling --------------------------------------------------------------
        target_id, target_req = jobs.popleft() if jobs else (await prepare(store, 1, label="ceiling job"))[0]
        command, sha = await ceiling_command(store, target_id, target_req)
        check = sync.execute_command(*command)
        assert check[0] == "INVALID_REQUEST", check  # every check passed; only the audit entry written
        version_before = (await store.get(target_id)).version
        outbox_before = sync.xlen(keys.job(target_id).outbox)
        log(f"redis-benchmark: EVALSHA consume_pause (full check path) with {args.clients} connections")
        probe = redis_benchmark(server.port, args.clients, 20_000, command)
        n_req = max(20_000, int(probe["rps"] * args.seconds))
        rb = redis_benchmark(server.port, args.clients, n_req, command)
        assert (await store.get(target_id)).version == version_before
        assert sync.xlen(keys.job(target_id).outbox) == outbox_before
        rb["what"] = (
            f"EVALSHA of the real consume_pause script (sha {sha[:12]}) with the real KEYS and ARGV of a waiting "
            "job: idempotency miss, not cancelled, version ok, pause WAITING, token ok; returns at the "
            "final check before apply_plan (only its audit entry written), so it is an upper bound"
        )
        log(f"  {rb['rps']:.0f} calls/s, p50 {rb['p50_ms']:.3f} ms, p99 {rb['p99_ms']:.3f} ms")

        bound = server_cost["server_bound_rate"]
        result.update(
            python=py,
            server_cost=server_cost,
            redis_benchmark=rb,
            ratio=py["rate"] / rb["rps"] if rb["rps"] else None,
            ratio_server_bound=py["rate"] / bound if bound else None,
        )

        # 3. memory -------------------------------------------------------------------------------
        log(f"memory: {args.memory_jobs} waiting jobs with three boxes each")
        result["memory"] = await memory_per_job(store, sync, args.memory_jobs)
        return result
    finally:
        await store.close()
        sync.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def table(r: dict[str, Any]) -> str:
    py, rb, sc, mem = r["python"], r["redis_benchmark"], r["server_cost"], r["memory"]
    rows = [
        ("what", "ops/s", "p50 ms", "p99 ms"),
        (
            f"python Store.intervene, {r['config']['clients']} clients",
            f"{py['rate']:.0f}",
            f"{py['p50_ms']:.2f}",
            f"{py['p99_ms']:.2f}",
        ),
        (
            f"redis-benchmark EVALSHA consume_pause (checks only), -c {r['config']['clients']}",
            f"{rb['rps']:.0f}",
            f"{rb['p50_ms']:.3f}",
            f"{rb['p99_ms']:.3f}",
        ),
        (
            "server-bound (1e6 / Redis usec per real consume)",
            f"{sc['server_bound_rate']:.0f}" if sc["server_bound_rate"] else "-",
            "-",
            "-",
        ),
    ]
    w = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(row)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines += [
        "",
        f"ratio python / redis-benchmark: {r['ratio']:.3f}",
        f"ratio python / server-bound: {r['ratio_server_bound']:.3f}" if r.get("ratio_server_bound") else "",
        f"python CPU per consume (this process, all of it): {py['cpu_us_per_op']:.0f} us",
        f"Redis time per real consume: EVALSHA {sc['evalsha_usec_per_call']:.1f} us + HGETALL "
        f"{sc['hgetall_usec_per_call']:.1f} us",
        f"memory per waiting job (3 boxes, {mem['jobs']} jobs): {mem['bytes_per_job_used_memory']:.0f} B "
        f"(used_memory delta), {mem['bytes_per_job_key_sum']:.0f} B (sum of MEMORY USAGE); "
        f"target < {mem['target_bytes']}: {'OK' if mem['under_target'] else 'OVER'}",
        "  by key: " + ", ".join(f"{k} {v:.0f}" for k, v in mem["per_job_by_key"].items()),
        "",
        "ceiling runs: " + rb["what"],
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each timed run (default 5)")
    ap.add_argument("--clients", type=int, default=50, help="concurrent clients / connections (default 50)")
    ap.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="event loop for the Python clients (default uvloop, as uvicorn and Ray Serve use)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--memory-jobs", type=int, default=10_000, help="waiting jobs for the memory figure")
    ap.add_argument("--max-jobs", type=int, default=200_000, help="cap on jobs prepared for the timed run")
    ap.add_argument(
        "--redis-args",
        default="",
        help="extra redis-server options on top of the project's defaults, "
        "e.g. '--stream-node-max-bytes 2048' (for experiments)",
    )
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    # The event loop the control plane runs on: uvicorn and Ray Serve replicas both use uvloop.
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(main_async(args))
    else:
        result = asyncio.run(main_async(args))
    result["benchmark_seconds"] = round(time.monotonic() - t0, 1)
    print()
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
