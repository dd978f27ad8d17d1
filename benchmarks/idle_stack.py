"""What does a `hitl up` cost in CPU to start, and while nobody uses it? Per process, per variant.

Each variant starts a real `hitl up` with the UI (embedded redis-server, local Ray, Serve, the page
server; ``harness.hitl_up``) with the environment the variant adds, waits for READY, lets it settle
``--settle`` seconds, then reads every process's CPU time (user + system, ``psutil``) over
``--seconds`` with no request at all: the idle cost in ms of CPU per second, by process. The start's
cost is the whole tree's CPU time at the first reading (the processes of the start that have already
exited, such as Ray's short-lived helpers, are not in it). Variants run one after another on the
same host, so compare them within one run (ratios), not across runs.

Variants are ``NAME`` or ``NAME:KEY=VALUE[,KEY=VALUE…]``; the default pair is `hitl up` as shipped
and one with Serve's own control-loop interval (0.1 s) instead of ours (docs/scaling.md § The
controller's loop).

    .venv/bin/python benchmarks/idle_stack.py --json benchmarks/out/idle_stack.json
    .venv/bin/python benchmarks/idle_stack.py --variants shipped 'metrics:RAY_SERVE_METRICS_EXPORT_INTERVAL_MS=1000'
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from harness.bench import stop_on_sigterm
from harness.hitl_up import HitlUp

DEFAULT_VARIANTS = ["shipped", "serve-default-loop:RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.1"]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    env = dict(pair.split("=", 1) for pair in rest.split(",") if pair)
    return name, env


def kind(proc: psutil.Process) -> str:
    """A name for the process that is the same from run to run: Ray's actor title, or what it runs."""
    cmd = proc.cmdline()
    line = " ".join(cmd)
    if line.startswith("ray::"):
        return line.split()[0].split(".")[0]  # ray::ServeController.listen_for_change -> ray::ServeController
    for marker, name in (
        ("hitl_review.ui", "reviewer page server"),
        ("hitl_review.serve_app.cli", "hitl up (main)"),
        ("dashboard/dashboard.py", "ray dashboard"),
        ("log_monitor.py", "ray log monitor"),
        ("autoscaler/_private/monitor.py", "ray monitor"),
    ):
        if marker in line:
            return name
    return proc.name()


def cpu_by_pid(root: psutil.Process) -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            out[proc.pid] = (kind(proc), t.user + t.system)
        except psutil.Error:
            continue
    return out


def measure(name: str, env: dict[str, str], settle: float, seconds: float) -> dict[str, Any]:
    began = time.monotonic()
    up = HitlUp(Path(tempfile.mkdtemp(prefix="idle-stack-")), ui=True, env=env).start(timeout=400)
    try:
        ready_s = time.monotonic() - began
        print(f"[{name}] READY in {ready_s:.1f} s; settling {settle:.0f} s, then {seconds:.0f} s idle", flush=True)
        time.sleep(settle)
        root = psutil.Process(up.pid)
        first = cpu_by_pid(root)
        t0 = time.monotonic()
        time.sleep(seconds)
        second = cpu_by_pid(root)
        span = time.monotonic() - t0
    finally:
        up.stop()
    started: dict[str, float] = {}
    for what, cpu in first.values():
        started[what] = started.get(what, 0.0) + cpu
    idle: dict[str, float] = {}
    for pid, (what, cpu) in second.items():
        idle[what] = idle.get(what, 0.0) + 1000 * (cpu - first.get(pid, (what, 0.0))[1]) / span
    return {
        "variant": name,
        "env": env,
        "ready_s": round(ready_s, 1),
        "start_cpu_s": round(sum(cpu for _, cpu in first.values()), 1),
        "start_cpu_by_process": {k: round(v, 2) for k, v in sorted(started.items(), key=lambda kv: -kv[1])},
        "idle_ms_per_s": round(sum(idle.values()), 1),
        "idle_by_process": {k: round(v, 1) for k, v in sorted(idle.items(), key=lambda kv: -kv[1])},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="NAME or NAME:KEY=VALUE,… (see above)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after READY before the idle reading")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the idle reading")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    results = [measure(*parse_variant(v), args.settle, args.seconds) for v in args.variants]
    kinds = sorted(
        {k for r in results for k in r["idle_by_process"]}, key=lambda k: -results[0]["idle_by_process"].get(k, 0)
    )
    width = max(len(k) for k in kinds)
    print()
    print(f"{'idle ms of CPU per s':<{width}} " + " ".join(f"{r['variant']:>20}" for r in results))
    for k in kinds:
        print(f"{k:<{width}} " + " ".join(f"{r['idle_by_process'].get(k, 0.0):>20.1f}" for r in results))
    print(f"{'all':<{width}} " + " ".join(f"{r['idle_ms_per_s']:>20.1f}" for r in results))
    print(f"{'start: CPU s':<{width}} " + " ".join(f"{r['start_cpu_s']:>20.1f}" for r in results))
    print(f"{'start: READY s':<{width}} " + " ".join(f"{r['ready_s']:>20.1f}" for r in results))
    starts = sorted(
        {k for r in results for k in r["start_cpu_by_process"]},
        key=lambda k: -results[0]["start_cpu_by_process"].get(k, 0),
    )
    print()
    print(f"{'start: CPU s by process':<{width}} " + " ".join(f"{r['variant']:>20}" for r in results))
    for k in starts:
        print(f"{k:<{width}} " + " ".join(f"{r['start_cpu_by_process'].get(k, 0.0):>20.2f}" for r in results))
    base = results[0]["idle_ms_per_s"]
    for r in results[1:]:
        print(f"idle {r['variant']} / {results[0]['variant']}: {r['idle_ms_per_s'] / base:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"host": {"cpus": psutil.cpu_count(), "python": platform.python_version()}, "results": results}
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    stop_on_sigterm()
    main()
