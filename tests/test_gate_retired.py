"""The retired gate policies (issue 38 item 14): ``--quality-gate-policy gate-v3`` is refused at start in
one line naming the kept ones, and a verdict gate-v3 wrote (a job reviewed and archived before the
upgrade) stays readable: the mask review page, the job's results, ``hitl export`` and
``hitl learn report``'s gate figures."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.tokens import auth
from hitl_review.archive import migrate
from hitl_review.archive.archiver import archive_job
from hitl_review.archive.db import Archive
from hitl_review.archive.export import main as export_main
from hitl_review.archive.gate_report import gate_report
from hitl_review.deployments.quality.gate import POLICIES, RETIRED, policy
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.store import Store, StoreConfig
from hitl_review.ui.mask_review import MaskReview, mask_panel_from_snapshot, subject_md

from . import test_archive
from .asgi_util import BASE_URL, asgi_transport
from .test_cli_errors import one_line, up
from .test_export import _mask, _png
from .test_mask_review_state import _segmented
from .test_mask_review_state import _store as review_store

OLD_PASS = {"verdict": "PASS", "reasons": [], "scores": {"fill": 0.6, "ring_recut_iou": 0.9}, "policy": "gate-v3"}
OLD_FAIL = {
    "verdict": "FAIL",
    "reasons": ["the learned score rates this mask likely wrong (81%: a coarser cut overlaps it by only 40%)"],
    "scores": {"fill": 0.4, "ring_recut_iou": 0.4, "stands_out": 0.2},
    "policy": "gate-v3",
    "severity": 1.2,
}


def test_a_retired_policy_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    assert set(RETIRED) == {"gate-v2", "gate-v3", "gate-v4"} and set(POLICIES) == {"gate-v1", "gate-v5"}
    with pytest.raises(ValueError, match="gate-v1, gate-v5"):
        policy("gate-v3")
    one_line(up(tmp_path, "--quality-gate-policy", "gate-v3"), 2, "gate-v3", "retired", "gate-v1 or gate-v5")


async def test_the_mask_review_shows_a_retired_policy_s_verdict(redis_server, image) -> None:
    s = await review_store(redis_server.url, "review-failing")
    try:
        await s.r.flushdb()
        await s.ensure_groups()
        job_id, (_, bad) = await _segmented(s, image, [OLD_PASS, OLD_FAIL])
        st = await s.get(job_id)
        review = MaskReview(mask_panel_from_snapshot(st.snapshot()))  # type: ignore[arg-type]  # one is waiting
        assert review.subject.box_id == bad
        text = subject_md(review)
        assert "coarser cut overlaps it by only 40%" in text, text
    finally:
        await s.close()


async def test_an_archived_gate_v3_job_reads_back_everywhere(store, redis_server, tmp_path, monkeypatch) -> None:
    gated = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=60))  # the fixture's Redis
    monkeypatch.setattr(test_archive, "GATE_PASS", OLD_PASS)
    monkeypatch.setattr(test_archive, "GATE_FAIL", OLD_FAIL)
    artifacts = ArtifactStore(f"file://{tmp_path / 'artifacts'}")
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    migrate.upgrade(url)
    archive = Archive(url)
    try:
        w, h = 640, 480
        name = artifacts.put("image", _png(np.zeros((h, w, 3), np.uint8)), "png")
        img = ImageRef(sha256="b" * 64, width=w, height=h, url=ArtifactStore.url(name))
        masks = {i: artifacts.put("mask", _png(_mask(i, 0)), "png") for i in range(3)}
        job_id = await test_archive.finished_job(gated, img, masks=masks, gated=True)
        assert await archive_job(gated, archive, job_id) == "INSERTED"

        async with asgi_transport(redis_server.url, tmp_path, store=gated) as t:
            async with httpx.AsyncClient(transport=t, base_url=BASE_URL) as c:
                r = await c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("admin"))
        assert r.status_code == 200, r.text
        policies = {s["quality"]["policy"] for s in r.json()["subjects"] if s.get("quality")}
        assert policies == {"gate-v3"}

        out = tmp_path / "coco"
        argv = ["--format", "coco", "--out", str(out), "--archive-url", url, "--artifacts", str(tmp_path / "artifacts")]
        assert export_main(argv) == 0
        coco = json.loads(next(out.rglob("*.json")).read_text())
        assert {a["hitl_quality"]["policy"] for a in coco["annotations"] if "hitl_quality" in a} == {"gate-v3"}

        # hitl learn report's gate figures count the jobs created with mask spot checks; this one had none:
        # the report reads the archive with the gate-v3 verdicts in it and names no policy for them.
        assert "gate-v3" not in gate_report(archive)["gates"]
    finally:
        archive.close()
        await gated.close()
