"""The box auto-approval policy (SPEC §14, docs/learning.md): its versioned file, what it reads from a
detector's report, its decision, the spot-check draw and the exact binomial bounds it is judged by.

Pure: no I/O but reading the policy file's text given to it. The fitting lives in
``archive.learn`` (scikit-learn); a policy file holds the fitted model as plain numbers (a logistic
regression over standardised features, then an isotonic calibration's breakpoints), so evaluating it
here needs neither scikit-learn nor pickle, and its content hash names exactly what decides.

What a policy promises: of the jobs it approves, at most ``max_false_accept`` would have been
changed by a reviewer (a box kept, deleted, moved beyond IoU 0.9, relabelled or added), with that
rate's one-sided upper Clopper–Pearson bound at ``confidence`` measured on held-out jobs. A file
whose evidence does not bound its promise, or whose hash does not match its content, never loads
in ``on`` (:func:`load`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import orjson

from .ids import canonical_json

FORMAT = "hitl-box-policy/1"
MODES = ("off", "shadow", "on")
DEFAULT_SPOT_CHECK = 0.05
DEFAULT_CONFIDENCE = 0.95
MOVED_IOU = 0.9  # a model box the reviewer moved to below this IoU with itself counts as changed
MAX_LABELS = 8  # label-count features: the most frequent labels of the training window
REF = re.compile(r"^policy:[A-Za-z0-9_.-]{1,64}@[0-9a-f]{16}$")

# What the policy reads from the detector's report (and the image's size the job carries). Chosen to
# be what a reviewer's "this list is fine" depends on: how sure the model is (scores), how much there
# is (counts, areas), what tends to be wrong (overlapping duplicates, slivers, boxes cut by the edge)
# and what kind of picture it is. Label counts follow, one per label of the policy's vocabulary.
BASE_FEATURES = (
    "n_boxes",
    "score_max",
    "score_min",
    "score_mean",
    "n_low_score",
    "area_max",
    "area_min",
    "area_sum",
    "max_pair_iou",
    "n_overlapping_pairs",
    "n_on_border",
    "min_box_aspect",
    "image_aspect",
    "image_megapixels",
    "n_labels",
)
# What the detector saw in the picture around each box, where its backend reports it (a box's
# ``evidence``: ``shrink``, 1 − IoU of the box with its foreground less shadow-like pixels; ``parts``,
# the separate pieces of that foreground): a box that took in its subject's shadow or merged two
# subjects looks like any other to the features above. A policy uses these only when every job it
# was fitted on carried them (its model's ``features`` name them).
EVIDENCE_FEATURES = ("shrink_max", "shrink_mean", "parts_max", "n_multi_part")
LOW_SCORE = 0.5
OVERLAP_IOU = 0.3
BORDER = 0.01  # a box within 1 % of the image's side from its edge touches the border


class PolicyRefused(ValueError):
    """A policy file that may not be written or loaded as asked, with the reason in one line."""


# --------------------------------------------------------------------------- exact binomial bounds


def _beta() -> Any:
    """SciPy's beta distribution, imported on first use: scipy.stats costs ~1 s of CPU to import, and
    every process that imports the store (each Serve replica, each ``hitl`` command) would pay it at
    start for bounds that only a policy check computes."""
    from scipy.stats import beta

    return beta


def upper_bound(k: int, n: int, confidence: float) -> float:
    """One-sided upper Clopper–Pearson bound on a rate seen ``k`` times in ``n`` (1.0 with no data)."""
    if n <= 0 or k >= n:
        return 1.0
    return float(_beta().ppf(confidence, k + 1, n - k))


def lower_bound(k: int, n: int, confidence: float) -> float:
    """One-sided lower Clopper–Pearson bound (0.0 with no event seen)."""
    if n <= 0 or k <= 0:
        return 0.0
    return float(_beta().ppf(1 - confidence, k, n - k + 1))


def approvals_needed(k: int, max_false_accept: float, confidence: float) -> int:
    """The fewest approved held-out jobs, ``k`` of them false accepts, whose upper bound is ≤ the
    promise: with none, ``ln(1 − confidence) / ln(1 − R)`` (598 for 0.5 % at 95 %)."""
    if not 0 < max_false_accept < 1:
        raise PolicyRefused(f"max_false_accept {max_false_accept} must lie in (0, 1)")
    lo = max(k + 1, math.ceil(math.log(1 - confidence) / math.log(1 - max_false_accept)))
    hi = lo
    while upper_bound(k, hi, confidence) > max_false_accept:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if upper_bound(k, mid, confidence) <= max_false_accept:
            hi = mid
        else:
            lo = mid + 1
    return lo


# --------------------------------------------------------------------------- features


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def feature_names(labels: Sequence[str], evidence: bool = False) -> list[str]:
    extra = EVIDENCE_FEATURES if evidence else ()
    return [*BASE_FEATURES, *extra, *(f"label:{lab}" for lab in labels), "label:other"]


def has_evidence(boxes: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every box carries the detector's evidence (``EVIDENCE_FEATURES``)."""
    return all(isinstance(b.get("evidence"), Mapping) for b in boxes)


