"""Whole-stack throughput: jobs per minute with an automatic reviewer, control-plane CPU per job,
and the latency from a report being applied to its SSE event reaching a subscriber.

Two servers in the same run, the same workload:

- ``ray-serve``: a real ``hitl up --no-ui`` (embedded Redis, local Ray, Serve; the classical
  OpenCV models in their own deployments) with ``--detector-delay-ms`` as GPU-like latency;
- ``uvicorn``: the same FastAPI app under plain uvicorn, one process, its dispatcher running the
  same models in threads (``harness.uvicorn.UvicornServer``, one dispatcher).

Each job: POST /jobs, follow its SSE stream, at PAUSE_OPENED submit the boxes (keep all), follow
until JOB_FINISHED. SSE latency = time a subscriber receives an event minus the event's ``at``
(stamped by the Lua script that applied the report), for events received live. Control-plane CPU
for ray-serve = CPU seconds of the Api + Events replicas and the Serve proxy; for uvicorn = the whole
server process, models included (so its figure is an upper bound of the control plane's).

    .venv/bin/python benchmarks/e2e.py --jobs 24 --concurrency 6 --delay-ms 80 --json benchmarks/out/e2e.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from httpx_sse import aconnect_sse

from harness.bench import log, parse_at, pct
from harness.hitl_up import HitlUp
from harness.uvicorn import UvicornServer
from hitl_review.client.approve_calls import answer_keeping
from hitl_review.serve_app.ops.samples import product_composite

CONTROL_PLANE = ("ServeReplica:hitl:Api", "ServeReplica:hitl:Events", "ProxyActor")


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def control_plane_procs(root_pid: int | None = None) -> list[psutil.Process]:
    if root_pid is not None:
        return [psutil.Process(root_pid)]
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if any(name in cmd for name in CONTROL_PLANE):
            out.append(p)
    return out


async def run_workload(api_url: str, token: str, jobs: int, concurrency: int, seed: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    sse_lat: list[float] = []
    iv_lat: list[float] = []
    job_s: list[float] = []
    statuses: dict[str, int] = {}
    sem = asyncio.Semaphore(concurrency)
    images = [product_composite(seed=seed + i, width=320, height=240, n=2)[0] for i in range(jobs)]

    async def one(i: int, c: httpx.AsyncClient) -> None:
        async with sem:
            t0 = time.perf_counter()
            r = await c.post("/api/v1/jobs", files={"image": (f"{i}.png", images[i], "image/png")})
            r.raise_for_status()
            job_id = r.json()["job_id"]
            async with aconnect_sse(c, "GET", f"/api/v1/jobs/{job_id}/events") as es:
                async for sse in es.aiter_sse():
                    if not sse.data:
                        continue  # a keep-alive comment
                    now = time.time()
                    ev = json.loads(sse.data)
                    if ev["type"] not in ("JOB_CREATED",):
                        sse_lat.append(now - parse_at(ev["at"]))
                    if ev["type"] == "PAUSE_OPENED":
                        pause = ev["data"]["active_pause"]
                        # every box kept; in a mask review (a cut-out the gate failed) every mask accepted
                        answer = answer_keeping(pause, ev["data"]["box_list"])
                        t = time.perf_counter()
                        iv = await c.post(
                            f"/api/v1/jobs/{job_id}/interventions",
                            json={
                                "intervention_id": f"iv_bench_{job_id}_{pause['pause_token'][-8:]}",
                                "pause_token": pause["pause_token"],
                                "base_version": pause["base_version"],
                                **answer,
                            },
                        )
                        iv_lat.append(time.perf_counter() - t)
                        iv.raise_for_status()
                    if ev["type"] == "JOB_FINISHED":
                        statuses[ev["data"]["status"]] = statuses.get(ev["data"]["status"], 0) + 1
                        break
            job_s.append(time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=concurrency * 3 + 4)
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=120, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, c) for i in range(jobs)))
        wall = time.perf_counter() - t0
    return {
        "jobs": jobs,
        "wall_s": round(wall, 3),
        "jobs_per_min": round(jobs / wall * 60, 1),
        "job_latency_p50_s": round(pct(job_s, 0.5), 3),
        "intervention_p50_ms": round(pct(iv_lat, 0.5) * 1000, 2),
        "intervention_p99_ms": round(pct(iv_lat, 0.99) * 1000, 2),
        "sse_latency_p50_ms": round(pct(sse_lat, 0.5) * 1000, 2),
        "sse_latency_p99_ms": round(pct(sse_lat, 0.99) * 1000, 2),
        "sse_events": len(sse_lat),
        "final_statuses": statuses,
    }


async def with_idle_streams(api_url: str, token: str, n: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The same workload while ``n`` SSE streams sit open on waiting jobs (review panels left open):
    they must neither starve the API nor slow the pipeline."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=api_url, headers=headers, timeout=120, limits=httpx.Limits(max_connections=n + 8)
    ) as c:
        waiting = []
        for i in range(4):
            r = await c.post(
                "/api/v1/jobs",
                files={
                    "image": ("w.png", product_composite(seed=seed + 500 + i, width=320, height=240)[0], "image/png")
                },
            )
            waiting.append(r.json()["job_id"])
        opened = 0
        ready = asyncio.Event()

        async def hold(job_id: str) -> None:
            nonlocal opened
            async with c.stream("GET", f"/api/v1/jobs/{job_id}/events") as resp:
                opened += 1
                if opened == n:
                    ready.set()
                async for _ in resp.aiter_lines():
                    pass

        holders = [asyncio.create_task(hold(waiting[i % len(waiting)])) for i in range(n)]
        try:
            await asyncio.wait_for(ready.wait(), timeout=120)
            res = await run_workload(api_url, token, args.jobs, args.concurrency, seed + 20_000)
            res["idle_streams_open"] = opened
            return res
        finally:
            for h in holders:
                h.cancel()
            await asyncio.gather(*holders, return_exceptions=True)


async def measure(
    name: str, api_url: str, token: str, procs: list[psutil.Process], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    log(f"{name}: warm-up ({max(2, args.concurrency)} jobs)")
    await run_workload(api_url, token, max(2, args.concurrency), args.concurrency, seed + 10_000)
    cpu0 = cpu_seconds(procs)
    log(f"{name}: {args.jobs} jobs, {args.concurrency} concurrent reviewers")
    res = await run_workload(api_url, token, args.jobs, args.concurrency, seed)
    res["control_plane_cpu_ms_per_job"] = round((cpu_seconds(procs) - cpu0) / args.jobs * 1000, 1)
    res["cpu_processes"] = len(procs)
    log(f"{name}: {res['jobs_per_min']} jobs/min, SSE p50 {res['sse_latency_p50_ms']} ms")
    if args.idle_streams:
        log(f"{name}: again with {args.idle_streams} idle SSE streams open")
        busy = await with_idle_streams(api_url, token, args.idle_streams, args, seed)
        res["with_idle_streams"] = {
            k: busy[k]
            for k in (
                "idle_streams_open",
                "jobs_per_min",
                "intervention_p50_ms",
                "sse_latency_p50_ms",
                "final_statuses",
            )
        }
        log(f"{name}: {busy['jobs_per_min']} jobs/min with {busy['idle_streams_open']} streams open")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--delay-ms", type=int, default=80, help="simulated model latency (--detector-delay-ms)")
    ap.add_argument(
        "--idle-streams",
        type=int,
        default=200,
        help="open this many idle SSE streams and run the workload again (0: skip)",
    )
    ap.add_argument("--json", default="benchmarks/out/e2e.json")
    args = ap.parse_args()
    out: dict[str, Any] = {
        "config": vars(args),
        "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
    }
    tmp = Path(tempfile.mkdtemp(prefix="hitl-e2e-bench-"))
    log(f"starting hitl up --no-ui --detector-delay-ms {args.delay_ms} --quality-gate off in {tmp}")
    # The same workload on both: the uvicorn harness records the quality gate's verdicts only, so Ray
    # Serve runs with --quality-gate off too (no mask review: this compares the serving paths).
    flags = ("--detector-delay-ms", str(args.delay_ms), "--quality-gate", "off")
    up = HitlUp(tmp / "ray", *flags, log_path=tmp / "ray.log").start()
    try:
        out["ray-serve"] = asyncio.run(measure("ray-serve", up.api_url, up.token, control_plane_procs(), args, 0))
    finally:
        up.stop()
    uv = UvicornServer(tmp / "uv", dispatchers=1, detector_delay_ms=args.delay_ms, log_path=tmp / "uv.log")
    try:
        uv.start()
        assert uv.pid is not None
        out["uvicorn"] = asyncio.run(measure("uvicorn", uv.api_url, uv.token, control_plane_procs(uv.pid), args, 0))
    finally:
        uv.stop()
    ray, uvi = out["ray-serve"], out["uvicorn"]
    out["ratios_ray_over_uvicorn"] = {
        k: round(ray[k] / uvi[k], 2) if uvi[k] else None
        for k in ("jobs_per_min", "intervention_p50_ms", "sse_latency_p50_ms", "sse_latency_p99_ms")
    }
    rows = [
        ("jobs/min", "jobs_per_min"),
        ("job latency p50 (s)", "job_latency_p50_s"),
        ("intervention p50 (ms)", "intervention_p50_ms"),
        ("intervention p99 (ms)", "intervention_p99_ms"),
        ("report→SSE p50 (ms)", "sse_latency_p50_ms"),
        ("report→SSE p99 (ms)", "sse_latency_p99_ms"),
        ("control-plane CPU ms/job", "control_plane_cpu_ms_per_job"),
    ]
    print(f"\n{'metric':<28}{'ray-serve':>12}{'uvicorn':>12}{'ray/uvicorn':>13}")
    print("-" * 65)
    for label, key in rows:
        r, u = ray[key], uvi[key]
        ratio = f"{r / u:.2f}" if u else "-"
        print(f"{label:<28}{r:>12}{u:>12}{ratio:>13}")
    if args.idle_streams:
        for label, key in (
            ("jobs/min", "jobs_per_min"),
            ("intervention p50 (ms)", "intervention_p50_ms"),
            ("report→SSE p50 (ms)", "sse_latency_p50_ms"),
        ):
            r, u = ray["with_idle_streams"][key], uvi["with_idle_streams"][key]
            print(f"{label + f' +{args.idle_streams} idle SSE':<28}{r:>12}{u:>12}{(r / u if u else 0):>13.2f}")
    print(
        f"\n{args.jobs} jobs, {args.concurrency} concurrent automatic reviewers, detector delay {args.delay_ms} ms, "
        f"classical backends; final statuses ray={ray['final_statuses']} uvicorn={uvi['final_statuses']}"
    )
    print(
        "control-plane CPU: ray-serve = Api + Events replicas + Serve proxy; uvicorn = whole process, models included"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
