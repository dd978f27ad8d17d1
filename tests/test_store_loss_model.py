"""Store loss under ``--durability strict``, model-based (docs/protocol.md § Redis outages, SPEC §11):
random sequences of creations (with keys, retried), interventions (retried), quorum votes, cancels,
model reports (detection, each subject's cut, the finalisation, a report delivered twice) and
FLUSHALLs at random points, each FLUSHALL followed by one of the two restore paths (the archiver's
sweep, or the read-through of the next request). The control plane is the real FastAPI app over ASGI
with a real redis-server and the SQLite archive; the reports go through the same store, as the
dispatcher's would.

After every step, for every job a client was told about, what it was told stays true:

- a creation key names one job: a retried creation answers the job the first answer named;
- a retried intervention or vote gets the answer it got before (status and bytes);
- a job a client saw terminal is terminal again, in the same status;
- the versions a client reads never go down;
- nothing acknowledged is missing: every job a 202 named answers GET with 200.

``HITL_MODEL_SEEDS`` / ``HITL_MODEL_STEPS`` run it longer (``pytest -m slow`` or by hand); CI runs
a few seeds of a few dozen steps. A failure names the seed and the steps that led to it.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.executor import report
from harness.tokens import auth
from hitl_review.archive import migrate
from hitl_review.archive.db import Archive
from hitl_review.archive.mirror import reconcile
from hitl_review.serve_app.recovery import durability
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.states import TERMINAL
from hitl_review.statecore.store import Store, StoreConfig

from .api_util import png
from .asgi_util import asgi_transport

TERMINAL_NAMES = {s.value for s in TERMINAL}
SEEDS = [int(s) for s in os.environ.get("HITL_MODEL_SEEDS", "1,2,3").split(",")]
STEPS = int(os.environ.get("HITL_MODEL_STEPS", "40"))
W, H = 320, 240
BOXES = [
    {"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.93},
    {"bbox": [150, 40, 300, 200], "label": "bag", "score": 0.88},
]


@asynccontextmanager
async def strict_control_plane(url: str, data_dir: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Store, Archive]]:
    """The app under ``--durability strict`` with its SQLite archive; the store it writes with (the
    reports go through it, as the dispatcher's do) and the archive."""
    archive_url = f"sqlite:///{data_dir / 'archive.sqlite3'}"
    migrate.upgrade(archive_url)
    archive = Archive(archive_url)
    config = StoreConfig(retention_s=3600, node_timeout_s=60, retry_backoff_s=0.0, archive=True)
    store = Store.from_url(url, config)
    await store.r.flushall()
    await store.ensure_groups()
    await durability.configure(store, "strict", 1.0, archive=archive)
    try:
        async with asgi_transport(url, data_dir, store=store, archive=archive, durability="strict") as transport:
            async with httpx.AsyncClient(transport=transport, base_url="http://asgi", timeout=30) as client:
                yield client, store, archive
    finally:
        archive.close()


@dataclass
class Told:
    """What clients were told, to hold the system to."""

    keys: dict[str, str] = field(default_factory=dict)  # Idempotency-Key -> the job the first answer named
    images: dict[str, bytes] = field(default_factory=dict)  # Idempotency-Key -> its image
    quorum: dict[str, int] = field(default_factory=dict)  # job -> its review quorum
    versions: dict[str, int] = field(default_factory=dict)  # job -> the highest version a client read
    terminal: dict[str, str] = field(default_factory=dict)  # job -> the terminal status a client read
    answers: dict[str, tuple[str, str, dict[str, Any], int, str]] = field(default_factory=dict)
    # intervention id -> (job, reviewer, body, status code, response bytes) of its 200
    reports: dict[str, NodeReport] = field(default_factory=dict)  # job -> the last report applied


class Model:
    def __init__(self, seed: int, client: httpx.AsyncClient, store: Store, archive: Archive) -> None:
        self.rng = random.Random(seed)
        self.c, self.store, self.archive = client, store, archive
        self.told = Told()
        self.trace: list[str] = []

    # ------------------------------------------------------------------ reads

    async def snap(self, job_id: str) -> dict[str, Any]:
        r = await self.c.get(f"/api/v1/jobs/{job_id}", headers=auth("admin"))
        assert r.status_code == 200, f"acknowledged job {job_id} is missing: {r.status_code} {r.text}"
        s = r.json()
        self.observe(job_id, s)
        return s

    def observe(self, job_id: str, s: dict[str, Any]) -> None:
        seen = self.told.versions.get(job_id, 0)
        assert s["version"] >= seen, f"{job_id}: version went down {seen} -> {s['version']} ({s['status']})"
        self.told.versions[job_id] = s["version"]
        was = self.told.terminal.get(job_id)
        if was is not None:
            assert s["status"] == was, f"{job_id}: was {was}, now {s['status']} at version {s['version']}"
        elif s["status"] in TERMINAL_NAMES:
            self.told.terminal[job_id] = s["status"]

    async def check(self) -> None:
        for job_id in list(self.told.versions):
            await self.snap(job_id)

    # ------------------------------------------------------------------ steps

    async def create(self) -> None:
        key = self.rng.choice([None, "k1", "k2", "k3", "k4", "k5", "k6"])
        image = self.told.images.setdefault(key or "", png(W, H, (self.rng.randrange(256), 90, 30)))
        quorum = 2 if key in ("k5", "k6") else 1
        headers = auth("sub1") | ({"Idempotency-Key": key} if key else {})
        r = await self.c.post(
            "/api/v1/jobs",
            params={"review_quorum": quorum},
            files={"image": ("i.png", image, "image/png")},
            headers=headers,
        )
        assert r.status_code in (200, 202), r.text
        body = r.json()
        job_id = body["job_id"]
        if key is not None:
            first = self.told.keys.setdefault(key, job_id)
            assert job_id == first, f"creation key {key} named {first}, then {job_id} on a retry"
        self.told.quorum.setdefault(job_id, quorum)
        if r.headers.get("Idempotent-Replayed") == "true":  # the first answer again, byte for byte: not a read
            self.told.versions.setdefault(job_id, body["version"])
        else:
            self.observe(job_id, {"version": body["version"], "status": body["status"]})
        self.trace.append(f"create key={key} -> {job_id} v{body['version']}")

    def pick(self) -> str | None:
        jobs = sorted(self.told.versions)
        return self.rng.choice(jobs) if jobs else None

    async def apply(self, job_id: str, output: dict[str, Any]) -> None:
        st = await self.store.get(job_id)
        node = st.current_node
        got = await report(self.store, job_id, output)
        if node is not None and not st.subject_nodes:
            self.told.reports[job_id] = NodeReport(
                node_instance_id=node.node_instance_id,
                node_type=node.node_type,
                job_id=job_id,
                outcome="SUCCEEDED",
                output=output,
            )
        self.trace.append(f"report {job_id} {st.status.value} -> {got}")

    async def work(self) -> None:
        """The model's part for one job: whatever its current node asks."""
        job_id = self.pick()
        if job_id is None:
            return
        s = await self.snap(job_id)
        if s["status"] == "DETECTING":
            await self.apply(job_id, {"boxes": BOXES})
        elif s["status"] == "PROCESSING_APPROVED_SUBJECTS":
            subjects = [
                {"box_id": b["box_id"], "status": "SUCCEEDED", "mask": f"m{i}.png", "cutout": f"c{i}.png"}
                for i, b in enumerate(s["approved_box_list"])
            ]
            await self.apply(job_id, {"subjects": subjects})
        elif s["status"] == "FINALIZING_RESULTS":
            await self.apply(job_id, {})

    async def replay_report(self) -> None:
        """A report delivered again (a spooled write-back taken up late, a dead letter replayed)."""
        job_id = self.pick()
        rep = self.told.reports.get(job_id or "")
        if rep is None:
            return
        got = await self.store.apply_report(rep)
        assert got in ("OK", "DUPLICATE", "IGNORED"), got
        self.trace.append(f"replay report {job_id} {rep.node_type} -> {got}")

    async def intervene(self) -> None:
        job_id = self.pick()
        if job_id is None:
            return
        s = await self.snap(job_id)
        pause = s.get("active_pause")
        if not pause or pause["stage"] != "WAITING_USER_SELECTION":
            return
        keep = [b for b in s["box_list"] if self.rng.random() < 0.8]
        body = {
            "intervention_id": f"iv_{uuid.uuid4().hex[:10]}",
            "pause_token": pause["pause_token"],
            "base_version": s["version"],
            "subjects": [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in keep],
        }
        who = self.rng.choice(["rev1", "rev2"])
        r = await self.c.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth(who))
        self.trace.append(f"intervene {job_id} by {who} keep={len(keep)} -> {r.status_code}")
        if r.status_code == 200:
            self.told.answers[body["intervention_id"]] = (job_id, who, body, r.status_code, r.text)

    async def retry_intervention(self) -> None:
        if not self.told.answers:
            return
        iid = self.rng.choice(sorted(self.told.answers))
        job_id, who, body, code, text = self.told.answers[iid]
        r = await self.c.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth(who))
        self.trace.append(f"retry intervention {iid} on {job_id} -> {r.status_code}")
        assert (r.status_code, r.text) == (code, text), (
            f"retried intervention {iid} on {job_id}: first {code} {text[:120]}, now {r.status_code} {r.text[:200]}"
        )

    async def cancel(self) -> None:
        job_id = self.pick()
        if job_id is None or self.rng.random() < 0.5:
            return
        r = await self.c.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev1"))
        assert r.status_code in (200, 409), r.text
        if r.status_code == 200:
            self.observe(job_id, r.json())
        self.trace.append(f"cancel {job_id} -> {r.status_code}")

    async def flush(self) -> None:
        await self.store.r.flushall()
        await self.store.ensure_groups()
        if self.rng.random() < 0.5:
            done = await reconcile(self.store, self.archive, actor="recovery")
            self.trace.append(f"FLUSHALL, swept: {done['counts']}")
        else:
            self.trace.append("FLUSHALL, read-through")

    async def step(self) -> None:
        rules = [
            (self.create, 4),
            (self.work, 6),
            (self.intervene, 5),
            (self.retry_intervention, 2),
            (self.replay_report, 1),
            (self.cancel, 1),
            (self.flush, 2),
        ]
        fn = self.rng.choices([f for f, _ in rules], weights=[w for _, w in rules])[0]
        await fn()
        await self.check()


@pytest.mark.parametrize("seed", SEEDS)
async def test_what_a_client_was_told_survives_a_store_loss(redis_server, tmp_path: Path, seed: int) -> None:
    async with strict_control_plane(redis_server.url, tmp_path) as (client, store, archive):
        model = Model(seed, client, store, archive)
        try:
            for _ in range(STEPS):
                await model.step()
        except AssertionError as e:
            steps = "\n  ".join(model.trace[-25:])
            raise AssertionError(f"seed {seed}, step {len(model.trace)}: {e}\n  {steps}") from e
        finally:
            await store.close()
    # The run did something: jobs were created and at least one loss was lived through.
    assert model.told.versions and any(t.startswith("FLUSHALL") for t in model.trace), json.dumps(model.trace)
