"""A mask to look at while reviewing (docs/protocol.md § Cut-out quality, the preview route): the
subject's box plus the reviewer's points through the segmenter's prompted path (SAM's on the cached
image embedding), and the quality gate's verdict on it. Nothing is stored and no job changes."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from hitl_review.statecore.models import ImageRef

from .executor import Models, load_image, mask_png
from .quality.gate import judge, score_mask

if TYPE_CHECKING:
    from hitl_review.statecore.artifacts import ArtifactStore


def preview_mask(
    models: Models,
    artifacts: ArtifactStore,
    image: ImageRef,
    bbox: list[float],
    points: list[dict[str, Any]],
    pixels: np.ndarray | None = None,
) -> dict[str, Any]:
    """``{"mask_png_base64", "area", "quality", "ms"}`` for ``bbox`` and ``points`` on ``image``.
    ``ValueError`` (a point off the image, a bad box) is the caller's 400; a segmenter without a
    prompted path raises ``LookupError``."""
    segmenter = models.segmenter
    prompt = getattr(segmenter, "segment_prompt", None)
    if segmenter is None or not callable(prompt):
        raise LookupError("this segmenter has no prompted path (box and points)")
    t0 = time.perf_counter()
    img = pixels if pixels is not None else load_image(artifacts, image.url)
    [best, *_] = prompt(img, image.sha256, bbox, points)
    mask = np.asarray(best["mask"], bool)
    quality = None
    if models.quality is not None:
        gate = models.quality.policy
        scores = score_mask(
            img, bbox, mask, predicted_iou=best.get("predicted_iou"), stability=best.get("stability"), gate=gate
        )
        quality = judge(scores, gate).to_dict()
    return {
        "mask_png_base64": base64.b64encode(mask_png(mask)).decode("ascii"),
        "area": int(mask.sum()),
        "quality": quality,
        "ms": round(1000 * (time.perf_counter() - t0), 1),
    }
