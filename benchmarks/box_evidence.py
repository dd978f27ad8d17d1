"""Can image evidence from the detector tell the lists a reviewer changes from those approved as they
are? Offline, on the learning loop's shop (benchmarks/learning_loop.py: the `easy` split, the classical
detector, the simulated reviewer of benchmarks/learning_stream.py), the box policy's fitting code
(``archive.learn``: cross-fitted logistic regression + isotonic, threshold chosen on one half of the
jobs, bounded on the other) with the policy's features alone, then with the detector's evidence per box
(``ClassicalDetector.evidence``: how far the box would shrink without its shadow-like pixels, how many
separate parts it holds), then with that evidence shuffled among jobs (the ablation: a gain that
survives shuffling is no gain).

    .venv/bin/python benchmarks/box_evidence.py --jobs 1200 --json benchmarks/out/box_evidence.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from benchmarks import cutout_data
from benchmarks.learning_stream import review
from hitl_review.archive import learn
from hitl_review.deployments.backends.classical import ClassicalDetector
from hitl_review.statecore import autoapprove as aa


def rows_of(n: int, seed: int, keep_iou: float, start: int = 0) -> list[dict[str, Any]]:
    det = ClassicalDetector()
    rows = []
    t0 = time.monotonic()
    for i in range(start, start + n):
        s = cutout_data.make_sample("easy", i, seed)
        if not s.subjects:
            continue
        boxes = det.detect(s.image, f"img{i}")
        ev = det.evidence(s.image, [b["bbox"] for b in boxes])
        shown = [{**b, "box_id": f"b{k}", "evidence": e} for k, (b, e) in enumerate(zip(boxes, ev, strict=True))]
        truth = [{"bbox": sub.bbox, "label": sub.label} for sub in s.subjects]
        verdict = review(shown, truth, keep_iou)
        h, w = s.image.shape[:2]
        rows.append({"job_id": f"job{seed}-{i}", "width": w, "height": h, "boxes": shown, **verdict})
        if (i - start + 1) % 200 == 0:
            print(f"  {i - start + 1}/{n} images, {time.monotonic() - t0:.0f} s", flush=True)
    return rows


def policy_at(rows: list[dict[str, Any]], promise: float, p: np.ndarray) -> dict[str, Any]:
    """What ``archive.learn.box_policy`` decides for ``promise`` (the same steps, the figures kept): the
    cleanest threshold's approvals in the choosing half, and where a threshold bounds the promise
    there, what it does on the judging half."""
    y = np.array([1 if r["unchanged"] else 0 for r in rows])
    nonempty = np.array([bool(r["boxes"]) for r in rows])
    pick, judge = learn.disjoint_parts([str(r["job_id"]) for r in rows])
    chosen = learn.choose_threshold(p[pick], y[pick], nonempty[pick], promise, aa.DEFAULT_CONFIDENCE)
    out: dict[str, Any] = {"clean_in_choosing_half": chosen["clean_approved"], "choosing_half": chosen["total"]}
    if chosen["threshold"] is None:
        return {**out, "written": False}
    ev = learn.evidence_at(float(chosen["threshold"]), p[judge], y[judge], nonempty[judge], aa.DEFAULT_CONFIDENCE)
    return {
        **out,
        "written": ev["false_accept_upper"] <= promise,
        "approved": ev["heldout_approved"],
        "of": ev["heldout_jobs"],
        "false_accepts": ev["heldout_false_accepts"],
        "upper": round(ev["false_accept_upper"], 4),
        "share": round(ev["approve_share"], 3),
    }


def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "boxes": [{k: v for k, v in b.items() if k != "evidence"} for b in r["boxes"]]} for r in rows]


def shuffled(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    pool = [b["evidence"] for r in rows for b in r["boxes"]]
    rng.shuffle(pool)
    it = iter(pool)
    return [{**r, "boxes": [{**b, "evidence": next(it)} for b in r["boxes"]]} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--keep-iou", type=float, default=0.7)
    ap.add_argument("--promises", default="0.005,0.01,0.02,0.05")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = rows_of(args.jobs, args.seed, args.keep_iou)
    unchanged = sum(r["unchanged"] for r in rows)
    print(f"{len(rows)} jobs, {unchanged} unchanged ({unchanged / len(rows):.1%})")
    out: dict[str, Any] = {"jobs": len(rows), "unchanged": unchanged, "seed": args.seed, "rows": []}
    variants = (("features", strip(rows)), ("+evidence", rows), ("+shuffled", shuffled(rows, 1)))
    head = ("promise", "features", "AUC", "clean (choosing half)", "approved (judging half)", "FA", "bound")
    print("{:>8} {:<10} {:>6} {:>22} {:>24} {:>4} {:>7}  policy".format(*head))
    for name, data in variants:
        labels = learn.vocabulary(data)
        p = learn.heldout_probabilities(data, labels)
        auc = roc_auc_score([r["unchanged"] for r in data], p)
        for promise in [float(v) for v in args.promises.split(",")]:
            res = policy_at(data, promise, p)
            out["rows"].append({"promise": promise, "features": name, "auc": round(float(auc), 4), **res})
            judged = f"{res['approved']}/{res['of']} ({res['share']:.1%})" if "approved" in res else "-"
            print(
                f"{promise:>8} {name:<10} {auc:>6.3f} {res['clean_in_choosing_half']:>13}/{res['choosing_half']:<8} "
                f"{judged:>24} {res.get('false_accepts', '-'):>4} {res.get('upper', '-'):>7}  "
                f"{'written' if res['written'] else 'refused'}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