def features(
    boxes: Sequence[Mapping[str, Any]], width: int, height: int, labels: Sequence[str], evidence: bool = False
) -> list[float]:
    """The policy's inputs for one detection: ``boxes`` as the detector reported them (``bbox``,
    ``score``, ``label``, and with ``evidence`` what the detector saw around each), the image's size,
    and the policy's label vocabulary. A box without evidence reads as shrink 1 in no parts (for
    training rows; a policy that reads evidence gives such a list probability 0: ``BoxPolicy``)."""
    w, h = max(float(width), 1.0), max(float(height), 1.0)
    bbs = [tuple(float(v) for v in b["bbox"]) for b in boxes]
    scores = [float(b.get("score") or 0.0) for b in boxes]
    areas = [max(0.0, (x2 - x1) * (y2 - y1)) / (w * h) for x1, y1, x2, y2 in bbs]
    pairs = [iou(a, b) for a, b in combinations(bbs, 2)]
    bw, bh = BORDER * w, BORDER * h
    border = sum(1 for x1, y1, x2, y2 in bbs if x1 <= bw or y1 <= bh or x2 >= w - bw or y2 >= h - bh)
    aspects = [min(x2 - x1, y2 - y1) / max(x2 - x1, y2 - y1, 1e-9) for x1, y1, x2, y2 in bbs]
    names = [str(b.get("label") or "") for b in boxes]
    n = len(boxes)
    row = [
        float(n),
        max(scores, default=0.0),
        min(scores, default=0.0),
        sum(scores) / n if n else 0.0,
        float(sum(1 for s in scores if s < LOW_SCORE)),
        max(areas, default=0.0),
        min(areas, default=0.0),
        sum(areas),
        max(pairs, default=0.0),
        float(sum(1 for v in pairs if v > OVERLAP_IOU)),
        float(border),
        min(aspects, default=0.0),
        w / h,
        w * h / 1e6,
        float(len(set(names))),
    ]
    if evidence:
        ev: list[Mapping[str, Any]] = []
        for b in boxes:
            seen = b.get("evidence")
            ev.append(seen if isinstance(seen, Mapping) else {})
        shrink = [float(e.get("shrink", 1.0)) for e in ev]
        parts = [float(e.get("parts", 0.0)) for e in ev]
        row += [
            max(shrink, default=0.0),
            sum(shrink) / n if n else 0.0,
            max(parts, default=0.0),
            float(sum(1 for v in parts if v >= 2)),
        ]
    known = set(labels)
    row += [float(names.count(lab)) for lab in labels]
    row.append(float(sum(1 for x in names if x not in known)))
    return row


