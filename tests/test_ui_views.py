"""The reviewer app without a server: the review queue, the results view, and the app's blocks."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import gradio as gr
from PIL import Image

from hitl_review.statecore.models import (
    ClaimView,
    JobResults,
    JobSummary,
    SubjectResult,
)
from hitl_review.ui.annotator import (
    edits_between,
    read_annotator,
    subjects_from_annotator,
)
from hitl_review.ui.panel import (
    annotator_value,
    backends_text,
    panel_image_name,
)
from hitl_review.ui.queue import (
    NOTHING_WAITING,
    claim_left_s,
    format_age,
    next_job_id,
    nothing_to_open_text,
    presence_text,
    queue_rows,
)
from hitl_review.ui.results import results_view
from tests.ui_fakes import (
    IMAGE,
    H,
    W,
    as_raw,
    drawn,
    opened,
    round1,
    round2,
    shown,
)

# --------------------------------------------------------------------------- queue


def summary(
    job_id: str, paused_at: str | None, stage: str | None = "WAITING_USER_SELECTION", boxes: int = 2
) -> JobSummary:
    return JobSummary(
        job_id=job_id,
        status=stage or "DETECTING",
        version=3,
        created_at="2026-05-21T09:00:00Z",
        updated_at="2026-05-21T09:00:00Z",
        submitter="alice",
        box_count=boxes,
        stage=stage,
        pause_created_at=paused_at,
    )


def test_queue_rows_oldest_pause_first() -> None:
    jobs = [
        summary("job_b", "2026-05-21T10:00:00Z"),
        summary("job_a", "2026-05-21T09:58:55Z", "WAITING_BOX_BATCH_REVISION", 1),
        summary("job_c", "2026-05-21T08:00:00Z"),
        summary("job_d", None, None),
    ]  # not waiting
    now = datetime(2026, 5, 21, 10, 0, 30, tzinfo=UTC)
    assert queue_rows(jobs, now) == [
        ["job_c", "Confirm boxes (round 1)", "2 h 00 min", 2, ""],
        ["job_a", "Fix rejected boxes (round 2)", "1 min 35 s", 1, ""],
        ["job_b", "Confirm boxes (round 1)", "30 s", 2, ""],
    ]
    # the stage filter takes raw stage names; the rows show words, never the raw state name
    assert [r[0] for r in queue_rows(jobs, now, stage="WAITING_BOX_BATCH_REVISION")] == ["job_a"]
    assert [r[0] for r in queue_rows(jobs, now, stage="all")] == ["job_c", "job_a", "job_b"]
    assert next_job_id(jobs) == "job_c"
    assert next_job_id(jobs, exclude=["job_c"]) == "job_a"
    assert next_job_id([summary("job_d", None, None)]) is None
    assert format_age(3 * 86400 + 7200) == "3 d 2 h"


def test_queue_rows_say_who_is_reviewing() -> None:
    now = datetime(2026, 5, 21, 10, 0, 30, tzinfo=UTC)
    live = ClaimView(reviewer="rev1", expires_at="2026-05-21T10:01:00Z")
    over = ClaimView(reviewer="rev2", expires_at="2026-05-21T10:00:00Z")
    jobs = [
        summary("job_a", "2026-05-21T09:00:00Z").model_copy(update={"claim": live}),
        summary("job_b", "2026-05-21T09:01:00Z").model_copy(update={"claim": over}),
        summary("job_c", "2026-05-21T09:02:00Z"),
    ]
    assert [r[-1] for r in queue_rows(jobs, now)] == ["rev1 is reviewing", "", ""]  # an expired claim is nobody
    assert queue_rows(jobs, now, me="rev1")[0][-1] == "you are reviewing"
    assert claim_left_s(live, now) == 30 and claim_left_s(over, now) == 0 and claim_left_s(None, now) == 0
    assert presence_text(live, "rev2", now) == "rev1 is reviewing"


def test_n_finding_nothing_says_whether_the_others_are_being_reviewed() -> None:
    now = datetime(2026, 5, 21, 10, 0, 30, tzinfo=UTC)

    def held(job: str, who: str, until: str = "2026-05-21T10:01:00Z") -> JobSummary:
        return summary(job, "2026-05-21T09:00:00Z").model_copy(
            update={"claim": ClaimView(reviewer=who, expires_at=until)}
        )

    mine = held("job_a", "rev1")  # on rev1's screen
    assert nothing_to_open_text([], "rev1", None, now=now) == NOTHING_WAITING
    assert nothing_to_open_text([mine], "rev1", "job_a", now=now) == NOTHING_WAITING
    one = nothing_to_open_text([mine, held("job_b", "rev2")], "rev1", "job_a", now=now)
    assert one == "No other job is free: the other waiting job is being reviewed by rev2."
    three = [mine, held("job_b", "rev3"), held("job_c", "rev2"), held("job_d", "rev2")]
    assert nothing_to_open_text(three, "rev1", "job_a", now=now).endswith(
        "the 3 other waiting jobs are being reviewed by rev2, rev3."
    )
    assert "the 3+ other waiting jobs" in nothing_to_open_text(three, "rev1", "job_a", more=True, now=now)
    # an expired claim holds nothing (N would have taken it): the plain answer
    assert (
        nothing_to_open_text([held("job_b", "rev2", "2026-05-21T10:00:00Z")], "rev1", None, now=now) == NOTHING_WAITING
    )


# --------------------------------------------------------------------------- results


def rgb(img: Image.Image, xy: tuple[int, int]) -> tuple[int, ...]:
    pixel = img.getpixel(xy)
    assert isinstance(pixel, tuple)
    return pixel


def near(a: tuple[int, ...], b: tuple[int, ...], tol: int = 12) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_results_view_cutouts_on_checkerboard_and_mask_overlays(tmp_path: Path) -> None:
    cutout = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    cutout.paste((10, 200, 10, 255), (10, 10, 30, 20))
    mask = Image.new("L", (W, H), 0)
    mask.paste(255, (10, 20, 110, 120))
    artifacts = {"/api/v1/artifacts/c1.png": png(cutout), "/api/v1/artifacts/m1.png": png(mask)}
    res = JobResults(
        job_id="job_1",
        status="PARTIAL_SUCCEEDED",
        subjects=[
            SubjectResult(
                box_id="box_1",
                bbox=(10, 20, 110, 120),
                label="shoe",
                status="SUCCEEDED",
                mask_url="/api/v1/artifacts/m1.png",
                cutout_url="/api/v1/artifacts/c1.png",
            ),
            SubjectResult(
                box_id="box_5", bbox=(0, 0, 40, 40), label="ghost", status="REJECTED", reason="no object inside the box"
            ),
        ],
    )
    image = png(Image.new("RGB", (W, H), (255, 255, 255)))
    view = results_view(res, artifacts.__getitem__, image, tmp_path / "out")
    assert "PARTIAL_SUCCEEDED" in view.summary and "1 of 2" in view.summary
    assert "REJECTED: ghost (box_5) — no object inside the box" in view.summary
    assert [c for _, c in view.cutouts] == ["shoe — box_1"]
    preview = Image.open(view.cutouts[0][0])  # a JPEG preview (ui.results.PREVIEW_QUALITY): colours within a few levels
    assert preview.format == "JPEG" and preview.mode == "RGB"
    assert near(rgb(preview, (0, 0)), (204, 204, 204)) or near(rgb(preview, (0, 0)), (255, 255, 255))
    assert near(rgb(preview, (20, 15)), (10, 200, 10), tol=25)  # the cut-out's own colour (JPEG rings at its edge)
    overlay = Image.open(view.overlays[0][0])
    inside, outside = rgb(overlay, (50, 50)), rgb(overlay, (300, 250))
    assert overlay.format == "JPEG" and not near(inside, (255, 255, 255)) and sum(inside) > sum(outside)
    assert near(outside, (89, 89, 89))
    assert sorted(Path(f).name for f in view.files) == ["shoe_box_1_cutout.png", "shoe_box_1_mask.png"]
    assert Path(view.files[0]).read_bytes() in artifacts.values()


def test_results_view_names_the_cut_outs_the_quality_gate_failed(tmp_path: Path) -> None:
    mask = png(Image.new("L", (W, H), 0))
    artifacts = {"/api/v1/artifacts/m.png": mask}
    verdict = {"verdict": "FAIL", "reasons": ["the mask stops short of one side"], "scores": {}, "policy": "gate-v1"}
    res = JobResults.model_validate(
        {
            "job_id": "job_2",
            "status": "SUCCEEDED",
            "subjects": [
                {
                    "box_id": "box_1",
                    "bbox": [1, 1, 9, 9],
                    "label": "cap",
                    "status": "SUCCEEDED",
                    "mask_url": "/api/v1/artifacts/m.png",
                    "quality": {**verdict, "verdict": "PASS", "reasons": []},
                    "decided_by": "gate",
                },
                {
                    "box_id": "box_2",
                    "bbox": [1, 1, 9, 9],
                    "label": "mug",
                    "status": "SUCCEEDED",
                    "mask_url": "/api/v1/artifacts/m.png",
                    "quality": verdict,
                    "refinements": [{"strategy": "enlarged_box", "quality": verdict}],
                },
            ],
        }
    )
    view = results_view(res, artifacts.__getitem__, png(Image.new("RGB", (W, H))), tmp_path / "out")
    assert [c for _, c in view.overlays] == ["cap — box_1 — gate PASS", "mug — box_2 — gate FAIL"]
    assert (
        "Check this cut-out: mug (box_2) failed the gate after 1 refinement(s) — the mask stops short" in view.summary
    )
    assert "cap (box_1) failed" not in view.summary


def test_backends_line() -> None:
    assert (
        backends_text({"backends": {"detector": "classical", "segmenter": "sam"}})
        == "Model backends: detector = `classical`, segmenter = `sam`"
    )
    assert backends_text({}) == ""


# --------------------------------------------------------------------------- app


def test_build_app_builds_blocks_without_a_server() -> None:
    from hitl_review.ui.app import build_app

    demo = build_app("http://127.0.0.1:9", token="x")
    assert isinstance(demo, gr.Blocks)
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    for elem_id in (
        "queue-table",
        "job-id",
        "stage-text",
        "banner",
        "submit-btn",
        "cut-nothing-btn",
        "cancel-job-btn",
        "confirm-cut-nothing-btn",
        "confirm-cancel-btn",
        "new-box-label",
        "results-gallery",
        "annotator",
    ):
        assert elem_id in ids
    assert isinstance(build_app("http://127.0.0.1:9", require_login=True), gr.Blocks)


def test_a_stale_view_is_read_against_the_panel_it_showed() -> None:
    st = opened(round1())
    name = panel_image_name(shown(st.panel), ".png")
    assert name == f"{IMAGE.sha256}__pause_1.png"
    stale = as_raw(annotator_value(shown(st.panel), f"/tmp/{name}"))
    stale["image"] = {"path": f"/tmp/gradio/0f3a/{name}", "orig_name": name}  # as the browser sends it back
    stale["boxes"].insert(0, drawn(60, 80, 220, 300, "new: red block"))
    st.apply_snapshot(round2())  # the follower already moved to round 2 when the click is handled
    panel = shown(st.panel_for(stale))
    assert panel.pause_token == "pause_1" and shown(st.panel).pause_token == "pause_2"
    subjects, err = subjects_from_annotator(panel, stale)
    # read against round 1: nothing of round 2 (box_4, box_5) is taken as deleted or kept
    assert err is None and [s.get("box_id") for s in subjects] == ["box_1", "box_2", "box_3", None]
    out = st.record_conflict(
        "VERSION_CONFLICT",
        round2().model_dump(mode="json"),
        edits_between(panel, read_annotator(panel, stale)),
        submitted=panel,
    )
    assert out.banner.startswith("Your view was out of date: another reviewer submitted first.")
    assert out.offer is not None
    assert out.offer.added == [((60.0, 80.0, 220.0, 300.0), "red block")] and out.offer.deleted == []
    assert st.panel_for(None) is st.panel and st.panel_for({"image": "/tmp/x.png"}) is st.panel
    assert st.panel_for({"image": f"/tmp/{IMAGE.sha256}__pause_unknown.png"}) is None
