"""Reading the annotator: what the reviewer drew, kept, moved, relabelled and deleted.

The canvas value comes from ``gradio_image_annotation`` (raw, in canvas units,
or preprocessed); the boxes are matched to the panel by their ``#n`` tags
(see ``ui.panel``). From them come the intervention's ``subjects``
(docs/protocol.md § Intervention), the notes beside the canvas, the label
field's choices, and the edits offered again after a 409.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hitl_review.statecore.models import BBox

from .box_geometry import same_place, translated_bbox
from .panel import (
    MANUAL_COLOR,
    NEW_PREFIX,
    TAG_RE,
    Panel,
    PanelBox,
    annotator_box,
    annotator_value,
    box_caption,
    box_color,
    from_display,
    new_box_caption,
    to_display,
)

MAX_LABEL = 200
AUTO_TARGET = "auto"


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


def raw_boxes(value: Any) -> list[dict[str, Any]]:
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
    dividing gives pixels of the image the canvas shows, as the component's own
    ``preprocess`` does, and ``from_display`` pixels of the original image. A box that is
    unmoved (within half a pixel) keeps its exact original coordinates so that rounding never
    reads as a move; a box only shifted keeps its size and moves by whole pixels
    (``ui.box_geometry``).
    """
    out: list[DrawnBox] = []
    for i, box in enumerate(raw_boxes(value)):
        scale = float(box.get("scaleFactor") or 1.0)
        raw = from_display(panel.image, [float(box[k]) / scale for k in ("xmin", "ymin", "xmax", "ymax")])
        text = str(box.get("label") or "").strip()
        m = TAG_RE.match(text)
        source = panel.by_tag(int(m.group(1))) if m else None
        if source is not None:
            x1, y1, x2, y2 = source.box.bbox
            bbox = (
                (float(x1), float(y1), float(x2), float(y2))
                if same_place(raw, source.box.bbox)  # within 0.5 px (ui.box_geometry)
                else translated_bbox(source.box.bbox, raw, panel.image.width, panel.image.height)
                or clamp_bbox(raw, panel.image.width, panel.image.height)
            )
            out.append(DrawnBox(index=i, bbox=bbox, source=source))
            continue
        label = text[len(NEW_PREFIX) :].strip() if text.startswith(NEW_PREFIX) else text
        out.append(
            DrawnBox(
                index=i,
                bbox=clamp_bbox(raw, panel.image.width, panel.image.height),
                source=None,
                new_label=label or None,
            )
        )
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
        text += (
            f" — **{unlabelled} new box still needs a label**"
            if unlabelled == 1
            else f" — **{unlabelled} new boxes still need a label**"
        )
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


def subjects_from_annotator(
    panel: Panel | None, value: Any, relabels: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str | None]:
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
        return [], (
            f"A box drawn by hand needs a label before it can be submitted: {', '.join(sorted(unlabelled))}. "
            "Type the name in “Label” and press Enter, or delete the box."
        )
    too_long = [s for s in subjects if len(s.get("label") or "") > MAX_LABEL]
    if too_long:
        return [], f"A label is longer than {MAX_LABEL} characters."
    # Panel boxes in panel order, then drawn boxes oldest first: the same edits give the same payload.
    tags = {pb.box_id: pb.tag for pb in panel.boxes}
    kept = sorted((s for s in subjects if "box_id" in s), key=lambda s: tags[s["box_id"]])
    drawn_new = [s for s in subjects if "box_id" not in s][::-1]
    return kept + drawn_new, None


def box_notes(panel: Panel | None, drawn: list[DrawnBox] | None = None, relabels: dict[str, str] | None = None) -> str:
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
            lines.append(
                f"- #{pb.tag} {relabels.get(pb.box_id, pb.box.label) or '(no label)'}"
                + (f" · {pb.box.score:.2f}" if pb.box.score is not None else "")
                + f" · {pb.box.source}"
            )
    if not panel.boxes:
        lines.append("No boxes were proposed: draw the subjects to cut out, or choose **Cut nothing**.")
    if drawn is not None:
        lines.append("\n" + describe_changes(panel, drawn, relabels))
    return "\n".join(lines)


# --------------------------------------------------------------------------- labels for drawn boxes


def label_choices(
    panel: Panel | None, drawn: list[DrawnBox] | None, relabels: dict[str, str] | None = None
) -> list[tuple[str, str]]:
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


def apply_label(
    panel: Panel | None, value: Any, relabels: dict[str, str] | None, target: str | None, text: str | None, image: Any
) -> tuple[dict[str, Any] | None, dict[str, str], str | None]:
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
        return (
            None,
            relabels,
            (
                "There is no drawn box without a label. Draw a box first (press C or the "
                "▢ button, then drag on the image), or pick a box under “Box to label”."
            ),
        )
    if chosen.source is not None:
        if label == chosen.source.box.label:
            relabels.pop(chosen.source.box_id, None)
        else:
            relabels[chosen.source.box_id] = label
    boxes = []
    for d, raw in zip(drawn, raw_boxes(value), strict=True):
        scale = float(raw.get("scaleFactor") or 1.0)
        shown = [float(raw[k]) / scale for k in ("xmin", "ymin", "xmax", "ymax")]
        coords = to_display(panel.image, d.bbox or from_display(panel.image, shown))
        if d.source is not None:
            boxes.append(
                annotator_box(coords, box_caption(d.source, relabels.get(d.source.box_id)), box_color(d.source))
            )
        else:
            boxes.append(annotator_box(coords, new_box_caption(label if d is chosen else d.new_label), MANUAL_COLOR))
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
    value = annotator_value(
        panel,
        image,
        relabels=edits.relabelled,
        moved=edits.moved,
        deleted=edits.deleted,
        added=list(reversed(edits.added)),
    )
    return value, dict(edits.relabelled)
