"""What the reviewer app shows and sends, as plain functions over the domain models.

Nothing here talks to the network or to Gradio, so every rule of the panel is
testable without a server. The review panel is decided ONLY from the job's
``active_pause`` and ``pending_actions`` (SPEC §4), never from ``status``.

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

import copy
import io
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from PIL import Image

from statecore.models import BBox, Box, ImageRef, JobResults, JobSnapshot, JobSummary
from statecore.states import TERMINAL, JobStatus

ROUND1_TEXT = "Confirm the detected subjects"
ROUND2_TEXT = "These boxes did not pass naming — redraw or remove them"
STAGE_TEXT = {
    "WAITING_USER_SELECTION": ROUND1_TEXT,
    "WAITING_BOX_BATCH_REVISION": ROUND2_TEXT,
}

# Colour by where a box came from; round-2 problem boxes are red.
MODEL_COLOR = (37, 99, 235)
MANUAL_COLOR = (234, 88, 12)
PROBLEM_COLOR = (220, 38, 38)
NEW_BOX_COLOR_HEX = "#ea580c"  # what the annotator gives a freshly drawn box (a manual box)

NEW_PREFIX = "new:"
TAG_RE = re.compile(r"^#(\d+)(?=\s|$)")
MAX_LABEL = 200
AUTO_TARGET = "auto"

TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)

STATUS_WORDS = {
    "CREATED": "received; detection has not started yet",
    "DETECTING": "detecting subjects…",
    "WAITING_USER_SELECTION": "waiting for a reviewer to confirm the boxes",
    "VALIDATING_MANUAL_BOXES": "checking the names of the hand-drawn boxes…",
    "WAITING_BOX_BATCH_REVISION": "waiting for a reviewer to fix the boxes that did not pass naming",
    "PROCESSING_APPROVED_SUBJECTS": "cutting out the approved subjects…",
    "FINALIZING_RESULTS": "putting the results together…",
    "SUCCEEDED": "done: every approved subject was cut out",
    "PARTIAL_SUCCEEDED": "done: some subjects could not be cut out",
    "FAILED": "failed",
    "EMPTY_SELECTION": "ended: the reviewer chose to cut nothing",
    "CANCELLED": "cancelled",
    "TIMED_OUT": "model work ran past its time limit",
}

NEXT_NODE_WORDS = {
    "VALIDATE_MANUAL_BOX_LIST": "checking the names of the drawn boxes",
    "PROCESS_APPROVED_BOX_LIST": "cutting out the approved subjects",
}


def new_intervention_id() -> str:
    return f"iv_{uuid.uuid4().hex}"


# --------------------------------------------------------------------------- panel


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
    revise = set(pause.box_ids_to_revise)
    boxes = tuple(PanelBox(tag=i + 1, box=b, problem=b.box_id in revise) for i, b in enumerate(snap.box_list))
    return Panel(job_id=snap.job_id, pause_token=pause.pause_token, base_version=pause.base_version,
                 stage=pause.stage, round=pause.round, snapshot_id=pause.snapshot_id, image=snap.image,
                 boxes=boxes, can_draw="DRAW_MANUAL_BOX" in snap.pending_actions)


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
    text = f"**{status}** — {words}" if words else f"**{status}**"
    node = snap.current_node
    if node is not None and status not in TERMINAL_VALUES and node.status in ("QUEUED", "RUNNING"):
        attempt = f", attempt {node.attempt}" if node.attempt > 1 else ""
        text += f"  \n`{node.node_type}` {node.status.lower()}{attempt}"
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


def _annotator_box(bbox: Sequence[float], label: str, color: tuple[int, int, int]) -> dict[str, Any]:
    x1, y1, x2, y2 = bbox
    return {"xmin": x1, "ymin": y1, "xmax": x2, "ymax": y2, "label": label, "color": color}


def annotator_value(panel: Panel, image: Any, *, relabels: dict[str, str] | None = None,
                    moved: dict[str, BBox] | None = None, deleted: Iterable[str] = (),
                    added: Iterable[tuple[BBox, str | None]] = ()) -> dict[str, Any]:
    """The annotator's value for ``panel``: every box with its caption and colour.

    ``relabels``/``moved``/``deleted``/``added`` lay the reviewer's edits over the
    panel (used when edits are re-applied after a conflict). New boxes come first,
    as the annotator itself puts a freshly drawn box first.
    """
    relabels, moved, gone = relabels or {}, moved or {}, set(deleted)
    boxes = [_annotator_box(bbox, new_box_caption(label), MANUAL_COLOR) for bbox, label in added]
    for pb in panel.boxes:
        if pb.box_id in gone:
            continue
        boxes.append(_annotator_box(moved.get(pb.box_id, pb.box.bbox),
                                    box_caption(pb, relabels.get(pb.box_id)), box_color(pb)))
    return {"image": image, "boxes": boxes, "orientation": 0}


def box_notes(panel: Panel | None, drawn: list[DrawnBox] | None = None,
              relabels: dict[str, str] | None = None) -> str:
    """The list beside the canvas: problem boxes with the validator's reason, then the others."""
    if panel is None:
        return ""
    relabels = relabels or {}
    lines: list[str] = []
    problems = [pb for pb in panel.boxes if pb.problem]
    if problems:
        lines.append(f"**Did not pass naming ({len(problems)})** — in red; redraw, relabel or remove them:\n")
        for pb in problems:
            score = pb.box.validation.score if pb.box.validation else None
            why = pb.reason or "no reason given"
            extra = f" (score {score:.2f})" if score is not None and "score" not in why else ""
            lines.append(f"- **#{pb.tag} {relabels.get(pb.box_id, pb.box.label) or '(no label)'}** — {why}{extra}")
    others = [pb for pb in panel.boxes if not pb.problem]
    if others:
        title = "Kept from the last round" if problems else "Boxes"
        lines.append(f"\n**{title} ({len(others)})** — blue: detected by the model, orange: drawn by hand\n")
        for pb in others:
            lines.append(f"- #{pb.tag} {relabels.get(pb.box_id, pb.box.label) or '(no label)'}"
                         + (f" · {pb.box.score:.2f}" if pb.box.score is not None else "")
                         + f" · {pb.box.source}")
    if not panel.boxes:
        lines.append("No boxes were proposed: draw the subjects to cut out, or choose **Cut nothing**.")
    if drawn is not None:
        lines.append("\n" + describe_changes(panel, drawn, relabels))
    return "\n".join(lines)


