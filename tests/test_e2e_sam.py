"""One job through `hitl up --detector sam-auto --segmenter sam` on a tiny, randomly initialised
Segment Anything checkpoint (no download): the real loading code, the Serve deployments and the
whole review flow to a terminal state. Plumbing, not quality: random weights propose random boxes."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import torch

from harness.hitl_up import HitlUp
from hitl_review.deployments.backends import sam as S
from hitl_review.serve_app.ops.samples import product_composite

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_one_job_through_sam_backends(tmp_path):
    torch.manual_seed(0)
    ckpt = tmp_path / "sam_tiny.pth"
    torch.save(S.build_sam_vit_tiny().state_dict(), ckpt)
    up = HitlUp(
        tmp_path / "data",
        "--detector",
        "sam-auto",
        "--segmenter",
        "sam",
        "--sam-checkpoint",
        str(ckpt),
        "--sam-model-type",
        "vit_tiny",
    ).start()
    try:
        c = httpx.Client(base_url=up.api_url, timeout=120, headers={"Authorization": f"Bearer {up.token}"})
        ready = c.get("/readyz").json()
        assert ready["backends"] == {"detector": "sam-auto", "validator": "sam", "segmenter": "sam"}
        png, truth = product_composite(seed=5, width=320, height=240, n=2)
        job = c.post("/api/v1/jobs", files={"image": ("p.png", png, "image/png")}).json()["job_id"]

        def wait(statuses: set[str]) -> dict:
            deadline = time.monotonic() + 240
            while True:
                snap = c.get(f"/api/v1/jobs/{job}").json()
                if snap["status"] in statuses:
                    return snap
                assert snap["status"] not in ("FAILED", "TIMED_OUT"), snap
                assert time.monotonic() < deadline, snap["status"]
                time.sleep(0.2)

        def submit(snap: dict, subjects: list[dict], **answer: list[dict]) -> dict:
            r = c.post(
                f"/api/v1/jobs/{job}/interventions",
                json={
                    "intervention_id": f"iv_{uuid.uuid4().hex[:10]}",
                    "pause_token": snap["active_pause"]["pause_token"],
                    "base_version": snap["version"],
                    **(answer or {"subjects": subjects}),
                },
            )
            assert r.status_code == 200, r.text
            return r.json()

        snap = wait({"WAITING_USER_SELECTION"})
        for b in snap["box_list"]:  # sam-auto proposals: well-formed boxes inside the image with scores
            x1, y1, x2, y2 = b["bbox"]
            assert 0 <= x1 < x2 <= 320 and 0 <= y1 < y2 <= 240 and 0 <= b["score"] <= 1
        # Keep at most one proposal and add a manual box around a real object: validation (SAM
        # predicted IoU), then segmentation (SAM box prompts) or a second round.
        subjects = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"][:1]]
        subjects.append({"bbox": truth[0], "label": "product"})
        assert submit(snap, subjects)["next_node_type"] == "VALIDATE_MANUAL_BOX_LIST"
        snap = wait({"WAITING_BOX_BATCH_REVISION", "SUCCEEDED", "PARTIAL_SUCCEEDED"})
        if snap["status"] == "WAITING_BOX_BATCH_REVISION":
            reasons = [
                b["validation"] for b in snap["box_list"] if b["box_id"] in snap["active_pause"]["box_ids_to_revise"]
            ]
            assert all(v and v["score"] is not None for v in reasons)
            submit(snap, [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]])
        done = wait({"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED", "WAITING_MASK_REVIEW"})
        if done["status"] == "WAITING_MASK_REVIEW":  # random weights: the gate fails masks (hitl up's default)
            listed = done["active_pause"]["subjects_to_review"]
            assert listed and all(s["quality"]["verdict"] == "FAIL" for s in listed), listed
            submit(done, [], decisions=[{"box_id": s["box_id"], "decision": "ACCEPT"} for s in listed])
            done = wait({"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED"})
        res = c.get(f"/api/v1/jobs/{job}/results").json()
        assert res["subjects"], res
        for s in res["subjects"]:
            if s["status"] == "SUCCEEDED":
                from io import BytesIO

                from PIL import Image

                assert Image.open(BytesIO(c.get(s["mask_url"]).content)).size == (320, 240)
        assert done["status"] in ("SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED")
        # One encoder pass per image: the detector encoded it; validation and segmentation, in other
        # replicas after the pause, found the persisted embedding instead of encoding again.
        cache: dict[tuple[str, str], float] = {}
        for line in c.get("/metrics").text.splitlines():
            if line.startswith("hitl_embedding_cache_total{"):  # a counter (running totals)
                labels, value = line[len("hitl_embedding_cache_total{") :].split("} ")
                d = dict(kv.split("=") for kv in labels.split(","))
                cache[(d["deployment"].strip('"'), d["kind"].strip('"'))] = float(value)
        assert cache[("Detector", "misses")] >= 1
        reused = sum(
            cache.get((dep, k), 0) for dep in ("BoxValidator", "Segmenter") for k in ("memory_hits", "store_hits")
        )
        assert reused >= 1 and cache.get(("Segmenter", "misses"), 0) == 0, cache
    finally:
        up.stop()
