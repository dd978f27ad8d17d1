"""`make loadtest`: one command from nothing to a verdict.

    python -m loadtest.run [--seconds 60] [--users 50] [--spawn-rate 10] [--detector-delay-ms 80]
                           [--out loadtest/out] [--no-bench] [--docs docs/benchmarks.md]

Stages (as data in ``STAGES``, each timed in the summary): start a fresh ``hitl up --no-ui`` on free
ports in a temporary data directory with a GPU-like detector delay; run locust headless against it
(``loadtest/locustfile.py``); wait until the outbox is empty and check the invariants
(``loadtest.check_invariants``); benchmark the intervention path against the same server
(``benchmarks/bench_interventions.py``); stop everything with SIGTERM. Writes under ``--out``:
locust's CSV and HTML report, the client record (JSONL), the invariant report, the benchmark JSON
and ``summary.json``.

Exits non-zero on any invariant breach, any 5xx or dropped connection, any failed protocol check
seen by the clients (two winners of one race, a stale tab that won, ...), or when a stage fails.
CI runs the short form: ``python -m loadtest.run --seconds 20 --users 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.hitl_up import HitlUp
from harness.uvicorn import UvicornServer
from hitl_review.statecore.store import Store

from .check_invariants import Report, check, print_report

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_interventions.py"
STAGES = ("start", "locust", "check", "bench", "stop")


def run_locust(args: argparse.Namespace, api_url: str, token: str, out: Path) -> int:
    env = {
        **os.environ,
        "HITL_TOKEN": token,
        "HITL_LT_RECORD": str(out / "record.jsonl"),
        "HITL_LT_SUMMARY": str(out / "locust_summary.json"),
    }
    if args.weights:
        env["HITL_LT_WEIGHTS"] = args.weights
    if args.counts:
        env["HITL_LT_COUNTS"] = args.counts
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / "loadtest" / "locustfile.py"),
        "--headless",
        "-u",
        str(args.users),
        "-r",
        str(args.spawn_rate),
        "-t",
        f"{args.seconds}s",
        "--host",
        api_url,
        "--csv",
        str(out / "locust"),
        "--html",
        str(out / "locust.html"),
        "--only-summary",
        "--stop-timeout",
        "5",
        *args.locust_args,
    ]
    print("$ " + " ".join(cmd), flush=True)
    with (out / "locust.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
        assert proc.stdout
        for line in proc.stdout:
            log.write(line)
            sys.stdout.write(line)
        return proc.wait()


def locust_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "locust_stats.csv"
    if not path.exists():
        return []
    rows = []
    with path.open() as f:
        for r in csv.DictReader(f):
            rows.append(
                {
                    "type": r["Type"],
                    "name": r["Name"],
                    "count": int(r["Request Count"]),
                    "failures": int(r["Failure Count"]),
                    "p50": r["50%"],
                    "p95": r["95%"],
                    "p99": r["99%"],
                    "rps": r["Requests/s"],
                }
            )
    return rows


def first_detail(jobs: dict[str, list[str]]) -> str | None:
    return next((f"{j}: {d[0]}" for j, d in sorted(jobs.items()) if d), None)


def check_now(redis_url: str, api_url: str, token: str, out: Path, quiet_timeout: float) -> dict[str, Any]:
    async def go() -> Report:
        store = Store.from_url(redis_url, max_connections=64)
        try:
            return await check(
                store, record=out / "record.jsonl", api_url=api_url, token=token, quiet_timeout=quiet_timeout
            )
        finally:
            await store.close()

    rep = asyncio.run(go())
    print_report(rep)
    result = rep.to_json()
    (out / "invariants.json").write_text(json.dumps(result, indent=2))
    return result


def run_bench(
    args: argparse.Namespace, api_url: str, redis_url: str, token: str, data_dir: Path, out: Path
) -> tuple[int, dict[str, Any] | None]:
    """The intervention benchmark against the running server, in a process of its own (it prints its
    tables; with ``--docs`` it also rewrites that section, with the summary so far)."""
    result = out / "bench_interventions.json"
    cmd = [
        sys.executable,
        str(BENCH),
        "--api-url",
        api_url,
        "--redis-url",
        redis_url,
        "--data-dir",
        str(data_dir),
        "--token",
        token,
        "--out",
        str(out),
        "--json",
        str(result),
        "--jobs",
        str(args.bench_jobs),
        "--concurrency",
        args.bench_concurrency,
        "--rounds",
        "2",
        "--consume",
        args.bench_consume,
    ]
    if args.docs:
        cmd += ["--docs", args.docs, "--loadtest-summary", str(out / "summary.json")]
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    return rc, json.loads(result.read_text()) if rc == 0 and result.exists() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="locust run time (default 60)")
    ap.add_argument("--users", type=int, default=50, help="locust users (default 50)")
    ap.add_argument("--spawn-rate", type=float, default=10, help="users started per second (default 10)")
    ap.add_argument("--detector-delay-ms", type=int, default=80, help="simulated model latency (default 80)")
    ap.add_argument("--out", default=str(ROOT / "loadtest" / "out"), help="reports folder (default loadtest/out)")
    ap.add_argument(
        "--server",
        choices=["hitl-up", "uvicorn"],
        default="hitl-up",
        help="hitl-up (Ray Serve, default) or uvicorn (the same app without Ray; no benchmark)",
    )
    ap.add_argument("--weights", default="", help="user class weights, e.g. Reviewer=4,Canceller=1")
    ap.add_argument("--counts", default="", help="fixed user counts, e.g. RivalReviewers=2")
    ap.add_argument(
        "--quality-gate",
        choices=["review-failing", "review-all", "off"],
        default="review-failing",
        help="hitl up's --quality-gate (default review-failing: the cut-outs the gate still fails wait for a "
        "Reviewer user's decision, so the load covers the mask review too; the uvicorn server ignores it)",
    )
    ap.add_argument("--quiet-timeout", type=float, default=120, help="seconds to wait for an empty outbox")
    ap.add_argument("--no-bench", action="store_true", help="skip the intervention benchmark")
    ap.add_argument("--bench-jobs", type=int, default=60, help="benchmark jobs per door and concurrency")
    ap.add_argument("--bench-concurrency", default="1,8", help="benchmark client concurrencies")
    ap.add_argument(
        "--bench-consume",
        choices=["empty", "keep"],
        default="empty",
        help="what the benchmark's 200 submits (see benchmarks/bench_interventions.py)",
    )
    ap.add_argument("--docs", default=None, help="rewrite the 'Interventions under load' section of this file")
    ap.add_argument("--keep-data", action="store_true", help="keep the temporary data directory")
    ap.add_argument("locust_args", nargs="*", help="extra locust arguments after --, e.g. -- --tags review")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("record.jsonl", "locust_summary.json", "invariants.json", "bench_interventions.json"):
        (out / stale).unlink(missing_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="hitl-loadtest-"))
    timings: dict[str, float] = {}
    problems: list[str] = []
    summary: dict[str, Any] = {"config": {k: v for k, v in vars(args).items()}, "data_dir": str(data_dir)}
    server: HitlUp | UvicornServer | None = None
    t = time.monotonic()
    try:
        print(f"[start] {args.server} in {data_dir} (detector delay {args.detector_delay_ms} ms)", flush=True)
        if args.server == "hitl-up":
            server = HitlUp(
                data_dir,
                "--detector-delay-ms",
                str(args.detector_delay_ms),
                "--quality-gate",
                args.quality_gate,
                log_path=out / "hitl-up.log",
            )
        else:
            server = UvicornServer(
                data_dir, dispatchers=1, detector_delay_ms=args.detector_delay_ms, log_path=out / "uvicorn.log"
            )
        server.start()
        redis_url = server.redis_url
        if not redis_url:
            raise RuntimeError("the server did not say where its redis-server is")
        token = server.token
        print(f"[start] api={server.api_url} redis={redis_url} ({time.monotonic() - t:.1f}s)", flush=True)
        summary["server"] = {"kind": args.server, "api_url": server.api_url, "redis_url": redis_url}
        timings["start"] = time.monotonic() - t

        t = time.monotonic()
        rc = run_locust(args, server.api_url, token, out)
        timings["locust"] = time.monotonic() - t
        lsum_path = out / "locust_summary.json"
        lsum = json.loads(lsum_path.read_text()) if lsum_path.exists() else {}
        rows = locust_rows(out)
        agg = next((r for r in rows if r["name"] == "Aggregated"), {})
        summary["locust"] = {
            "exit_code": rc,
            "requests": agg.get("count"),
            "failures": agg.get("failures"),
            "server_errors": lsum.get("server_errors"),
            "transport_errors": lsum.get("transport_errors"),
            "checks_failed": lsum.get("checks_failed"),
            "checks": lsum.get("checks"),
            "rows": [r for r in rows if r["name"] != "Aggregated"],
        }
        unexpected = sum(r["failures"] for r in rows if r["type"] in ("GET", "POST"))
        summary["locust"]["unexpected_answers"] = unexpected
        if rc not in (0, 1) or not lsum:
            problems.append(f"locust did not complete (exit {rc})")
        if lsum.get("server_errors"):
            problems.append(f"{lsum['server_errors']} 5xx answers: {lsum.get('server_errors_by_name')}")
        if lsum.get("transport_errors"):
            problems.append(f"{lsum['transport_errors']} dropped connections: {lsum.get('transport_errors_by_name')}")
        if lsum.get("checks_failed"):
            failed = {k: v for k, v in (lsum.get("checks") or {}).items() if v.get("failed")}
            problems.append(f"{lsum['checks_failed']} failed protocol checks: {failed}")

        print("[check] waiting for an empty outbox, then checking every job", flush=True)
        t = time.monotonic()
        inv = check_now(redis_url, server.api_url, token, out, args.quiet_timeout)
        timings["check"] = time.monotonic() - t
        summary["invariants"] = {
            "jobs": inv.get("jobs"),
            "breaches": inv["breaches"],
            "quiet": inv.get("quiet"),
            "invariants": {
                k: {
                    "checked": v["checked"],
                    "breaches": v["breaches"],
                    "jobs": sorted(v["jobs"]),
                    "example": first_detail(v["jobs"]),
                }
                for k, v in inv["invariants"].items()
            },
        }
        if inv["breaches"]:
            problems.append(
                f"{inv['breaches']} invariant breaches: "
                + "; ".join(
                    f"{k}: {' '.join(sorted(v['jobs']))}" for k, v in inv["invariants"].items() if v["breaches"]
                )
            )

        if not args.no_bench and args.server == "hitl-up":
            print("[bench] interventions: Ray Serve vs uvicorn vs store", flush=True)
            t = time.monotonic()
            if args.docs:  # the docs section quotes the load run so far
                (out / "summary.json").write_text(json.dumps({**summary, "problems": problems}, indent=2))
            rc_bench, res = run_bench(args, server.api_url, redis_url, token, data_dir, out)
            if res is None:  # the verdict is the load test's; a failed benchmark is reported
                problems.append(f"benchmark failed (exit {rc_bench}; its output is above)")
            else:
                summary["bench"] = {"json": str(out / "bench_interventions.json"), "comparison": res["comparison"]}
            timings["bench"] = time.monotonic() - t
    except Exception as e:
        problems.append(f"{type(e).__name__}: {e}")
        raise
    finally:
        t = time.monotonic()
        if server is not None:
            rc_stop = server.stop()
            summary["server_exit_code"] = rc_stop
            print(f"[stop] server exited with {rc_stop}", flush=True)
        timings["stop"] = time.monotonic() - t
        summary["timings_s"] = {k: round(timings[k], 1) for k in STAGES if k in timings}
        summary["problems"] = problems
        summary["ok"] = not problems
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(f"[summary] {out / 'summary.json'}: " + ("OK" if not problems else "FAILED"))
    for p in problems:
        print(f"  - {p}")
    if summary["locust"].get("unexpected_answers"):
        print(
            f"  note: {summary['locust']['unexpected_answers']} answers a scenario did not expect (see "
            f"{out / 'locust_failures.csv'}); not fatal by themselves"
        )
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