# --------------------------------------------------------------------------- reading the annotator


@dataclass(frozen=True)
class DrawnBox:
    """One box as the annotator holds it now, in pixels of the original image."""

    index: int
    bbox: BBox | None  # None when the box is smaller than a pixel inside the image
    source: PanelBox | None  # the panel box it is (None: drawn by the reviewer)
    new_label: str | None = None  # the label of a reviewer-drawn box


def clamp_bbox(raw: Sequence[float], width: int, height: int) -> BBox | None:
    """Sort, clamp to the image and round to whole pixels; None if nothing is left."""
    x1, x2 = sorted((float(raw[0]), float(raw[2])))
    y1, y2 = sorted((float(raw[1]), float(raw[3])))
    x1, x2 = (float(round(min(max(v, 0.0), width))) for v in (x1, x2))
    y1, y2 = (float(round(min(max(v, 0.0), height))) for v in (y1, y2))
    if x2 - x1 < 1 or y2 - y1 < 1:
        return None
    return (x1, y1, x2, y2)


def _same_place(a: Sequence[float], b: Sequence[float], tol: float = 1.0) -> bool:
    return all(abs(float(p) - float(q)) <= tol for p, q in zip(a, b))


def _raw_boxes(value: Any) -> list[dict[str, Any]]:
    if not value:
        return []
    boxes = value.get("boxes") if isinstance(value, dict) else getattr(value, "boxes", None)
    return list(boxes or [])


def orientation_of(value: Any) -> int:
    if isinstance(value, dict):
        return int(value.get("orientation") or 0)
    return int(getattr(value, "orientation", 0) or 0)


def read_annotator(panel: Panel, value: Any) -> list[DrawnBox]:
    """The annotator's boxes (raw payload or preprocessed value) matched to the panel by tag.

    A raw payload carries each box in canvas units with its ``scaleFactor``;
    dividing gives pixels of the original image, as the component's own
    ``preprocess`` does. A box that is unmoved (within a pixel) keeps its exact
    original coordinates so that rounding never reads as a move.
    """
    out: list[DrawnBox] = []
    for i, box in enumerate(_raw_boxes(value)):
        scale = float(box.get("scaleFactor") or 1.0)
        raw = [float(box[k]) / scale for k in ("xmin", "ymin", "xmax", "ymax")]
        text = str(box.get("label") or "").strip()
        m = TAG_RE.match(text)
        source = panel.by_tag(int(m.group(1))) if m else None
        if source is not None:
            bbox = (tuple(float(v) for v in source.box.bbox) if _same_place(raw, source.box.bbox)
                    else clamp_bbox(raw, panel.image.width, panel.image.height))
            out.append(DrawnBox(index=i, bbox=bbox, source=source))  # type: ignore[arg-type]
            continue
        label = text[len(NEW_PREFIX):].strip() if text.startswith(NEW_PREFIX) else text
        out.append(DrawnBox(index=i, bbox=clamp_bbox(raw, panel.image.width, panel.image.height), source=None,
                            new_label=label or None))
    return out


