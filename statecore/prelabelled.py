"""Boxes from another system, sent with a new job (docs/protocol.md § Routes, Pre-labelled jobs).

They stand in for the detector's answer: the job opens its first review pause with them as the
model's proposal, no detector called. Refused whole (400, nothing written) unless every box is
inside the image, finite and not degenerate, so what the reviewer sees is what was sent."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson

from .errors import InvalidRequest
from .ids import canonical_json
from .nodes import Detection

SOURCE = "prelabelled"  # the job's proposal source, in its JOB_CREATED event, meta and audit outcome
AUDIT_OUTCOME = "CREATED:PRELABELLED"  # the SUBMIT entry's outcome (create_job.lua's ARGV[9])
MAX_BOXES = 1000
MIN_SIDE = 1.0  # the detector's own floor (reports._clip): a thinner box would be dropped


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InvalidRequest(f"{what} must be a finite number, got {v!r}", field="boxes")
    return float(v)


def parse(raw: str, width: int, height: int) -> list[Detection]:
    """The multipart field ``boxes``: JSON ``[{"bbox": [x1, y1, x2, y2], "label": str?, "score": 0..1?}]``
    in pixels of the (uprighted) image."""
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"boxes is not JSON: {e}", field="boxes") from e
    if not isinstance(items, list):
        raise InvalidRequest('boxes must be a JSON list of {"bbox": [x1, y1, x2, y2], ...}', field="boxes")
    if len(items) > MAX_BOXES:
        raise InvalidRequest(f"at most {MAX_BOXES} boxes, got {len(items)}", field="boxes")
    out = []
    for i, item in enumerate(items):
        where = f"boxes[{i}]"
        if not isinstance(item, dict) or set(item) - {"bbox", "label", "score"}:
            raise InvalidRequest(f'{where} must be an object with "bbox", optionally "label", "score"', field="boxes")
        bbox = item.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise InvalidRequest(f"{where}.bbox must be [x1, y1, x2, y2]", field="boxes")
        x1, y1, x2, y2 = (_number(v, f"{where}.bbox") for v in bbox)
        if not (0 <= x1 and 0 <= y1 and x2 <= width and y2 <= height):
            raise InvalidRequest(f"{where}.bbox {bbox} is not inside the {width}x{height} image", field="boxes")
        if x2 - x1 < MIN_SIDE or y2 - y1 < MIN_SIDE:
            raise InvalidRequest(f"{where}.bbox {bbox} is degenerate (x2 - x1 and y2 - y1 ≥ 1)", field="boxes")
        label, score = item.get("label"), item.get("score")
        if label is not None and (not isinstance(label, str) or not label.strip() or len(label) > 200):
            raise InvalidRequest(f"{where}.label must be a non-empty string", field="boxes")
        if score is not None and not 0 <= _number(score, f"{where}.score") <= 1:
            raise InvalidRequest(f"{where}.score must be within 0 and 1", field="boxes")
        out.append(Detection(bbox=(x1, y1, x2, y2), label=label, score=score))
    return out


def boxes_hash(boxes: list[Detection]) -> str:
    """The boxes' digest, kept in the job's policy (``prelabelled``) so the archive's copy of the
    creation fingerprint (archive/archiver.py) has it too; 16 hex digits keep the fingerprint
    within the archive's column."""
    body = canonical_json([b.model_dump(mode="json") for b in boxes])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def fingerprint_part(digest: str | None) -> str:
    """What a creation's fingerprint adds for its boxes' digest (decide.create_fingerprint): the
    same Idempotency-Key with other boxes is a conflict; a job without boxes adds nothing."""
    return "" if digest is None else ":b" + digest


def is_prelabelled(fingerprint: str) -> bool:
    """A creation's fingerprint names whether it had boxes: what its replay's body says (its status)."""
    return ":b" in fingerprint
