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
for ray-serve = CPU seconds of the Api (its dispatcher included) + Events + Archiver replicas and the
Serve proxy, summed over ``hitl up``'s own process tree (psutil deltas over the measured run); the
model replicas and Ray's own processes are reported apart. For uvicorn = the whole server process,
models included (so its figure is an upper bound of the control plane's). The Redis server's own CPU
per job comes from ``INFO cpu`` (the process), its split by command from ``INFO commandstats`` (a
script's ``EVALSHA`` time includes the commands it runs, which are listed again under their names).

``--detector null --segmenter null`` measures the control plane alone (deployments/backends/null.py);
``--baseline DIR`` runs ``hitl up`` from another checkout (``PYTHONPATH=DIR``, e.g. a worktree of an
earlier commit) alternately with this one, ``--rounds`` times, in the same run; ``--profile DIR``
records py-spy's raw stacks of each control-plane process during the measured run (a separate run:
the sampler's own CPU competes on a small machine).

    .venv/bin/python benchmarks/e2e.py --jobs 24 --concurrency 6 --delay-ms 80 --json benchmarks/out/e2e.json
    .venv/bin/python benchmarks/e2e.py --detector null --segmenter null --delay-ms 0 --servers ray-serve \
        --idle-streams 0 --jobs 100 --concurrency 8 --baseline /work/base-prof --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis
from httpx_sse import aconnect_sse

from harness.bench import log, parse_at, pct, stop_on_sigterm
from harness.hitl_up import HitlUp
from harness.uvicorn import UvicornServer
from hitl_review.client.approve_calls import answer_keeping
from hitl_review.serve_app.ops.samples import product_composite

CONTROL_PLANE = ("ServeReplica:hitl:Api", "ServeReplica:hitl:Events", "ServeReplica:hitl:Archiver", "ProxyActor")
MODELS = ("ServeReplica:hitl:Detector", "ServeReplica:hitl:BoxValidator", "ServeReplica:hitl:Segmenter")


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def proc_groups(root_pid: int) -> dict[str, list[psutil.Process]]:
    """``hitl up``'s process tree (not another run's on the same machine) by role: the control plane,
    the model replicas, and the rest (the ``hitl up`` driver, Ray's raylet/GCS, Serve's controller)."""
    root = psutil.Process(root_pid)
    groups: dict[str, list[psutil.Process]] = {"control_plane": [], "models": [], "ray_and_driver": []}
    for p in [root, *root.children(recursive=True)]:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "redis-server" in cmd:
            continue  # its CPU comes from INFO cpu
        key = "control_plane" if any(n in cmd for n in CONTROL_PLANE) else "ray_and_driver"
        key = "models" if any(n in cmd for n in MODELS) else key
        groups[key].append(p)
    return groups


def role_of(p: psutil.Process) -> str:
    """A control-plane process's short name (Api, Events, Archiver, ProxyActor) and its pid."""
    try:
        role = next((n.split(":")[-1] for n in CONTROL_PLANE if n in " ".join(p.cmdline())), "proc")
    except psutil.Error:
        role = "gone"
    return f"{role}-{p.pid}"


def redis_cpu(r: redis.Redis | None) -> dict[str, Any]:
    """The Redis server's CPU seconds (INFO cpu) and its commandstats (calls, usec per command)."""
    if r is None:
        return {}
    cpu = r.info("cpu")
    stats = r.info("commandstats")
    return {
        "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "commands": {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()},
    }


def redis_per_job(before: dict[str, Any], after: dict[str, Any], jobs: int) -> dict[str, Any]:
    if not before:
        return {}
    cmds = {}
    for name, (calls, usec) in after["commands"].items():
        c0, u0 = before["commands"].get(name, (0, 0))
        if calls > c0:
            cmds[name] = {"calls_per_job": round((calls - c0) / jobs, 2), "usec_per_job": round((usec - u0) / jobs, 1)}
    top = dict(sorted(cmds.items(), key=lambda kv: -kv[1]["usec_per_job"]))  # every command, costliest first
    return {
        "redis_cpu_ms_per_job": round((after["cpu_s"] - before["cpu_s"]) / jobs * 1000, 2),
        "redis_calls_per_job": round(sum(v["calls_per_job"] for v in cmds.values()), 1),
        "redis_top_commands": top,
    }


class Profiler:
    """py-spy record (raw collapsed stacks) of each control-plane process while the run lasts."""

    def __init__(self, out_dir: Path | None, name: str, procs: list[psutil.Process]) -> None:
        self.children: list[subprocess.Popen[bytes]] = []
        if out_dir is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        for p in procs:
            out = out_dir / f"{name}-{role_of(p)}.txt"
            cmd = [str(spy), "record", "--format", "raw", "-r", "100", "--nonblocking", "-p", str(p.pid)]
            cmd += ["-o", str(out)]
            self.children.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # py-spy attached

    def stop(self) -> None:
        for c in self.children:
            c.send_signal(signal.SIGINT)
        for c in self.children:
            c.wait(timeout=30)


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
        "jobs_per_s": round(jobs / wall, 2),
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
    name: str,
    api_url: str,
    token: str,
    groups: dict[str, list[psutil.Process]],
    args: argparse.Namespace,
    seed: int,
    redis_url: str | None = None,
) -> dict[str, Any]:
    log(f"{name}: warm-up ({max(2, args.concurrency)} jobs)")
    await run_workload(api_url, token, max(2, args.concurrency), args.concurrency, seed + 10_000)
    await asyncio.sleep(2.0)  # the warm-up's archive copies done
    r = redis.Redis.from_url(redis_url) if redis_url else None
    idle = {}
    if args.idle_s:  # what the loops cost with no work: per second, apart from the jobs' cost
        idle0 = {k: cpu_seconds(v) for k, v in groups.items()}
        red_idle0 = redis_cpu(r)
        await asyncio.sleep(args.idle_s)
        idle = {k: (cpu_seconds(v) - idle0[k]) / args.idle_s for k, v in groups.items()}
        if red_idle0:
            idle["redis"] = (redis_cpu(r)["cpu_s"] - red_idle0["cpu_s"]) / args.idle_s
    profiler = Profiler(Path(args.profile) if args.profile else None, name, groups["control_plane"])
    cpu0 = {k: cpu_seconds(v) for k, v in groups.items()}
    by_proc0 = {p.pid: cpu_seconds([p]) for p in groups["control_plane"]}
    red0 = redis_cpu(r)
    load0 = os.getloadavg()[0]
    log(f"{name}: {args.jobs} jobs, {args.concurrency} concurrent reviewers")
    res = await run_workload(api_url, token, args.jobs, args.concurrency, seed)
    # the archiver copies each finished job after its JOB_FINISHED: wait for it (within the run's CPU)
    await asyncio.sleep(args.settle_s)
    profiler.stop()
    cpu = {k: round((cpu_seconds(v) - cpu0[k]) / args.jobs * 1000, 1) for k, v in groups.items()}
    res["control_plane_cpu_ms_per_job"] = cpu["control_plane"]
    res["cpu_ms_per_job_by_group"] = cpu
    res["cpu_processes"] = {k: len(v) for k, v in groups.items()}
    res["control_plane_cpu_ms_per_job_by_process"] = {
        role_of(p): round((cpu_seconds([p]) - by_proc0[p.pid]) / args.jobs * 1000, 1) for p in groups["control_plane"]
    }
    res.update(redis_per_job(red0, redis_cpu(r), args.jobs))
    if idle:
        # per job less what the same seconds cost idle (the loops' polls): the jobs' own cost
        span = res["wall_s"] + args.settle_s
        res["idle_cpu_ms_per_s"] = {k: round(v * 1000, 1) for k, v in idle.items()}
        res["control_plane_cpu_ms_per_job_less_idle"] = round(
            cpu["control_plane"] - idle["control_plane"] * span / args.jobs * 1000, 1
        )
        if "redis" in idle and "redis_cpu_ms_per_job" in res:
            res["redis_cpu_ms_per_job_less_idle"] = round(
                res["redis_cpu_ms_per_job"] - idle["redis"] * span / args.jobs * 1000, 2
            )
    if res.get("redis_cpu_ms_per_job"):
        res["control_plane_over_redis"] = round(cpu["control_plane"] / res["redis_cpu_ms_per_job"], 1)
    res["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    log(
        f"{name}: {res['jobs_per_s']} jobs/s, control plane {cpu['control_plane']} ms CPU/job, "
        f"Redis {res.get('redis_cpu_ms_per_job')} ms/job, SSE p50 {res['sse_latency_p50_ms']} ms"
    )
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


def print_rounds(rounds: list[dict[str, Any]], args: argparse.Namespace) -> None:
    keys = (
        ("jobs/s", "jobs_per_s"),
        ("job latency p50 (s)", "job_latency_p50_s"),
        ("control plane CPU ms/job", "control_plane_cpu_ms_per_job"),
        ("  less idle polling", "control_plane_cpu_ms_per_job_less_idle"),
        ("Redis CPU ms/job", "redis_cpu_ms_per_job"),
        ("  less idle polling", "redis_cpu_ms_per_job_less_idle"),
        ("control plane / Redis", "control_plane_over_redis"),
        ("Redis calls/job", "redis_calls_per_job"),
    )
    print(f"\n{'metric':<28}" + "".join(f"{r['server'][:18]:>20}" for r in rounds))
    print("-" * (28 + 20 * len(rounds)))
    for label, key in keys:
        print(f"{label:<28}" + "".join(f"{r.get(key, '-')!s:>20}" for r in rounds))
    for group in ("models", "ray_and_driver"):
        print(f"{group + ' CPU ms/job':<28}" + "".join(f"{r['cpu_ms_per_job_by_group'][group]!s:>20}" for r in rounds))
    print(
        f"\n{args.jobs} jobs, {args.concurrency} concurrent automatic reviewers, detector {args.detector}, "
        f"segmenter {args.segmenter}, delay {args.delay_ms} ms; load average (1 min) before/after: "
        + ", ".join(str(r["load_avg_1m"]) for r in rounds)
    )


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
    ap.add_argument("--detector", default="classical", help="hitl up --detector (null: no model cost)")
    ap.add_argument("--segmenter", default="classical", help="hitl up --segmenter (null: no model cost)")
    ap.add_argument("--servers", default="ray-serve,uvicorn", help="which of ray-serve,uvicorn to run")
    ap.add_argument("--baseline", help="also run hitl up from this checkout (PYTHONPATH), alternated")
    ap.add_argument("--after", help="also run hitl up from this checkout, after the baseline in each round")
    ap.add_argument("--rounds", type=int, default=1, help="with --baseline: alternations (baseline first)")
    ap.add_argument("--settle-s", type=float, default=3.0, help="after the last job: archive copies finish")
    ap.add_argument("--idle-s", type=float, default=10.0, help="first measure the idle CPU this long (0: skip)")
    ap.add_argument("--profile", help="py-spy raw stacks of each control-plane process into this folder")
    ap.add_argument("--json", default="benchmarks/out/e2e.json")
    args = ap.parse_args()
    servers = args.servers.split(",")
    out: dict[str, Any] = {
        "config": vars(args),
        "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
    }
    tmp = Path(tempfile.mkdtemp(prefix="hitl-e2e-bench-"))
    log(f"starting hitl up --no-ui --detector-delay-ms {args.delay_ms} --quality-gate off in {tmp}")
    # The same workload on both: the uvicorn harness records the quality gate's verdicts only, so Ray
    # Serve runs with --quality-gate off too (no mask review: this compares the serving paths).
    flags: tuple[str, ...] = ("--detector-delay-ms", str(args.delay_ms), "--quality-gate", "off")
    flags += ("--detector", args.detector, "--segmenter", args.segmenter)
    if args.segmenter == "null":
        # The null segmenter's mask is its box, which a pixel gate always fails: each subject would be refined
        # twice and gated three times (the "models" CPU of such a run was ~60 % gate and PNG work a real mask
        # that passes never costs). One gate per subject, as for a mask that passes.
        flags += ("--max-refinements", "0")
    # (name, checkout): Ray's workers put the driver's working directory first on their sys.path, so
    # a checkout is both the PYTHONPATH and the working directory of its hitl up
    one_round: list[tuple[str, Path]] = []
    if args.baseline:
        one_round.append(("ray-serve-baseline", Path(args.baseline).resolve()))
    if args.after:
        one_round.append(("ray-serve-after", Path(args.after).resolve()))
    if "ray-serve" in servers:
        one_round.append(("ray-serve", Path.cwd()))
    runs = one_round * args.rounds
    for i, (name, checkout) in enumerate(runs):
        env = {"PYTHONPATH": str(checkout)}
        here = Path.cwd()
        os.chdir(checkout)
        try:
            up = HitlUp(tmp / f"ray{i}", *flags, env=env, log_path=tmp / f"ray{i}.log").start()
        finally:
            os.chdir(here)
        log(f"{name}: hitl up from {checkout}")
        try:
            res = asyncio.run(measure(name, up.api_url, up.token, proc_groups(up.pid), args, 0, up.redis_url))
        finally:
            up.stop()
        out.setdefault("rounds", []).append({"server": name, **res})
        out[name] = res  # the last round of each
    if "uvicorn" not in servers:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
        print_rounds(out["rounds"], args)
        print(f"wrote {args.json}")
        return 0
    uv = UvicornServer(
        tmp / "uv",
        dispatchers=1,
        detector_delay_ms=args.delay_ms,
        detector=args.detector,
        segmenter=args.segmenter,
        log_path=tmp / "uv.log",
    )
    try:
        uv.start()
        assert uv.pid is not None
        uv_groups = {"control_plane": [psutil.Process(uv.pid)], "models": [], "ray_and_driver": []}
        out["uvicorn"] = asyncio.run(measure("uvicorn", uv.api_url, uv.token, uv_groups, args, 0, uv.redis_url))
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
    stop_on_sigterm()
    sys.exit(main())
