"""Writes to a job Redis forgot answer as they did before (docs/protocol.md § Archive, § Routes).

The control plane's app in this process over ASGI, on the test's real redis-server, with a SQLite
archive; jobs are driven through the store (the detector's part played by ``harness.executor``). A
finished job is copied into the archive, then its Redis records are deleted, as the retention
would (``forget``):

- (a) a rerun creation under the same ``Idempotency-Key`` replays the original response (202,
  ``Idempotent-Replayed: true``) instead of creating the job again; another image is 409
  ``IDEMPOTENCY_CONFLICT`` with the archived snapshot;
- (b) the same key with another ``review_quorum`` is a conflict, not a replay;
- (c) a replay is answered under backlog, where a new creation is refused 429 ``BACKLOG_FULL``;
- (d) interventions and cancels on the forgotten job answer exactly as Redis answered them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from harness.executor import report
from harness.tokens import TOKENS_SPEC, auth
from hitl_review.archive import migrate
from hitl_review.archive.archiver import archive_job
from hitl_review.archive.db import Archive
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.routes.api import Runtime, create_app
from hitl_review.serve_app.routes.auth import Authenticator
from hitl_review.statecore import keys
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.store import Store, StoreConfig
from tests.api_util import png
from tests.helpers import THREE_BOXES


async def _no_events(_job_id: str, _after: int) -> AsyncIterator[str]:
    if False:
        yield ""


async def _ready() -> dict[str, Any]:
    return {"models_ready": True}


@pytest_asyncio.fixture
async def archive(tmp_path: Path) -> AsyncIterator[Archive]:
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    await asyncio.to_thread(migrate.upgrade, url)
    a = Archive(url)
    yield a
    a.close()


@asynccontextmanager
async def served(url: str, tmp_path: Path, archive: Archive, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app on the test's Redis (``url``), answering from the test's archive (its own engine on
    it: the app closes its archive at shutdown)."""
    own = Archive(archive.url)
    settings = Settings(data_dir=tmp_path, tokens=TOKENS_SPEC, redis_url=url, **kw)

    async def build() -> Runtime:
        return Runtime(
            settings=settings,
            store=Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=60)),
            artifacts=ArtifactStore(settings.artifacts),
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=_no_events,
            readiness=_ready,
            archive=own,
        )

    app = create_app(build)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi", timeout=30) as c:
            yield c


async def submit(
    c: httpx.AsyncClient, image: bytes, key: str | None, quorum: int = 1, who: str = "sub1"
) -> httpx.Response:
    headers = {**auth(who), **({"Idempotency-Key": key} if key else {})}
    params = {"review_quorum": quorum} if quorum != 1 else {}
    return await c.post("/api/v1/jobs", files={"image": ("a.png", image, "image/png")}, headers=headers, params=params)


async def forget(store: Store, archive: Archive, job_id: str) -> None:
    """The finished job is copied into the archive, then Redis forgets it: every record of it,
    its creation's idempotency record included, as the retention would."""
    await archive_job(store, archive, job_id)
    state = await store.get(job_id)
    jk = keys.job(job_id)
    gone = [jk.meta, jk.pauses, jk.events, jk.idem, jk.reports, jk.executor, jk.claim, jk.audit]
    if state.idem_key:
        gone.append(keys.create_idem(state.submitter, state.idem_key))
    await store.r.delete(*gone)
    await store.r.zrem(jk.jobs, job_id)


async def test_a_creation_replay_is_answered_from_the_archive(
    store: Store, redis_server: Any, tmp_path: Path, archive: Archive
) -> None:
    """(a) ``hitl submit`` rerun after the retention: the same job, not a second one."""
    image, key = png(640, 480), f"batch:{uuid.uuid4().hex}"
    async with served(redis_server.url, tmp_path, archive) as c:
        first = await submit(c, image, key)
        assert first.status_code == 202, first.text
        job_id = first.json()["job_id"]
        assert (await c.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev1"))).status_code == 200
        await forget(store, archive, job_id)
        assert (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("sub1"))).json()["status"] == "CANCELLED"

        again = await submit(c, image, key)
        assert again.status_code == 202, again.text
        assert again.content == first.content  # the original response, byte for byte
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert await store.r.zcard(keys.jobs(keys.partition_of(job_id))) == 0  # no job created again

        other = await submit(c, png(640, 480, colour=(1, 2, 3)), key)
        assert other.status_code == 409, other.text
        body = other.json()
        assert body["code"] == "IDEMPOTENCY_CONFLICT" and body["job_id"] == job_id
        assert body["snapshot"]["job_id"] == job_id and body["snapshot"]["status"] == "CANCELLED"
        # Another submitter's key of the same name is its own.
        theirs = await submit(c, image, key, who="sub2")
        assert theirs.status_code == 202 and theirs.json()["job_id"] != job_id, theirs.text
        assert "Idempotent-Replayed" not in theirs.headers


