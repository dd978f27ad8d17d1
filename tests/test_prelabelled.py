"""Pre-labelled jobs (issue 38, item 9): ``POST /jobs`` with a ``boxes`` field goes straight to the
review pause with those boxes as the model's proposal, no detector called (nothing in the outbox),
the source recorded in the job's events and audit; bad boxes are a 400 that writes nothing; the
same Idempotency-Key with other boxes is a conflict. Through the FastAPI app on a real redis-server."""

from __future__ import annotations

import json
from pathlib import Path

from harness.tokens import auth
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store

from .api_util import png
from .asgi_util import asgi_client

API = "/api/v1"
BOXES = [{"bbox": [10, 5, 40, 30], "label": "cat", "score": 0.9}, {"bbox": [0, 0, 64, 48], "label": "scene"}]


def _form(boxes: object) -> dict[str, object]:
    return {"files": {"image": ("a.png", png(64, 48), "image/png")}, "data": {"boxes": json.dumps(boxes)}}


async def test_a_prelabelled_job_waits_for_review_with_its_boxes_and_no_detector_call(
    store: Store, tmp_path: Path
) -> None:
    async with asgi_client(store.url, tmp_path) as c:
        r = await c.post(f"{API}/jobs", headers={**auth("sub1"), "Idempotency-Key": "k1"}, **_form(BOXES))
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "WAITING_USER_SELECTION"
        job_id = r.json()["job_id"]
        snap = (await c.get(f"{API}/jobs/{job_id}", headers=auth("rev1"))).json()
        assert snap["status"] == "WAITING_USER_SELECTION"
        assert snap["active_pause"]["stage"] == "WAITING_USER_SELECTION"
        assert [(b["bbox"], b["label"], b["source"]) for b in snap["box_list"]] == [
            ([10, 5, 40, 30], "cat", "model"),
            ([0, 0, 64, 48], "scene", "model"),
        ]
        assert snap["current_node"] is None
        # No detector call: nothing was queued for any executor.
        assert await store.r.xlen(keys.outbox(keys.partition_of(job_id))) == 0
        events = await store.events_after(job_id)
        assert [e.type for e in events] == ["JOB_CREATED", "STATUS_CHANGED", "STATUS_CHANGED", "PAUSE_OPENED"]
        assert events[0].data["proposal_source"] == "prelabelled"
        assert [e.data.get("to") for e in events[1:3]] == ["DETECTING", "WAITING_USER_SELECTION"]
        audit = (await c.get(f"{API}/jobs/{job_id}/audit", headers=auth("admin"))).json()["entries"]
        assert (audit[0]["action"], audit[0]["outcome"]) == ("SUBMIT", "CREATED:PRELABELLED")

        # The same key and boxes: the replay; other boxes: 409.
        again = await c.post(f"{API}/jobs", headers={**auth("sub1"), "Idempotency-Key": "k1"}, **_form(BOXES))
        assert (again.status_code, again.json()["job_id"]) == (202, job_id)
        other = await c.post(f"{API}/jobs", headers={**auth("sub1"), "Idempotency-Key": "k1"}, **_form(BOXES[:1]))
        assert other.status_code == 409 and other.json()["code"] == "IDEMPOTENCY_CONFLICT", other.text

        # The reviewer approves the proposal like a detector's.
        pause = snap["active_pause"]
        body = {
            "intervention_id": "i1",
            "pause_token": pause["pause_token"],
            "base_version": snap["version"],
            "snapshot_id": pause["snapshot_id"],
            "subjects": [{k: b[k] for k in ("box_id", "bbox", "label")} for b in snap["box_list"]],
        }
        r = await c.post(f"{API}/jobs/{job_id}/interventions", json=body, headers=auth("rev1"))
        assert r.status_code in (200, 202), r.text
        # What the dispatcher gets next is the segmenter's work: the detector was never asked.
        outbox = await store.r.xrange(keys.outbox(keys.partition_of(job_id)))
        queued = [json.loads(f["cmd"])["node_type"] for _, f in outbox]
        assert queued and "DETECT_SUBJECTS" not in queued, queued


async def test_bad_boxes_are_refused_and_nothing_is_written(store: Store, tmp_path: Path) -> None:
    bad = [
        [{"bbox": [10, 5, 70, 30]}],  # past the right edge
        [{"bbox": [10, 5, 10, 30]}],  # no width
        [{"bbox": [10, 5, "NaN", 30]}],
        [{"bbox": [10, 5, 1e999, 30]}],
        [{"bbox": [10, 5, 40]}],
        [{"bbox": [-1, 5, 40, 30]}],
        [{"bbox": [1, 5, 40, 30], "score": 2}],
        {"bbox": [1, 5, 40, 30]},
    ]
    async with asgi_client(store.url, tmp_path) as c:
        for boxes in bad:
            r = await c.post(f"{API}/jobs", headers=auth("sub1"), **_form(boxes))
            assert r.status_code == 400, (boxes, r.text)
            assert r.json()["code"] == "INVALID_REQUEST"
        garbage = await c.post(
            f"{API}/jobs",
            headers=auth("sub1"),
            files={"image": ("a.png", png(64, 48), "image/png")},
            data={"boxes": "not json"},
        )
        assert garbage.status_code == 400
    assert sum([await store.r.zcard(keys.jobs(p)) for p in range(keys.PARTITIONS)]) == 0


async def test_no_boxes_is_an_empty_proposal_still_without_a_detector(store: Store, tmp_path: Path) -> None:
    async with asgi_client(store.url, tmp_path) as c:
        r = await c.post(f"{API}/jobs", headers=auth("sub1"), **_form([]))
        assert r.status_code == 202, r.text
        snap = (await c.get(f"{API}/jobs/{r.json()['job_id']}", headers=auth("rev1"))).json()
        assert (snap["status"], snap["box_list"]) == ("WAITING_USER_SELECTION", [])
        assert await store.r.xlen(keys.outbox(keys.partition_of(snap["job_id"]))) == 0
