"""Snapshots, pauses and annotator values for the reviewer app's tests (``test_ui_handlers.py``,
``test_ui_views.py``, ``test_ui_callbacks.py``): a round-1 and a round-2 pause on one image, as the
API would send them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hitl_review.statecore.models import (
    BBox,
    Box,
    CurrentNode,
    ImageRef,
    JobSnapshot,
    Pause,
    Validation,
)
from hitl_review.ui.panel import (
    Panel,
)
from hitl_review.ui.session import ReviewerState

W, H = 400, 300
IMAGE = ImageRef(sha256="ab" * 32, width=W, height=H, url="/api/v1/artifacts/img.png")
WAITING_ACTIONS = ["SUBMIT_BOX_LIST", "DRAW_MANUAL_BOX"]


def model_box(
    i: int, bbox: BBox = (10.0, 20.0, 110.0, 120.0), label: str | None = "shoe", score: float | None = 0.92
) -> Box:
    return Box(box_id=f"box_{i}", bbox=bbox, label=label, score=score, source="model")


def manual_box(i: int, bbox: BBox, label: str | None, validation: Validation | None = None) -> Box:
    return Box(box_id=f"box_{i}", bbox=bbox, label=label, score=None, source="manual", validation=validation)


def pause(
    token: str = "pause_1",
    stage: str = "WAITING_USER_SELECTION",
    round_: int = 1,
    base_version: int = 3,
    revise: Sequence[str] = (),
) -> Pause:
    return Pause(
        pause_token=token,
        status="WAITING",
        stage=stage,
        base_version=base_version,
        round=round_,
        snapshot_id="snap_1",
        box_ids_to_revise=list(revise),
        created_at="2026-05-21T10:00:00Z",
    )


def snapshot(
    status: str = "WAITING_USER_SELECTION",
    boxes: Sequence[Box] = (),
    active: Pause | None = None,
    actions: Sequence[str] = WAITING_ACTIONS,
    version: int = 3,
    job_id: str = "job_1",
    node: CurrentNode | None = None,
    approved: Sequence[Box] = (),
) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        status=status,
        version=version,
        round=active.round if active else 1,
        created_at="2026-05-21T09:59:00Z",
        updated_at="2026-05-21T10:00:00Z",
        image=IMAGE,
        box_list=list(boxes),
        approved_box_list=list(approved),
        active_pause=active,
        pending_actions=list(actions),
        current_node=node,
    )


def round1() -> JobSnapshot:
    return snapshot(
        boxes=[
            model_box(1),
            model_box(2, (200, 50, 300, 150), "sock", 0.55),
            model_box(3, (50, 160, 150, 280), "hand", 0.41),
        ],
        active=pause(),
    )


def round2() -> JobSnapshot:
    bad = Validation(status="NEEDS_REVISION", score=0.12, reason="no object inside the box")
    ok = Validation(status="PASSED", score=0.9, reason=None)
    return snapshot(
        status="WAITING_BOX_BATCH_REVISION",
        version=6,
        boxes=[
            model_box(1),
            manual_box(4, (220, 40, 320, 140), "hat", ok),
            manual_box(5, (0, 0, 40, 40), "ghost", bad),
        ],
        active=pause("pause_2", "WAITING_BOX_BATCH_REVISION", 2, 6, revise=["box_5"]),
    )


def as_raw(value: dict[str, Any] | None, scale: float = 1.0) -> dict[str, Any]:
    """What the browser sends back: canvas units plus each box's scaleFactor, colours as CSS text."""
    assert value is not None
    boxes = []
    for b in value["boxes"]:
        r, g, bl = b["color"]
        boxes.append(
            {
                "label": b["label"],
                "xmin": b["xmin"] * scale,
                "ymin": b["ymin"] * scale,
                "xmax": b["xmax"] * scale,
                "ymax": b["ymax"] * scale,
                "color": f"rgb({r}, {g}, {bl})",
                "scaleFactor": scale,
            }
        )
    return {"image": {"path": "/tmp/x.png"}, "boxes": boxes, "orientation": 0}


def drawn(xmin: float, ymin: float, xmax: float, ymax: float, label: str = "", scale: float = 1.0) -> dict[str, Any]:
    return {
        "label": label,
        "xmin": xmin * scale,
        "ymin": ymin * scale,
        "xmax": xmax * scale,
        "ymax": ymax * scale,
        "color": "rgb(234, 88, 12)",
        "scaleFactor": scale,
    }


def shown(panel: Panel | None) -> Panel:
    """The panel, which the test expects to be there."""
    assert panel is not None
    return panel


def opened(snap: JobSnapshot) -> ReviewerState:
    st = ReviewerState(token="t", signed_in=True)
    st.open(snap)
    return st
