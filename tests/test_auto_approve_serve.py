"""`hitl up --auto-approve on` through Ray Serve (issue 36, docs/learning.md): a job the policy approves
takes its edge with no pause (decided by the policy, in the job, its subjects, its events and its audit
trail), and a spot-checked job pauses like any other and is recorded against the policy when answered.

The null models (no compute): the detector's two fixed boxes score 0.9 and 0.8, which the committed test
policy (``tests/auto_policy_util.py``'s, its intercept raised so that a lowest score of 0.8 passes)
approves; ``--spot-check 0.5`` sends about half of those to a person, so a few jobs show both."""

from __future__ import annotations

import time
import uuid

import httpx
import orjson
import pytest

from harness.hitl_up import HitlUp
from harness.sse import read_events
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore import autoapprove as aa
from tests.auto_policy_util import policy_doc

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def null_detector_policy() -> bytes:
    """The test policy, approving the null detector's list (lowest score 0.8: p = sigmoid(20 * 0.8 - 10))."""
    doc = policy_doc()
    doc.pop("hash")
    doc["model"]["intercept"] = -10.0
    return orjson.dumps(aa.sealed(doc))


def wait(c: httpx.Client, job_id: str, statuses: set[str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        snap = c.get(f"/api/v1/jobs/{job_id}").json()
        if snap["status"] in statuses:
            return snap
        assert time.monotonic() < deadline, f"{job_id} stuck in {snap['status']}"
        time.sleep(0.1)


@pytest.mark.timeout(400)
def test_auto_approve_on_through_hitl_up(tmp_path):
    text = null_detector_policy()
    ref = aa.load(text, "on").ref
    (tmp_path / "box.json").write_bytes(text)
    up = HitlUp(
        tmp_path / "hitl",
        *("--detector", "null", "--segmenter", "null", "--validator", "null", "--quality-gate", "off"),
        *("--auto-approve", "on", "--auto-approve-policy", str(tmp_path / "box.json"), "--spot-check", "0.5"),
        log_path=tmp_path / "hitl-up.log",
    ).start()
    c = httpx.Client(base_url=up.api_url, timeout=60, headers={"Authorization": f"Bearer {up.token}"})
    try:
        auto: dict | None = None
        spot: dict | None = None
        for i in range(16):  # P(no auto or no spot check in 16) = 2 * 0.5**16
            r = c.post("/api/v1/jobs", files={"image": ("x.png", product_composite(seed=i)[0], "image/png")})
            assert r.status_code == 202, r.text
            snap = wait(c, r.json()["job_id"], {"WAITING_USER_SELECTION", "SUCCEEDED", "FAILED"})
            if snap["status"] == "WAITING_USER_SELECTION":
                spot = spot or snap
            else:
                auto = auto or snap
            if auto and spot:
                break
        assert auto is not None and spot is not None, "16 jobs and not one of each"

        # Approved automatically: no pause, decided by the policy, with its event and audit entry.
        assert auto["status"] == "SUCCEEDED" and auto["decided_by"] == ref, auto
        events = read_events(c, auto["job_id"], until="JOB_FINISHED")
        types = [e["type"] for e in events]
        assert "AUTO_APPROVED" in types and "PAUSE_OPENED" not in types, types
        approved = next(e["data"] for e in events if e["type"] == "AUTO_APPROVED")
        assert approved["policy"] == ref and len(approved["box_ids"]) == 2
        results = c.get(f"/api/v1/jobs/{auto['job_id']}/results").json()["subjects"]
        assert [s["status"] for s in results] == ["SUCCEEDED", "SUCCEEDED"]  # each subject cut, no person asked
        audit = c.get(f"/api/v1/jobs/{auto['job_id']}/audit").json()["entries"]
        entry = next(e for e in audit if e["action"] == "AUTO_APPROVE")
        assert (entry["actor"], entry["outcome"]) == (ref, "APPLIED:PROCESSING_APPROVED_SUBJECTS")

        # Spot-checked: the same pause as any job, nothing naming the policy; answered unchanged, it is
        # recorded against the policy as a spot check without a false accept.
        assert spot["decided_by"] is None and spot["active_pause"]["stage"] == "WAITING_USER_SELECTION"
        assert "POLICY" not in orjson.dumps(spot).decode() and ref not in orjson.dumps(spot).decode()
        shown = read_events(c, spot["job_id"], until="PAUSE_OPENED")
        assert not any("POLICY" in e["type"] or e["type"] == "AUTO_APPROVED" for e in shown)
        pause = spot["active_pause"]
        r = c.post(
            f"/api/v1/jobs/{spot['job_id']}/interventions",
            json={
                "intervention_id": f"iv_{uuid.uuid4().hex[:10]}",
                "pause_token": pause["pause_token"],
                "base_version": spot["version"],
                "subjects": [{"box_id": b["box_id"], "bbox": b["bbox"], "label": b["label"]} for b in spot["box_list"]],
            },
        )
        assert r.status_code == 200, r.text
        assert wait(c, spot["job_id"], {"SUCCEEDED", "FAILED"})["status"] == "SUCCEEDED"
        events = read_events(c, spot["job_id"], until="JOB_FINISHED")
        keys = ("policy", "would_approve", "unchanged", "change", "false_accept")
        checked = [{k: e["data"][k] for k in keys} for e in events if e["type"] == "POLICY_SPOT_CHECKED"]
        assert checked == [
            {"policy": ref, "would_approve": True, "unchanged": True, "change": "", "false_accept": False}
        ], checked
    finally:
        c.close()
        up.stop()
