"""Learning from reviewers' decisions (SPEC §14, docs/learning.md): the data set the archive holds of
what reviewers did with what the detector proposed, and the box auto-approve policy fitted on it.

The model is a logistic regression over the detection's features (``statecore.autoapprove.features``),
calibrated by isotonic regression on jobs the regression did not see (scikit-learn for both). Each job's
probability is held out by cross-fitting (from a model fitted on the other folds); the jobs are then cut
in two disjoint parts by a hash of their id (``disjoint_parts``): the threshold is chosen on the first —
the lowest one whose approved jobs' false-accept rate has a one-sided upper Clopper–Pearson bound ≤ the
promise — and judged on the second, which never took part in the choice: the file's evidence is the
second part's count, and it must bound the promise too. (Choosing and bounding on the same jobs picks the
threshold where the luck of those jobs is best, and the bound then flatters it.) The file ships the same
recipe fitted on every job. When the evidence cannot bound the promise nothing is written, and the
refusal says how many more reviewed jobs it needs. ``archive.learn_gate`` fits the mask gate with the
same pieces (``fit_calibrated``, ``disjoint_parts``).

Feedback (DESIGN.md's traps): a job a policy approved is no label for any policy; its spot checks are
(a person decided them, unaware). Selection: every reviewed job with a detection counts, not only those
a rule picked.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, train_test_split
from sklearn.preprocessing import StandardScaler
from sqlalchemy import select

from hitl_review.statecore import autoapprove as aa
from hitl_review.statecore.ids import now_iso

from .db import Archive
from .schema import ArchivedEvent, ArchivedJob

FOLDS = 5
MIN_JOBS = 20  # fewer reviewed jobs than this: nothing to fit


# --------------------------------------------------------------------------- the data set


def row_of(job_id: str, snapshot: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One job as training data: what the detector proposed (its first review's list), the image's
    size, and whether the reviewer approved the list unchanged; None for a job that is no label (no
    detection, never reviewed, or approved by a policy: feedback)."""
    types = [e["type"] for e in events]
    if "AUTO_APPROVED" in types:
        return None
    shown: list[dict[str, Any]] | None = None
    accepted: Mapping[str, Any] | None = None
    for e in events:
        data = e.get("data") or {}
        if shown is None and e["type"] == "PAUSE_OPENED":
            pause = data.get("active_pause") or {}
            if pause.get("stage") != "WAITING_USER_SELECTION" or int(pause.get("round", 1)) != 1:
                return None
            shown = [dict(b) for b in data.get("box_list") or []]
        elif shown is not None and e["type"] == "INTERVENTION_ACCEPTED":
            accepted = data
            break
    if not shown or accepted is None:
        return None
    diff = accepted.get("diff") or {}
    if diff.get("added"):
        same, change = False, "added"
    elif diff.get("deleted"):
        same, change = False, "deleted"
    else:  # nothing added: the list the job ends with is the one the reviewer submitted
        same, change = aa.unchanged(shown, snapshot.get("box_list") or [])
    image = snapshot.get("image") or {}
    return {
        "job_id": job_id,
        "finished_at": next((e["at"] for e in events if e["type"] == "JOB_FINISHED"), snapshot.get("updated_at")),
        "width": int(image.get("width") or 1),
        "height": int(image.get("height") or 1),
        "boxes": [_proposed(b) for b in shown],
        "unchanged": same,
        "change": change,
        "spot_check": "POLICY_SPOT_CHECKED" in types,
    }


def _proposed(box: Mapping[str, Any]) -> dict[str, Any]:
    """A box of the first review's list as the policy reads it: with the detector's evidence where
    the box carries it (``statecore.models.DetectorEvidence``)."""
    out = {"bbox": box["bbox"], "score": box.get("score"), "label": box.get("label")}
    if isinstance(box.get("evidence"), Mapping):
        out["evidence"] = dict(box["evidence"])
    return out


def dataset(archive: Archive, since: str | None = None) -> list[dict[str, Any]]:
    """Every archived job that is a label, oldest first (by when it finished)."""
    rows: list[dict[str, Any]] = []
    with archive.reading() as s:
        q = select(ArchivedJob.job_id, ArchivedJob.snapshot).order_by(ArchivedJob.finished_ts, ArchivedJob.job_id)
        if since:
            q = q.where(ArchivedJob.finished_at >= since)
        for job_id, snapshot in s.execute(q):
            evq = select(ArchivedEvent.type, ArchivedEvent.at, ArchivedEvent.data).where(ArchivedEvent.job_id == job_id)
            events = [{"type": t, "at": at, "data": d} for t, at, d in s.execute(evq.order_by(ArchivedEvent.event_id))]
            row = row_of(job_id, snapshot, events)
            if row is not None:
                rows.append(row)
    return rows


