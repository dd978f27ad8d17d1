"""A standalone dispatcher (``hitl dispatcher``) is built from the deployment's
settings (``<data-dir>/deployment.json``, written by ``hitl up``): under an archive it never starts
a finished job's retention without a copy, and it keeps the deployment's retention (issue 19,
finding 4: it used to build its store with default settings, so the job it finished started its
retention at once, with no copy queued, and the record was gone after retention)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from harness.proc import Child
from hitl_review.serve_app.ops.config import Settings, save_deployment
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.serve_app.work.standalone import parser, settings_for
from hitl_review.statecore import keys
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef, InterventionRequest, Subject
from hitl_review.statecore.store import Store, StoreConfig


async def wait_for(store: Store, job_id: str, statuses: set[str], child: Child, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (await store.get(job_id)).status.value not in statuses:
        assert time.monotonic() < deadline, f"job {job_id} not in {statuses}:\n{child.tail()}"
        await asyncio.sleep(0.1)


def test_flags_override_single_settings_of_the_deployment(tmp_path: Path):
    save_deployment(Settings(data_dir=tmp_path, redis_url="redis://127.0.0.1:1/0", retention_s=77, max_attempts=5))
    s = settings_for(parser().parse_args(["--data-dir", str(tmp_path), "--heartbeat-s", "0.5"]))
    assert (s.redis_url, s.retention_s, s.max_attempts, s.heartbeat_s) == ("redis://127.0.0.1:1/0", 77, 5, 0.5)
    assert s.tokens is None
    with pytest.raises(SystemExit, match="no deployment settings"):
        settings_for(parser().parse_args(["--data-dir", str(tmp_path / "elsewhere")]))


async def test_a_job_finished_by_a_standalone_dispatcher_waits_for_its_archive_copy(redis_server, tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    save_deployment(Settings(data_dir=data, redis_url=redis_server.url, retention_s=1234, archive=True))
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=1234, archive=True))
    await store.r.flushdb()
    await store.ensure_groups()
    artifacts = ArtifactStore(f"file://{data / 'artifacts'}")
    png, _ = product_composite(seed=5, width=320, height=240, n=1)
    ref = ImageRef(sha256="c" * 64, width=320, height=240, url=ArtifactStore.url(artifacts.put("image", png, "png")))
    job_id = (await store.create_job("alice", ref)).job_id
    child = Child(
        [sys.executable, "-m", "hitl_review.serve_app.cli", "dispatcher", "--data-dir", str(data), "--consumer", "solo"]
        + ["--log-format", "json", "--verbose"]
    )
    child.start()
    try:
        await wait_for(store, job_id, {"WAITING_USER_SELECTION"}, child)
        state = await store.get(job_id)
        snap = await store.snapshot_of(state)
        assert snap.active_pause is not None
        subjects = [Subject(box_id=b.box_id, bbox=b.bbox) for b in snap.box_list]
        req = InterventionRequest(
            intervention_id="iv-solo",
            pause_token=snap.active_pause.pause_token,
            base_version=snap.version,
            subjects=subjects,
        )
        assert (await store.intervene(job_id, req, "rev")).status_code == 200
        await wait_for(store, job_id, {"SUCCEEDED"}, child)
    finally:
        child.kill()
    # Its lines are the control plane's: JSON objects (--log-format), DEBUG lines too (--verbose).
    lines = [json.loads(line) for line in child.tail(10_000).splitlines() if line.startswith("{")]
    assert any(d["msg"].startswith("standalone dispatcher on") for d in lines), child.tail(20)
    assert {"INFO", "DEBUG"} <= {d["level"] for d in lines}, sorted({d["level"] for d in lines})
    jk = keys.job(job_id)
    assert await store.r.ttl(jk.meta) == -1, "retention started with no archive copy"
    assert await store.r.zscore(keys.archive_waiting(keys.partition_of(job_id)), job_id) is not None
    await store.close()
