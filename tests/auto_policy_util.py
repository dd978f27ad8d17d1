"""A hand-made box policy for the auto-approval tests: it approves a detection whose lowest score is
high (the logistic weight is on ``score_min`` alone, the calibration the identity)."""

from __future__ import annotations

import random
from typing import Any

import orjson

from hitl_review.statecore import autoapprove as aa
from hitl_review.statecore.auto_store import AutoApproveConfig

SURE_BOXES = [
    {"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.97},
    {"bbox": [200, 40, 320, 200], "label": "shoe", "score": 0.95},
]


def policy_doc(
    approved: int = 1000,
    false_accepts: int = 0,
    max_false_accept: float = 0.005,
    feature: str = "score_min",
    weight: float = 20.0,
    intercept: float = -15.0,
    threshold: float = 0.9,
) -> dict[str, Any]:
    names = aa.feature_names([])
    coef = [0.0] * len(names)
    coef[names.index(feature)] = weight
    return aa.sealed(
        {
            "format": aa.FORMAT,
            "kind": "box",
            "name": "box-test",
            "promise": {"max_false_accept": max_false_accept, "confidence": 0.95},
            "threshold": threshold,
            "evidence": {"heldout_approved": approved, "heldout_false_accepts": false_accepts, "heldout_jobs": 3000},
            "model": {
                "labels": [],
                "features": names,
                "mean": [0.0] * len(names),
                "scale": [1.0] * len(names),
                "coef": coef,
                "intercept": intercept,
                "isotonic": {"x": [0.0, 1.0], "y": [0.0, 1.0]},
            },
        }
    )


def policy(**kw: Any) -> aa.BoxPolicy:
    return aa.load(orjson.dumps(policy_doc(**kw)), "on")


def config(mode: str = "on", spot_check: float = 0.0, seed: int = 7) -> AutoApproveConfig:
    return AutoApproveConfig(policy=policy(), mode=mode, spot_check=spot_check, rng=random.Random(seed))


def big_image_policy_text() -> bytes:
    """A policy file that would approve every detection on an image of 0.2 megapixels or more (640 x 480:
    p = 1.0) and none on a smaller one (320 x 240: p = 0.0), promising a false-accept rate of at most 0.99:
    with ``--spot-check 1.0`` every job waits for a person, the big ones as spot checks, and no number
    of changed lists (fewer than 299 in a row) drops it to shadow."""
    doc = policy_doc(max_false_accept=0.99, feature="image_megapixels", weight=100.0, intercept=-20.0, threshold=0.5)
    return orjson.dumps(doc)