def new_box_numbers(drawn: list[DrawnBox]) -> dict[int, int]:
    """Annotator index -> number of each reviewer-drawn box, oldest = 1 (new boxes are put first)."""
    new = [d.index for d in drawn if d.source is None]
    return {idx: len(new) - j for j, idx in enumerate(new)}


def describe_changes(panel: Panel, drawn: list[DrawnBox], relabels: dict[str, str] | None = None) -> str:
    ed = edits_between(panel, drawn, relabels)
    unlabelled = sum(1 for d in drawn if d.source is None and not d.new_label)
    if ed.is_empty():
        return "_No changes yet._"
    text = "Your changes: " + ed.describe()
    if unlabelled:
        text += (f" — **{unlabelled} new box still needs a label**" if unlabelled == 1
                 else f" — **{unlabelled} new boxes still need a label**")
    return text


@dataclass
class Edits:
    """What the reviewer changed relative to the panel they were shown."""

    deleted: list[str] = field(default_factory=list)
    moved: dict[str, BBox] = field(default_factory=dict)
    relabelled: dict[str, str] = field(default_factory=dict)
    added: list[tuple[BBox, str | None]] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.deleted or self.moved or self.relabelled or self.added)

    def describe(self) -> str:
        parts = []
        if self.deleted:
            parts.append(f"deleted {len(self.deleted)}")
        if self.moved:
            parts.append(f"moved {len(self.moved)}")
        if self.relabelled:
            parts.append(f"relabelled {len(self.relabelled)}")
        if self.added:
            parts.append(f"drew {len(self.added)} new")
        return ", ".join(parts) or "no changes"


def edits_between(panel: Panel, drawn: list[DrawnBox], relabels: dict[str, str] | None = None) -> Edits:
    relabels = relabels or {}
    present = {d.source.box_id: d for d in drawn if d.source is not None}
    ed = Edits()
    for pb in panel.boxes:
        d = present.get(pb.box_id)
        if d is None:
            ed.deleted.append(pb.box_id)
            continue
        if d.bbox is not None and tuple(d.bbox) != tuple(pb.box.bbox):
            ed.moved[pb.box_id] = d.bbox
        if pb.box_id in relabels and relabels[pb.box_id] != pb.box.label:
            ed.relabelled[pb.box_id] = relabels[pb.box_id]
    ed.added = [(d.bbox, d.new_label) for d in reversed(drawn) if d.source is None and d.bbox is not None]
    return ed


