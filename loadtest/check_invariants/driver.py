"""One check run: wait until quiet, read every job, run every check; and the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path

from harness.tokens import resolve_token
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store

from ..common import read_records
from .api import check_api
from .jobs import SLOW_COMMAND_S, check_job
from .reading import Job, job_ids, read_job, read_outboxes, wait_quiet
from .records import check_records
from .report import Report, print_report


async def check(
    store: Store,
    *,
    record: str | Path | None = None,
    api_url: str | None = None,
    token: str | None = None,
    quiet_timeout: float = 60.0,
    api_sample: int = 200,
    sse_sample: int = 20,
    now: float | None = None,
) -> Report:
    """Every invariant over every job of the jobs index (and the client ``record``, and the API when
    ``api_url`` and ``token`` are given). ``now`` is the wall clock command ages are judged by."""
    rep = Report()
    quiet, pending, waited = await wait_quiet(store, quiet_timeout)
    rep.info.update(quiet=quiet, pending_after_wait=pending, waited_s=round(waited, 2))
    r = store.r
    # Quiet: one read of every outbox is a consistent picture. Still moving: each job is read
    # together with its own partition's outbox, so a command handled meanwhile is not "lost".
    outbox = await read_outboxes(r) if quiet else None
    sem = asyncio.Semaphore(32)

    async def load(job_id: str) -> Job | None:
        async with sem:
            return await read_job(store, job_id, with_commands=outbox is None)

    loaded = await asyncio.gather(*(load(j) for j in dict.fromkeys(await job_ids(r))))
    jobs = {j.job_id: j for j in loaded if j is not None}
    if outbox is not None:
        for job in jobs.values():
            job.commands = outbox.get(job.job_id, [])
    rep.info["jobs"] = len(jobs)
    rep.info["statuses"] = dict(Counter(j.meta.get("status") for j in jobs.values()).most_common())
    rep.info["commands"] = sum(len(j.commands) for j in jobs.values())
    clock = time.time() if now is None else now
    for job in jobs.values():
        check_job(job, rep, quiet=quiet, grace_s=max(quiet_timeout, SLOW_COMMAND_S), now=clock)
    submitter = None
    if api_url and token:
        submitter = await check_api(api_url, token, store, jobs, rep, api_sample, sse_sample)
    records = read_records(record)
    rep.info["records"] = len(records)
    create_idem: dict[str, str] = {}
    if submitter:
        for key in {x["idempotency_key"] for x in records if x.get("kind") == "create"}:
            stored = await r.hget(keys.create_idem(submitter, key), "response")
            if stored:
                create_idem[key] = stored
    check_records(records, jobs, rep, submitter, create_idem)
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadtest.check_invariants",
        description="Check the review protocol's invariants after a load run.",
    )
    ap.add_argument("--redis-url", required=True, help="the Redis the server uses (redis+cluster://… for a cluster)")
    ap.add_argument("--api-url", default=None, help="the API, to compare snapshots and SSE history with Redis")
    ap.add_argument("--token", default=None, help="bearer token (default HITL_TOKEN or <data-dir>/api-token)")
    ap.add_argument("--data-dir", default=None, help="where the local api-token lives (default HITL_DATA_DIR)")
    ap.add_argument("--record", default=None, help="JSONL written by the locust run (HITL_LT_RECORD)")
    ap.add_argument("--json", default=None, help="write the result as JSON here")
    ap.add_argument("--quiet-timeout", type=float, default=60.0, help="seconds to wait for an empty outbox")
    ap.add_argument("--api-sample", type=int, default=200, help="jobs whose snapshot is compared (-1: all)")
    ap.add_argument("--sse-sample", type=int, default=20, help="finished jobs whose SSE history is compared")
    args = ap.parse_args(argv)
    token = None
    if args.api_url:
        token = resolve_token(args.token, args.data_dir)

    async def run() -> Report:
        store = Store.from_url(args.redis_url, max_connections=64)
        try:
            return await check(
                store,
                record=args.record,
                api_url=args.api_url,
                token=token,
                quiet_timeout=args.quiet_timeout,
                api_sample=args.api_sample,
                sse_sample=args.sse_sample,
            )
        finally:
            await store.close()

    rep = asyncio.run(run())
    print_report(rep)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rep.to_json(), indent=2))
    return 0 if rep.ok else 1
