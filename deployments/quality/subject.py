"""One subject's mask through the quality gate and its refinements (docs/protocol.md § Cut-out quality).

The segmentation node gates every mask it makes (``gate.score_mask`` and ``gate.judge`` under the
deployment's policy, ``hitl up --quality-gate-policy``); a failing mask is refined
(``refine.refine``: the next prompt strategy, at most ``--max-refinements`` times) and each new mask
gated again; each refinement starts from the one before (its mask, and its box when it grew it).
The mask kept is the first that passes; when none does, the one that fails by the least (the
verdict's ``severity``: how far past the policy's thresholds; docs/benchmarks.md § Cut-out quality
measures the choice), with its verdict ``FAIL``, so the results say which cut-outs no gate vouched
for.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .gate import DEFAULT_POLICY, judge, policy, score_mask
from .refine import STRATEGIES, refine

log = logging.getLogger("hitl.quality")

MAX_REFINEMENTS = len(STRATEGIES)


@dataclass
class GatedMask:
    """The mask kept for one subject, whether a refinement made it (its alpha is then the mask's own),
    the gate's verdict on it and every refinement tried (``{"strategy", "quality"}``)."""

    mask: np.ndarray
    refined: bool
    quality: dict[str, Any]
    refinements: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class QualityGate:
    """The gate a segmentation node applies: ``policy`` (a version of ``gate.POLICIES``) and how many
    refinements a failing mask gets (0 … ``MAX_REFINEMENTS``)."""

    policy: str = DEFAULT_POLICY
    max_refinements: int = 2

    def __post_init__(self) -> None:
        policy(self.policy)  # ValueError naming the known policies
        if not 0 <= self.max_refinements <= MAX_REFINEMENTS:
            raise ValueError(
                f"max_refinements must be 0..{MAX_REFINEMENTS} (one per strategy: {', '.join(STRATEGIES)})"
            )

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> QualityGate | None:
        """From ``Settings.backend_config()["quality"]``; None (or ``{"enabled": False}``): no gate."""
        if not cfg or not cfg.get("enabled", True):
            return None
        return cls(policy=str(cfg.get("policy") or DEFAULT_POLICY), max_refinements=int(cfg.get("max_refinements", 2)))

    def describe(self) -> dict[str, Any]:
        return {"policy": self.policy, "max_refinements": self.max_refinements}

    def _verdict(
        self, image: np.ndarray, bbox: list[float], mask: np.ndarray, found: Mapping[str, Any]
    ) -> dict[str, Any]:
        scores = score_mask(
            image,
            bbox,
            mask,
            predicted_iou=_score(found, "predicted_iou"),
            stability=_score(found, "stability"),
            gate=self.policy,
        )
        return judge(scores, self.policy).to_dict()

    def check(
        self, segmenter: Any, image: np.ndarray, image_sha: str, bbox: list[float], found: Mapping[str, Any]
    ) -> GatedMask:
        """Gate ``found`` (a segmenter's answer for ``bbox``: ``mask`` and, from SAM, ``predicted_iou``
        and ``stability``), refining while it fails and refinements are left."""
        mask = np.asarray(found["mask"], bool)
        quality = self._verdict(image, bbox, mask, found)
        out = GatedMask(mask=mask, refined=False, quality=quality)
        can_refine = callable(getattr(segmenter, "segment_prompt", None))
        box, last = list(bbox), mask
        for attempt in range(1, self.max_refinements + 1 if can_refine else 1):
            if out.quality["verdict"] == "PASS":
                break
            try:
                tried = refine(segmenter, image, image_sha, box, last, attempt)
            except Exception:  # a strategy that breaks costs its refinement, never the subject or the job
                log.exception("refinement %d (%s) failed", attempt, STRATEGIES[attempt - 1])
                break
            # Judged against the box the refinement prompted (a grown one runs past the reviewer's), which
            # the next refinement starts from, with this mask.
            box, last = tried.get("bbox") or box, tried["mask"]
            quality = self._verdict(image, box, last, tried)
            out.refinements.append({"strategy": tried["strategy"], "quality": quality})
            if _better(quality, out.quality):
                out.mask, out.refined, out.quality = last, True, quality
        if out.quality["verdict"] == "FAIL":
            log.info("a mask fails the gate after %d refinement(s): %s", len(out.refinements), out.quality["reasons"])
        return out


def _better(new: Mapping[str, Any], kept: Mapping[str, Any]) -> bool:
    """A refinement's mask replaces the kept one when it passes, or fails by less: a lower
    ``severity`` (how far past the policy's thresholds; on a tie the kept one stays)."""
    if new["verdict"] != kept["verdict"]:
        return bool(new["verdict"] == "PASS")
    return float(new.get("severity", 0.0)) < float(kept.get("severity", 0.0))


def _score(found: Mapping[str, Any], key: str) -> float | None:
    value = found.get(key)
    return float(value) if isinstance(value, int | float) else None
