"""A mask gate policy file that ``hitl learn gate`` wrote from a team's own mask reviews (SPEC §14,
docs/learning.md § The mask gate), loaded by ``hitl up --quality-gate-policy FILE`` (``gate.policy``
takes a path as it takes a version).

The file holds a logistic regression over the gate's measured features (``gate.score_mask``: those that
read the picture, such as the contrast across the outline, its alignment with the picture's edges and
the share of the mask that looks like the background, and the mask's shape against its box),
calibrated by isotonic regression, as plain numbers (``statecore.autoapprove.predict`` evaluates them:
no scikit-learn, no pickle), the threshold on the calibrated probability that a reviewer accepts the
mask, and the held-out evidence of its recall. Every verdict names ``policy:<name>@<hash>``, the
SHA-256 of the file's content: a file edited after it was written is refused, and so is one whose
held-out evidence does not bound the recall it promises.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from hitl_review.statecore import autoapprove as aa

FORMAT = "hitl-gate-policy/1"
LOG = "log1p:"  # a feature name so prefixed is log(1 + |value|) of the feature


def is_file(name: str) -> bool:
    """Whether a ``--quality-gate-policy`` value names a file rather than a version."""
    return name.endswith(".json") or os.sep in name


def row(model: Mapping[str, Any], scores: Mapping[str, float]) -> list[float]:
    """The model's inputs from the gate's scores."""
    out = []
    for name in model["features"]:
        if name.startswith(LOG):
            out.append(math.log1p(abs(float(scores[name[len(LOG) :]]))))
        else:
            out.append(float(scores[name]))
    return out


def base_features(model: Mapping[str, Any]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for name in model["features"]:
        seen[name[len(LOG) :] if name.startswith(LOG) else name] = None
    return tuple(seen)


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class FileScore:
    """``gate_v2.Score`` for a learned file: the log-odds that the mask is bad (a reviewer would refine or
    reject it); the mask fails at ``>= threshold``, the file's threshold on the probability of good as
    log-odds of bad (good at or below the file's threshold fails)."""

    model: Mapping[str, Any]
    threshold: float
    words: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def features(self) -> tuple[str, ...]:
        return base_features(self.model)

    def good(self, scores: Mapping[str, float]) -> float:
        return aa.predict(self.model, row(self.model, scores))

    def score(self, scores: Mapping[str, float]) -> float:
        return _logit(1.0 - self.good(scores))

    def probability(self, scores: Mapping[str, float]) -> float:
        return 1.0 - self.good(scores)

    def contributions(self, scores: Mapping[str, float]) -> dict[str, float]:
        """Per feature, how much it pushes the regression towards "bad" (standardised value x weight)."""
        out: dict[str, float] = {}
        m = self.model
        for name, v, mu, sd, c in zip(m["features"], row(m, scores), m["mean"], m["scale"], m["coef"], strict=True):
            key = name[len(LOG) :] if name.startswith(LOG) else name
            out[key] = out.get(key, 0.0) - float(c) * (v - float(mu)) / (float(sd) or 1.0)
        return out


def evidence_problem(doc: Mapping[str, Any]) -> str | None:
    """Why the held-out evidence does not bound the promised recall (recomputed from its counts), or None."""
    promise, ev = doc.get("promise") or {}, doc.get("evidence") or {}
    r, conf = float(promise.get("min_recall", 0)), float(promise.get("confidence", 0))
    n, k = int(ev.get("heldout_bad", 0)), int(ev.get("heldout_caught", 0))
    if not (0 < r < 1 and 0.5 <= conf < 1):
        return f"promise min_recall={r} confidence={conf} is not a rate and a confidence"
    low = aa.lower_bound(k, n, conf)
    if low >= r:
        return None
    return (
        f"its held-out evidence ({k} of {n} bad masks caught) bounds the recall at {low:.3f} < the promised {r} "
        f"at {conf:.0%}"
    )


def parse(text: str | bytes) -> dict[str, Any]:
    """Verify a gate policy file: ``PolicyRefused`` (a ``ValueError``) when it is not one, its hash does not
    match its content, its model is incomplete, or its evidence does not bound its promise."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise aa.PolicyRefused(f"not a gate policy file (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise aa.PolicyRefused(f"not a gate policy file (format is not {FORMAT})")
    if doc.get("hash") != aa.content_hash(doc):
        raise aa.PolicyRefused("its hash does not match its content (edited after it was written)")
    try:
        model = doc["model"]
        width = len(model["features"])
        if not width or not all(len(model[k]) == width for k in ("mean", "scale", "coef")):
            raise aa.PolicyRefused(f"its model has not {width} features")
        if not model["isotonic"]["x"] or len(model["isotonic"]["x"]) != len(model["isotonic"]["y"]):
            raise aa.PolicyRefused("its isotonic calibration is empty or ragged")
        if not 0 <= float(doc["threshold"]) <= 1 or not aa.REF.match(f"policy:{doc['name']}@{'0' * 16}"):
            raise aa.PolicyRefused("its name or threshold is not valid")
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, aa.PolicyRefused):
            raise
        raise aa.PolicyRefused(f"its model is incomplete ({type(e).__name__}: {e})") from None
    problem = evidence_problem(doc)
    if problem:
        raise aa.PolicyRefused(f"refused: {problem}")
    return doc


def ref(doc: Mapping[str, Any]) -> str:
    """``policy:<name>@<hash>``: the version every verdict of this file records."""
    return f"policy:{doc['name']}@{str(doc['hash'])[:16]}"


def score_of(doc: Mapping[str, Any]) -> FileScore:
    return FileScore(doc["model"], _logit(1.0 - float(doc["threshold"])))


@functools.lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    del mtime_ns, size  # the cache key: an edited file is read (and refused) again
    with open(path, "rb") as f:
        return parse(f.read())


def read(path: str) -> dict[str, Any]:
    """The verified file at ``path`` (``PolicyRefused`` as ``parse``; ``OSError`` as ``ValueError``)."""
    try:
        st = os.stat(path)
        return _read(path, st.st_mtime_ns, st.st_size)
    except OSError as e:
        raise ValueError(f"quality-gate policy file {path}: {e.strerror or e}") from None
