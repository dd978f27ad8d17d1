"""Pre-labelled jobs (issue 38, item 9): ``POST /jobs`` with a ``boxes`` field goes straight to the
review pause with those boxes as the model's proposal, no detector called (nothing in the outbox),
the source recorded in the job's events and audit; bad boxes are a 400 that writes nothing; the
same Idempotency-Key with other boxes is a conflict. Through the FastAPI app on a real redis-server."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from harness.tokens import TOKENS, auth
from hitl_review.client import prelabels
from hitl_review.client.api import AsyncHitlClient, SubmitResult
from hitl_review.client.batch import run_batch
from hitl_review.serve_app.cli import build_parser
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store

from .api_util import png
from .asgi_util import BASE_URL, asgi_client, asgi_transport

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
        assert sum([await store.r.xlen(s) for s in keys.job(job_id).outboxes]) == 0
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
        queued = [c.node_type for c in await store.outbox_commands(job_id)]
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
        assert sum([await store.r.xlen(s) for s in keys.job(snap["job_id"]).outboxes]) == 0


# --------------------------------------------------------------------------- the client and hitl submit

COCO = {
    "images": [{"id": 7, "file_name": "shots/a.png", "width": 64, "height": 48}, {"id": 8, "file_name": "b.png"}],
    "annotations": [
        {"id": 1, "image_id": 7, "category_id": 3, "bbox": [10, 5, 30, 25]},
        {"id": 2, "image_id": 8, "category_id": 3, "bbox": [1, 1, 2, 2]},
        {"id": 3, "image_id": 7, "category_id": 4, "bbox": [0, 0, 64.004, 48], "score": 0.5},
    ],
    "categories": [{"id": 3, "name": "cat"}, {"id": 4, "name": "scene"}],
}


def _image(fmt: str, size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format=fmt)
    return buf.getvalue()


def test_coco_boxes_are_converted_from_xywh_for_the_image_by_file_name() -> None:
    assert prelabels.coco_boxes(COCO, "a.png") == [
        {"bbox": [10.0, 5.0, 40.0, 30.0], "label": "cat"},
        {"bbox": [0.0, 0.0, 64.0, 48.0], "label": "scene", "score": 0.5},  # the hair past the edge clipped
    ]
    with pytest.raises(prelabels.LabelError, match="not among"):
        prelabels.coco_boxes(COCO, "c.png")


def test_yolo_boxes_are_denormalised_with_the_class_names() -> None:
    text = "0 0.390625 0.364583 0.46875 0.520833\n\n1 0.5 0.5 1 1 0.75\n"
    boxes = prelabels.yolo_boxes(text, 64, 48, ["cat", "scene"])
    assert [b["label"] for b in boxes] == ["cat", "scene"]
    assert boxes[0]["bbox"] == pytest.approx([10, 5, 40, 30], abs=0.01)
    assert boxes[1] == {"bbox": [0, 0, 64, 48], "label": "scene", "score": 0.75}
    assert prelabels.yolo_boxes("1 0.5 0.5 1 1", 64, 48)[0]["label"] == "1"  # no names: the index
    for bad in ("2 0.5 0.5 1 1", "0 0.5 0.5 1", "0 nan 0.5 1 1"):
        with pytest.raises(prelabels.LabelError):
            prelabels.yolo_boxes(bad, 64, 48, ["cat", "scene"])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_the_image_size_for_yolo_is_read_from_the_header(fmt: str) -> None:
    assert prelabels.image_size(_image(fmt, (123, 45))) == (123, 45)


def test_read_classes_from_names_a_file_or_a_data_yaml(tmp_path: Path) -> None:
    assert prelabels.read_classes("cat, scene") == ["cat", "scene"]
    (tmp_path / "names.txt").write_text("cat\nscene\n")
    assert prelabels.read_classes(str(tmp_path / "names.txt")) == ["cat", "scene"]
    (tmp_path / "data.yaml").write_text("path: .\nnames: ['cat', 'scene']\n")
    assert prelabels.read_classes(str(tmp_path / "data.yaml")) == ["cat", "scene"]


async def test_the_client_submits_coco_boxes_and_the_job_waits_with_them(store: Store, tmp_path: Path) -> None:
    async with asgi_transport(store.url, tmp_path) as transport:
        sub = AsyncHitlClient(BASE_URL, TOKENS["sub1"], transport=transport)
        try:
            boxes = prelabels.coco_boxes(COCO, "a.png")
            res = await sub.submit(png(64, 48), filename="a.png", boxes=boxes)
            assert res.status == "WAITING_USER_SELECTION"
            snap = await sub.get_job(res.job_id)
            assert [(list(b.bbox), b.label, b.source) for b in snap.box_list] == [
                ([10, 5, 40, 30], "cat", "model"),
                ([0, 0, 64, 48], "scene", "model"),
            ]
        finally:
            await sub.aclose()


class _Recorder:
    """Stands in for HitlClient.submit in run_batch: what each file was sent with."""

    def __init__(self) -> None:
        self.sent: dict[str, Any] = {}

    def submit(self, data: bytes, *, filename: str | None = None, boxes: Any = None, **_: Any) -> SubmitResult:
        self.sent[filename or ""] = boxes
        return SubmitResult(job_id=f"job_{len(self.sent)}", status="WAITING_USER_SELECTION", version=1)


def test_hitl_submit_boxes_reads_a_yolo_folder_per_image(tmp_path: Path) -> None:
    images, labels = tmp_path / "images", tmp_path / "labels"
    images.mkdir()
    labels.mkdir()
    (images / "a.png").write_bytes(_image("PNG"))
    (images / "b.jpg").write_bytes(_image("JPEG", (100, 50)))
    (labels / "a.txt").write_text("0 0.390625 0.364583 0.46875 0.520833\n")
    args = build_parser().parse_args(
        ["submit", str(images), "--boxes", str(labels), "--classes", "cat,scene", "--batch", "t"]
    )
    assert (args.boxes, args.classes) == (labels, "cat,scene")
    client = _Recorder()
    source = prelabels.BoxSource(args.boxes, prelabels.read_classes(args.classes))
    summary = run_batch(client, [images], batch="t", boxes=source, manifest=tmp_path / "m.jsonl", progress=False)  # type: ignore[arg-type]  # a stand-in for HitlClient
    assert summary.exit_code == 0
    assert client.sent["a.png"][0]["label"] == "cat"
    assert client.sent["a.png"][0]["bbox"] == pytest.approx([10, 5, 40, 30], abs=0.01)
    assert client.sent["b.jpg"] == []  # no label file: no objects, YOLO's own convention
