"""The learning loop's stream (benchmarks/learning_loop.py): cutout_data images as jobs of a real ``hitl
up``, each followed on its SSE stream to its end, and the simulated reviewer who answers its first box
review from the ground truth (kept at IoU >= ``--keep-iou``, moved onto the truth at IoU >= 0.5, else
deleted; every subject left over drawn)."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import cv2
import httpx
from httpx_sse import aconnect_sse

from benchmarks import cutout_data
from harness.hitl_up import HitlUp
from hitl_review.statecore.autoapprove import iou

MOVE_IOU = 0.5  # below this a detection is not the subject's box at all: deleted, the subject drawn


# --------------------------------------------------------------------------- the simulated reviewer


def review(shown: list[dict[str, Any]], truth: list[dict[str, Any]], keep_iou: float) -> dict[str, Any]:
    """What a reviewer who knows the truth submits for the detector's list ``shown``: the subjects, the
    edits made (moved, deleted, drawn) and whether the list was approved unchanged."""
    pairs = sorted(
        ((iou(b["bbox"], t["bbox"]), i, j) for i, b in enumerate(shown) for j, t in enumerate(truth)),
        reverse=True,
    )
    kept: dict[int, tuple[int, float]] = {}
    used: set[int] = set()
    for v, i, j in pairs:
        if v < MOVE_IOU:
            break
        if i in kept or j in used:
            continue
        kept[i] = (j, v)
        used.add(j)
    subjects: list[dict[str, Any]] = []
    moved = 0
    for i, (j, v) in kept.items():
        b = shown[i]
        if v >= keep_iou:
            subjects.append({"box_id": b["box_id"], "bbox": b["bbox"], "label": b.get("label")})
        else:
            moved += 1
            subjects.append({"box_id": b["box_id"], "bbox": truth[j]["bbox"], "label": b.get("label")})
    drawn = [t for j, t in enumerate(truth) if j not in used]
    subjects += [{"bbox": t["bbox"], "label": t["label"]} for t in drawn]
    deleted = len(shown) - len(kept)
    return {
        "subjects": subjects,
        "moved": moved,
        "deleted": deleted,
        "drawn": len(drawn),
        "unchanged": moved == 0 and deleted == 0 and not drawn,
    }


# --------------------------------------------------------------------------- the stream


@dataclass
class Job:
    index: int
    domain: str
    truth: list[dict[str, Any]]
    job_id: str = ""
    shown: list[dict[str, Any]] | None = None  # the detector's list (the first review's, or the one approved)
    auto: bool = False
    spot: bool = False
    spot_fa: bool | None = None
    reviewed: bool = False  # a person answered the first box review
    verdict: dict[str, Any] = field(default_factory=dict)  # review() of ``shown``
    status: str = ""


@dataclass
class Domain:
    split: str
    seed: int

    def sample(self, index: int) -> tuple[bytes, list[dict[str, Any]]]:
        s = cutout_data.make_sample(self.split, index, self.seed)
        ok, png = cv2.imencode(".png", cv2.cvtColor(s.image, cv2.COLOR_RGB2BGR))
        assert ok
        return png.tobytes(), [{"bbox": sub.bbox, "label": sub.label} for sub in s.subjects]


class Stream:
    """Jobs of one ``hitl up`` driven to their end, ``concurrency`` at a time."""

    def __init__(self, up: HitlUp, args: argparse.Namespace) -> None:
        self.up = up
        self.args = args
        self.client = httpx.AsyncClient(
            base_url=up.api_url,
            headers={"Authorization": f"Bearer {up.token}"},
            timeout=120,
            limits=httpx.Limits(max_connections=args.concurrency * 3 + 4),
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def post(self, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(30):
            try:
                r = await self.client.post(path, **kw)
            except httpx.TransportError:
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            if r.status_code in (429, 503):
                await asyncio.sleep(float(r.headers.get("Retry-After") or 1))
                continue
            return r
        raise RuntimeError(f"POST {path}: no answer after 30 tries")

    async def one(self, job: Job, png: bytes) -> Job:
        r = await self.post(
            "/api/v1/jobs",
            files={"image": (f"{job.domain}_{job.index}.png", png, "image/png")},
            headers={"Idempotency-Key": f"ll-{job.domain}-{job.index}-{self.args.run_id}"},
        )
        r.raise_for_status()
        job.job_id = r.json()["job_id"]
        async with aconnect_sse(self.client, "GET", f"/api/v1/jobs/{job.job_id}/events") as es:
            async for sse in es.aiter_sse():
                if not sse.data:
                    continue
                ev = json.loads(sse.data)
                t = ev["type"]
                if t == "AUTO_APPROVED":
                    job.auto = True
                elif t == "POLICY_SPOT_CHECKED":
                    job.spot = True
                    job.spot_fa = bool(ev["data"].get("false_accept"))
                elif t == "PAUSE_OPENED":
                    await self.answer(job, ev["data"])
                elif t == "JOB_FINISHED":
                    job.status = ev["data"]["status"]
                    break
        if job.auto:  # the list it approved is the detector's: judge it as the reviewer would have
            snap = (await self.client.get(f"/api/v1/jobs/{job.job_id}")).json()
            job.shown = [dict(b) for b in snap["box_list"]]
            job.verdict = review(job.shown, job.truth, self.args.keep_iou)
        return job

    async def answer(self, job: Job, data: dict[str, Any]) -> None:
        from hitl_review.client.approve_calls import answer_keeping

        pause = data["active_pause"]
        boxes = [dict(b) for b in data.get("box_list") or []]
        if pause["stage"] == "WAITING_USER_SELECTION" and int(pause.get("round", 1)) == 1 and job.shown is None:
            job.shown = boxes
            job.verdict = review(boxes, job.truth, self.args.keep_iou)
            job.reviewed = True
            body: dict[str, Any] = {"subjects": job.verdict["subjects"]}
        else:  # a second round or a mask review: keep what is shown
            body = answer_keeping(pause, boxes)
        r = await self.post(
            f"/api/v1/jobs/{job.job_id}/interventions",
            json={
                "intervention_id": f"iv_ll_{job.job_id}_{pause['pause_token'][-8:]}",
                "pause_token": pause["pause_token"],
                "base_version": pause["base_version"],
                **body,
            },
        )
        if r.status_code != 200:
            raise RuntimeError(f"{job.job_id}: intervention answered {r.status_code}: {r.text[:300]}")

    async def run(self, domain: Domain, indexes: range, stop: Any = None) -> list[Job]:
        """Run the jobs of ``indexes``; ``stop`` (an async callable) ends the stream early when true."""
        done: list[Job] = []
        queue = iter(indexes)
        halt = asyncio.Event()

        async def worker() -> None:
            for i in queue:
                if halt.is_set():
                    return
                png, truth = domain.sample(i)
                job = await self.one(Job(i, f"{domain.split}/{domain.seed}", truth), png)
                done.append(job)
                if stop is not None and await stop(job, done):
                    halt.set()

        await asyncio.gather(*(worker() for _ in range(self.args.concurrency)))
        return done
