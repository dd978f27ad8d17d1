"""Artifact garbage collection (docs/archive.md § Artifact retention) on a real Redis, a real archive
(SQLite and PostgreSQL) and a real artifact directory: the blobs only old archived jobs refer to go;
a blob a live job, a job Redis still holds or a newer archived job uses stays, and so does one
written within the grace period. Then the route and ``hitl admin gc-artifacts`` on a served API."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import update

from hitl_review.archive.archiver import copy_job
from hitl_review.archive.db import Archive
from hitl_review.archive.gc import collect
from hitl_review.archive.schema import ArchivedJob
from hitl_review.serve_app import cli
from hitl_review.statecore import keys
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.store import Store

from .helpers import waiting_job
from .test_archive import finished_job


def _image(tag: str) -> ImageRef:
    name = f"img_{tag * 32}.png"
    return ImageRef(sha256=tag * 64, width=640, height=480, url=f"/api/v1/artifacts/{name}")


def _blob(art: ArtifactStore, name: str, age_s: float) -> Path:
    art.put_named(name, b"bytes of " + name.encode())
    path = Path(art.path) / name
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


async def _forget_in_redis(store: Store, job_id: str) -> None:
    """What the retention does to a finished job: its records expire, the listing drops it."""
    jk = keys.job(job_id)
    await store.r.delete(jk.meta, jk.pauses, jk.events, jk.idem, jk.reports, jk.audit)
    await store.r.zrem(jk.jobs, job_id)


def _finished_days_ago(archive: Archive, job_id: str, days: float) -> None:
    with archive.transaction() as s:
        when = datetime.now(UTC) - timedelta(days=days)
        s.execute(update(ArchivedJob).where(ArchivedJob.job_id == job_id).values(finished_ts=when))


async def test_only_blobs_no_other_job_uses_are_collected(store: Store, archive: Archive, tmp_path: Path) -> None:
    art = ArtifactStore(f"file://{tmp_path / 'artifacts'}")
    shared, alone, newer, fresh = _image("a"), _image("b"), _image("c"), _image("d")
    alone_masks = {i: f"mask_{'e' * 31}{i}.png" for i in range(3)}
    files = {
        n: _blob(art, n, 7200)
        for n in (*(i.url.rsplit("/", 1)[-1] for i in (shared, alone, newer)), *alone_masks.values())
    }
    files["fresh"] = _blob(art, fresh.url.rsplit("/", 1)[-1], 60)  # written a minute ago
    placeholders = [f"{k}_{i:032x}.png" for i in range(3) for k in ("mask", "cutout")]
    for n in placeholders:  # finished_job's default names: every job here shares them
        files[n] = _blob(art, n, 7200)

    old_shared = await finished_job(store, shared)
    old_alone = await finished_job(store, alone, masks=alone_masks)
    old_fresh = await finished_job(store, fresh)
    recent = await finished_job(store, newer)
    for job_id in (old_shared, old_alone, old_fresh, recent):
        await copy_job(store, archive, job_id)
    for job_id in (old_shared, old_alone, old_fresh):
        _finished_days_ago(archive, job_id, 40)
        await _forget_in_redis(store, job_id)
    live = await waiting_job(store, shared)  # a live job on the same image as an old one

    dry = await collect(store, archive, art, 30, dry_run=True)
    expect = sorted([alone.url.rsplit("/", 1)[-1], *alone_masks.values()])
    assert dry.deleted == expect and all(p.exists() for p in files.values())
    done = await collect(store, archive, art, 30)
    print(f"\n[gc] {archive.dialect}: {done.as_dict()}")
    assert done.deleted == expect and (done.jobs, done.recent, done.missing) == (3, 1, 0)
    assert done.shared == done.candidates - len(expect) - 1  # the live job's image, the newer job's placeholders
    for name, path in files.items():
        assert path.exists() == (name not in expect), name
    assert (await store.get(live)).image == shared
    again = await collect(store, archive, art, 30)
    assert again.deleted == [] and again.missing == len(expect)


def test_gc_route_and_command(api_server: Any, capsys: Any) -> None:
    conn = ["--api-url", api_server.url, "--token", "tok-admin", "--json"]
    capsys.readouterr()
    assert cli.main(["admin", "gc-artifacts", "--older-than-days", "36500", "--dry-run", *conn]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] is True and out["deleted"] == 0 and out["jobs"] == 0
    assert cli.main(["admin", "gc-artifacts", "--older-than-days", "0", *conn]) != 0  # must be > 0: a 400
