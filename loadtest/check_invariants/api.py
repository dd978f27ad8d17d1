"""The checks of the API against Redis: snapshots, and a finished job's SSE history against its log."""

from __future__ import annotations

import asyncio

import httpx

from harness.sse import parse_sse
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store

from ..common import request_id
from .reading import Job, read_job
from .report import Report


async def check_api(
    api_url: str, token: str, store: Store, jobs: dict[str, Job], rep: Report, sample: int, sse_sample: int
) -> str | None:
    """Compare a sample of snapshots (and finished jobs' SSE history) with Redis; returns the caller's name."""
    name = "api_consistent"
    r = store.r
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as c:
        who = None
        resp = await c.get("/api/v1/whoami", headers={"X-Request-ID": request_id("check")})
        if resp.status_code == 200:
            who = resp.json().get("name")
        ready = await c.get("/readyz", headers={"X-Request-ID": request_id("check")})
        rep.info["readyz"] = ready.status_code
        ids = sorted(jobs)[:sample] if sample >= 0 else sorted(jobs)
        sem = asyncio.Semaphore(16)

        async def one(job_id: str) -> None:
            async with sem:
                before = await r.hmget(keys.job(job_id).meta, "version", "status", "pause_token")
                resp = await c.get(f"/api/v1/jobs/{job_id}", headers={"X-Request-ID": request_id("check")})
                after = await r.hmget(keys.job(job_id).meta, "version", "status", "pause_token")
            if before != after:
                return  # moved while we looked; not comparable
            rep.checked(name)
            if resp.status_code != 200:
                rep.breach(name, job_id, f"GET /jobs/{job_id} answered {resp.status_code}")
                return
            snap = resp.json()
            token_api = (snap.get("active_pause") or {}).get("pause_token") or ""
            if (str(snap.get("version")), snap.get("status"), token_api) != (after[0], after[1], after[2] or ""):
                rep.breach(
                    name,
                    job_id,
                    f"API shows v{snap.get('version')} {snap.get('status')} pause "
                    f"{token_api or '-'}, Redis v{after[0]} {after[1]} pause {after[2] or '-'}",
                )

        await asyncio.gather(*(one(j) for j in ids))
        finished = [j for j in sorted(jobs) if any(e["type"] == "JOB_FINISHED" for e in jobs[j].events)]
        for job_id in finished[:sse_sample]:
            rep.checked(name)
            try:
                async with c.stream(
                    "GET", f"/api/v1/jobs/{job_id}/events", headers={"X-Request-ID": request_id("check")}
                ) as s:
                    lines = [line async for line in s.aiter_lines()]
            except httpx.HTTPError as e:
                rep.breach(name, job_id, f"SSE history failed: {e}")
                continue
            got = [(e["id"], e["type"], e["version"]) for e in parse_sse(lines) if e.get("type") != ":"]
            log = await read_job(store, job_id)  # a late REPORT_IGNORED may have joined since loading
            want = [(e["id"], e["type"], e["version"]) for e in (log.events if log else [])]
            if got != want:
                rep.breach(name, job_id, f"SSE history has {len(got)} events, the log {len(want)}")
    return who
