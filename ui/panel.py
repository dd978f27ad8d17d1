"""The review panel: which pause the reviewer answers, and how its boxes are drawn on the canvas.

The panel is decided ONLY from the job's ``active_pause`` and ``pending_actions``
(docs/protocol.md § Routes), never from ``status``.

Box identity on the canvas: ``gradio_image_annotation`` keeps only label,
coordinates and colour per box, so each box of the panel carries a tag ``#n``
at the start of its label (n = its position in the panel, 1-based). A box
without a tag was drawn by the reviewer; its label is the text after
``new:`` (empty while it has none). Labels are never edited on the canvas
itself (``disable_edit_boxes``); the app's label field writes them.

Panel identity: the tags only mean something for the pause they were drawn
for, so the image file the annotator shows is named after that pause
(:func:`panel_image_name`). The browser sends the image back with the boxes,
in one value, so a submission is always read against the panel it showed,
even when a newer round has opened meanwhile (the server then answers 409).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hitl_review.statecore.models import BBox, Box, ImageRef, JobSnapshot
from hitl_review.statecore.states import TERMINAL, JobStatus

ROUND1_TEXT = "Confirm the detected subjects"
ROUND2_TEXT = "These boxes did not pass naming — redraw or remove them"
STAGE_TEXT = {
    "WAITING_USER_SELECTION": ROUND1_TEXT,
    "WAITING_BOX_BATCH_REVISION": ROUND2_TEXT,
    "WAITING_MASK_REVIEW": "Check the cut-outs the quality gate did not pass",  # ui.mask_review
}

# Colour by where a box came from; round-2 problem boxes are red.
MODEL_COLOR = (37, 99, 235)
MANUAL_COLOR = (234, 88, 12)
PROBLEM_COLOR = (220, 38, 38)
NEW_BOX_COLOR_HEX = "#ea580c"  # what the annotator gives a freshly drawn box (a manual box)

NEW_PREFIX = "new:"
TAG_RE = re.compile(r"^#(\d+)(?=\s|$)")

TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)

STATUS_WORDS = {
    "CREATED": "received; detection has not started yet",
    "DETECTING": "detecting subjects…",
    "WAITING_USER_SELECTION": "waiting for a reviewer to confirm the boxes",
    "VALIDATING_MANUAL_BOXES": "checking the names of the hand-drawn boxes…",
    "WAITING_BOX_BATCH_REVISION": "waiting for a reviewer to fix the boxes that did not pass naming",
    "PROCESSING_APPROVED_SUBJECTS": "cutting out the approved subjects…",
    "WAITING_MASK_REVIEW": "waiting for a reviewer to check the cut-outs the quality gate did not pass",
    "FINALIZING_RESULTS": "putting the results together…",
    "SUCCEEDED": "done: every approved subject was cut out",
    "PARTIAL_SUCCEEDED": "done: some subjects could not be cut out",
    "FAILED": "failed",
    "EMPTY_SELECTION": "ended: the reviewer chose to cut nothing",
    "CANCELLED": "cancelled",
    "TIMED_OUT": "model work ran past its time limit",
}


@dataclass(frozen=True)
class PanelBox:
    tag: int
    box: Box
    problem: bool = False

    @property
    def box_id(self) -> str:
        return self.box.box_id

    @property
    def reason(self) -> str | None:
        return self.box.validation.reason if self.box.validation else None


@dataclass(frozen=True)
class Panel:
    """One open review: the pause it answers and the boxes the reviewer was shown."""

    job_id: str
    pause_token: str
    base_version: int
    stage: str
    round: int
    snapshot_id: str
    image: ImageRef
    boxes: tuple[PanelBox, ...]
    can_draw: bool

    @property
    def stage_text(self) -> str:
        return STAGE_TEXT[self.stage]

    def by_id(self, box_id: str) -> PanelBox | None:
        return next((b for b in self.boxes if b.box_id == box_id), None)

    def by_tag(self, tag: int) -> PanelBox | None:
        return self.boxes[tag - 1] if 1 <= tag <= len(self.boxes) else None


def panel_from_snapshot(snap: JobSnapshot | None) -> Panel | None:
    """The review panel, or None when nothing is waiting for this reviewer."""
    if snap is None:
        return None
    pause = snap.active_pause
    if pause is None or pause.status != "WAITING" or "SUBMIT_BOX_LIST" not in snap.pending_actions:
        return None
    if pause.stage == "WAITING_MASK_REVIEW":  # not boxes: the mask panel (ui.mask_review_view)
        return None
    revise = set(pause.box_ids_to_revise)
    boxes = tuple(PanelBox(tag=i + 1, box=b, problem=b.box_id in revise) for i, b in enumerate(snap.box_list))
    return Panel(
        job_id=snap.job_id,
        pause_token=pause.pause_token,
        base_version=pause.base_version,
        stage=pause.stage,
        round=pause.round,
        snapshot_id=pause.snapshot_id,
        image=snap.image,
        boxes=boxes,
        can_draw="DRAW_MANUAL_BOX" in snap.pending_actions,
    )


def panel_image_name(panel: Panel, suffix: str) -> str:
    """The file name the annotator shows the panel's image under: it names the pause."""
    return f"{panel.image.sha256}__{panel.pause_token}{suffix}"


