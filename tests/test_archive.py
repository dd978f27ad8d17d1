"""The archive of finished jobs (docs/archive.md) on SQLite and on a real PostgreSQL: Alembic from an
empty database, the bodies read back equal the API's, the upsert is idempotent (twice, racing, and
after a copy killed half-way) and never lets an older copy replace a newer one."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select

from harness.tokens import auth
from hitl_review.archive import migrate, reads
from hitl_review.archive.archiver import (
    Copied,
    NotFinished,
    archive_finished,
    archive_job,
    copy_job,
    read_job,
    write_record,
)
from hitl_review.archive.cli import add_upgrade_command
from hitl_review.archive.db import Archive
from hitl_review.archive.schema import ArchivedEvent, ArchivedJob, ArchivedPause, ArtifactRef, AuditEntry, Base
from hitl_review.serve_app.routes.events import sse_frame
from hitl_review.statecore.models import JobResults, NodeReport
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store

from .api_util import blank_with_product, intervene, keep_all, submit, wait_status
from .helpers import THREE_BOXES, iv, keep, manual, report, validate, waiting_job

TABLES = (ArchivedJob, ArchivedPause, ArchivedEvent, AuditEntry, ArtifactRef)


def counts(archive: Archive, job_id: str) -> dict[str, int]:
    with archive.reading() as s:
        return {
            t.__tablename__: s.scalar(select(func.count()).select_from(t).where(t.job_id == job_id)) or 0
            for t in TABLES
        }


# --------------------------------------------------------------------------- driving a job to its end


GATE_PASS = {"verdict": "PASS", "reasons": [], "scores": {"fill": 0.6}, "policy": "gate-v1"}
GATE_FAIL = {"verdict": "FAIL", "reasons": ["the mask stops short"], "scores": {"box_gap": 0.3}, "policy": "gate-v1"}


async def finished_job(
    store: Store, image: Any, masks: dict[int, str] | None = None, key: str | None = None, gated: bool = False
) -> str:
    """Through the store, as reviewer and executors: three proposals; box 0 moved, box 1 kept,
    box 2 deleted, one manual box drawn; the manual box passes naming; every approved box is
    segmented (``masks``: an artifact name per approved position, default placeholder names).
    ``key``: the submission's Idempotency-Key (``<batch>:<sha256>`` from ``hitl submit``). ``gated``:
    the quality gate passed the first mask and failed the second after one refinement."""
    job_id = (await store.create_job("alice", image, key)).job_id
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    st = await store.get(job_id)
    b0 = st.box_list[0]
    subjects = [
        {"box_id": b0.box_id, "bbox": [b0.bbox[0] + 5, b0.bbox[1], b0.bbox[2] + 5, b0.bbox[3]]},
        *keep(st, 1),
        manual([500, 300, 600, 400], "bag"),
    ]
    await store.intervene(job_id, iv(st, subjects), "rev")
    added = [b.box_id for b in (await store.get(job_id)).box_list if b.source == "manual"]
    assert await validate(store, job_id, dict.fromkeys(added, True)) == "OK"
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    names = masks or {}
    outcome = [
        {
            "box_id": b.box_id,
            "status": "SUCCEEDED",
            "mask": names.get(i, f"mask_{i:032x}.png"),
            "cutout": f"cutout_{i:032x}.png",
        }
        for i, b in enumerate(st.approved_box_list)
    ]
    if gated:
        outcome[0]["quality"] = GATE_PASS
        outcome[1].update(quality=GATE_FAIL, refinements=[{"strategy": "enlarged_box", "quality": GATE_FAIL}])
    assert await report(store, job_id, {"subjects": outcome}) == "OK"
    assert await report(store, job_id, {}) == "OK"
    assert (await store.get(job_id)).status == S.SUCCEEDED
    return job_id


async def late_report(store: Store, job_id: str) -> None:
    """A report for a node the finished job has left: recorded as a REPORT_IGNORED event."""
    before = len(await store.events_after(job_id))
    node = (await store.get(job_id)).current_node
    assert node is not None
    late = NodeReport(
        node_instance_id="node_late_" + uuid.uuid4().hex[:8],
        node_type=node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
    )
    assert await store.apply_report(late) == "IGNORED"
    events = await store.events_after(job_id)
    assert len(events) == before + 1 and events[-1].type == "REPORT_IGNORED"


# --------------------------------------------------------------------------- migrations


def test_alembic_upgrades_an_empty_database_and_reports_its_schema_version(empty_url):
    assert migrate.schema_version(empty_url) is None
    assert migrate.main(["--archive-url", empty_url, "--check"]) == 1  # behind: `hitl admin archive-upgrade --check`
    assert migrate.upgrade(empty_url) == migrate.head() == "0007"
    assert migrate.main(["--archive-url", empty_url, "--check"]) == 0
    assert migrate.schema_version(empty_url) == "0007"
    assert migrate.upgrade(empty_url) == "0007"  # again: nothing to do
    # As `hitl admin archive-upgrade` (archive.cli on hitl's `admin` subparsers).
    admin = argparse.ArgumentParser(prog="hitl admin").add_subparsers(dest="admin_command")
    add_upgrade_command(admin)
    args = admin._name_parser_map["archive-upgrade"].parse_args(["--archive-url", empty_url])
    assert args.func(args) == 0
    a = Archive(empty_url)
    try:
        with a.engine.connect() as conn:
            # Alembic's own comparison: the revisions create exactly what the ORM maps (types included).
            assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []
        found = inspect(a.engine)
        # The revisions create what the ORM maps, column for column.
        for table in Base.metadata.sorted_tables:
            assert {c["name"] for c in found.get_columns(table.name)} == {c.name for c in table.columns}, table.name
            assert {c["name"] for c in found.get_columns(table.name) if not c["nullable"]} == {
                c.name for c in table.columns if not c.nullable
            }, table.name
        assert "alembic_version" in found.get_table_names()
    finally:
        a.close()


# --------------------------------------------------------------------------- bodies


async def test_archived_bodies_equal_the_stores(store, image, archive):
    job_id = await finished_job(store, image)
    assert await archive_job(store, archive, job_id) == "INSERTED"
    view = reads.job(archive, job_id)
    assert view is not None and view.submitter == "alice"
    assert view.snapshot.model_dump_json() == (await store.snapshot(job_id)).model_dump_json()
    state = await store.get(job_id)
    expected = JobResults(job_id=job_id, status=state.status, reason_code=state.reason_code, subjects=state.results)
    assert view.results is not None and view.results.model_dump_json() == expected.model_dump_json()
    assert len(expected.subjects) == 3
    ours, theirs = reads.events(archive, job_id), await store.events_after(job_id)
    assert ours is not None and [sse_frame(e) for e in ours] == [sse_frame(e) for e in theirs]
    assert reads.events(archive, job_id, after=3) == theirs[3:]
    assert reads.pause_history(archive, job_id) == await store.pause_history(job_id)
    assert reads.audit(archive, job_id) == await store.audit(job_id)  # the chain, its head and length
    with archive.reading() as s:
        refs = s.scalars(select(ArtifactRef).where(ArtifactRef.job_id == job_id).order_by(ArtifactRef.position)).all()
    assert [(r.kind, r.box_id) for r in refs] == [("image", None)] + [
        (k, b.box_id) for b in state.approved_box_list for k in ("mask", "cutout")
    ]
    assert refs[0].url == state.image.url
    assert reads.lookup(archive, job_id) == view
    down = Archive("postgresql://nobody@127.0.0.1:1/none")  # nothing listens on port 1
    try:
        assert reads.lookup(down, job_id) is None  # a 404 for the route, not a 500
    finally:
        down.close()
    for unknown in (reads.job, reads.snapshot, reads.results, reads.events, reads.audit, reads.pause_history):
        assert unknown(archive, "job_missing") is None


async def test_a_live_job_is_not_archived_and_the_catch_up_copies_the_finished_ones(store, image, archive):
    live = await waiting_job(store, image)
    with pytest.raises(NotFinished):
        await archive_job(store, archive, live)
    done = [await finished_job(store, image) for _ in range(3)]
    assert await archive_finished(store, archive, page=2) == {"INSERTED": 3}  # pages of 2: the cursor is followed
    assert await archive_finished(store, archive) == {"UNCHANGED": 3}
    assert counts(archive, live)["archived_jobs"] == 0
    assert all(counts(archive, j)["archived_jobs"] == 1 for j in done)


@pytest.fixture(scope="module")
def api_finished() -> Iterator[tuple[Any, str, dict[str, Any]]]:
    """One job through the real control plane (HTTP, its dispatcher, the classical models), and
    what the API answers for it: the snapshot, the results and the raw event stream."""
    from harness.ci import require_binary
    from harness.tokens import TOKENS_SPEC
    from harness.uvicorn import LocalServer

    require_binary("redis-server")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hitl-archive-api-") as d:
        server = LocalServer(Path(d), tokens=TOKENS_SPEC).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                r = submit(c, blank_with_product(3))
                assert r.status_code == 202, r.text
                job_id = r.json()["job_id"]
                snap = wait_status(c, job_id, {"WAITING_USER_SELECTION"})
                assert intervene(c, job_id, snap, keep_all(snap)).status_code == 200
                wait_status(c, job_id)
                bodies = {
                    "snapshot": c.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1")).text,
                    "results": c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("rev1")).text,
                    "events": c.get(f"/api/v1/jobs/{job_id}/events", headers=auth("rev1")).text,
                }
            yield server, job_id, bodies
        finally:
            server.stop()


async def test_the_archive_answers_with_the_apis_own_bodies(api_finished, archive):
    server, job_id, bodies = api_finished
    store = Store.from_url(server.redis_url)
    try:
        assert await archive_job(store, archive, job_id) == "INSERTED"
    finally:
        await store.close()
    view = reads.job(archive, job_id)
    assert view is not None and view.results is not None
    assert view.snapshot.model_dump_json() == bodies["snapshot"]
    assert view.results.model_dump_json() == bodies["results"]
    assert any(s.mask_url for s in view.results.subjects), "the model segmented nothing: a weak comparison"
    # The stream's frames as sent, without its keep-alive comments.
    lines = "\n".join(line for line in bodies["events"].split("\n") if not line.startswith(":"))
    frames = "".join(chunk.strip("\n") + "\n\n" for chunk in lines.split("\n\n") if chunk.strip("\n"))
    events = reads.events(archive, job_id)
    assert events is not None and events[-1].type == "JOB_FINISHED"
    assert "".join(sse_frame(e) for e in events) == frames


# --------------------------------------------------------------------------- the upsert


async def test_upsert_is_idempotent_and_only_moves_forward(store, image, archive):
    job_id = await finished_job(store, image)
    assert await archive_job(store, archive, job_id) == "INSERTED"
    first = counts(archive, job_id)
    assert first == {"archived_jobs": 1, "archived_pauses": 1, "archived_events": first["archived_events"],
                     "audit_entries": 8, "artifact_refs": 7}  # fmt: skip  # a report per subject's node (3)
    copied = await copy_job(store, archive, job_id)
    assert copied == Copied("UNCHANGED", (await store.get(job_id)).version, first["archived_events"], 8)
    assert counts(archive, job_id) == first
    # The finished job gains an event (a late report): the newer copy replaces the archived one.
    await late_report(store, job_id)
    assert await archive_job(store, archive, job_id) == "REPLACED"
    now = counts(archive, job_id)
    assert now == {**first, "archived_events": first["archived_events"] + 1, "audit_entries": 9}  # its audit entry
    # An older copy (a delayed archiver holding an earlier read) never replaces a newer one.
    record = await read_job(store, job_id)
    older = dataclasses.replace(record, events=record.events[:-1])
    assert write_record(archive, older) == "OLDER"
    assert write_record(archive, dataclasses.replace(record, audit=record.audit[:-1])) == "OLDER"
    assert write_record(archive, dataclasses.replace(record, version=record.version - 1)) == "OLDER"
    assert counts(archive, job_id) == now
    assert reads.events(archive, job_id) == record.events


async def test_two_archivers_racing_leave_one_copy(store, image, archive):
    job_id = await finished_job(store, image)
    record = await read_job(store, job_id)
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def copy() -> None:
        barrier.wait()
        outcomes.append(write_record(archive, record))

    threads = [threading.Thread(target=copy) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["INSERTED", "UNCHANGED", "UNCHANGED", "UNCHANGED"]
    assert counts(archive, job_id)["archived_jobs"] == 1
    assert counts(archive, job_id)["archived_events"] == len(record.events)


KILLED_COPY = """
import asyncio, sys, time
from hitl_review.archive.archiver import archive_job
from hitl_review.archive.db import Archive
from hitl_review.statecore.store import Store

