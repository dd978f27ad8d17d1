"""Archive throughput: finished jobs copied from Redis into the archive per second, on SQLite and on
PostgreSQL, in the same run (docs/archive.md § Benchmark).

A real redis-server and a real PostgreSQL (``harness.postgres``) are started in temporary
directories; ``--jobs`` jobs are driven to SUCCEEDED through the store (three proposals, the
reviewer keeps them all, each segmented, ~15 events and 7 artifact references per job). Then, for
each database and each ``--concurrency``, on a freshly migrated archive:

* ``archive``: ``archive.archiver.archive_job`` for every job (Redis reads + one transaction each);
* ``again``: the same again, every copy ``UNCHANGED`` (what a redelivered ARCHIVE_JOB costs);
* ``write``: ``write_record`` alone on records read beforehand (the database's share).

Both databases run as they do by default: SQLite in WAL mode with synchronous=FULL (Python's
default), PostgreSQL with fsync off (a test cluster; a production server's fsync adds its own cost).

    .venv/bin/python benchmarks/bench_archive.py --json benchmarks/out/archive.json
    .venv/bin/python benchmarks/bench_archive.py --jobs 50 --concurrency 1   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.executor import report
from harness.postgres import PostgresServer, find_pg_bin
from hitl_review.archive import migrate
from hitl_review.archive.archiver import JobRecord, archive_job, read_job, write_record
from hitl_review.archive.db import Archive
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.statecore.models import ImageRef, InterventionRequest
from hitl_review.statecore.store import Store, StoreConfig

BOXES = [
    {"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.93},
    {"bbox": [200, 40, 320, 200], "label": "shoe", "score": 0.88},
    {"bbox": [400, 100, 460, 300], "label": "hand", "score": 0.41},
]


async def finished_job(store: Store, n: int) -> str:
    image = ImageRef(sha256=f"{n:064x}", width=640, height=480, url=f"/api/v1/artifacts/image_{n:032x}.png")
    job_id = (await store.create_job("bench", image, f"bench:{n:064x}")).job_id
    assert await report(store, job_id, {"boxes": BOXES}) == "OK"
    st = await store.get(job_id)
    assert st.active_pause is not None
    keep = [{"box_id": b.box_id, "bbox": list(b.bbox)} for b in st.box_list]
    req = InterventionRequest(
        intervention_id=f"iv_{n}", pause_token=st.active_pause.pause_token, base_version=st.version, subjects=keep
    )
    await store.intervene(job_id, req, "reviewer")
    st = await store.get(job_id)
    outcome = [
        {
            "box_id": b.box_id,
            "status": "SUCCEEDED",
            "mask": f"mask_{n:024x}{i:08x}.png",
            "cutout": f"cutout_{n:024x}{i:08x}.png",
        }
        for i, b in enumerate(st.approved_box_list)
    ]
    assert await report(store, job_id, {"subjects": outcome}) == "OK"
    assert await report(store, job_id, {}) == "OK"
    return job_id


async def _gather(n: int, concurrency: int, one: Any) -> list[Any]:
    sem = asyncio.Semaphore(concurrency)

    async def run(i: int) -> Any:
        async with sem:
            return await one(i)

    return await asyncio.gather(*(run(i) for i in range(n)))


async def measure(
    store: Store, url: str, job_ids: list[str], records: list[JobRecord], concurrency: int
) -> dict[str, Any]:
    migrate.upgrade(url)
    archive = Archive(url)
    row: dict[str, Any] = {"concurrency": concurrency, "jobs": len(job_ids)}
    try:
        for mode, expected in (("archive", "INSERTED"), ("again", "UNCHANGED")):
            t0, c0 = time.perf_counter(), time.process_time()
            outcomes = await _gather(len(job_ids), concurrency, lambda i: archive_job(store, archive, job_ids[i]))
            elapsed = time.perf_counter() - t0
            assert set(outcomes) == {expected}, set(outcomes)
            row[f"{mode}_jobs_per_s"] = round(len(job_ids) / elapsed, 1)
            row[f"{mode}_cpu_ms_per_job"] = round((time.process_time() - c0) / len(job_ids) * 1000, 2)
        # The database's share: the same records, re-written (each one a REPLACE of a newer copy).
        newer = [_bumped(r) for r in records]
        t0, c0 = time.perf_counter(), time.process_time()
        outcomes = await _gather(len(newer), concurrency, lambda i: asyncio.to_thread(write_record, archive, newer[i]))
        row["write_jobs_per_s"] = round(len(newer) / (time.perf_counter() - t0), 1)
        row["write_cpu_ms_per_job"] = round((time.process_time() - c0) / len(newer) * 1000, 2)
        assert set(outcomes) == {"REPLACED"}, set(outcomes)
    finally:
        archive.close()
    return row


def _bumped(r: JobRecord) -> JobRecord:
    return dataclasses.replace(r, version=r.version + 1)


def _sqlite_url(base: Path, name: str) -> str:
    return f"sqlite:///{base / name}"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL's server is not installed (Debian: apt-get install postgresql)")
    with tempfile.TemporaryDirectory(prefix="hitl-bench-archive-") as tmp:
        base = Path(tmp)
        redis = RedisServer(base / "redis").start()
        pg = PostgresServer(bin_dir).start()
        store = Store.from_url(redis.url, StoreConfig(retention_s=3600))
        try:
            await store.ensure_groups()
            t0 = time.perf_counter()
            job_ids = list(await _gather(args.jobs, 8, lambda i: finished_job(store, i)))
            prepare_s = time.perf_counter() - t0
            records = [await read_job(store, j) for j in job_ids]
            rows = []
            for concurrency in args.concurrency:
                for db in ("sqlite", "postgresql"):
                    if db == "sqlite":
                        url = _sqlite_url(base, f"archive-{concurrency}.sqlite3")
                    else:
                        pg.reset()
                        url = pg.url
                    row = {"database": db, **await measure(store, url, job_ids, records, concurrency)}
                    rows.append(row)
                    print(f"  {db:<10} c={concurrency:<3} archive {row['archive_jobs_per_s']:>8} jobs/s", flush=True)
        finally:
            await store.close()
            pg.stop()
            redis.stop()
    events = sum(len(r.events) for r in records) / len(records)
    return {
        "benchmark": "archive",
        "jobs": args.jobs,
        "events_per_job": round(events, 1),
        "prepare_s": round(prepare_s, 2),
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
        "results": rows,
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200, help="finished jobs to archive (default 200)")
    p.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 8],
        help="copies in flight, comma-separated (default 1,8)",
    )
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    result = asyncio.run(run(args))
    header = (
        f"{'database':<11}{'conc.':>6}{'archive jobs/s':>16}{'again jobs/s':>14}{'write jobs/s':>14}"
        f"{'archive CPU ms':>16}{'write CPU ms':>14}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in result["results"]:
        print(
            f"{r['database']:<11}{r['concurrency']:>6}{r['archive_jobs_per_s']:>16}"
            f"{r['again_jobs_per_s']:>14}{r['write_jobs_per_s']:>14}"
            f"{r['archive_cpu_ms_per_job']:>16}{r['write_cpu_ms_per_job']:>14}"
        )
    print("CPU: this process's, per job (Redis reads and SQLite included; PostgreSQL's server not)")
    print(f"\n{result['jobs']} jobs, {result['events_per_job']} events each on average")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
