"""``hitl learn gate`` (SPEC §14, docs/learning.md § The mask gate): a mask gate trained on the team's own
mask reviews, written as a versioned policy file (``deployments.quality.gate_file``).

The labels: every mask a person judged (``SUBJECT_DECIDED``): accepted is good, refined or rejected is
bad; a mask the gate passed is judged only when a spot check drew it (``GATE_SPOT_CHECKED``), and then
stands, as a sample weight, for the ``1 / share`` passed masks nobody looked at. The features: the gate's
scores recorded with the mask's verdict (``SUBJECT_GATED``; those every row carries, each also as
``log(1 + |x|)``): the picture around the outline (contrast, edge alignment, background-like share,
cut-off) and the mask against its box. The model: ``learn.fit_calibrated`` (logistic regression,
isotonic calibration on rows it did not see). The threshold: each mask's probability is cross-fitted
(folds by job, a job's masks together), the jobs are cut in two by ``learn.disjoint_parts``, the
threshold is the lowest that catches ``target_recall`` of the bad masks of the first part, and its recall
and precision are measured, with exact Clopper–Pearson bounds, on the second part alone. Refused when
that recall's lower bound falls below the promise, or there are too few bad masks to bound it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.model_selection import StratifiedGroupKFold
from sqlalchemy import select

from hitl_review.deployments.quality import gate_file
from hitl_review.statecore import autoapprove as aa
from hitl_review.statecore.ids import now_iso

from .db import Archive
from .learn import disjoint_parts, fit_calibrated
from .schema import ArchivedEvent

# The gate's scores the model may read (gate.score_mask): gate-v1's, recorded under every policy, then
# gate-v2's, recorded under a learned one.
CANDIDATES = (
    "fill",
    "box_gap",
    "box_agreement",
    "edge_touch",
    "cut_off",
    "components",
    "largest_share",
    "holes",
    "contrast",
    "edge_alignment",
    "bg_closer",
    "recut_iou",
    "solidity",
    "edge_share",
    "bg_like",
    "fg_iou_loose",
    "fg_iou_strict",
    "fg_stability",
    "bg_noise",
    "outline_fit",
)
FOLDS = 5
MIN_SUBJECTS = 40
GOOD = "ACCEPT"


# --------------------------------------------------------------------------- the data set


def rows_of(job_id: str, events: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per mask a person decided in a job: the last verdict's scores before the decision, the
    decision, and the sample weight of a spot check (``1 / share``)."""
    share = 0.0
    gated: dict[str, Mapping[str, Any]] = {}
    spots: dict[str, bool] = {}
    out: list[dict[str, Any]] = []
    for etype, data in events:
        box = str(data.get("box_id"))
        if etype == "JOB_CREATED":
            share = float((data.get("policy") or {}).get("mask_spot_check") or data.get("mask_spot_check") or 0)
        elif etype == "SUBJECT_GATED" and data.get("scores"):
            gated[box] = data
        elif etype == "GATE_SPOT_CHECKED":
            spots[box] = True
        elif etype == "SUBJECT_DECIDED" and box in gated:
            verdict = gated.pop(box)
            out.append(
                {
                    "job_id": job_id,
                    "box_id": box,
                    "scores": dict(verdict["scores"]),
                    "verdict": verdict.get("verdict"),
                    "gate": verdict.get("policy"),
                    "decision": data.get("decision"),
                    "good": data.get("decision") == GOOD,
                }
            )
    for r in out:
        spot = spots.get(r["box_id"], False) or r["verdict"] == "PASS"
        r["spot_check"] = spot
        r["weight"] = 1.0 / share if spot and share > 0 else 1.0
    return out


def dataset(archive: Archive, since: str | None = None) -> list[dict[str, Any]]:
    """Every mask a person decided in the archived jobs (``since``: events at or after that time)."""
    types = ("JOB_CREATED", "SUBJECT_GATED", "SUBJECT_DECIDED", "GATE_SPOT_CHECKED")
    by_job: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    with archive.reading() as s:
        q = select(ArchivedEvent.job_id, ArchivedEvent.type, ArchivedEvent.data, ArchivedEvent.at)
        q = q.where(ArchivedEvent.type.in_(types)).order_by(ArchivedEvent.job_id, ArchivedEvent.event_id)
        for job_id, etype, data, at in s.execute(q):
            if since and etype != "JOB_CREATED" and str(at) < since:
                continue
            by_job.setdefault(str(job_id), []).append((str(etype), data or {}))
    return [r for job_id, events in by_job.items() for r in rows_of(job_id, events)]


# --------------------------------------------------------------------------- fitting


