"""One job's subjects cut side by side (SPEC §13): from a reviewer's approval to the job's last
cut-out, per number of subjects, on ``hitl up`` with its default settings and the classical backend;
the knobs changed: ``--segmenter-delay-ms`` (each subject's segmentation takes at least that long,
so model time dominates what is measured) and ``--quality-gate off`` (the gate records its verdict
and nothing waits for a person, so the time ends at the cut).

Jobs go one at a time (submit, wait for the box pause, approve every proposed box, wait for the end),
so the Segmenter is never busy with another job: the figure is one job's latency. For each job, ``cut``
is the server time from its ``INTERVENTION_ACCEPTED`` to its last ``SUBJECT_SEGMENTED`` event. The
baselines in the same run are the bounds: cutting ``k`` subjects one after another needs at least ``k
× delay`` (``serial``), side by side at least one ``delay`` (``parallel``); ``cut ÷ serial`` below 1
is time the fan-out saved.

    .venv/bin/python benchmarks/subject_fanout.py --subjects 1,2,4 --jobs 5 --segmenter-delay-ms 500

``--store WRITERS`` measures the store alone instead (benchmarks/subject_race.py): one job per subject
count on its own redis-server, every subject node started and reported by WRITERS racing tasks; the
time, the STALE answers (writes planned again because the job changed under them) and the moves on:

    .venv/bin/python benchmarks/subject_fanout.py --store 16 --subjects 2,50,200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from harness.bench import stop_on_sigterm
from harness.hitl_up import HitlUp
from harness.sse import read_events
from hitl_review.serve_app.ops.samples import product_composite


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def at_s(ev: dict[str, Any]) -> float:
    return datetime.fromisoformat(ev["at"].replace("Z", "+00:00")).timestamp()


def wait(c: httpx.Client, job_id: str, statuses: set[str], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        snap: dict[str, Any] = c.get(f"/api/v1/jobs/{job_id}").json()
        if snap["status"] in statuses:
            return snap
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job_id} still {snap['status']} after {timeout_s:.0f}s")
        time.sleep(0.05)


def one_job(c: httpx.Client, seed: int, k: int, timeout_s: float) -> dict[str, Any]:
    """Submit an image of ``k`` objects, approve every box the detector proposed, wait for the end."""
    png = product_composite(seed=seed, width=480, height=360, n=k)[0]
    r = c.post("/api/v1/jobs", files={"image": ("x.png", png, "image/png")})
    r.raise_for_status()
    job_id = r.json()["job_id"]
    snap = wait(c, job_id, {"WAITING_USER_SELECTION"}, timeout_s)
    body = {
        "intervention_id": f"iv_{uuid.uuid4().hex[:12]}",
        "pause_token": snap["active_pause"]["pause_token"],
        "base_version": snap["version"],
        "subjects": [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]],
    }
    c.post(f"/api/v1/jobs/{job_id}/interventions", json=body).raise_for_status()
    done = wait(c, job_id, {"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}, timeout_s)
    events = read_events(c, job_id, until="JOB_FINISHED", timeout=timeout_s)
    accepted = next(e for e in events if e["type"] == "INTERVENTION_ACCEPTED")
    cut = [e for e in events if e["type"] == "SUBJECT_SEGMENTED"]
    starts = [e for e in events if e["type"] == "NODE_STARTED" and e["data"].get("node_type") == "SEGMENT_SUBJECT"]
    return {
        "job_id": job_id,
        "status": done["status"],
        "boxes": len(snap["box_list"]),
        "subjects_cut": len(cut),
        "cut_s": round(max(at_s(e) for e in cut) - at_s(accepted), 3) if cut else None,
        "first_start_s": round(min(at_s(e) for e in starts) - at_s(accepted), 3) if starts else None,
    }


def table(rows: list[dict[str, Any]], delay_ms: int) -> str:
    head = f"{'subjects':>8} {'jobs':>5} {'cut p50 (s)':>12} {'cut max (s)':>12} {'serial (s)':>11} "
    head += f"{'parallel (s)':>13} {'cut/serial':>11}"
    out = [f"segmenter delay {delay_ms} ms; one job at a time; approval → last SUBJECT_SEGMENTED", head]
    out.append("-" * len(head))
    for r in rows:
        out.append(
            f"{r['subjects']:>8} {r['jobs']:>5} {r['cut_p50_s']:>12.3f} {r['cut_max_s']:>12.3f} "
            f"{r['serial_bound_s']:>11.3f} {r['parallel_bound_s']:>13.3f} {r['cut_over_serial']:>11.2f}"
        )
    return "\n".join(out)


async def store_only(counts: list[int], writers: int) -> list[dict[str, Any]]:
    """``subject_race.race`` for each count, one fresh job each, on a redis-server of its own."""
    from benchmarks.subject_race import race
    from hitl_review.serve_app.ops.redis_server import RedisServer
    from hitl_review.statecore.store import Store, StoreConfig

    rows = []
    with tempfile.TemporaryDirectory(prefix="hitl-race-") as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            for k in counts:
                store = Store.from_url(server.url, StoreConfig(retention_s=3600, node_timeout_s=600))
                await store.r.flushdb()
                await store.ensure_groups()
                try:
                    row = await race(store, k, writers)
                finally:
                    await store.close()
                log(f"{k} subjects, {writers} writers: {row['seconds']} s, {row['stale']} STALE, {row['answers']}")
                rows.append(row)
        finally:
            server.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subjects", default="1,2,4", help="objects per image, comma-separated (default 1,2,4)")
    ap.add_argument("--jobs", type=int, default=5, help="jobs per subject count (default 5)")
    ap.add_argument("--segmenter-delay-ms", type=int, default=500, help="each segmentation's model time (default 500)")
    ap.add_argument("--timeout-s", type=float, default=120, help="one job gives up after this long")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/out/subject_fanout.json"))
    ap.add_argument("--store", type=int, default=0, metavar="WRITERS", help="the store alone, WRITERS racing writers")
    args = ap.parse_args()
    counts = [int(x) for x in args.subjects.split(",")]
    if args.store:
        found = asyncio.run(store_only(counts, args.store))
        head = f"{'subjects':>8} {'writers':>7} {'seconds':>8} {'STALE':>6} {'scripts':>8} {'moves':>5} {'meta B':>8}"
        print(head + "\n" + "-" * len(head))
        for r in found:
            print(
                f"{r['subjects']:>8} {r['writers']:>7} {r['seconds']:>8.3f} {r['stale']:>6} {r['script_calls']:>8} "
                f"{r['moves_to_finalizing']:>5} {r['meta_bytes']:>8}"
            )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.with_name("subject_race.json").write_text(json.dumps(found, indent=2))
        return 0
    delay_s = args.segmenter_delay_ms / 1000
    with tempfile.TemporaryDirectory(prefix="hitl-fanout-") as tmp:
        up = HitlUp(Path(tmp), "--segmenter-delay-ms", str(args.segmenter_delay_ms), "--quality-gate", "off")
        log(f"starting hitl up (segmenter delay {args.segmenter_delay_ms} ms, quality gate off)")
        up.start()
        rows: list[dict[str, Any]] = []
        jobs: list[dict[str, Any]] = []
        try:
            with httpx.Client(base_url=up.api_url, timeout=60, headers={"Authorization": f"Bearer {up.token}"}) as c:
                one_job(c, 999, 1, args.timeout_s)  # warm-up: the replicas' first calls load their code
                for k in counts:
                    mine = []
                    for i in range(args.jobs):
                        j = one_job(c, 100 * k + i, k, args.timeout_s)
                        log(f"{k} objects, job {i + 1}/{args.jobs}: {j['subjects_cut']} cut in {j['cut_s']} s")
                        mine.append(j)
                    jobs += mine
                    timed = [j for j in mine if j["cut_s"] is not None]
                    n = round(statistics.median(j["subjects_cut"] for j in timed))
                    cut = statistics.median(j["cut_s"] for j in timed)
                    rows.append(
                        {
                            "subjects": n,
                            "objects_drawn": k,
                            "jobs": len(timed),
                            "cut_p50_s": round(cut, 3),
                            "cut_max_s": round(max(j["cut_s"] for j in timed), 3),
                            "serial_bound_s": round(n * delay_s, 3),
                            "parallel_bound_s": round(delay_s, 3),
                            "cut_over_serial": round(cut / (n * delay_s), 3),
                        }
                    )
        finally:
            up.stop()
    print(table(rows, args.segmenter_delay_ms))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"segmenter_delay_ms": args.segmenter_delay_ms, "rows": rows, "jobs": jobs}, indent=2)
    )
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    raise SystemExit(main())
