"""The HTTP contract (docs/protocol.md § Routes, § Intervention) against the real control plane
(uvicorn, real Redis, classical models). Ray Serve itself is covered by test_e2e_serve.py.
"""

from __future__ import annotations

import io
import struct

import httpx
import pytest
from PIL import Image

from .api_util import auth, blank_with_product, get, intervene, keep_all, png, sse_events, submit, wait_status


@pytest.fixture(scope="module")
def c(api_server):
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        yield client


@pytest.fixture
def waiting(c):
    r = submit(c, blank_with_product(seed=1))
    assert r.status_code == 202, r.text
    return wait_status(c, r.json()["job_id"], {"WAITING_USER_SELECTION"})


# ----------------------------------------------------------------------------- identity


def test_missing_and_unknown_token_are_401(c):
    assert c.get("/api/v1/jobs").status_code == 401
    r = c.get("/api/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"


def test_401_comes_before_a_malformed_body(c):
    r = c.post("/api/v1/jobs/job_x/interventions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 401


def test_wrong_role_is_403(c, waiting):
    r = intervene(c, waiting["job_id"], waiting, keep_all(waiting), who="sub1")
    assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
    assert submit(c, png(), who="rev1").status_code == 403
    assert get(c, waiting["job_id"])["version"] == waiting["version"]


def test_submitter_sees_only_its_own_jobs(c, waiting):
    assert c.get(f"/api/v1/jobs/{waiting['job_id']}", headers=auth("sub1")).status_code == 200
    r = c.get(f"/api/v1/jobs/{waiting['job_id']}", headers=auth("sub2"))
    assert r.status_code == 404 and r.json()["code"] == "JOB_NOT_FOUND"
    mine = c.get("/api/v1/jobs", headers=auth("sub2")).json()["jobs"]
    assert all(j["submitter"] == "sub2" for j in mine)


def test_health_ready_metrics_need_no_token(c):
    assert c.get("/healthz").json() == {"ok": True}
    ready = c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["redis"] is True
    assert ready.json()["backends"]["detector"] == "classical"
    text = c.get("/metrics").text
    for name in (
        "hitl_jobs",
        "hitl_interventions_total",
        "hitl_oldest_pause_age_seconds",
        "hitl_outbox_pending",
        "hitl_node_duration_seconds",
    ):
        assert name in text


# ----------------------------------------------------------------------------- create


def test_create_is_accepted_and_detecting_at_once(c):
    r = submit(c, blank_with_product(seed=2))
    assert r.status_code == 202
    body = r.json()
    assert body["accepted"] is True and body["version"] == 1
    assert body["status"] == "DETECTING"
    assert get(c, body["job_id"])["status"] in ("DETECTING", "WAITING_USER_SELECTION")


def test_create_idempotency_replay_and_conflict(c):
    img = blank_with_product(seed=3)
    first = submit(c, img, key="batch-a:1")
    again = submit(c, img, key="batch-a:1")
    assert again.status_code == first.status_code == 202
    assert again.content == first.content
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    other = submit(c, png(), key="batch-a:1")
    assert other.status_code == 409
    body = other.json()
    assert body["code"] == "IDEMPOTENCY_CONFLICT"
    assert body["snapshot"]["job_id"] == first.json()["job_id"]
    # The key is scoped to the submitter: another submitter gets its own job.
    theirs = submit(c, img, who="sub2", key="batch-a:1")
    assert theirs.status_code == 202 and theirs.json()["job_id"] != first.json()["job_id"]


@pytest.mark.parametrize(
    "data,why",
    [
        (b"", "empty"),
        (b"hello, this is not an image at all", "not a PNG"),
        (png(200, 200)[:120], "truncated"),
        (b"GIF89a" + b"\x00" * 64, "not a PNG"),
    ],
)
def test_bad_uploads_are_400(c, data, why):
    before = c.get("/api/v1/jobs", headers=auth("admin")).json()["jobs"]
    r = submit(c, data)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "INVALID_REQUEST"
    after = c.get("/api/v1/jobs", headers=auth("admin")).json()["jobs"]
    assert [j["job_id"] for j in after] == [j["job_id"] for j in before]


def test_oversize_upload_is_413(c, api_server):
    big = b"\x89PNG\r\n\x1a\n" + b"\x00" * (api_server.settings.max_upload_bytes + 10)
    r = submit(c, big)
    assert r.status_code == 413 and r.json()["code"] == "PAYLOAD_TOO_LARGE"


def test_pixel_bomb_is_413(c, api_server):
    # A valid PNG header claiming 30000 x 30000 pixels.
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, format="PNG")
    raw = bytearray(buf.getvalue())
    raw[16:24] = struct.pack(">II", 30000, 30000)
    r = submit(c, bytes(raw))
    assert r.status_code in (400, 413)


def test_upload_wrong_content_type_is_400(c):
    r = c.post("/api/v1/jobs", json={"image": "x"}, headers=auth("sub1"))
    assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST"


# ----------------------------------------------------------------------------- pause & interventions


def test_pause_is_durable_shape_without_timeout(c, waiting):
    pause = waiting["active_pause"]
    assert pause["status"] == "WAITING" and pause["stage"] == "WAITING_USER_SELECTION" and pause["round"] == 1
    assert pause["base_version"] == waiting["version"]
    for f in ("timeout_at", "timeout_seconds", "auto_submit_on_timeout"):
        assert f not in pause
    assert waiting["pending_actions"] == ["SUBMIT_BOX_LIST", "DRAW_MANUAL_BOX"]
    assert len(waiting["box_list"]) >= 1
    assert all(b["source"] == "model" for b in waiting["box_list"])


def test_sse_history_and_resume(c, waiting):
    job_id = waiting["job_id"]
    history = sse_events(c, job_id, until="PAUSE_OPENED")
    types = [e["type"] for e in history]
    assert types[0] == "JOB_CREATED" and "PAUSE_OPENED" in types
    opened = history[-1]
    assert opened["data"]["active_pause"]["pause_token"] == waiting["active_pause"]["pause_token"]
    assert [e["id"] for e in history] == list(range(1, len(history) + 1))
    # Resume from the middle: exactly the later events, no gap, no duplicate.
    resumed = sse_events(c, job_id, last_event_id=2, until="PAUSE_OPENED")
    assert [e["id"] for e in resumed] == [e["id"] for e in history if e["id"] > 2]
    # Query-string form of Last-Event-ID.
    r = c.get(f"/api/v1/jobs/{job_id}/events?last_event_id=abc", headers=auth("rev1"))
    assert r.status_code == 400


def test_submit_subset_replay_and_stale_token(c, waiting):
    job_id = waiting["job_id"]
    subset = keep_all(waiting)[:1]
    r = intervene(c, job_id, waiting, subset, iid="iv_subset_1")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] is True and body["next_node_type"] == "PROCESS_APPROVED_BOX_LIST"
    assert body["version"] == waiting["version"] + 1
    assert body["diff"]["kept"] == [subset[0]["box_id"]]
    replay = intervene(c, job_id, waiting, subset, iid="iv_subset_1")
    assert replay.status_code == 200 and replay.content == r.content
    assert replay.headers["Idempotent-Replayed"] == "true"
    # New id with the old token and version: 409 with a newer snapshot.
    stale = intervene(c, job_id, waiting, subset, iid="iv_subset_2")
    assert stale.status_code == 409
    err = stale.json()
    assert err["code"] == "VERSION_CONFLICT"
    assert err["snapshot"]["version"] > waiting["version"]
    # Same id, other payload: conflict.
    other = intervene(c, job_id, waiting, [], iid="iv_subset_1")
    assert other.status_code == 409 and other.json()["code"] == "IDEMPOTENCY_CONFLICT"
    # Same id and payload by another reviewer: conflict, not a replay.
    rival = intervene(c, job_id, waiting, subset, iid="iv_subset_1", who="rev2")
    assert rival.status_code == 409 and rival.json()["code"] == "IDEMPOTENCY_CONFLICT"
    done = wait_status(c, job_id)
    assert done["status"] == "SUCCEEDED"
    res = c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("rev1")).json()
    assert [s["box_id"] for s in res["subjects"]] == [subset[0]["box_id"]]
    subject = res["subjects"][0]
    assert subject["status"] == "SUCCEEDED"
    mask = Image.open(io.BytesIO(c.get(subject["mask_url"], headers=auth("rev1")).content))
    cut = Image.open(io.BytesIO(c.get(subject["cutout_url"], headers=auth("rev1")).content))
    assert mask.size == cut.size == (done["image"]["width"], done["image"]["height"])
    assert cut.mode == "RGBA"


