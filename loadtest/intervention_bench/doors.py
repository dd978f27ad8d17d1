"""The three doors an intervention goes through (the store itself, FastAPI under uvicorn, Ray
Serve), and driving a door: the timed requests and its floor (the cheapest round trip)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from hitl_review.statecore.errors import HitlError
from hitl_review.statecore.models import InterventionRequest
from hitl_review.statecore.store import Store
from loadtest.common import outcome, request_id
from loadtest.intervention_bench.jobs import BenchJob, mix

DOORS = ("direct", "uvicorn", "ray")
DOOR_TITLES = {"direct": "store (Lua ceiling)", "uvicorn": "FastAPI + uvicorn", "ray": "Ray Serve (hitl up)"}


@dataclass
class Door:
    """``prepare`` turns a body into what ``send`` takes (untimed); ``send`` returns the outcome (timed);
    ``floor`` is the cheapest round trip through the same door (``GET /healthz``, or a Redis PING)."""

    prepare: Callable[[dict[str, Any]], Any]
    send: Callable[[str, Any], Awaitable[str]]
    floor: Callable[[], Awaitable[Any]]


def http_door(client: httpx.AsyncClient) -> Door:
    async def send(job_id: str, payload: bytes) -> str:
        r = await client.post(
            f"/api/v1/jobs/{job_id}/interventions",
            content=payload,
            headers={"Content-Type": "application/json", "X-Request-ID": request_id("bench")},
        )
        try:
            js = r.json() if r.status_code != 200 else None
        except ValueError:
            js = None
        return outcome(r.status_code, r.headers.get("Idempotent-Replayed") == "true", js)

    async def floor() -> Any:
        return await client.get("/healthz")

    return Door(lambda body: json.dumps(body).encode(), send, floor)


def store_door(store: Store, reviewer: str) -> Door:
    async def send(job_id: str, req: InterventionRequest) -> str:
        try:
            reply = await store.intervene(job_id, req, reviewer)
        except HitlError as e:
            return f"{e.status} {e.code}"
        return "replay" if reply.replayed else str(reply.status_code)

    return Door(InterventionRequest.model_validate, send, store.r.ping)


async def drive(
    door: Door, jobs: list[BenchJob], concurrency: int, consume: str = "empty"
) -> tuple[list[tuple[str, str, float]], float]:
    """Each worker takes a job and sends its six requests in order; (expected, got, ms) per request."""
    queue = list(reversed(jobs))
    samples: list[tuple[str, str, float]] = []

    async def worker() -> None:
        while queue:
            job = queue.pop()
            for expected, body in mix(job, consume):
                payload = door.prepare(body)
                t0 = time.perf_counter()
                got = await door.send(job.job_id, payload)
                samples.append((expected, got, (time.perf_counter() - t0) * 1000))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - t0


async def floor(door: Door, n: int, concurrency: int) -> list[float]:
    """Latencies (ms) of ``n`` cheapest round trips through the door, ``concurrency`` at a time."""
    left = [n]
    out: list[float] = []

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            t0 = time.perf_counter()
            await door.floor()
            out.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out