def pause_of_value(value: Any) -> str | None:
    """The pause an annotator value was drawn for, from its image's file name (None if it does not say)."""
    image = value.get("image") if isinstance(value, dict) else None
    if isinstance(image, dict):
        image = image.get("orig_name") or image.get("path")
    if not isinstance(image, str):
        return None
    stem = Path(image).stem
    return stem.split("__", 1)[1] if "__" in stem else None


def short_snapshot(snapshot_id: str) -> str:
    """The snapshot id as the panel shows it: ``snap_`` and 8 characters."""
    head, _, rest = snapshot_id.partition("_")
    return f"{head}_{rest[:8]}" if rest else snapshot_id[:13]


def stage_text(panel: Panel | None) -> str:
    return panel.stage_text if panel else ""


def status_text(snap: JobSnapshot) -> str:
    """The job's state in plain words, with the model node that is working on it."""
    status = JobStatus(snap.status).value
    words = STATUS_WORDS.get(status, "")
    if status in ("FAILED", "TIMED_OUT") and snap.reason_code:
        words += f" ({snap.reason_code})"
    if status == "PROCESSING_APPROVED_SUBJECTS" and snap.approved_box_list:
        n = len(snap.approved_box_list)
        words = f"cutting out {n} approved subject{'s' if n != 1 else ''}…"
        done = sum(1 for s in snap.subjects if s.status not in ("QUEUED", "SEGMENTING", "REFINING", "REJECTED"))
        if any(s.status in ("QUEUED", "SEGMENTING") for s in snap.subjects):  # one node per subject
            words += f" {done} of {n} done"
    text = f"**{status}** — {words}" if words else f"**{status}**"
    node = snap.current_node
    if node is not None and status not in TERMINAL_VALUES and node.status in ("QUEUED", "RUNNING"):
        attempt = f", attempt {node.attempt}" if node.attempt > 1 else ""
        text += f"  \n`{node.node_type}` {node.status.lower()}{attempt}"
    live = [n for n in snap.subject_nodes if n.status in ("QUEUED", "RETRY_WAIT", "RUNNING")]
    if live and status not in TERMINAL_VALUES:  # side by side, one per subject
        running = sum(1 for n in live if n.status == "RUNNING")
        retried = sum(1 for n in live if n.attempt > 1 or n.status == "RETRY_WAIT")
        text += f"  \n`SEGMENT_SUBJECT` ×{len(live)}: {running} running, {len(live) - running} queued"
        text += f", {retried} retried" if retried else ""
    return text


def box_caption(pb: PanelBox, relabel: str | None = None) -> str:
    """The text drawn on the canvas: tag, label, score, source, and the problem for round 2."""
    label = relabel if relabel is not None else pb.box.label
    parts = [f"#{pb.tag} {label or '(no label)'}"]
    if pb.box.score is not None:
        parts.append(f"{pb.box.score:.2f}")
    parts.append(pb.box.source)
    if relabel is not None and relabel != pb.box.label:
        parts.append("relabelled")
    if pb.problem:
        reason = pb.reason or "needs revision"
        parts.append("⚠ " + (reason if len(reason) <= 40 else reason[:39] + "…"))
    return " · ".join(parts)