def test_pause_token_mismatch_with_current_version(c, waiting):
    r = intervene(c, waiting["job_id"], waiting, keep_all(waiting), pause_token="pause_not_the_one")
    assert r.status_code == 409 and r.json()["code"] == "PAUSE_TOKEN_MISMATCH"
    assert r.json()["snapshot"]["active_pause"]["pause_token"] == waiting["active_pause"]["pause_token"]


def test_empty_selection(c, waiting):
    r = intervene(c, waiting["job_id"], waiting, [])
    assert r.status_code == 200 and r.json()["status"] == "EMPTY_SELECTION"
    assert r.json()["next_node_type"] is None
    snap = get(c, waiting["job_id"])
    assert snap["status"] == "EMPTY_SELECTION" and snap["empty_selection"] is True
    assert snap["active_pause"] is None and snap["pending_actions"] == []
    res = c.get(f"/api/v1/jobs/{waiting['job_id']}/results", headers=auth("rev1")).json()
    assert res["subjects"] == []


def test_manual_box_over_blank_goes_to_round_two_then_succeeds(c, waiting):
    job_id = waiting["job_id"]
    w, _h = waiting["image"]["width"], waiting["image"]["height"]
    blank_box = {"bbox": [w - 60, 5, w - 5, 50], "label": "ghost"}
    r = intervene(c, job_id, waiting, keep_all(waiting) + [blank_box])
    assert r.status_code == 200 and r.json()["next_node_type"] == "VALIDATE_MANUAL_BOX_LIST"
    assert len(r.json()["diff"]["added"]) == 1
    snap = wait_status(c, job_id, {"WAITING_BOX_BATCH_REVISION"})
    pause = snap["active_pause"]
    assert pause["stage"] == "WAITING_BOX_BATCH_REVISION" and pause["round"] == 2
    assert pause["box_ids_to_revise"] == r.json()["diff"]["added"]
    assert pause["pause_token"] != waiting["active_pause"]["pause_token"]
    bad = next(b for b in snap["box_list"] if b["box_id"] in pause["box_ids_to_revise"])
    assert bad["validation"]["status"] == "NEEDS_REVISION"
    keep = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"] if b["box_id"] != bad["box_id"]]
    r2 = intervene(c, job_id, snap, keep)
    assert r2.status_code == 200 and r2.json()["next_node_type"] == "PROCESS_APPROVED_BOX_LIST"
    done = wait_status(c, job_id)
    assert done["status"] == "SUCCEEDED"
    res = c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("rev1")).json()
    assert len(res["subjects"]) == len(keep) and all(s["status"] == "SUCCEEDED" for s in res["subjects"])


