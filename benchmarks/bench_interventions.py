"""Interventions per second and latency by outcome through three doors, with the same mix:

(a) Ray Serve — a real ``hitl up --no-ui`` (by default direct ingress: the Api replica listens on the
    API port itself → store → Redis; ``--ingress proxy``: Serve's proxy → Api replica);
(b) the same FastAPI app under plain uvicorn, alone in its process (``harness.uvicorn.UvicornServer``);
(c) the store itself (``Store.intervene``: one HGETALL + the consume_pause Lua script) — the ceiling.

All three use the Redis of the ``hitl up``, whose dispatcher takes the follow-up commands of every
door alike. The waiting jobs are made beforehand through the store (``create_job`` + a detection
report), so only the intervention path is timed. Each job gets the same six requests, in order:
a wrong ``pause_token`` (409 PAUSE_TOKEN_MISMATCH), the real submission (200), the same again
(replay), the same id with other boxes (409 IDEMPOTENCY_CONFLICT), a new id on the old version
(409 VERSION_CONFLICT) and a new id on the new version (409 PAUSE_NOT_ACTIVE). The submission is an
empty list by default (EMPTY_SELECTION: no model work follows to compete for the CPU and blur the
doors); ``--consume keep`` submits two model boxes instead, so the dispatcher runs the next node
meanwhile (and a late PAUSE_NOT_ACTIVE may turn into VERSION_CONFLICT). Latency is bucketed by the
outcome actually seen, next to each door's floor (Redis PING, ``GET /healthz``). The doors are
interleaved in rounds so drift on a shared machine hits them alike.

    python benchmarks/bench_interventions.py [--jobs 100] [--concurrency 1,8] [--rounds 2] [--consume empty|keep]
        [--api-url URL --redis-url URL --data-dir DIR [--token T]]   # reuse a running `hitl up`
        [--ingress auto|direct|proxy] [--json benchmarks/out/bench_interventions.json] [--docs docs/benchmarks.md]

It reports Ray Serve against uvicorn as two ratios with their targets: p50 at the lowest
concurrency (service time) ≤ 1.2×, interventions per second at the highest ≥ 0.8×.

``make loadtest`` runs it against the load test's own ``hitl up`` once locust and the invariant
check are done (``loadtest/run.py``), ``make bench`` on a fresh one.

The jobs, the doors, the statistics and the report live in ``loadtest.intervention_bench``; this
script keeps the run itself and its command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from harness.bench import stop_on_sigterm
from harness.hitl_up import HitlUp
from harness.tokens import resolve_token
from harness.uvicorn import UvicornServer
from hitl_review.statecore.store import Store
from loadtest.intervention_bench.doors import DOORS, Door, drive, floor, http_door, store_door
from loadtest.intervention_bench.jobs import make_jobs
from loadtest.intervention_bench.report import SECTION, docs_section, tables, write_docs
from loadtest.intervention_bench.results import compare, machine, stats, summarize, targets

# --------------------------------------------------------------------------- the benchmark


async def bench(
    api_ray: str,
    api_uvicorn: str,
    redis_url: str,
    token: str,
    *,
    jobs: int,
    concurrency: list[int],
    rounds: int,
    consume: str = "empty",
    warmup: int = 10,
) -> dict[str, Any]:
    store = Store.from_url(redis_url, max_connections=256)
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=max(concurrency) + 4, max_keepalive_connections=max(concurrency) + 4)
    clients = {
        d: httpx.AsyncClient(base_url=u, headers=headers, limits=limits, timeout=30)
        for d, u in (("ray", api_ray), ("uvicorn", api_uvicorn))
    }
    try:
        who = (await clients["uvicorn"].get("/api/v1/whoami")).json()["name"]
        doors: dict[str, Door] = {
            "direct": store_door(store, who),
            "uvicorn": http_door(clients["uvicorn"]),
            "ray": http_door(clients["ray"]),
        }
        per_round = max(1, jobs // rounds)
        needed = (per_round * rounds + warmup) * len(DOORS) * len(concurrency)
        t0 = time.perf_counter()
        pool = await make_jobs(store, needed, who)
        prepared_s = time.perf_counter() - t0
        if len(pool) < needed:  # share what there is evenly: every door gets as many jobs
            per_round = max(1, (len(pool) // (len(DOORS) * len(concurrency)) - warmup) // rounds)
            print(
                f"bench: only {len(pool)} of {needed} prepared jobs are waiting; {per_round * rounds} per door "
                "and concurrency",
                file=sys.stderr,
            )
        results: dict[str, Any] = {}
        for c in concurrency:
            raw: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
            wall: dict[str, float] = defaultdict(float)
            floors: dict[str, list[float]] = defaultdict(list)
            for door in DOORS:  # warm connections, JITs and caches; not counted
                await drive(doors[door], [pool.pop() for _ in range(min(warmup, len(pool)))], c, consume)
            for _ in range(rounds):
                for door in DOORS:
                    take = [pool.pop() for _ in range(min(per_round, len(pool)))]
                    samples, w = await drive(doors[door], take, c, consume)
                    raw[door] += samples
                    wall[door] += w
                    floors[door] += await floor(doors[door], 50, c)
            results[str(c)] = {
                door: {**summarize(raw[door], wall[door]), "floor": stats(floors[door])} for door in DOORS
            }
        return {
            "jobs_prepared": needed,
            "prepare_s": round(prepared_s, 2),
            "jobs_per_door_per_concurrency": per_round * rounds,
            "rounds": rounds,
            "concurrency": concurrency,
            "consume": consume,
            "results": results,
            "comparison": compare(results),
            "targets": targets(compare(results)),
            "machine": machine(redis_url),
        }
    finally:
        for client in clients.values():
            await client.aclose()
        await store.close()


def run_against(
    hitl_api: str,
    redis_url: str,
    data_dir: Path,
    out_dir: Path,
    *,
    jobs: int,
    concurrency: list[int],
    rounds: int,
    consume: str = "empty",
    token: str | None = None,
) -> dict[str, Any]:
    """The benchmark against a running ``hitl up``; starts (and stops) the uvicorn door itself."""
    uv = UvicornServer(data_dir, redis_url, log_path=out_dir / "bench-uvicorn.log").start()
    try:
        tok = resolve_token(token, data_dir)
        return asyncio.run(
            bench(
                hitl_api, uv.api_url, redis_url, tok, jobs=jobs, concurrency=concurrency, rounds=rounds, consume=consume
            )
        )
    finally:
        uv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_interventions.py",
        description="Intervention throughput and latency: Ray Serve vs uvicorn vs store.",
    )
    ap.add_argument("--jobs", type=int, default=100, help="jobs per door and concurrency (6 requests each)")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated client concurrencies (default 1,8)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds the doors are interleaved over")
    ap.add_argument(
        "--consume",
        choices=["empty", "keep"],
        default="empty",
        help="what the 200 submits: empty (EMPTY_SELECTION, default) or keep (two model boxes, "
        "so the dispatcher runs the next node during the measurement)",
    )
    ap.add_argument("--api-url", default=None, help="a running `hitl up` (else one is started)")
    ap.add_argument("--redis-url", default=None, help="its Redis (with --api-url)")
    ap.add_argument("--data-dir", default=None, help="its data directory (with --api-url)")
    ap.add_argument("--token", default=None, help="its token (default HITL_TOKEN or <data-dir>/api-token)")
    ap.add_argument("--detector-delay-ms", type=int, default=80, help="for the `hitl up` started here")
    ap.add_argument(
        "--ingress",
        choices=["auto", "direct", "proxy"],
        default="auto",
        help="`hitl up --ingress` for the `hitl up` started here (default: its own default, direct)",
    )
    ap.add_argument(
        "--no-archive",
        dest="archive",
        action="store_false",
        help="turn archiving off in the `hitl up` started here (default on, as `hitl up` runs: each "
        "EMPTY_SELECTION queues an ARCHIVE_JOB, copied by the Archiver deployment in its own process)",
    )
    ap.add_argument("--out", default="benchmarks/out", help="folder for logs and JSON")
    ap.add_argument("--json", default=None, help="result JSON (default <out>/bench_interventions.json)")
    ap.add_argument("--docs", default=None, help="rewrite the 'Interventions under load' section of this file")
    ap.add_argument("--loadtest-summary", default=None, help="a loadtest.run summary JSON to add to the docs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    conc = [int(x) for x in args.concurrency.split(",") if x.strip()]
    ingress = "as running (--api-url)"
    hitl = None
    tmp = None
    try:
        if args.api_url:
            if not (args.redis_url and args.data_dir):
                ap.error("--api-url needs --redis-url and --data-dir")
            api, redis_url, data_dir = args.api_url, args.redis_url, Path(args.data_dir)
        else:
            tmp = Path(tempfile.mkdtemp(prefix="hitl-ivbench-"))
            print("starting hitl up --no-ui ...", flush=True)
            hitl = HitlUp(
                tmp,
                "--detector-delay-ms",
                str(args.detector_delay_ms),
                "--ingress",
                args.ingress,
                *(() if args.archive else ("--no-archive",)),
                log_path=out / "bench-hitl-up.log",
            )
            hitl.start()
            ingress = next((line.split("ingress: ", 1)[1].split()[0] for line in hitl.lines if "ingress: " in line), "")
            if hitl.redis_url is None:
                raise RuntimeError("hitl up did not log where its embedded redis-server is")
            api, redis_url, data_dir = hitl.api_url, hitl.redis_url, tmp
        res = run_against(
            api,
            redis_url,
            data_dir,
            out,
            jobs=args.jobs,
            concurrency=conc,
            rounds=args.rounds,
            consume=args.consume,
            token=args.token,
        )
    finally:
        if hitl is not None:
            hitl.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    res["ingress"] = ingress
    print(tables(res))
    path = Path(args.json) if args.json else out / "bench_interventions.json"
    path.write_text(json.dumps(res, indent=2))
    print(f"wrote {path}")
    if args.docs:
        lt = json.loads(Path(args.loadtest_summary).read_text()) if args.loadtest_summary else None
        write_docs(Path(args.docs), docs_section(res, lt))
        print(f"updated the '{SECTION[3:]}' section of {args.docs}")
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main())