def box_color(pb: PanelBox) -> tuple[int, int, int]:
    if pb.problem:
        return PROBLEM_COLOR
    return MODEL_COLOR if pb.box.source == "model" else MANUAL_COLOR


def new_box_caption(label: str | None) -> str:
    return f"{NEW_PREFIX} {label}" if label else ""


DISPLAY_MAX_W = 1280  # the canvas never shows more: a wider image is shown scaled down (ui.images)


def display_size(width: int, height: int) -> tuple[int, int]:
    """The size of the image the canvas shows: the original up to ``DISPLAY_MAX_W`` wide, else scaled."""
    if width <= DISPLAY_MAX_W:
        return width, height
    return DISPLAY_MAX_W, max(1, round(height * DISPLAY_MAX_W / width))


def display_scale(image: ImageRef) -> tuple[float, float]:
    """Display pixels per original pixel, across and down (1.0 for an image shown at its own size)."""
    w, h = display_size(image.width, image.height)
    return w / image.width, h / image.height


def to_display(image: ImageRef, bbox: Sequence[float]) -> tuple[float, float, float, float]:
    """A box in original pixels as the canvas holds it (pixels of the display image)."""
    sx, sy = display_scale(image)
    x1, y1, x2, y2 = (float(v) for v in bbox)
    return (x1, y1, x2, y2) if sx == sy == 1.0 else (x1 * sx, y1 * sy, x2 * sx, y2 * sy)


def from_display(image: ImageRef, coords: Sequence[float]) -> list[float]:
    """The inverse of ``to_display``: canvas (display) pixels back in pixels of the original image."""
    sx, sy = display_scale(image)
    x1, y1, x2, y2 = (float(v) for v in coords)
    return [x1, y1, x2, y2] if sx == sy == 1.0 else [x1 / sx, y1 / sy, x2 / sx, y2 / sy]


def annotator_box(bbox: Sequence[float], label: str, color: tuple[int, int, int]) -> dict[str, Any]:
    x1, y1, x2, y2 = bbox
    return {"xmin": x1, "ymin": y1, "xmax": x2, "ymax": y2, "label": label, "color": color}


def annotator_value(
    panel: Panel,
    image: Any,
    *,
    relabels: dict[str, str] | None = None,
    moved: dict[str, BBox] | None = None,
    deleted: Iterable[str] = (),
    added: Iterable[tuple[BBox, str | None]] = (),
) -> dict[str, Any]:
    """The annotator's value for ``panel``: every box with its caption and colour.

    ``relabels``/``moved``/``deleted``/``added`` lay the reviewer's edits over the
    panel (used when edits are re-applied after a conflict). New boxes come first,
    as the annotator itself puts a freshly drawn box first. Coordinates are in pixels of the image
    the canvas shows (``display_size``); every reader turns them back with ``from_display``.
    """
    relabels, moved, gone = relabels or {}, moved or {}, set(deleted)
    shown = panel.image  # boxes go to the canvas in pixels of the display image (``to_display``)
    boxes = [annotator_box(to_display(shown, bbox), new_box_caption(label), MANUAL_COLOR) for bbox, label in added]
    for pb in panel.boxes:
        if pb.box_id in gone:
            continue
        bbox = to_display(shown, moved.get(pb.box_id, pb.box.bbox))
        boxes.append(annotator_box(bbox, box_caption(pb, relabels.get(pb.box_id)), box_color(pb)))
    return {"image": image, "boxes": boxes, "orientation": 0}


def is_terminal(snap: JobSnapshot | None) -> bool:
    return snap is not None and JobStatus(snap.status).value in TERMINAL_VALUES


def backends_text(readyz: dict[str, Any] | None) -> str:
    """Which model backends the control plane runs, from GET /readyz (empty when it does not say)."""
    backends = (readyz or {}).get("backends")
    if not isinstance(backends, dict) or not backends:
        return ""
    return "Model backends: " + ", ".join(f"{k} = `{v}`" for k, v in sorted(backends.items()))
