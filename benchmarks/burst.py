"""Burst: N jobs submitted at once on ``hitl up`` (default settings plus slow classical models), automatic
reviewers answering every pause, through to a terminal state. What it measures, per phase:

- **drain**: first submission → last job terminal (the last ``JOB_FINISHED`` event's server time),
  against the ideal the model deployments allow. Detection stage ``D = jobs × detector delay ÷
  (Detector replicas × slots)``, segmentation stage ``G = approved subjects × segmenter delay ÷
  (Segmenter replicas × slots)`` (one node per subject, a job's side by side); the stages run on
  different deployments and overlap (reviewers answer as pauses open), so the ideal is the pipelined
  lower bound ``max(D + one segmentation, one detection + G)``.
  Replicas: the most replicas Serve reported RUNNING during the phase (its status API, what ``serve
  status`` reads; else the replicas seen in Ray's metrics; else the deployment defaults of
  ``deployments/serve.py``), slots: the deployment's ``max_ongoing_requests`` as Serve runs it; the
  model replicas run one thread per request slot (``deployments/serve.py``), so every slot is a node
  running at once. Efficiency = ideal ÷ actual (target ≥ 0.8);
- **model time** is the *simulated* delay (``--detector-delay-ms``, ``--segmenter-delay-ms``, passed to
  ``hitl up``): the ideal counts nothing else. The classical detector's and GrabCut segmenter's own
  compute comes on top of it, ~0.5-1 s of CPU per 640x480 image, which on a small host (2 cores) caps
  throughput far below what the delays allow and makes the efficiency meaningless; so the jobs' images
  are small composites (``serve_app.ops.samples.product_composite``), ``--image-size`` (default 320x240).
  The table names the delays and the image size, and also gives the ideal with the replicas' measured
  mean run times (delay + own compute + contention for the cores);
- **jobs by terminal status** and by ``reason_code``: FAILED, TIMED_OUT, EXECUTOR_LOST (target 0 each);
- **model executions per node**: the replicas' own ``ray_hitl_model_node_seconds_count`` (Ray's
  Prometheus endpoint, summed over replicas, the phase's increase; outcomes ``ok`` and ``error`` only:
  a ``not_started`` call, whose node was already running elsewhere or superseded, computed nothing)
  divided by the nodes that ran (distinct ``(job, node type)`` with a ``NODE_STARTED``; a retry is the
  same node again), target 1.00; plus the ``NODE_FAILED`` / ``NODE_RETRY_SCHEDULED`` /
  ``REPORT_IGNORED`` events;
- **dead letters** (``GET /api/v1/admin/dead-letters``), target 0;
- **Redis memory**: ``used_memory`` sampled every second (baseline, peak) and ``used_memory_peak``;
- **admission control** (a second ``hitl up`` with ``--max-backlog``, default 200): the 429
  ``BACKLOG_FULL`` answers (the submitter waits ``Retry-After`` and tries again, as the protocol says)
  and whether every accepted job still succeeds;
- **cancel at once** (after the drain, same ``hitl up``): N more jobs, wait until all are waiting for
  review, cancel them all at once, then the share whose retention started (the job's meta key has a
  TTL: archived and acknowledged, docs/protocol.md § Archive) within 2 minutes, target 100 %.

The reviewers find waiting jobs by reading the jobs' status from Redis (one pipelined read a second,
what the progress lines print too; a listing through the API would add its own load to what is
measured), then answer through the API as a person would: ``GET /jobs/{id}``, ``POST
/jobs/{id}/interventions`` keeping every proposed box (so each job goes on to segmentation), 503s and
dropped connections retried with the same intervention id. Targets missed are reported (``met``
column, ``targets`` in the JSON), not an exit status: the exit status is non-zero only when the run
itself broke.

This file is the entry point (arguments, the ``hitl up`` runs, the JSON); the driver (HTTP, Redis,
submitters, reviewers) is ``harness.burst_stack``, the phases and their figures ``harness.burst_phases``,
the ideal, the targets and the table ``harness.burst_report``.

    .venv/bin/python benchmarks/burst.py --jobs 120 --detector-delay-ms 500 --segmenter-delay-ms 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.bench import log, stop_on_sigterm
from harness.burst_phases import burst_phase, cancel_phase
from harness.burst_report import print_table, targets
from harness.burst_stack import Stack
from harness.hitl_up import HitlUp
from hitl_review.serve_app.ops.samples import product_composite


def hitl_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--detector-delay-ms", str(args.detector_delay_ms), "--segmenter-delay-ms", str(args.segmenter_delay_ms)]
    extra = list(args.hitl_arg or [])
    if any(a == "--segmenter" and b == "null" for a, b in zip(extra, extra[1:], strict=False)):
        # The null segmenter's mask is its box, which the pixel gate always fails: refined twice, each subject
        # would be segmented three times (three delays, not the ideal's one) and, under the default gate, wait
        # for a mask review. The burst then measures what the ideal counts: one segmentation per subject.
        for flag, value in (("--quality-gate", "off"), ("--max-refinements", "0")):
            if flag not in extra:
                log(f"--segmenter null: adding {flag} {value} (a box as the mask fails the pixel gate)")
                extra += [flag, value]
    return flags + extra


async def run_stack(up: HitlUp, args: argparse.Namespace, images: list[bytes], phases: list[str]) -> dict[str, Any]:
    stack = Stack(up, args, images)
    out: dict[str, Any] = {}
    try:
        if stack.watcher is not None:  # one answer from Serve before the burst: the config it runs
            for _ in range(20):
                if stack.watcher.config:
                    break
                await asyncio.sleep(0.5)
        for phase in phases:
            if phase == "burst":
                log(f"burst: {args.jobs} jobs at once, {args.reviewers} automatic reviewers")
                out["burst"] = await burst_phase(stack, args.jobs, "burst")
            elif phase == "backlog":
                log(f"backlog: {args.jobs} jobs at once against --max-backlog {args.max_backlog}")
                out["backlog"] = await burst_phase(stack, args.jobs, "backlog")
            elif phase == "cancel":
                log(f"cancel: {args.jobs} more jobs, to be cancelled together once all wait for review")
                out["cancel"] = await cancel_phase(stack, args.jobs)
        if stack.watcher is not None:
            out["serve"] = {"config": stack.watcher.config, "polls": stack.watcher.samples}
    finally:
        await stack.close()
    return out


def start(args: argparse.Namespace, data_dir: Path, extra: list[str]) -> HitlUp:
    flags = hitl_flags(args) + extra
    log(f"starting hitl up {' '.join(flags)} in {data_dir}")
    t0 = time.monotonic()
    up = HitlUp(data_dir, *flags, dashboard=not args.no_dashboard, log_path=data_dir / "hitl-up.log")
    up.start(timeout=args.start_timeout_s)
    log(f"hitl up ready in {time.monotonic() - t0:.0f}s: {up.api_url} dashboard={up.dashboard_url}")
    return up


def image_size(text: str) -> tuple[int, int]:
    """``--image-size WxH``: ``320x240`` → ``(320, 240)``."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or int(m.group(1)) < 16 or int(m.group(2)) < 16:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WxH, each at least 16, e.g. 320x240")
    return int(m.group(1)), int(m.group(2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="jobs submitted at once (each phase)")
    ap.add_argument(
        "--detector-delay-ms", type=int, default=500, help="hitl up --detector-delay-ms (the simulated model time)"
    )
    ap.add_argument(
        "--segmenter-delay-ms", type=int, default=200, help="hitl up --segmenter-delay-ms (the simulated model time)"
    )
    ap.add_argument(
        "--max-backlog",
        type=int,
        default=200,
        help="the admission-control phase: a second hitl up with --max-backlog N (0: skip that phase)",
    )
    ap.add_argument("--reviewers", type=int, default=16, help="automatic reviewers answering at the same time")
    ap.add_argument("--submit-concurrency", type=int, default=32, help="POST /jobs in flight at once")
    ap.add_argument("--timeout-s", type=float, default=1800, help="each phase gives up after this long")
    ap.add_argument("--start-timeout-s", type=float, default=400, help="waiting for hitl up's READY line")
    ap.add_argument("--poll-s", type=float, default=1.0, help="how often the jobs' statuses are read")
    ap.add_argument("--progress-s", type=float, default=5.0, help="how often a progress line is printed")
    ap.add_argument("--distinct-images", type=int, default=32, help="the jobs cycle through this many images")
    ap.add_argument(
        "--image-size",
        type=image_size,
        default=(320, 240),
        metavar="WxH",
        help="size of the composite images (default 320x240): the classical models' own compute grows with it "
        "and is not in the ideal (model time is the simulated delay)",
    )
    ap.add_argument("--skip-cancel-phase", action="store_true", help="no cancel-at-once phase after the drain")
    ap.add_argument("--no-dashboard", action="store_true", help="no Ray dashboard: replicas from metrics/defaults")
    ap.add_argument(
        "--hitl-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for hitl up (repeat: --hitl-arg=--heartbeat-lapse-s --hitl-arg=30); with "
        "--segmenter null, --quality-gate off and --max-refinements 0 are added unless given (its box-shaped "
        "masks fail the pixel gate)",
    )
    ap.add_argument("--data-dir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/out/burst.json"))
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")

    width, height = args.image_size
    log(f"making {min(args.jobs, args.distinct_images)} distinct {width}x{height} images")
    images = [
        product_composite(seed=4000 + i, width=width, height=height, n=2)[0]
        for i in range(max(1, min(args.jobs, args.distinct_images)))
    ]
    out: dict[str, Any] = {
        "benchmark": "burst",
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "args": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "image_size": f"{width}x{height}",
        },
        "hitl_up_flags": hitl_flags(args),
        "model_time": {
            "detector_ms": args.detector_delay_ms,
            "segmenter_ms": args.segmenter_delay_ms,
            "image_size": f"{width}x{height}",
            "note": "model time is the simulated delay (hitl up --detector-delay-ms / --segmenter-delay-ms); "
            "the classical models' own compute per image comes on top and is not in the ideal",
        },
    }
    with tempfile.TemporaryDirectory(prefix="hitl-burst-") as tmp:
        root = args.data_dir or Path(tmp)
        phases = ["burst"] + ([] if args.skip_cancel_phase else ["cancel"])
        up = start(args, root / "default", [])
        try:
            out.update(asyncio.run(run_stack(up, args, images, phases)))
        finally:
            up.stop(60)
        if args.max_backlog > 0:
            up = start(args, root / "backlog", ["--max-backlog", str(args.max_backlog)])
            try:
                res = asyncio.run(run_stack(up, args, images, ["backlog"]))
                out["backlog"] = res["backlog"]
                out["backlog_serve"] = res.get("serve")
            finally:
                up.stop(60)
    out["targets"] = targets(out)
    print_table(out)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main())
