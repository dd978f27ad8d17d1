"""Raw-HTTP helpers for the control-plane tests (deliberately not the project's client)."""

from __future__ import annotations

import io
import time
import uuid
from typing import Any

import httpx
from PIL import Image

from harness.sse import read_events
from harness.tokens import auth
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore.states import TERMINAL


def png(width: int = 64, height: int = 48, colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, format="PNG")
    return buf.getvalue()


def blank_with_product(seed: int = 0) -> bytes:
    return product_composite(seed=seed, n=2)[0]


def submit(
    c: httpx.Client, data: bytes, who: str = "sub1", key: str | None = None, filename: str = "img.png"
) -> httpx.Response:
    headers = auth(who)
    if key:
        headers["Idempotency-Key"] = key
    return c.post("/api/v1/jobs", files={"image": (filename, data, "application/octet-stream")}, headers=headers)


def get(c: httpx.Client, job_id: str, who: str = "rev1") -> dict[str, Any]:
    r = c.get(f"/api/v1/jobs/{job_id}", headers=auth(who))
    assert r.status_code == 200, r.text
    return r.json()


def wait_status(
    c: httpx.Client, job_id: str, statuses: set[str] | None = None, timeout: float = 60, who: str = "rev1"
) -> dict[str, Any]:
    want = statuses or {s.value for s in TERMINAL}
    deadline = time.monotonic() + timeout
    while True:
        snap = get(c, job_id, who)
        if snap["status"] in want:
            return snap
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} stuck in {snap['status']}, wanted {want}")
        time.sleep(0.05)


def intervene(
    c: httpx.Client,
    job_id: str,
    snap: dict[str, Any],
    subjects: list[dict[str, Any]],
    who: str = "rev1",
    iid: str | None = None,
    **over: Any,
) -> httpx.Response:
    pause = snap["active_pause"] or {}
    body = {
        "intervention_id": iid or f"iv_{uuid.uuid4().hex[:12]}",
        "pause_token": pause.get("pause_token", "x"),
        "base_version": snap["version"],
        "subjects": subjects,
    }
    body.update(over)
    if "decisions" in over:  # a mask review's answer carries decisions instead of subjects
        del body["subjects"]
    return c.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth(who))


def wait_done(c: httpx.Client, job_id: str, timeout: float = 60, who: str = "rev1") -> dict[str, Any]:
    """The job's terminal snapshot, accepting every mask of a mask review on the way: ``hitl up``
    sends a cut-out its quality gate fails to a person by default (``--quality-gate
    review-failing``), and a test about the box stages answers that as a reviewer who agrees would."""
    deadline = time.monotonic() + timeout
    answered: set[str] = set()
    while True:
        snap = wait_status(
            c, job_id, {*(s.value for s in TERMINAL), "WAITING_MASK_REVIEW"}, deadline - time.monotonic(), who
        )
        pause = snap["active_pause"]
        if snap["status"] != "WAITING_MASK_REVIEW":
            return snap
        if pause and pause["pause_token"] not in answered:
            decisions = [{"box_id": s["box_id"], "decision": "ACCEPT"} for s in pause["subjects_to_review"]]
            r = intervene(c, job_id, snap, [], who, snapshot_id=pause["snapshot_id"], decisions=decisions)
            assert r.status_code == 200, r.text
            answered.add(pause["pause_token"])
        time.sleep(0.05)


def keep_all(snap: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]]


def sse_events(
    c: httpx.Client,
    job_id: str,
    *,
    last_event_id: int | None = None,
    until: str | None = None,
    limit: int = 1000,
    who: str = "rev1",
    timeout: float = 30,
) -> list[dict[str, Any]]:
    """The job's events until one of type ``until`` (or the stream's end), as ``who`` sees them."""
    return read_events(
        c, job_id, headers=auth(who), last_event_id=last_event_id, until=until, limit=limit, timeout=timeout
    )
