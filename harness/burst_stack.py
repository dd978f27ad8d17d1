"""The burst benchmark's driver (``benchmarks/burst.py``): one ``hitl up`` and everything the benchmark
does to it and reads from it.

- ``Stack``: the API through httpx (submissions retried on 429 after ``Retry-After``, 502/503/504 and
  dropped connections retried until a deadline), the automatic reviewer's answer to one job's pause,
  and the reads straight from the embedded Redis (statuses, key TTLs, event histories, memory), the
  dead letters, the replicas' node counts from Ray's metrics and Serve's status API (``harness.serve_status``);
- ``Tally``: what the client side saw in one phase (submissions, 429s, interventions and their times);
- ``drive``: N jobs submitted at once, their statuses polled from Redis every second and, when asked,
  automatic reviewers answering every pause as it opens, until every job is in one of the wanted states.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.bench import log
from harness.hitl_up import HitlUp, ray_token_header
from harness.serve_status import DeploymentWatcher, metrics_url, model_node_counts, parse_node_counts
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store

TERMINAL = ("SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED", "EMPTY_SELECTION", "CANCELLED", "TIMED_OUT")
WAITING = ("WAITING_USER_SELECTION", "WAITING_BOX_BATCH_REVISION", "WAITING_MASK_REVIEW")
BEFORE_REVIEW = ("CREATED", "DETECTING")
APP = "hitl"
DEPLOYMENTS = ("Detector", "BoxValidator", "Segmenter")


@dataclass
class Tally:
    """What the client side saw in one phase."""

    accepted: dict[str, float] = field(default_factory=dict)  # job_id -> wall time accepted
    submit_codes: Counter[str] = field(default_factory=Counter)
    backlog_full: int = 0  # 429 BACKLOG_FULL answers
    jobs_refused_once: int = 0  # jobs whose submission saw at least one 429
    retry_after_s: list[float] = field(default_factory=list)
    not_created: Counter[str] = field(default_factory=Counter)
    first_submit: float | None = None  # wall time the first POST /jobs left
    last_accept: float | None = None
    interventions: Counter[str] = field(default_factory=Counter)  # by outcome
    intervention_s: list[float] = field(default_factory=list)
    kept_nothing: int = 0  # reviews with no box to keep (EMPTY_SELECTION: no segmentation follows)
    transport_retries: int = 0


class Stack:
    """One ``hitl up`` and everything the benchmark reads it through."""

    def __init__(self, up: HitlUp, args: argparse.Namespace, images: list[bytes]) -> None:
        self.up = up
        self.args = args
        self.images = images
        self.run_id = uuid.uuid4().hex[:8]
        assert up.redis_url is not None, "hitl up named no embedded Redis"
        self.store = Store.from_url(up.redis_url, max_connections=32, timeout_s=30)
        limits = httpx.Limits(max_connections=args.submit_concurrency + args.reviewers + 8)
        self.http = httpx.AsyncClient(
            base_url=up.api_url,
            headers={"Authorization": f"Bearer {up.token}"},
            timeout=httpx.Timeout(60.0, connect=10.0),
            limits=limits,
        )
        self.metrics_url = metrics_url(up.lines)
        self.watcher: DeploymentWatcher | None = None
        if up.dashboard_url:
            self.watcher = DeploymentWatcher(up.dashboard_url, APP, DEPLOYMENTS, ray_token_header()).start()

    async def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        await self.http.aclose()
        await self.store.close()

    # ------------------------------------------------------------------------------------ requests

    async def call(self, tally: Tally, method: str, url: str, deadline: float, **kw: Any) -> httpx.Response | None:
        """A request retried on 503 / 502 / 504 and dropped connections (after ``Retry-After``) until
        ``deadline``; every other answer, 429 included, is the caller's."""
        while time.monotonic() < deadline:
            try:
                r = await self.http.request(method, url, **kw)
            except httpx.HTTPError:
                tally.transport_retries += 1
                await asyncio.sleep(1.0)
                continue
            if r.status_code in (502, 503, 504):
                tally.transport_retries += 1
                await asyncio.sleep(retry_after(r, 1.0))
                continue
            return r
        return None

    async def submit(self, tally: Tally, label: str, i: int, deadline: float, sem: asyncio.Semaphore) -> str | None:
        """POST /jobs until accepted: a 429 waits ``Retry-After`` and tries again (the same
        ``Idempotency-Key``, so a retry after a dropped answer never makes a second job)."""
        png = self.images[i % len(self.images)]
        headers = {"Idempotency-Key": f"burst-{self.run_id}-{label}-{i}"}
        refused = False
        async with sem:
            while True:
                if tally.first_submit is None:
                    tally.first_submit = time.time()
                r = await self.call(
                    tally,
                    "POST",
                    "/api/v1/jobs",
                    deadline,
                    files={"image": (f"{i}.png", png, "image/png")},
                    headers=headers,
                )
                if r is None:
                    tally.not_created["timeout"] += 1
                    return None
                tally.submit_codes[str(r.status_code)] += 1
                if r.status_code == 429:
                    tally.backlog_full += error_code(r) == "BACKLOG_FULL"
                    refused = True
                    wait = retry_after(r, 1.0)
                    tally.retry_after_s.append(wait)
                    await asyncio.sleep(wait)
                    continue
                if r.status_code not in (200, 202):
                    tally.not_created[f"{r.status_code} {error_code(r)}"] += 1
                    return None
                job_id = str(r.json()["job_id"])
                tally.accepted[job_id] = time.time()
                tally.last_accept = time.time()
                tally.jobs_refused_once += refused
                return job_id

    async def review(self, tally: Tally, job_id: str, answered: set[str], deadline: float) -> None:
        """One automatic reviewer's look at a job: answer its waiting pause, keeping every proposed
        box (round 2: every box not sent back; a mask review: accept every mask)."""
        r = await self.call(tally, "GET", f"/api/v1/jobs/{job_id}", deadline)
        if r is None or r.status_code != 200:
            tally.interventions[f"snapshot {r.status_code if r is not None else 'timeout'}"] += 1
            return
        snap = r.json()
        pause = snap.get("active_pause") or {}
        token = pause.get("pause_token")
        if pause.get("status") != "WAITING" or not token or token in answered:
            return
        body: dict[str, Any] = {
            "intervention_id": f"iv_{uuid.uuid4().hex[:16]}",
            "pause_token": token,
            "base_version": snap["version"],
        }
        if pause.get("stage") == "WAITING_MASK_REVIEW":
            subjects = pause.get("subjects_to_review") or []
            body["decisions"] = [{"box_id": s["box_id"], "decision": "ACCEPT"} for s in subjects]
        else:
            revise = set(pause.get("box_ids_to_revise") or [])
            keep = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap.get("box_list") or []]
            body["subjects"] = [s for s in keep if s["box_id"] not in revise]
            if not body["subjects"]:
                tally.kept_nothing += 1
        t0 = time.perf_counter()
        r = await self.call(tally, "POST", f"/api/v1/jobs/{job_id}/interventions", deadline, json=body)
        if r is None:
            tally.interventions["timeout"] += 1
            return
        if r.status_code == 200:
            tally.intervention_s.append(time.perf_counter() - t0)
            tally.interventions["200"] += 1
            answered.add(token)
        else:  # a 409 (the job moved on, or was cancelled): read again at the next poll
            tally.interventions[f"{r.status_code} {error_code(r)}"] += 1

    # ---------------------------------------------------------------------------------- Redis reads

    async def statuses(self, job_ids: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for chunk in chunks(job_ids, 1000):
            pipe = self.store.r.pipeline(transaction=False)
            for j in chunk:
                pipe.hget(keys.job(j).meta, "status")
            for j, s in zip(chunk, await pipe.execute(), strict=True):
                out[j] = s.decode() if isinstance(s, bytes) else str(s)
        return out

    async def used_memory(self) -> dict[str, int]:
        info = await self.store.r.info("memory")
        return {"used_memory": int(info["used_memory"]), "used_memory_peak": int(info["used_memory_peak"])}

    async def ttls(self, job_ids: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in chunks(job_ids, 1000):
            pipe = self.store.r.pipeline(transaction=False)
            for j in chunk:
                pipe.pttl(keys.job(j).meta)
            for j, t in zip(chunk, await pipe.execute(), strict=True):
                out[j] = int(t)
        return out

    async def history(self, job_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        sem = asyncio.Semaphore(16)

        async def one(j: str) -> tuple[str, list[dict[str, Any]]]:
            async with sem:
                return j, [e.model_dump() for e in await self.store.events_after(j)]

        return dict(await asyncio.gather(*(one(j) for j in job_ids)))

    async def dead_letters(self) -> list[dict[str, Any]] | None:
        try:
            r = await self.http.get("/api/v1/admin/dead-letters")
            r.raise_for_status()
            return list(r.json())
        except (httpx.HTTPError, ValueError):
            return None

    def node_counts(self, at_least: int = 0, timeout_s: float = 45.0) -> dict[str, Any] | None:
        if not self.metrics_url:
            return None
        if at_least <= 0:  # a baseline: whatever is there now
            try:
                return {**parse_node_counts(httpx.get(self.metrics_url, timeout=10).text), "settled": True}
            except httpx.HTTPError:
                return None
        return model_node_counts(self.metrics_url, at_least=at_least, timeout_s=timeout_s)


# ------------------------------------------------------------------------------------------ helpers


def retry_after(r: httpx.Response, default: float) -> float:
    try:
        return max(0.05, float(r.headers.get("Retry-After", default)))
    except ValueError:
        return default


def error_code(r: httpx.Response) -> str:
    try:
        return str(r.json().get("code", ""))
    except (ValueError, AttributeError):
        return ""


def chunks(items: list[str], n: int) -> list[list[str]]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def bucket(status: str) -> str:
    if status in TERMINAL:
        return "terminal"
    if status in WAITING:
        return "waiting"
    if status in BEFORE_REVIEW:
        return "detecting"
    return "after review"


async def sample_memory(stack: Stack, into: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            into.append((await stack.used_memory())["used_memory"])
        except Exception:  # a missed sample is no reason to stop measuring
            pass
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


# --------------------------------------------------------------------------------------- one phase


async def drive(
    stack: Stack, n: int, label: str, *, review: bool, until: tuple[str, ...], tally: Tally
) -> dict[str, Any]:
    """Submit ``n`` jobs at once and poll their status every second (reviewers answering every
    pause when ``review``) until every accepted job is in one of ``until`` or the phase times out.
    Returns the last statuses seen and when the poll first saw everything done."""
    args = stack.args
    deadline = time.monotonic() + args.timeout_s
    sem = asyncio.Semaphore(args.submit_concurrency)
    submitting = [asyncio.create_task(stack.submit(tally, label, i, deadline, sem)) for i in range(n)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    inflight: set[str] = set()
    answered: dict[str, set[str]] = {}

    async def reviewer() -> None:
        while True:
            job_id = await queue.get()
            try:
                await stack.review(tally, job_id, answered.setdefault(job_id, set()), deadline)
            finally:
                inflight.discard(job_id)
                queue.task_done()

    reviewers = [asyncio.create_task(reviewer()) for _ in range(args.reviewers if review else 0)]
    status: dict[str, str] = {}
    done_at: float | None = None
    last_print = 0.0
    t0 = time.monotonic()
    try:
        while True:
            live = [j for j in tally.accepted if status.get(j) not in TERMINAL]
            status.update(await stack.statuses(live))
            if review:
                for j in live:
                    if status.get(j) in WAITING and j not in inflight:
                        inflight.add(j)
                        queue.put_nowait(j)
            submit_done = all(t.done() for t in submitting)
            everything = submit_done and all(status.get(j) in until for j in tally.accepted)
            now = time.monotonic()
            if everything or now - last_print >= args.progress_s or now > deadline:
                last_print = now
                seen = Counter(bucket(status.get(j, "CREATED")) for j in tally.accepted)
                log(
                    f"{label}: {now - t0:6.1f}s  submitted {len(tally.accepted)}/{n} (429s {tally.backlog_full})"
                    f"  detecting {seen['detecting']}  waiting {seen['waiting']}"
                    f"  after review {seen['after review']}  terminal {seen['terminal']}"
                    f"  reviewed {tally.interventions['200']}"
                )
            if everything:
                done_at = time.time()
                break
            if now > deadline:
                log(f"{label}: timed out after {args.timeout_s:.0f}s")
                break
            await asyncio.sleep(args.poll_s)
    finally:
        for t in reviewers + submitting:
            t.cancel()
        await asyncio.gather(*reviewers, *submitting, return_exceptions=True)
    return {"status": status, "done_at": done_at, "timed_out": done_at is None}