# --------------------------------------------------------------------------- fitting


def vocabulary(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The most frequent labels of the window (ties by name): one count feature each."""
    c = Counter(str(b.get("label") or "") for r in rows for b in r["boxes"])
    return [lab for lab, _ in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[: aa.MAX_LABELS]]


def with_evidence(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the detector's evidence may be read: every box of every job carries it (a window that
    spans a detector without it would teach the model that its absence means something)."""
    return any(r["boxes"] for r in rows) and all(aa.has_evidence(r["boxes"]) for r in rows)


def matrix(
    rows: Sequence[Mapping[str, Any]], labels: Sequence[str], evidence: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([aa.features(r["boxes"], r["width"], r["height"], labels, evidence) for r in rows], dtype=float)
    y = np.array([1 if r["unchanged"] else 0 for r in rows], dtype=int)
    return x, y


def fit_model(
    x: np.ndarray, y: np.ndarray, labels: Sequence[str], seed: int = 0, evidence: bool = False
) -> dict[str, Any]:
    """The box policy's model over ``autoapprove.features`` with the vocabulary ``labels``."""
    return {"labels": list(labels), **fit_calibrated(x, y, aa.feature_names(labels, evidence), seed)}


def fit_calibrated(
    x: np.ndarray, y: np.ndarray, names: Sequence[str], seed: int = 0, weight: np.ndarray | None = None
) -> dict[str, Any]:
    """The logistic regression on two thirds, its isotonic calibration on the other third (rows the
    regression did not see), as the plain numbers ``autoapprove.predict`` reads; ``weight``: each row's
    sample weight (a spot-checked mask stands for the passed ones nobody looked at)."""
    w = np.ones(len(y)) if weight is None else np.asarray(weight, float)
    strat = y if min(np.bincount(y, minlength=2)) >= 2 else None
    xa, xb, ya, yb, wa, wb = train_test_split(x, y, w, test_size=1 / 3, random_state=seed, stratify=strat)
    scaler = StandardScaler().fit(xa)
    if len(set(ya.tolist())) < 2:  # one class only: a constant score, calibrated to its rate
        coef, intercept = np.zeros(x.shape[1]), 0.0
    else:
        lr = LogisticRegression(C=1.0, max_iter=5000).fit(scaler.transform(xa), ya, sample_weight=wa)
        coef, intercept = lr.coef_[0], float(lr.intercept_[0])
    raw = 1 / (1 + np.exp(-(scaler.transform(xb) @ coef + intercept)))
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(raw, yb, sample_weight=wb)
    return {
        "kind": "logistic+isotonic",
        "features": list(names),
        "mean": [float(v) for v in scaler.mean_],
        "scale": [float(v) for v in scaler.scale_],
        "coef": [float(v) for v in coef],
        "intercept": intercept,
        "isotonic": {"x": [float(v) for v in iso.X_thresholds_], "y": [float(v) for v in iso.y_thresholds_]},
    }


def heldout_probabilities(
    rows: Sequence[Mapping[str, Any]], labels: Sequence[str], folds: int = FOLDS, seed: int = 0
) -> np.ndarray:
    """Each job's probability from a model fitted without its fold (cross-fitting)."""
    evidence = with_evidence(rows)
    x, y = matrix(rows, labels, evidence)
    p = np.zeros(len(rows))
    k = max(2, min(folds, int(min(np.bincount(y, minlength=2)))))
    split = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(x, y)
    for train, test in split:
        model = fit_model(x[train], y[train], labels, seed, evidence)
        p[test] = [aa.predict(model, row) for row in x[test]]
    return p


def disjoint_parts(keys: Sequence[str], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint halves of the rows by a hash of ``keys`` (a job's id: a job's rows stay together):
    the threshold is chosen on the first and bounded on the second. The same job falls on the same side
    on every run with the same ``seed``."""
    first = np.array([hashlib.sha256(f"{seed}:{k}".encode()).digest()[0] < 128 for k in keys], dtype=bool)
    return first, ~first


def choose_threshold(
    p: np.ndarray, y: np.ndarray, nonempty: np.ndarray, max_false_accept: float, confidence: float
) -> dict[str, Any]:
    """The lowest threshold whose approved jobs' false-accept upper bound is ≤ the promise (``threshold``
    None when none), and the most approvals any threshold made without a false accept (``clean_approved``
    of ``total``): the choice only, judged on other jobs by ``evidence_at``."""
    best: float | None = None
    clean = 0
    for t in sorted(set(p[nonempty].tolist()), reverse=True):
        approved = nonempty & (p >= t)
        n, k = int(approved.sum()), int((approved & (y == 0)).sum())
        if k == 0 and n > clean:
            clean = n
        if aa.upper_bound(k, n, confidence) <= max_false_accept:
            best = float(t)
    return {"threshold": best, "clean_approved": clean, "total": len(p)}


def evidence_at(
    threshold: float, p: np.ndarray, y: np.ndarray, nonempty: np.ndarray, confidence: float
) -> dict[str, Any]:
    """What ``threshold`` does on held-out jobs that took no part in choosing it: the file's evidence."""
    approved = nonempty & (p >= threshold)
    n, k, total = int(approved.sum()), int((approved & (y == 0)).sum()), len(p)
    positives = int((y == 1).sum())
    return {
        "heldout_jobs": total,
        "heldout_approved": n,
        "heldout_false_accepts": k,
        "false_accept_rate": k / n if n else 0.0,
        "false_accept_upper": aa.upper_bound(k, n, confidence),
        "approve_share": n / total if total else 0.0,
        "approve_share_lower": aa.lower_bound(n, total, confidence),
        # unchanged lists the policy still sends to a person (the time it does not save)
        "missed_unchanged": int(((y == 1) & ~approved).sum()),
        "unchanged_share": positives / total if total else 0.0,
    }


def refusal(chosen: Mapping[str, Any], max_false_accept: float, confidence: float, parts: int = 2) -> str:
    """Why no policy, and about how many more reviewed jobs it needs: ``chosen`` is what the choosing part
    saw (``choose_threshold``); the bounding part must show as many approvals again (``parts``)."""
    need = aa.approvals_needed(0, max_false_accept, confidence)
    total, clean = int(chosen["total"]), int(chosen["clean_approved"])
    have = total * parts
    if clean:
        more = max(1, math.ceil(need * total / clean) * parts - have)
        share = f"{clean} of {total} in the choosing part"
        how = f"at this data's approval share ({share}), about {more} more reviewed jobs"
    else:
        how = (
            f"no threshold approved any held-out job without a false accept, so at least {max(need * parts - have, 1)} "
            "more reviewed jobs, and features that tell these apart"
        )
    return (
        f"refused: the held-out evidence cannot bound the false-accept rate at {max_false_accept} with "
        f"{confidence:.0%} confidence; that needs at least {need} approved held-out jobs without a false accept "
        f"(ln(1-{confidence})/ln(1-{max_false_accept})) in the part that chooses the threshold and as many again "
        f"in the disjoint part that bounds it; the best threshold approved {clean}: {how}"
    )


def unbounded(ev: Mapping[str, Any], threshold: float, max_false_accept: float, confidence: float) -> str:
    """The refusal when the threshold chosen on one part does not bound the promise on the other."""
    n, k = int(ev["heldout_approved"]), int(ev["heldout_false_accepts"])
    more = aa.approvals_needed(k, max_false_accept, confidence) - n
    return (
        f"refused: the threshold {threshold:.4f} chosen on one part of the held-out jobs approves {n} of the "
        f"{ev['heldout_jobs']} jobs of the disjoint part that judges it, {k} of them false accepts: upper bound "
        f"{ev['false_accept_upper']:.4f} > {max_false_accept} at {confidence:.0%}; about {more} more approved jobs "
        "there (twice as many more reviewed jobs at this share) would bound it"
    )


def box_policy(
    rows: Sequence[Mapping[str, Any]],
    max_false_accept: float,
    confidence: float = aa.DEFAULT_CONFIDENCE,
    name: str = "box",
    folds: int = FOLDS,
    seed: int = 0,
) -> dict[str, Any]:
    """The sealed policy file's content, or ``PolicyRefused`` saying why and how many more jobs it needs."""
    if not 0 < max_false_accept < 1 or not 0.5 <= confidence < 1:
        raise aa.PolicyRefused("--max-false-accept must lie in (0, 1) and --confidence in [0.5, 1)")
    if len(rows) < MIN_JOBS:
        raise aa.PolicyRefused(
            f"refused: {len(rows)} reviewed jobs; at least {aa.approvals_needed(0, max_false_accept, confidence)} "
            "approved held-out jobs without a false accept are needed to bound the promise"
        )
    labels = vocabulary(rows)
    seen = with_evidence(rows)  # what the detector saw around its boxes: read when every job has it
    x, y = matrix(rows, labels, seen)
    if len(set(y.tolist())) < 2:
        raise aa.PolicyRefused("refused: every reviewed job has the same outcome; nothing tells them apart")
    p = heldout_probabilities(rows, labels, folds, seed)
    nonempty = np.array([bool(r["boxes"]) for r in rows])
    pick, judge = disjoint_parts([str(r["job_id"]) for r in rows], seed)
    chosen = choose_threshold(p[pick], y[pick], nonempty[pick], max_false_accept, confidence)
    if chosen["threshold"] is None:
        raise aa.PolicyRefused(refusal(chosen, max_false_accept, confidence))
    threshold = float(chosen["threshold"])
    evidence = evidence_at(threshold, p[judge], y[judge], nonempty[judge], confidence)
    if evidence["false_accept_upper"] > max_false_accept:
        raise aa.PolicyRefused(unbounded(evidence, threshold, max_false_accept, confidence))
    stamps = sorted(str(r["finished_at"]) for r in rows if r.get("finished_at"))
    doc = {
        "format": aa.FORMAT,
        "kind": "box",
        "name": name,
        "created_at": now_iso(),
        "promise": {"max_false_accept": max_false_accept, "confidence": confidence},
        "threshold": threshold,
        "evidence": {
            **evidence,
            "method": f"cross-fitted, {folds} folds, seed {seed}; threshold chosen on {chosen['total']} jobs, "
            f"judged on the {evidence['heldout_jobs']} others (disjoint halves by job id)",
            "chosen_on_jobs": chosen["total"],
        },
        "training": {
            "from": stamps[0] if stamps else None,
            "to": stamps[-1] if stamps else None,
            "jobs": len(rows),
            "unchanged": int(y.sum()),
            "spot_checks": sum(1 for r in rows if r.get("spot_check")),
        },
        "model": fit_model(x, y, labels, seed, seen),
    }
    return aa.sealed(doc)


# --------------------------------------------------------------------------- the report

REPORTED = ("AUTO_APPROVED", "POLICY_SPOT_CHECKED", "POLICY_SHADOW_COMPARED")


def policy_report(archive: Archive, policy_text: str | None = None, confidence: float = 0.95) -> dict[str, Any]:
    """Per policy (``policy:<name>@<hash>``), from the archived jobs' events: jobs approved automatically,
    spot checks and their false accepts with the rate's two-sided exact interval, and shadow agreement."""
    tally: dict[str, Counter[str]] = {}
    with archive.reading() as s:
        q = select(ArchivedEvent.type, ArchivedEvent.data).where(ArchivedEvent.type.in_(REPORTED))
        for etype, data in s.execute(q):
            c = tally.setdefault(str(data.get("policy")), Counter())
            if etype == "AUTO_APPROVED":
                c["auto"] += 1
            elif etype == "POLICY_SPOT_CHECKED":
                c["spot"] += 1
                c["spot_fa"] += bool(data.get("false_accept"))
            else:
                c["shadow"] += 1
                c["shadow_agree"] += bool(data.get("agreed"))
                c["shadow_fa"] += bool(data.get("false_accept"))
    half = 1 - (1 - confidence) / 2
    out: dict[str, Any] = {"policies": {}}
    for ref, c in sorted(tally.items()):
        n, k = c["spot"], c["spot_fa"]
        out["policies"][ref] = {
            "auto_approved": c["auto"],
            "spot_checks": n,
            "spot_false_accepts": k,
            "spot_rate": k / n if n else 0.0,
            "spot_lower": aa.lower_bound(k, n, half),
            "spot_upper": aa.upper_bound(k, n, half),
            "shadow_reviewed": c["shadow"],
            "shadow_agreement": c["shadow_agree"] / c["shadow"] if c["shadow"] else 0.0,
            "shadow_false_accepts": c["shadow_fa"],
        }
    if policy_text is not None:
        p = aa.load(policy_text, "shadow")
        out["file"] = {"ref": p.ref, "promise": p.doc["promise"], "evidence": p.doc["evidence"]}
    return out
