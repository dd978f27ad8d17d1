"""The preview route (docs/protocol.md § Cut-out quality): the control plane's app in this process
over ASGI with the classical segmenter and the gate behind it (the uvicorn mode's LocalRunner), on a
real redis-server and a real image artifact. A mask for the box and the reviewer's points, with the
gate's verdict; the job does not change (version, events, audit); bad requests are 400, other roles
403, and a reviewer clicking too fast gets 429 RATE_LIMITED."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from harness.tokens import TOKENS_SPEC, auth
from hitl_review.deployments.backends.classical import ClassicalSegmenter
from hitl_review.deployments.executor import Models
from hitl_review.deployments.quality.metrics import mask_iou
from hitl_review.deployments.quality.subject import QualityGate
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.routes.api import Runtime, create_app
from hitl_review.serve_app.routes.auth import Authenticator
from hitl_review.serve_app.routes.preview_routes import BURST, RateLimiter
from hitl_review.serve_app.work.dispatcher import LocalRunner
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.store import Store, StoreConfig

from .asgi_util import _no_events, _ready
from .helpers import report
from .test_refine import scene


@asynccontextmanager
async def app_client(url: str, data_dir: Path, preview: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(data_dir=data_dir, tokens=TOKENS_SPEC, redis_url=url)
    artifacts = ArtifactStore(settings.artifacts)
    runner = LocalRunner(Models(segmenter=ClassicalSegmenter(), quality=QualityGate()), artifacts, threads=2)

    async def build() -> Runtime:
        return Runtime(
            settings=settings,
            store=Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=60)),
            artifacts=artifacts,
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=_no_events,
            readiness=_ready,
            preview=runner.preview if preview else None,
        )

    app = create_app(build)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://asgi") as client:
            yield client


async def waiting_on_a_real_image(store: Store, data_dir: Path) -> tuple[str, np.ndarray, list[float]]:
    """A waiting job whose image artifact is the ellipse scene; its one box is 15% short on the right."""
    pixels, truth, (x1, y1, x2, y2) = scene("ellipse")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    name = ArtifactStore(f"file://{data_dir.resolve() / 'artifacts'}").put("image", buf.getvalue(), "png")
    ref = ImageRef(sha256="f" * 64, width=pixels.shape[1], height=pixels.shape[0], url=ArtifactStore.url(name))
    job_id = (await store.create_job("sub1", ref)).job_id
    box = [x1, y1, x2 - 0.15 * (x2 - x1), y2]
    assert await report(store, job_id, {"boxes": [{"bbox": box, "label": "vase", "score": 0.9}]}) == "OK"
    return job_id, truth, box


def path(job_id: str, box_id: str) -> str:
    return f"/api/v1/jobs/{job_id}/subjects/{box_id}/preview"


async def footprint(store: Store, job_id: str) -> tuple[Any, ...]:
    state = await store.get(job_id)
    return state.version, len(await store.events_after(job_id)), len(await store.audit(job_id))


async def test_a_preview_from_points_answers_a_mask_and_its_verdict_and_changes_nothing(store, redis_server, tmp_path):
    job_id, truth, box = await waiting_on_a_real_image(store, tmp_path)
    box_id = (await store.get(job_id)).box_list[0].box_id
    before = await footprint(store, job_id)
    async with app_client(redis_server.url, tmp_path) as c:
        # A positive click inside the subject and one past the box's short side, where it goes on.
        points = [{"x": (box[0] + box[2]) / 2, "y": (box[1] + box[3]) / 2, "positive": True}]
        points.append({"x": box[2] + 20, "y": (box[1] + box[3]) / 2, "positive": True})
        r = await c.post(path(job_id, box_id), json={"points": points}, headers=auth("rev1"))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["box_id"] == box_id and body["quality"]["policy"] == "gate-v1" and body["ms"] > 0
        with Image.open(io.BytesIO(base64.b64decode(body["mask_png_base64"]))) as im:
            mask = np.asarray(im.convert("L")) > 0
        assert mask.shape == truth.shape and int(mask.sum()) == body["area"]
        # The click past the box took the mask beyond the box the detector drew, onto the subject.
        assert mask[:, int(box[2]) + 1 :].any() and mask_iou(mask, truth) > 0.9
    assert await footprint(store, job_id) == before  # no version, event or audit entry


async def test_bad_previews_are_refused_precisely(store, redis_server, tmp_path):
    job_id, _, box = await waiting_on_a_real_image(store, tmp_path)
    box_id = (await store.get(job_id)).box_list[0].box_id
    inside = {"x": box[0] + 5, "y": box[1] + 5, "positive": True}
    async with app_client(redis_server.url, tmp_path) as c:

        async def post(job: str, box_: str, body: Any, who: str = "rev1") -> httpx.Response:
            return await c.post(path(job, box_), json=body, headers=auth(who))

        r = await post(job_id, box_id, {"points": [{"x": 5000, "y": 10, "positive": True}]})
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_REQUEST") and "outside" in r.json()["message"]
        r = await post(job_id, "box_nope", {"points": [inside]})
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_REQUEST") and "box_nope" in r.json()["message"]
        for bad in ({"points": []}, {"points": [{**inside, "positive": "yes"}]}, {"points": [inside], "x": 1}):
            assert (await post(job_id, box_id, bad)).status_code == 400, bad
        assert (await post("job_" + "0" * 20, box_id, {"points": [inside]})).json()["code"] == "JOB_NOT_FOUND"
        assert (await post(job_id, box_id, {"points": [inside]}, who="sub1")).status_code == 403
        assert (await post(job_id, box_id, {"points": [inside]}, who="admin")).status_code == 200
    async with app_client(redis_server.url, tmp_path, preview=False) as c:
        r = await c.post(path(job_id, box_id), json={"points": [inside]}, headers=auth("rev1"))
        assert (r.status_code, r.json()["code"]) == (503, "PREVIEW_UNAVAILABLE") and r.headers["Retry-After"]


async def test_a_reviewer_clicking_faster_than_the_rate_is_told_to_wait(store, redis_server, tmp_path):
    job_id, _, box = await waiting_on_a_real_image(store, tmp_path)
    box_id = (await store.get(job_id)).box_list[0].box_id
    body = {"points": [{"x": box[0] + 30, "y": box[1] + 30, "positive": True}]}
    async with app_client(redis_server.url, tmp_path) as c:
        # At once (one computation lasts longer than the refill of a token on this machine).
        answers = await asyncio.gather(
            *(c.post(path(job_id, box_id), json=body, headers=auth("rev1")) for _ in range(BURST + 3))
        )
        refused = [r for r in answers if r.status_code == 429]
        assert len(refused) >= 2 and sum(r.status_code == 200 for r in answers) >= BURST - 1, answers
        assert refused and all(r.json()["code"] == "RATE_LIMITED" and r.headers["Retry-After"] for r in refused)
        # Another reviewer has a bucket of their own.
        assert (await c.post(path(job_id, box_id), json=body, headers=auth("rev2"))).status_code == 200


def test_the_rate_limiter_refills_at_its_rate():
    now = [100.0]
    limiter = RateLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)
    assert limiter.take("b") == 0.0
    now[0] += 0.5
    assert limiter.take("a") == 0.0 and limiter.take("a") > 0
