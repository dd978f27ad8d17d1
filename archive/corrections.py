"""The reviewer's corrections to the detector's proposals, box by box (docs/archive.md § Export):
what the detector proposed (the box list of the job's first pause) against what was approved,
matched by ``box_id``: added (drawn by the reviewer), moved, relabelled, deleted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MOVE_TOLERANCE_PX = 1e-6


@dataclass
class Corrections:
    proposed: int
    approved: int
    added: list[dict[str, Any]] = field(default_factory=list)
    moved: list[dict[str, Any]] = field(default_factory=list)
    relabelled: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "proposed": self.proposed,
            "approved": self.approved,
            "added": self.added,
            "moved": self.moved,
            "relabelled": self.relabelled,
            "deleted": self.deleted,
        }


def proposals(events: Iterable[Mapping[str, Any]], box_list: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The detector's proposals: the model boxes of the first ``PAUSE_OPENED`` event (what the
    reviewer was first shown). A job that never paused (auto-approved) has the model boxes of
    its final box list: nobody corrected them."""
    for e in events:
        if e["type"] == "PAUSE_OPENED":
            return [dict(b) for b in e["data"].get("box_list", []) if b.get("source") == "model"]
    return [dict(b) for b in box_list if b.get("source") == "model"]


def compare(proposed: Sequence[Mapping[str, Any]], approved: Sequence[Mapping[str, Any]]) -> Corrections:
    by_id = {b["box_id"]: b for b in proposed}
    out = Corrections(proposed=len(proposed), approved=len(approved))
    approved_ids = {b["box_id"] for b in approved}
    for b in approved:
        before = by_id.get(b["box_id"])
        if before is None:
            out.added.append(_box(b))
            continue
        if any(abs(float(x) - float(y)) > MOVE_TOLERANCE_PX for x, y in zip(before["bbox"], b["bbox"], strict=True)):
            out.moved.append(
                {"box_id": b["box_id"], "label": b.get("label"), "from": list(before["bbox"]), "to": list(b["bbox"])}
            )
        if before.get("label") != b.get("label"):
            out.relabelled.append({"box_id": b["box_id"], "from": before.get("label"), "to": b.get("label")})
    out.deleted = [_box(b) for b in proposed if b["box_id"] not in approved_ids]
    return out


def _box(b: Mapping[str, Any]) -> dict[str, Any]:
    return {k: b.get(k) for k in ("box_id", "bbox", "label", "score", "source")}