def feature_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The candidates every row carries, each raw and as ``log1p:``."""
    have = [set(r["scores"]) for r in rows]
    kept = [f for f in CANDIDATES if all(f in h for h in have)]
    return [*kept, *(gate_file.LOG + f for f in kept)]


def matrix(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> np.ndarray:
    model = {"features": list(names)}
    return np.array([gate_file.row(model, r["scores"]) for r in rows], dtype=float)


def heldout_good(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, groups: Sequence[str], names: Sequence[str], seed: int = 0
) -> np.ndarray:
    """Each mask's probability of good from a model fitted without its job's fold (cross-fitting)."""
    p = np.zeros(len(y))
    k = max(2, min(FOLDS, int(min(np.bincount(y, minlength=2)))))
    for train, test in StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed).split(x, y, list(groups)):
        model = fit_calibrated(x[train], y[train], names, seed, w[train])
        p[test] = [aa.predict(model, v) for v in x[test]]
    return p


def choose(p: np.ndarray, bad: np.ndarray, target_recall: float) -> float:
    """The lowest threshold on the probability of good (a mask fails at or below it) that fails at least
    ``target_recall`` of the bad masks of this part."""
    for t in sorted(set(p.tolist())):
        if ((p <= t) & bad).sum() >= target_recall * bad.sum():
            return float(t)
    return 1.0


def judged(threshold: float, p: np.ndarray, bad: np.ndarray, confidence: float) -> dict[str, Any]:
    """Recall and precision of ``threshold`` on a part that took no part in choosing it, with one-sided
    exact lower bounds at ``confidence``."""
    failed = p <= threshold
    n_bad, caught, n_failed = int(bad.sum()), int((failed & bad).sum()), int(failed.sum())
    return {
        "heldout_subjects": len(p),
        "heldout_bad": n_bad,
        "heldout_caught": caught,
        "heldout_failed": n_failed,
        "recall": caught / n_bad if n_bad else 0.0,
        "recall_lower": aa.lower_bound(caught, n_bad, confidence),
        "precision": caught / n_failed if n_failed else 0.0,
        "precision_lower": aa.lower_bound(caught, n_failed, confidence),
        "fail_share": n_failed / len(p) if len(p) else 0.0,
    }


def gate_policy(
    rows: Sequence[Mapping[str, Any]],
    min_recall: float = 0.9,
    target_recall: float = 0.97,
    confidence: float = aa.DEFAULT_CONFIDENCE,
    name: str = "gate",
    seed: int = 0,
) -> dict[str, Any]:
    """The sealed gate policy file's content, or ``PolicyRefused`` saying why and what more it needs."""
    if not 0 < min_recall <= target_recall < 1 or not 0.5 <= confidence < 1:
        raise aa.PolicyRefused("--min-recall <= --target-recall must lie in (0, 1) and --confidence in [0.5, 1)")
    # all bad masks of the judging part caught: lower bound confidence-quantile = (1 - confidence)^(1/n)
    need = aa.approvals_needed(0, 1 - min_recall, confidence)
    n_bad = sum(1 for r in rows if not r["good"])
    if len(rows) < MIN_SUBJECTS or n_bad < 2 * need:
        raise aa.PolicyRefused(
            f"refused: {len(rows)} decided masks, {n_bad} of them refined or rejected; bounding a recall of "
            f"{min_recall} at {confidence:.0%} needs at least {need} bad masks, all caught, in the part that judges "
            f"the threshold and as many in the part that chooses it: about {max(1, 2 * need - n_bad)} more bad masks"
        )
    names = feature_names(rows)
    if not names:
        raise aa.PolicyRefused("refused: no gate score is recorded with every decided mask")
    x = matrix(rows, names)
    y = np.array([1 if r["good"] else 0 for r in rows], dtype=int)
    w = np.array([float(r.get("weight") or 1.0) for r in rows])
    jobs = [str(r["job_id"]) for r in rows]
    p = heldout_good(x, y, w, jobs, names, seed)
    pick, judge = disjoint_parts(jobs, seed)
    threshold = choose(p[pick], y[pick] == 0, target_recall)
    evidence = judged(threshold, p[judge], y[judge] == 0, confidence)
    if evidence["recall_lower"] < min_recall:
        raise aa.PolicyRefused(
            f"refused: the threshold chosen on one part catches {evidence['heldout_caught']} of the "
            f"{evidence['heldout_bad']} bad masks of the disjoint part that judges it: recall's lower bound "
            f"{evidence['recall_lower']:.3f} < {min_recall} at {confidence:.0%}; more decided masks (or features "
            "that tell these apart) are needed"
        )
    doc = {
        "format": gate_file.FORMAT,
        "kind": "gate",
        "name": name,
        "created_at": now_iso(),
        "promise": {"min_recall": min_recall, "confidence": confidence, "target_recall": target_recall},
        "bad": "a person refined or rejected the mask (good: accepted)",
        "threshold": threshold,
        "evidence": {
            **evidence,
            "chosen_on_subjects": int(pick.sum()),
            "method": f"cross-fitted by job, {FOLDS} folds, seed {seed}; threshold chosen on one half of the jobs "
            "(by a hash of the job id), judged on the other",
        },
        "training": {
            "subjects": len(rows),
            "bad": n_bad,
            "spot_checks": sum(1 for r in rows if r.get("spot_check")),
            "gates": sorted({str(r.get("gate")) for r in rows}),
        },
        "model": fit_calibrated(x, y, names, seed, w),
    }
    return aa.sealed(doc)
