"""The benchmark's jobs: made waiting for review through the store (no model, no upload), and the
six requests each one gets (``mix``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from harness.executor import report
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.store import Store
from loadtest.check_invariants import read_outboxes

BOXES = [
    {"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.93},
    {"bbox": [150, 40, 250, 200], "label": "shoe", "score": 0.88},
    {"bbox": [260, 100, 310, 230], "label": "hand", "score": 0.41},
]


@dataclass
class BenchJob:
    job_id: str
    version: int
    token: str
    boxes: list[dict[str, Any]]


def mix(job: BenchJob, consume: str = "empty") -> list[tuple[str, dict[str, Any]]]:
    """The six requests of one job: (expected outcome, body). ``consume`` is what the 200 submits:
    ``empty`` (EMPTY_SELECTION: no model work follows) or ``keep`` (two model boxes: a
    PROCESS_APPROVED_BOX_LIST command the server's dispatcher then runs)."""
    iid = f"iv_bench_{uuid.uuid4().hex[:16]}"
    keep = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in job.boxes[:2]]
    chosen = keep if consume == "keep" else []
    ok = {"intervention_id": iid, "pause_token": job.token, "base_version": job.version, "subjects": chosen}
    return [
        ("409 PAUSE_TOKEN_MISMATCH", {**ok, "intervention_id": iid + "_t", "pause_token": "pause_" + "0" * 20}),
        ("200", ok),
        ("replay", ok),
        ("409 IDEMPOTENCY_CONFLICT", {**ok, "subjects": keep[:1]}),
        ("409 VERSION_CONFLICT", {**ok, "intervention_id": iid + "_v"}),
        ("409 PAUSE_NOT_ACTIVE", {**ok, "intervention_id": iid + "_p", "base_version": job.version + 1}),
    ]


async def settle(store: Store, job_ids: set[str], timeout: float) -> None:
    """Until no outbox command of these jobs is pending, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        outbox = await read_outboxes(store.r)
        if not any(c.pending for j in job_ids for c in outbox.get(j, [])):
            return
        await asyncio.sleep(0.3)


async def make_jobs(store: Store, n: int, submitter: str, attempts: int = 5) -> list[BenchJob]:
    """``n`` jobs waiting for review, made through the store (no model, no upload).

    The server's dispatcher sees each job's DETECT command too. Usually it finds the node already
    reported and skips it; when it wins the race it runs the detector on an image that does not
    exist and the job fails. Such jobs are left out and replaced."""
    out: list[BenchJob] = []
    for _ in range(attempts):
        ids = []
        for _ in range(n - len(out)):
            sha = uuid.uuid4().hex * 2
            image = ImageRef(sha256=sha, width=320, height=240, url=f"/api/v1/artifacts/img_bench_{sha[:16]}.png")
            reply = await store.create_job(submitter, image)
            await report(store, reply.job_id, {"boxes": BOXES})
            ids.append(reply.job_id)
        await settle(store, set(ids), 10)  # let the dispatcher see (and skip) their DETECT commands first
        for job_id in ids:
            st = await store.get(job_id)
            if st.active_pause is not None and st.active_pause.status == "WAITING":
                out.append(
                    BenchJob(
                        job_id,
                        st.version,
                        st.active_pause.pause_token,
                        [b.model_dump(mode="json") for b in st.box_list],
                    )
                )
        if len(out) >= n:
            break
    return out