def subjects_from_annotator(panel: Panel | None, value: Any,
                            relabels: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The intervention's ``subjects`` (the complete list to keep), or an inline error.

    Panel boxes keep their ``box_id`` (possibly moved or relabelled); drawn boxes
    go without one; panel boxes that are gone are deleted. A manual box without a
    label cannot be submitted.
    """
    if panel is None:
        return [], "Nothing to submit: no review is open on this job."
    if orientation_of(value) % 4:
        return [], "Turn the image back to its original orientation before submitting."
    relabels = relabels or {}
    drawn = read_annotator(panel, value)
    numbers = new_box_numbers(drawn)
    subjects: list[dict[str, Any]] = []
    seen: set[str] = set()
    unlabelled: list[str] = []
    for d in drawn:
        name = f"#{d.source.tag}" if d.source else f"new box {numbers[d.index]}"
        if d.bbox is None:
            return [], f"{name.capitalize()} is smaller than a pixel inside the image — draw it again or delete it."
        if d.source is not None:
            if d.source.box_id in seen:
                return [], f"Box #{d.source.tag} appears twice — delete one of them."
            seen.add(d.source.box_id)
            label = relabels.get(d.source.box_id, d.source.box.label)
            if d.source.box.source == "manual" and not label:
                unlabelled.append(name)
            s: dict[str, Any] = {"box_id": d.source.box_id, "bbox": list(d.bbox)}
            if label:
                s["label"] = label
            if d.source.box.target_policy != "SEGMENT":
                s["target_policy"] = d.source.box.target_policy
            subjects.append(s)
        else:
            if not d.new_label:
                unlabelled.append(name)
                continue
            subjects.append({"bbox": list(d.bbox), "label": d.new_label})
    if unlabelled:
        return [], (f"A box drawn by hand needs a label before it can be submitted: {', '.join(sorted(unlabelled))}. "
                    "Type the name in “Label” and press Enter, or delete the box.")
    too_long = [s for s in subjects if len(s.get("label") or "") > MAX_LABEL]
    if too_long:
        return [], f"A label is longer than {MAX_LABEL} characters."
    # Panel boxes in panel order, then drawn boxes oldest first: the same edits give the same payload.
    tags = {pb.box_id: pb.tag for pb in panel.boxes}
    kept = sorted((s for s in subjects if "box_id" in s), key=lambda s: tags[s["box_id"]])
    drawn_new = [s for s in subjects if "box_id" not in s][::-1]
    return kept + drawn_new, None


# --------------------------------------------------------------------------- labels for drawn boxes


def label_choices(panel: Panel | None, drawn: list[DrawnBox] | None,
                  relabels: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Choices of the "Box to label" dropdown: the newest unlabelled drawn box, then every box."""
    if panel is None:
        return []
    relabels = relabels or {}
    drawn = drawn or []
    choices = [("Newest drawn box without a label", AUTO_TARGET)]
    numbers = new_box_numbers(drawn)
    for d in sorted((d for d in drawn if d.source is None), key=lambda d: numbers[d.index]):
        choices.append((f"New box {numbers[d.index]}: {d.new_label or '(no label)'}", f"new:{numbers[d.index]}"))
    for d in drawn:
        if d.source is not None:
            label = relabels.get(d.source.box_id, d.source.box.label) or "(no label)"
            choices.append((f"#{d.source.tag} {label}", f"box:{d.source.box_id}"))
    return choices


def apply_label(panel: Panel | None, value: Any, relabels: dict[str, str] | None, target: str | None,
                text: str | None, image: Any) -> tuple[dict[str, Any] | None, dict[str, str], str | None]:
    """Give a box a label: (new annotator value, new relabels, error).

    ``target`` is a choice of :func:`label_choices`; ``auto`` (or a stale
    choice) means the newest drawn box that has no label yet.
    """
    relabels = dict(relabels or {})
    if panel is None:
        return None, relabels, "No review is open."
    label = (text or "").strip()
    if not label:
        return None, relabels, "Type a label first."
    if len(label) > MAX_LABEL:
        return None, relabels, f"A label can have at most {MAX_LABEL} characters."
    if orientation_of(value) % 4:
        return None, relabels, "Turn the image back to its original orientation first."
    drawn = read_annotator(panel, value)
    numbers = new_box_numbers(drawn)
    chosen: DrawnBox | None = None
    if target and target.startswith("new:"):
        chosen = next((d for d in drawn if d.source is None and str(numbers[d.index]) == target[4:]), None)
    elif target and target.startswith("box:"):
        chosen = next((d for d in drawn if d.source is not None and d.source.box_id == target[4:]), None)
    if chosen is None:
        chosen = next((d for d in drawn if d.source is None and not d.new_label), None)
    if chosen is None:
        return None, relabels, ("There is no drawn box without a label. Draw a box first (press C or the "
                                "▢ button, then drag on the image), or pick a box under “Box to label”.")
    if chosen.source is not None:
        if label == chosen.source.box.label:
            relabels.pop(chosen.source.box_id, None)
        else:
            relabels[chosen.source.box_id] = label
    boxes = []
    for d, raw in zip(drawn, _raw_boxes(value)):
        scale = float(raw.get("scaleFactor") or 1.0)
        coords = d.bbox or tuple(float(raw[k]) / scale for k in ("xmin", "ymin", "xmax", "ymax"))
        if d.source is not None:
            boxes.append(_annotator_box(coords, box_caption(d.source, relabels.get(d.source.box_id)),
                                        box_color(d.source)))
        else:
            boxes.append(_annotator_box(coords, new_box_caption(label if d is chosen else d.new_label),
                                        MANUAL_COLOR))
    return {"image": image, "boxes": boxes, "orientation": 0}, relabels, None


# --------------------------------------------------------------------------- re-applying edits


def applicable_edits(panel: Panel, edits: Edits) -> tuple[Edits, list[str]]:
    """The part of ``edits`` that still fits ``panel`` (its boxes still exist), and what was dropped."""
    keep = Edits(added=[(b, lbl) for b, lbl in edits.added])
    dropped: list[str] = []
    for box_id in edits.deleted:
        (keep.deleted.append(box_id) if panel.by_id(box_id) else dropped.append(f"delete {box_id}"))
    for box_id, bbox in edits.moved.items():
        if panel.by_id(box_id):
            fitted = clamp_bbox(bbox, panel.image.width, panel.image.height)
            if fitted:
                keep.moved[box_id] = fitted
        else:
            dropped.append(f"move {box_id}")
    for box_id, label in edits.relabelled.items():
        if panel.by_id(box_id):
            keep.relabelled[box_id] = label
        else:
            dropped.append(f"relabel {box_id}")
    keep.moved = {k: v for k, v in keep.moved.items() if k not in keep.deleted}
    keep.relabelled = {k: v for k, v in keep.relabelled.items() if k not in keep.deleted}
    return keep, dropped


def reapplied_value(panel: Panel, edits: Edits, image: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The annotator value with ``edits`` laid over ``panel`` (call :func:`applicable_edits` first)."""
    value = annotator_value(panel, image, relabels=edits.relabelled, moved=edits.moved,
                            deleted=edits.deleted, added=list(reversed(edits.added)))
    return value, dict(edits.relabelled)


# --------------------------------------------------------------------------- submissions and conflicts


def conflict_banner(code: str, *, already_ours: bool = False, message: str = "") -> str:
    """A 409 in plain words."""
    if code in ("PAUSE_TOKEN_MISMATCH", "PAUSE_NOT_ACTIVE"):
        return "This review was already submitted." if already_ours else "Another reviewer submitted first."
    if code == "VERSION_CONFLICT":
        return "Your view was out of date: the job changed after you opened it."
    if code == "JOB_CANCELLED":
        return "The job was cancelled, so this review can no longer be submitted."
    if code == "IDEMPOTENCY_CONFLICT":
        return "This review was already submitted with different boxes."
    if code == "JOB_TERMINAL":
        return "The job had already ended."
    return message or f"The server refused the request ({code})."


def submitted_message(status: str, next_node_type: str | None, kept: int, added: int, deleted: int) -> str:
    nxt = NEXT_NODE_WORDS.get(next_node_type or "", "nothing more: the job has ended")
    return (f"Submitted — kept {kept}, added {added}, deleted {deleted}. "
            f"The job is now {status}; next: {nxt}.")


@dataclass
class SnapshotChange:
    applied: bool
    redraw: bool = False
    banner: str | None = None


@dataclass
class ConflictOutcome:
    banner: str
    redraw: bool
    offer: Edits | None
    dropped: list[str]


class ReviewerState:
    """Everything one reviewer's browser session holds (kept in ``gr.State``).

    ``intervention_id`` lives from the first click on Submit until that
    submission succeeds or a 409 arrives: a double click or a retry after a
    network error sends the same id, and the server replays the first answer.
    Handlers of one session run concurrently (a follower streams while the
    reviewer clicks), so changes go through ``lock``. A plain class, not a
    dataclass: Gradio would try to serialise a dataclass (and its lock) into
    the page config.
    """

    def __init__(self, token: str | None = None, signed_in: bool = False) -> None:
        self.token = token
        self.signed_in = signed_in
        self.job_id: str | None = None
        self.snapshot: JobSnapshot | None = None
        self.panels: dict[str, Panel] = {}  # every panel of the open job shown so far, by pause token
        self._panel: Panel | None = None
        self.relabels: dict[str, str] = {}
        self.intervention_id: str | None = None
        self.results: dict[str, str] = {}  # pause_token -> the one result message shown for it
        self.offer: Edits | None = None  # the reviewer's edits offered for re-applying after a conflict
        self.carry: Edits | None = None  # edits from a conflict, kept until a panel they can go onto
        self.seen_token: str | None = None  # the pause of the last panel shown
        self.image_path: str | None = None
        self.notice: str | None = None  # the last thing the banner said about this job's review
        self.follow_gen = 0  # bumped by every open; a follower of an older generation stops
        self.followed_gen = -1  # the generation a follower already serves
        self.lock = threading.RLock()

    def __deepcopy__(self, memo: dict[int, Any]) -> ReviewerState:
        clone = ReviewerState()
        for name, value in vars(self).items():
            if name != "lock":
                setattr(clone, name, copy.deepcopy(value, memo))
        return clone

    @property
    def panel(self) -> Panel | None:
        """The review open now (the job's active pause), or None."""
        return self._panel

    @panel.setter
    def panel(self, value: Panel | None) -> None:
        self._panel = value
        if value is not None:
            self.panels[value.pause_token] = value

    def panel_for(self, value: Any) -> Panel | None:
        """The panel an annotator value was drawn for, which may be older than ``panel``: a submission
        is read against what the reviewer saw, and the server judges whether it is stale. A value
        that names no pause is taken as drawn for the open panel."""
        token = pause_of_value(value)
        return self.panels.get(token) if token else self.panel

    @property
    def last_result(self) -> str | None:
        return next(reversed(self.results.values()), None)

    @property
    def version(self) -> int:
        return self.snapshot.version if self.snapshot else -1

    def open(self, snap: JobSnapshot) -> None:
        """Show ``snap``'s job from scratch (a click in the queue, "next job", a reload)."""
        with self.lock:
            same_pause = (self.panel is not None and self.job_id == snap.job_id
                          and snap.active_pause is not None
                          and self.panel.pause_token == snap.active_pause.pause_token)
            if snap.job_id != self.job_id:
                self.panels = {}
            self.job_id = snap.job_id
            self.snapshot = snap
            self.panel = panel_from_snapshot(snap)
            self.seen_token = self.panel.pause_token if self.panel else None
            self.relabels = {}
            self.offer = None
            self.carry = None
            self.notice = None
            if not same_pause:
                self.intervention_id = None
            self.follow_gen += 1

    def apply_snapshot(self, snap: JobSnapshot) -> SnapshotChange:
        """A newer snapshot of the open job (from events or polling). Redraws only when the pause changed."""
        with self.lock:
            if snap.job_id != self.job_id or snap.version < self.version:
                return SnapshotChange(applied=False)
            old = self.panel
            self.snapshot = snap
            new = panel_from_snapshot(snap)
            old_token = old.pause_token if old else None
            new_token = new.pause_token if new else None
            if old_token == new_token:
                self.panel = new
                if new is None and is_terminal(snap) and not (self.notice or "").startswith("The job ended"):
                    # Replace what the banner said about the submission ("now PROCESSING…").
                    reason = f" ({snap.reason_code})" if snap.reason_code else ""
                    self.notice = f"The job ended: {snap.status.value}{reason}."
                    return SnapshotChange(applied=True, banner=self.notice)
                return SnapshotChange(applied=True)
            self.panel = new
            self.relabels = {}
            self.offer = None
            self.intervention_id = None
            # The pause this reviewer last had in front of them: was it answered by someone else?
            last = old_token or self.seen_token
            by_other = last is not None and last not in self.results
            if new is not None:
                self.seen_token = new_token
                banner = ("Another reviewer submitted the previous round. A new review round is open below."
                          if by_other else "")  # "" clears what the banner said about the last round
                if self.carry is not None:
                    banner = (banner + self._offer_text(self._offer_carried())).strip()
            elif old is not None and by_other:
                banner = ("The job was cancelled." if snap.status == JobStatus.CANCELLED
                          else "Another reviewer submitted first.")
            else:
                banner = None
            if banner is not None:
                self.notice = banner
            return SnapshotChange(applied=True, redraw=True, banner=banner)

    def submission_id(self) -> str:
        with self.lock:
            if self.intervention_id is None:
                self.intervention_id = new_intervention_id()
            return self.intervention_id

    def record_success(self, pause_token: str, status: str, version: int, next_node_type: str | None,
                       kept: int, added: int, deleted: int) -> str:
        """The pause is consumed: close the panel. A second answer for it shows the same one result."""
        with self.lock:
            if pause_token in self.results:
                return self.results[pause_token]
            msg = submitted_message(status, next_node_type, kept, added, deleted)
            self.results[pause_token] = msg
            self.notice = msg
            self.intervention_id = None
            self.offer = None
            if self.panel is not None and self.panel.pause_token == pause_token:
                self.panel = None
                self.relabels = {}
                if self.snapshot is not None and version > self.snapshot.version:
                    self.snapshot = self.snapshot.model_copy(update={
                        "status": JobStatus(status), "version": version, "active_pause": None,
                        "pending_actions": []})
            return msg

    def record_conflict(self, code: str, snapshot: dict[str, Any] | JobSnapshot | None,
                        edits: Edits | None, message: str = "", submitted: Panel | None = None) -> ConflictOutcome:
        """A 409: plain-words banner, redraw from the snapshot it carries, a NEW intervention id,
        and the reviewer's edits offered again where their boxes still exist (now, or when the
        next review round of this job opens). ``submitted`` is the panel the refused submission
        answered (default: the open one)."""
        with self.lock:
            old = submitted or self.panel
            already = old is not None and old.pause_token in self.results
            snap = JobSnapshot.model_validate(snapshot) if isinstance(snapshot, dict) else snapshot
            if snap is not None and snap.job_id != self.job_id:
                snap = None
            new = panel_from_snapshot(snap) if snap is not None else None
            pause_gone = old is not None and (new is None or new.pause_token != old.pause_token)
            banner = conflict_banner(code, already_ours=already, message=message)
            if code == "VERSION_CONFLICT" and pause_gone:
                banner = banner.split(":")[0] + (": this review was already submitted." if already
                                                 else ": another reviewer submitted first.")
            self.intervention_id = new_intervention_id()
            self.carry = edits if edits is not None and not edits.is_empty() else None
            self.offer, dropped = None, []
            if snap is not None:
                self.snapshot, self.panel, self.relabels = snap, new, {}
                if new is not None:
                    self.seen_token = new.pause_token
                if new is None:
                    banner += f" Nothing is waiting for review on this job now ({snap.status.value})."
                elif pause_gone:
                    banner += " A new review round is open; the panel now shows it."
                else:
                    banner += " The panel was redrawn from the current state."
                dropped = self._offer_carried()
            banner += self._offer_text(dropped)
            self.notice = banner
            return ConflictOutcome(banner=banner, redraw=snap is not None, offer=self.offer, dropped=dropped)

    def _offer_carried(self) -> list[str]:
        """Offer the edits kept from a conflict against the panel now shown (once)."""
        if self.carry is None or self.panel is None:
            return []
        offer, dropped = applicable_edits(self.panel, self.carry)
        self.carry = None
        self.offer = None if offer.is_empty() else offer
        return dropped

    def _offer_text(self, dropped: list[str]) -> str:
        text = ""
        if self.offer is not None:
            text += f" Your edits ({self.offer.describe()}) can be re-applied with “Re-apply my edits”."
        if dropped:
            text += f" Not re-applicable (box gone): {', '.join(dropped)}."
        return text


# --------------------------------------------------------------------------- queue


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def format_age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {(s % 3600) // 60:02d} min"
    return f"{s // 86400} d {(s % 86400) // 3600} h"


QUEUE_HEADERS = ["Job", "Stage", "Waiting for", "Boxes"]


def waiting_jobs(jobs: Iterable[JobSummary]) -> list[JobSummary]:
    """Jobs with an open pause (their summary names its stage), oldest pause first."""
    far = datetime.max.replace(tzinfo=timezone.utc)
    waiting = [j for j in jobs if j.stage]
    return sorted(waiting, key=lambda j: (parse_time(j.pause_created_at) or parse_time(j.updated_at) or far,
                                          j.job_id))


def queue_rows(jobs: Iterable[JobSummary], now: datetime | None = None) -> list[list[Any]]:
    now = now or datetime.now(timezone.utc)
    rows = []
    for j in waiting_jobs(jobs):
        since = parse_time(j.pause_created_at) or parse_time(j.updated_at)
        age = format_age((now - since).total_seconds()) if since else "?"
        rows.append([j.job_id, j.stage, age, j.box_count])
    return rows


def next_job_id(jobs: Iterable[JobSummary], exclude: Iterable[str | None] = ()) -> str | None:
    skip = set(exclude)
    return next((j.job_id for j in waiting_jobs(jobs) if j.job_id not in skip), None)


# --------------------------------------------------------------------------- results


def checkerboard(size: tuple[int, int], cell: int = 12) -> Image.Image:
    """The usual transparency background: light grey and white squares."""
    w, h = size
    tile = Image.new("RGB", (cell * 2, cell * 2), (255, 255, 255))
    tile.paste((204, 204, 204), (0, 0, cell, cell))
    tile.paste((204, 204, 204), (cell, cell, cell * 2, cell * 2))
    board = Image.new("RGB", (w, h))
    for y in range(0, h, cell * 2):
        for x in range(0, w, cell * 2):
            board.paste(tile, (x, y))
    return board


def on_checkerboard(cutout: Image.Image) -> Image.Image:
    rgba = cutout.convert("RGBA")
    board = checkerboard(rgba.size).convert("RGBA")
    return Image.alpha_composite(board, rgba).convert("RGB")


def mask_overlay(image: Image.Image, mask: Image.Image, color: tuple[int, int, int] = (255, 0, 102),
                 alpha: float = 0.5) -> Image.Image:
    """The image with the mask tinted and everything outside it dimmed, so the cut stands out."""
    base = image.convert("RGB")
    m = mask.convert("L")
    if m.size != base.size:
        m = m.resize(base.size, Image.NEAREST)
    inside = m.point(lambda v: 255 if v > 127 else 0)
    tinted = Image.blend(base, Image.new("RGB", base.size, color), alpha)
    dimmed = base.point(lambda v: int(v * 0.35))
    return Image.composite(tinted, dimmed, inside)


@dataclass
class ResultsView:
    summary: str
    cutouts: list[tuple[str, str]]  # (image path, caption): cut-outs on a checkerboard
    overlays: list[tuple[str, str]]  # (image path, caption): masks over the image
    files: list[str]  # the original PNGs, for download


def _slug(text: str | None) -> str:
    s = re.sub(r"[^A-Za-z0-9_-]+", "-", text or "subject").strip("-")
    return (s or "subject")[:40]


def write_atomic(path: Path, data: bytes | Image.Image) -> str:
    """Write whole or not at all: two reviewers may render the same finished job at once."""
    if isinstance(data, Image.Image):
        buf = io.BytesIO()
        data.save(buf, "PNG")
        data = buf.getvalue()
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return str(path)


def results_view(results: JobResults, fetch: Callable[[str], bytes], image_bytes: bytes | None,
                 out_dir: Path) -> ResultsView:
    """Files and captions for the results panel; ``fetch`` downloads an artifact URL."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Image.open(io.BytesIO(image_bytes)).convert("RGB") if image_bytes else None
    cutouts: list[tuple[str, str]] = []
    overlays: list[tuple[str, str]] = []
    files: list[str] = []
    lines = [f"**{results.status.value}**" + (f" ({results.reason_code})" if results.reason_code else "")]
    done = [s for s in results.subjects if s.status == "SUCCEEDED"]
    lines.append(f"{len(done)} of {len(results.subjects)} subject{'s' if len(results.subjects) != 1 else ''} cut out.")
    for s in results.subjects:
        caption = f"{s.label or '(no label)'} — {s.box_id}"
        if s.status != "SUCCEEDED":
            lines.append(f"- {s.status}: {s.label or '(no label)'} ({s.box_id}) — {s.reason or 'no reason given'}")
            continue
        stem = f"{_slug(s.label)}_{s.box_id}"
        if s.cutout_url:
            raw = fetch(s.cutout_url)
            files.append(write_atomic(out_dir / f"{stem}_cutout.png", raw))
            preview = on_checkerboard(Image.open(io.BytesIO(raw)))
            cutouts.append((write_atomic(out_dir / f"{stem}_cutout_preview.png", preview), caption))
        if s.mask_url:
            raw = fetch(s.mask_url)
            files.append(write_atomic(out_dir / f"{stem}_mask.png", raw))
            if base is not None:
                overlay = mask_overlay(base, Image.open(io.BytesIO(raw)))
                overlays.append((write_atomic(out_dir / f"{stem}_overlay.png", overlay), caption))
    if results.status == JobStatus.EMPTY_SELECTION:
        lines.append("The reviewer chose to cut nothing.")
    return ResultsView(summary="\n".join(lines), cutouts=cutouts, overlays=overlays, files=files)


def is_terminal(snap: JobSnapshot | None) -> bool:
    return snap is not None and JobStatus(snap.status).value in TERMINAL_VALUES


def backends_text(readyz: dict[str, Any] | None) -> str:
    """Which model backends the control plane runs, from GET /readyz (empty when it does not say)."""
    backends = (readyz or {}).get("backends")
    if not isinstance(backends, dict) or not backends:
        return ""
    return "Model backends: " + ", ".join(f"{k} = `{v}`" for k, v in sorted(backends.items()))
