"""The quality gate's recall on real work, from the archived jobs' events (``hitl learn report``;
statecore.gate_spot, docs/learning.md).

The population: the masks gated in jobs created with mask spot checks on (``JOB_CREATED`` carries
``mask_spot_check``), per gate policy (the verdict's ``policy``), each subject's first verdict
(``SUBJECT_GATED``). Every mask the gate failed went to a person, so the bad ones it caught are counted,
not sampled: a failed mask the person rejected or refined (``SUBJECT_DECIDED``). The bad masks it let
through are estimated from the spot checks (``GATE_SPOT_CHECKED``), a uniform random sample of the
passed masks drawn independently of the mask: miss rate ``q = k / n`` with its two-sided exact
(Clopper–Pearson) interval. Recall = caught / (caught + passed · q), decreasing in ``q``, so the
interval of ``q`` bounds it: its lower bound uses ``q``'s upper one.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select

from hitl_review.statecore import autoapprove as aa

from .db import Archive
from .schema import ArchivedEvent

TYPES = ("JOB_CREATED", "SUBJECT_GATED", "SUBJECT_DECIDED", "GATE_SPOT_CHECKED")


def tally(events_by_job: dict[str, list[tuple[str, dict[str, Any]]]]) -> dict[str, dict[str, int]]:
    """Per gate policy: passed, failed, failed_reviewed, failed_bad, spot_checks, spot_false_accepts."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for events in events_by_job.values():
        created = next((d for t, d in events if t == "JOB_CREATED"), {})
        if not float(created.get("mask_spot_check") or 0) > 0:
            continue
        verdict: dict[str, tuple[str, str]] = {}  # box_id -> (policy, PASS|FAIL): the first verdict
        decided: dict[str, str] = {}
        for etype, d in events:
            box = str(d.get("box_id"))
            if etype == "SUBJECT_GATED" and box not in verdict:
                verdict[box] = (str(d.get("policy")), str(d.get("verdict")))
            elif etype == "SUBJECT_DECIDED" and box not in decided:
                decided[box] = str(d.get("decision"))
            elif etype == "GATE_SPOT_CHECKED":
                c = out[str(d.get("policy"))]
                c["spot_checks"] += 1
                c["spot_false_accepts"] += bool(d.get("false_accept"))
        for box, (policy, v) in verdict.items():
            c = out[policy]
            if v == "PASS":
                c["passed"] += 1
            else:
                c["failed"] += 1
                if box in decided:
                    c["failed_reviewed"] += 1
                    c["failed_bad"] += decided[box] != "ACCEPT"
    return {k: dict(v) for k, v in out.items()}


def figures(c: dict[str, int], confidence: float = 0.95) -> dict[str, Any]:
    """Recall with its interval and precision from one gate policy's tally (None where nothing measures it)."""
    passed, n, k = c.get("passed", 0), c.get("spot_checks", 0), c.get("spot_false_accepts", 0)
    caught, reviewed = c.get("failed_bad", 0), c.get("failed_reviewed", 0)
    half = 1 - (1 - confidence) / 2
    out: dict[str, Any] = {
        "passed": passed,
        "failed": c.get("failed", 0),
        "failed_reviewed": reviewed,
        "failed_bad": caught,
        "spot_checks": n,
        "spot_false_accepts": k,
        "miss_rate": k / n if n else None,
        "miss_lower": aa.lower_bound(k, n, half) if n else None,
        "miss_upper": aa.upper_bound(k, n, half) if n else None,
        "precision": caught / reviewed if reviewed else None,
        "recall": None,
        "recall_lower": None,
        "recall_upper": None,
        "confidence": confidence,
    }
    if n:

        def recall(q: float) -> float | None:
            total = caught + passed * q
            return caught / total if total > 0 else None

        out["recall"] = recall(k / n)
        out["recall_lower"] = recall(out["miss_upper"])
        out["recall_upper"] = recall(out["miss_lower"])
    return out


def gate_report(archive: Archive, confidence: float = 0.95) -> dict[str, Any]:
    """``{"gates": {policy: figures}}`` over every archived job with mask spot checks on."""
    by_job: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    with archive.reading() as s:
        q = (
            select(ArchivedEvent.job_id, ArchivedEvent.type, ArchivedEvent.data)
            .where(ArchivedEvent.type.in_(TYPES))
            .order_by(ArchivedEvent.job_id, ArchivedEvent.event_id)
        )
        for job_id, etype, data in s.execute(q):
            by_job[job_id].append((etype, data or {}))
    return {"gates": {p: figures(c, confidence) for p, c in sorted(tally(by_job).items())}}


def lines(report: dict[str, Any]) -> list[str]:
    """``hitl learn report``'s lines for the gates."""
    out = []
    for policy, f in report["gates"].items():
        pct = f"{f['confidence']:.0%}"
        if f["recall"] is None:
            recall = "recall unknown (no spot check of a passed mask yet, or nothing caught)"
        else:
            recall = f"recall {f['recall']:.3f} ({pct} interval [{f['recall_lower']:.3f}, {f['recall_upper']:.3f}])"
        precision = "n/a" if f["precision"] is None else f"{f['precision']:.3f}"
        out.append(
            f"gate {policy}: {recall}; passed {f['passed']} masks, {f['spot_checks']} spot-checked, "
            f"{f['spot_false_accepts']} of them not accepted; failed {f['failed']}, {f['failed_bad']} of "
            f"{f['failed_reviewed']} reviewed were bad (precision {precision})"
        )
    return out