async def test_the_same_key_with_another_quorum_is_a_conflict(
    store: Store, redis_server: Any, tmp_path: Path, archive: Archive
) -> None:
    """(b) A replay must be the same creation: the same image *and* the same review quorum, in
    Redis and, once Redis forgot the job, in the archive alike."""
    image = png(640, 480)
    async with served(redis_server.url, tmp_path, archive) as c:
        for quorum, other in ((1, 2), (2, 3)):
            key = f"q:{uuid.uuid4().hex}"
            first = await submit(c, image, key, quorum)
            assert first.status_code == 202, first.text
            job_id = first.json()["job_id"]
            assert (await submit(c, image, key, quorum)).headers.get("Idempotent-Replayed") == "true"
            refused = await submit(c, image, key, other)
            assert refused.status_code == 409 and refused.json()["code"] == "IDEMPOTENCY_CONFLICT", refused.text
            assert refused.json()["job_id"] == job_id
            await c.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev1"))
            await forget(store, archive, job_id)
            assert (await submit(c, image, key, quorum)).content == first.content
            refused = await submit(c, image, key, other)
            assert refused.status_code == 409 and refused.json()["code"] == "IDEMPOTENCY_CONFLICT", refused.text


async def test_a_replay_is_answered_under_backlog(
    store: Store, redis_server: Any, tmp_path: Path, archive: Archive
) -> None:
    """(c) Under backlog a new creation is refused 429, but a replay creates no work: it is
    answered, from Redis's record and from the archive's."""
    async with served(redis_server.url, tmp_path, archive, max_backlog=1) as c:
        keyed = {}
        for i in range(2):  # nothing runs the queued detections: the backlog only grows
            key = f"bl:{i}:{uuid.uuid4().hex}"
            r = await submit(c, png(640, 480, colour=(i, 0, 0)), key)
            assert r.status_code == 202, r.text
            keyed[key] = r
        archived_key, live_key = list(keyed)
        job_id = keyed[archived_key].json()["job_id"]
        await c.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev1"))
        await forget(store, archive, job_id)
        more = [await submit(c, png(640, 480, colour=(9, 9, i)), None) for i in range(3)]
        assert more[-1].status_code == 429 and more[-1].json()["code"] == "BACKLOG_FULL", [m.text for m in more]
        for i, key in enumerate((archived_key, live_key)):
            replay = await submit(c, png(640, 480, colour=(i, 0, 0)), key)
            assert replay.status_code == 202, replay.text
            assert replay.content == keyed[key].content and replay.headers.get("Idempotent-Replayed") == "true"


async def _finished(store: Store, c: httpx.AsyncClient, cancel: bool) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A job that waited for a reviewer and ended: cancelled, or reviewed with nothing kept
    (EMPTY_SELECTION). Returns the job, its waiting snapshot and the accepted intervention's body."""
    r = await submit(c, png(640, 480), None)
    job_id = r.json()["job_id"]
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    waiting = (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).json()
    body = {
        "intervention_id": f"iv_{uuid.uuid4().hex[:12]}",
        "pause_token": waiting["active_pause"]["pause_token"],
        "base_version": waiting["version"],
        "subjects": [],
    }
    if cancel:
        assert (await c.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev1"))).status_code == 200
    else:
        done = await c.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth("rev1"))
        assert done.status_code == 200 and done.json()["status"] == "EMPTY_SELECTION", done.text
    return job_id, waiting, body


async def test_writes_to_a_forgotten_job_answer_as_before(
    store: Store, redis_server: Any, tmp_path: Path, archive: Archive
) -> None:
    """(d) The same requests on a finished job, while Redis holds it and once only the archive
    does: the same status codes, headers and bodies (the snapshot and ``rebase`` included)."""
    async with served(redis_server.url, tmp_path, archive) as c:
        asked: list[tuple[str, str, Any, str | None]] = []
        for cancel in (False, True):
            job_id, _waiting, accepted = await _finished(store, c, cancel)
            final = (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).json()
            interventions = f"/api/v1/jobs/{job_id}/interventions"
            iid, now = f"iv_{uuid.uuid4().hex[:12]}", final["version"]
            outside = [{"bbox": [0, 0, 900, 10], "label": "wide"}]  # wider than the 640-pixel image
            asked += [
                (job_id, interventions, accepted, "rev1"),  # a replay (or, cancelled, never recorded)
                (job_id, interventions, accepted, "rev2"),  # another reviewer: a conflict
                (job_id, interventions, {**accepted, "intervention_id": f"{iid}1"}, "rev1"),  # a stale version
                (job_id, interventions, {**accepted, "intervention_id": f"{iid}2", "base_version": now}, "rev1"),
                (job_id, interventions, {**accepted, "intervention_id": f"{iid}3", "subjects": outside}, "rev1"),
                (job_id, f"/api/v1/jobs/{job_id}/cancel", None, "rev1"),
            ]

        async def ask() -> list[tuple[int, str | None, Any]]:
            out = []
            for _job, path, body, who in asked:
                r = await c.post(path, json=body, headers=auth(who or "rev1"))
                out.append((r.status_code, r.headers.get("Idempotent-Replayed"), r.json()))
            return out

        before = await ask()
        for job_id in {a[0] for a in asked}:
            await forget(store, archive, job_id)
            assert not await store.r.exists(keys.job(job_id).meta)
        after = await ask()
        codes = [(s, b.get("code")) for s, _, b in after]
        assert codes == [
            (200, None),
            (409, "IDEMPOTENCY_CONFLICT"),
            (409, "VERSION_CONFLICT"),
            (409, "PAUSE_NOT_ACTIVE"),
            (400, "INVALID_REQUEST"),
            (409, "JOB_TERMINAL"),
            (409, "JOB_CANCELLED"),
            (409, "JOB_CANCELLED"),
            (409, "JOB_CANCELLED"),
            (409, "JOB_CANCELLED"),
            (400, "INVALID_REQUEST"),
            (200, None),
        ], codes
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            assert a == b, (i, asked[i][1:], b, a)