@pytest.mark.parametrize("bbox", [[-1, 0, 10, 10], [0, 0, 10_000, 10], [5, 5, 5, 9], [10, 0, 2, 9]])
def test_bad_bboxes_are_400_and_change_nothing(c, waiting, bbox):
    r = intervene(c, waiting["job_id"], waiting, [{"bbox": bbox, "label": "x"}])
    assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST"
    assert get(c, waiting["job_id"])["version"] == waiting["version"]


def test_nan_unknown_fields_and_huge_lists_are_400(c, waiting):
    job_id = waiting["job_id"]
    tok, v = waiting["active_pause"]["pause_token"], waiting["version"]
    body = f'"intervention_id":"iv_nan","pause_token":"{tok}","base_version":{v:d}'
    raw = "{" + body + ',"subjects":[{"bbox":[NaN,1,2,3]}]}'
    r = c.post(
        f"/api/v1/jobs/{job_id}/interventions",
        content=raw,
        headers={**auth("rev1"), "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    r = intervene(c, job_id, waiting, keep_all(waiting), surprise=1)
    assert r.status_code == 400
    huge = [{"bbox": [1, 1, 5, 5], "label": "x"}] * 10_000
    assert intervene(c, job_id, waiting, huge).status_code == 400
    r = c.post(
        f"/api/v1/jobs/{job_id}/interventions",
        content=b"plain text",
        headers={**auth("rev1"), "Content-Type": "text/plain"},
    )
    assert r.status_code == 400
    missing = c.post(f"/api/v1/jobs/{job_id}/interventions", json={"subjects": []}, headers=auth("rev1"))
    assert missing.status_code == 400
    unknown_box = intervene(c, job_id, waiting, [{"box_id": "box_nope", "bbox": [1, 1, 5, 5]}])
    assert unknown_box.status_code == 400
    assert get(c, job_id)["version"] == v


def test_unknown_job_is_404(c):
    body = {"intervention_id": "iv_1", "pause_token": "p", "base_version": 1, "subjects": []}
    r = c.post("/api/v1/jobs/job_missing/interventions", json=body, headers=auth("rev1"))
    assert r.status_code == 404 and r.json()["code"] == "JOB_NOT_FOUND"


def test_results_before_the_end_is_409(c, waiting):
    r = c.get(f"/api/v1/jobs/{waiting['job_id']}/results", headers=auth("rev1"))
    assert r.status_code == 409 and r.json()["code"] == "JOB_NOT_FINISHED"
    assert r.json()["snapshot"]["status"] == "WAITING_USER_SELECTION"


def test_cancel_waiting_is_idempotent_and_blocks_interventions(c, waiting):
    job_id = waiting["job_id"]
    r = c.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev1"))
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED" and r.json()["active_pause"] is None
    again = c.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev1"))
    assert again.status_code == 200 and again.json()["version"] == r.json()["version"]
    late = intervene(c, job_id, waiting, keep_all(waiting))
    assert late.status_code == 409 and late.json()["code"] == "JOB_CANCELLED"
    events = sse_events(c, job_id)
    assert events[-1]["type"] == "JOB_FINISHED"


def test_cancel_after_another_end_is_409(c, waiting):
    intervene(c, waiting["job_id"], waiting, [])
    r = c.post(f"/api/v1/jobs/{waiting['job_id']}/cancel", headers=auth("rev1"))
    assert r.status_code == 409 and r.json()["code"] == "JOB_TERMINAL"


def test_review_queue_lists_waiting_jobs_oldest_first(c, waiting):
    r = c.get("/api/v1/jobs", params={"status": "WAITING", "limit": 500}, headers=auth("rev1"))
    assert r.status_code == 200
    jobs = r.json()["jobs"]
    assert waiting["job_id"] in [j["job_id"] for j in jobs]
    created = [j["pause_created_at"] for j in jobs]
    assert created == sorted(created)
    assert all(j["stage"] in ("WAITING_USER_SELECTION", "WAITING_BOX_BATCH_REVISION") for j in jobs)
    assert c.get("/api/v1/jobs", params={"status": "BOGUS"}, headers=auth("rev1")).status_code == 400


def test_paging_through_jobs(c):
    for i in range(5):
        submit(c, png(40 + i, 40), who="sub2")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = c.get("/api/v1/jobs", params=params, headers=auth("sub2")).json()
        seen += [j["job_id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)) >= 5