def unchanged(shown: Sequence[Mapping[str, Any]], final: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """Whether a reviewer approved the detector's list ``shown`` as it was, given the list they
    submitted (``final``, matched by ``box_id``), and if not, the first change seen: a box added,
    deleted, skipped, relabelled, or moved beyond IoU ``MOVED_IOU``."""
    before = {str(b["box_id"]): b for b in shown}
    seen = set()
    for b in final:
        old = before.get(str(b.get("box_id")))
        if old is None:
            return False, "added"
        seen.add(str(old["box_id"]))
        if b.get("target_policy", "SEGMENT") != "SEGMENT":
            return False, "skipped"
        if (b.get("label") or None) != (old.get("label") or None):
            return False, "relabelled"
        if iou([float(v) for v in old["bbox"]], [float(v) for v in b["bbox"]]) < MOVED_IOU:
            return False, "moved"
    if len(seen) < len(before):
        return False, "deleted"
    return True, ""


# --------------------------------------------------------------------------- the model


def predict(model: Mapping[str, Any], x: Sequence[float]) -> float:
    """The calibrated probability that a reviewer approves the list unchanged: the logistic score
    of the standardised features, mapped through the isotonic breakpoints (linear between them,
    flat beyond, as scikit-learn's ``IsotonicRegression(out_of_bounds="clip")`` predicts)."""
    z = float(model["intercept"])
    for v, m, s, c in zip(x, model["mean"], model["scale"], model["coef"], strict=True):
        z += float(c) * (float(v) - float(m)) / (float(s) or 1.0)
    raw = 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0
    xs, ys = model["isotonic"]["x"], model["isotonic"]["y"]
    if raw <= xs[0]:
        return float(ys[0])
    if raw >= xs[-1]:
        return float(ys[-1])
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xs[mid] <= raw:
            lo = mid
        else:
            hi = mid
    x0, x1, y0, y1 = xs[lo], xs[hi], ys[lo], ys[hi]
    return float(y0 + (y1 - y0) * (raw - x0) / (x1 - x0)) if x1 > x0 else float(y1)


# --------------------------------------------------------------------------- the file


def content_hash(doc: Mapping[str, Any]) -> str:
    """SHA-256 of the file's canonical JSON without its ``hash``: what ``policy:<name>@<hash>`` names."""
    body = {k: v for k, v in doc.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def sealed(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with its content hash."""
    out = dict(doc)
    out["hash"] = content_hash(out)
    return out


@dataclass(frozen=True)
class BoxPolicy:
    """A loaded, verified policy file."""

    doc: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.doc["name"])

    @property
    def ref(self) -> str:
        """``policy:<name>@<hash>``: what every decision it makes is recorded under."""
        return f"policy:{self.name}@{str(self.doc['hash'])[:16]}"

    @property
    def threshold(self) -> float:
        return float(self.doc["threshold"])

    @property
    def max_false_accept(self) -> float:
        return float(self.doc["promise"]["max_false_accept"])

    @property
    def confidence(self) -> float:
        return float(self.doc["promise"]["confidence"])

    @property
    def labels(self) -> list[str]:
        return [str(x) for x in self.doc["model"]["labels"]]

    @property
    def reads_evidence(self) -> bool:
        """Whether its model reads the detector's evidence (it was fitted on jobs that all carried it)."""
        return uses_evidence(self.doc["model"])

    def probability(self, boxes: Sequence[Mapping[str, Any]], width: int, height: int) -> float:
        """0 for a list with a box its detector said nothing about, when the model reads evidence."""
        if self.reads_evidence and not has_evidence(boxes):
            return 0.0
        return predict(self.doc["model"], features(boxes, width, height, self.labels, self.reads_evidence))


def uses_evidence(model: Mapping[str, Any]) -> bool:
    return EVIDENCE_FEATURES[0] in (model.get("features") or ())


def evidence_problem(doc: Mapping[str, Any]) -> str | None:
    """Why the recorded held-out evidence does not bound the promise (recomputed, never trusted
    from the file's own figures), or None when it does."""
    promise, ev = doc.get("promise") or {}, doc.get("evidence") or {}
    r, conf = float(promise.get("max_false_accept", 0)), float(promise.get("confidence", 0))
    n, k = int(ev.get("heldout_approved", 0)), int(ev.get("heldout_false_accepts", 0))
    if not (0 < r < 1 and 0.5 <= conf < 1):
        return f"promise max_false_accept={r} confidence={conf} is not a rate and a confidence"
    bound = upper_bound(k, n, conf)
    if bound <= r:
        return None
    more = approvals_needed(k, r, conf) - n
    return (
        f"its held-out evidence ({k} false accepts in {n} approved jobs) bounds the false-accept rate at "
        f"{bound:.4f} > the promised {r} at {conf:.0%}; it needs at least {more} more approved held-out jobs "
        "without a false accept"
    )


def load(text: str | bytes, mode: str = "on") -> BoxPolicy:
    """Verify and load a policy file. Refused (``PolicyRefused``) when it is not one, its hash does not
    match its content, or, for ``on``, its evidence does not bound its promise (``shadow`` only
    watches, so an unbounded policy may be watched there)."""
    if mode not in MODES:
        raise PolicyRefused(f"mode {mode!r} must be one of {', '.join(MODES)}")
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise PolicyRefused(f"not a policy file (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PolicyRefused(f"not a policy file (format is not {FORMAT})")
    if doc.get("hash") != content_hash(doc):
        raise PolicyRefused("its hash does not match its content (edited after it was written)")
    try:
        model = doc["model"]
        names = feature_names(model["labels"], uses_evidence(model))
        width = len(names)
        if not all(len(model[k]) == width for k in ("mean", "scale", "coef")):
            raise PolicyRefused(f"its model has not {width} features")
        if "features" in model and list(model["features"]) != names:
            raise PolicyRefused("its model names features this version does not compute")
        iso = model["isotonic"]
        if not iso["x"] or len(iso["x"]) != len(iso["y"]):
            raise PolicyRefused("its isotonic calibration is empty or ragged")
        if not re.match(r"^[A-Za-z0-9_.-]{1,64}$", str(doc["name"])) or not 0 <= float(doc["threshold"]) <= 1:
            raise PolicyRefused("its name or threshold is not valid")
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, PolicyRefused):
            raise
        raise PolicyRefused(f"its model is incomplete ({type(e).__name__}: {e})") from None
    if mode == "on":
        problem = evidence_problem(doc)
        if problem:
            raise PolicyRefused(f"refused in on: {problem}")
    return BoxPolicy(doc)


# --------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class Ask:
    """What the store gives the decider for one detection: the loaded policy, the live mode (kept in
    Redis: a drop to shadow reaches every replica), the spot-check share, and a uniform draw in
    [0, 1) made before planning (the plan stays pure; the draw is seeded in tests)."""

    policy: BoxPolicy
    mode: str
    spot_check: float
    draw: float


@dataclass(frozen=True)
class Decision:
    policy: str  # policy:<name>@<hash>
    mode: str
    p: float
    threshold: float
    would_approve: bool
    spot_check: bool

    @property
    def approve(self) -> bool:
        """The job takes the policy's edge (DETECTING → PROCESSING_APPROVED_SUBJECTS)."""
        return self.mode == "on" and self.would_approve and not self.spot_check

    def record(self) -> dict[str, Any]:
        """What the job keeps for the control plane alone (never in its snapshot, pause or events)
        while a person reviews it, to compare with their decision."""
        return {
            "policy": self.policy,
            "mode": self.mode,
            "p": round(self.p, 6),
            "threshold": self.threshold,
            "would_approve": self.would_approve,
            "spot_check": self.spot_check,
        }


def spot_drawn(draw: float, share: float) -> bool:
    """Whether a job the policy would approve goes to a person all the same."""
    return draw < share


def decide(ask: Ask, boxes: Sequence[Mapping[str, Any]], width: int, height: int) -> Decision | None:
    """The policy's decision on one detection; None when it has no say (mode off). An empty list is
    never approved: a person may still draw what the model missed."""
    if ask.mode not in ("shadow", "on"):
        return None
    p = ask.policy.probability(boxes, width, height)
    would = bool(boxes) and p >= ask.policy.threshold
    spot = ask.mode == "on" and would and spot_drawn(ask.draw, ask.spot_check)
    return Decision(ask.policy.ref, ask.mode, p, ask.policy.threshold, would, spot)


def should_drop(spot_checks: int, false_accepts: int, policy: BoxPolicy) -> tuple[bool, float]:
    """The live check: drop to shadow when the spot checks' false-accept rate's lower confidence
    bound rises above the promise (the rate is then above it with that confidence)."""
    low = lower_bound(false_accepts, spot_checks, policy.confidence)
    return low > policy.max_false_accept, low