def stop_here():
    print("WRITTEN", flush=True)
    time.sleep(120)

async def main():
    store = Store.from_url(sys.argv[1])
    await archive_job(store, Archive(sys.argv[2]), sys.argv[3], on_written=stop_here)

asyncio.run(main())
"""


def _kill_mid_copy(redis_url: str, archive: Archive, job_id: str, during: dict[str, int]) -> None:
    """Run the copy in another process, SIGKILL it once every row is written and not committed;
    while it waits there, the archive must still show ``during``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_COPY, redis_url, archive.url, job_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "WRITTEN", (
            f"the copy did not get half-way: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        )
        assert counts(archive, job_id) == during  # uncommitted: nobody else sees it
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL


async def test_a_copy_killed_mid_transaction_leaves_the_previous_state(store, image, archive, redis_server):
    job_id = await finished_job(store, image)
    nothing = dict.fromkeys((t.__tablename__ for t in TABLES), 0)
    t0 = time.monotonic()
    _kill_mid_copy(redis_server.url, archive, job_id, nothing)
    assert counts(archive, job_id) == nothing
    assert await archive_job(store, archive, job_id) == "INSERTED"
    first = counts(archive, job_id)
    # Killed while replacing an archived copy with a newer one: the archived copy stays whole.
    await late_report(store, job_id)
    _kill_mid_copy(redis_server.url, archive, job_id, first)
    assert counts(archive, job_id) == first
    assert reads.job(archive, job_id) is not None
    assert await archive_job(store, archive, job_id) == "REPLACED"
    assert counts(archive, job_id) == {
        **first,
        "archived_events": first["archived_events"] + 1,
        "audit_entries": first["audit_entries"] + 1,  # the late report's IGNORED entry
    }
    assert await archive_job(store, archive, job_id) == "UNCHANGED"
    assert time.monotonic() - t0 < 60


@pytest.mark.cluster
async def test_a_job_on_a_redis_cluster_is_archived_the_same(cluster_store, image, tmp_path):
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    migrate.upgrade(url)
    archive = Archive(url)
    try:
        job_id = await finished_job(cluster_store, image)
        assert await archive_job(cluster_store, archive, job_id) == "INSERTED"
        assert await archive_finished(cluster_store, archive) == {"UNCHANGED": 1}
        view = reads.job(archive, job_id)
        assert view is not None
        assert view.snapshot.model_dump_json() == (await cluster_store.snapshot(job_id)).model_dump_json()
        assert reads.events(archive, job_id) == await cluster_store.events_after(job_id)
    finally:
        archive.close()


def test_an_archive_at_the_first_revision_upgrades_to_the_live_mirror(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    assert migrate.upgrade(url, "0001") == "0001"
    assert migrate.not_ready(url) is not None  # behind: the build refuses to use it as it is
    assert migrate.upgrade(url) == "0007" and migrate.not_ready(url) is None
    a = Archive(url)
    try:
        assert "live_mirror" in inspect(a.engine).get_table_names()
    finally:
        a.close()
