"""What the live mirror costs an intervention (docs/protocol.md § Reconcile): the store-level
``Store.intervene`` p50/p99 with the mirror running (a ``Mirror.sync`` over every partition every
``--period-s``, into a SQLite archive, as a dispatcher runs it) and without, in the same run,
alternating rounds so that machine noise falls on both. The mirror never sits on the intervention's
path; this measures what it takes from the same process and the same Redis. Target: ≤ 0.5 ms added
to the p50.

    .venv/bin/python benchmarks/bench_mirror.py --json benchmarks/out/mirror.json
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

from harness.executor import report
from hitl_review.archive import migrate
from hitl_review.archive.db import Archive
from hitl_review.archive.mirror import Mirror
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.statecore import keys
from hitl_review.statecore.models import ImageRef, InterventionRequest
from hitl_review.statecore.store import Store, StoreConfig

BOXES = [{"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.9}, {"bbox": [200, 40, 320, 200], "label": "bag"}]


async def waiting_job(store: Store, n: int) -> str:
    image = ImageRef(sha256=f"{n:064x}", width=640, height=480, url=f"/api/v1/artifacts/image_{n:032x}.png")
    job_id = (await store.create_job("bench", image)).job_id
    assert await report(store, job_id, {"boxes": BOXES}) == "OK"
    return job_id


async def consume(store: Store, job_id: str, n: int) -> float:
    st = await store.get(job_id)
    assert st.active_pause is not None
    keep = [{"box_id": b.box_id, "bbox": list(b.bbox)} for b in st.box_list]
    req = InterventionRequest(
        intervention_id=f"iv_{n}", pause_token=st.active_pause.pause_token, base_version=st.version, subjects=keep
    )
    t0 = time.perf_counter()
    await store.intervene(job_id, req, "reviewer")
    return (time.perf_counter() - t0) * 1000


async def mirror_loop(mirror: Mirror, period_s: float, stop: asyncio.Event, syncs: list[int]) -> None:
    while not stop.is_set():
        await mirror.sync(range(keys.PARTITIONS))
        syncs[0] += 1
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except TimeoutError:
            pass


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hitl-bench-mirror-") as tmp:
        redis = RedisServer(Path(tmp) / "redis").start()
        url = f"sqlite:///{Path(tmp) / 'archive.sqlite3'}"
        migrate.upgrade(url)
        archive = Archive(url)
        store = Store.from_url(redis.url, StoreConfig(retention_s=3600))
        samples: dict[str, list[float]] = {"off": [], "on": []}
        syncs = [0]
        try:
            # A standing population of waiting jobs for the mirror to walk, besides the consumed ones.
            for i in range(args.standing):
                await waiting_job(store, 1_000_000 + i)
            n = 0
            for r in range(args.rounds):
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    jobs = [await waiting_job(store, n + i) for i in range(args.per_round)]
                    stop = asyncio.Event()
                    loop = None
                    if mode == "on":
                        mirror = Mirror(store, archive)
                        loop = asyncio.create_task(mirror_loop(mirror, args.period_s, stop, syncs))
                        await asyncio.sleep(args.period_s)  # its first pass (every job is new) is behind us
                    for j in jobs:
                        samples[mode].append(await consume(store, j, n))
                        n += 1
                    stop.set()
                    if loop is not None:
                        await loop
        finally:
            await store.close()
            archive.close()
            redis.stop()

    def stats(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {
            "n": len(xs),
            "p50_ms": round(statistics.median(xs), 3),
            "p99_ms": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 3),
        }

    off, on = stats(samples["off"]), stats(samples["on"])
    return {
        "benchmark": "mirror",
        "machine": {"python": platform.python_version()},
        "args": vars(args) | {"json": str(args.json) if args.json else None},
        "mirror_off": off,
        "mirror_on": on,
        "mirror_syncs": syncs[0],
        "p50_added_ms": round(on["p50_ms"] - off["p50_ms"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6, help="alternating off/on rounds (default 6)")
    p.add_argument("--per-round", type=int, default=200, help="interventions per round (default 200)")
    p.add_argument("--standing", type=int, default=500, help="waiting jobs the mirror walks (default 500)")
    p.add_argument("--period-s", type=float, default=0.2, help="mirror period (default 0.2; hitl up: 5)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    res = asyncio.run(run(args))
    print(f"\n{'mirror':<8}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}")
    for k in ("off", "on"):
        s = res[f"mirror_{k}"]
        print(f"{k:<8}{s['n']:>6}{s['p50_ms']:>10}{s['p99_ms']:>10}")
    print(f"\np50 added by the mirror: {res['p50_added_ms']} ms ({res['mirror_syncs']} mirror passes)")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
