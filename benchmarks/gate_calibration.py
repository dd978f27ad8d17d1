#!/usr/bin/env python
"""Calibrate gate-v5's threshold (``deployments/quality/gate_v5.py``: the mask checker's log-odds,
``gate_net``) on the labelled set.

For each calibration seed (never 0, the report's, nor the network's training seeds), every subject of
``--n`` images is segmented by the classical segmenter from the benchmark's boxes
(``cutout_quality.subject_boxes``) and scored with the policy's features; a mask is bad at IoU < 0.85.
Masks the degenerate-case thresholds already fail (fill, pieces) fail before the score; the threshold
is the score of the bad mask at ``--recall``. Prints the ``GATE_V5_SCORE`` literal, and the
calibration's own recall and precision at that threshold; ``--held-out`` first leaves each seed out in
turn (threshold on the others, figures on it: how far a threshold fixed in advance moves on unseen
images), ``--check-seeds`` reports its figures on more seeds. ``--rows`` keeps the scored rows (JSON),
``--from-rows`` starts from them without segmenting again.

    .venv/bin/python benchmarks/gate_calibration.py --seeds 11,12,13 --recall 0.98 --check-seeds 30,31

The retired gate-v2, gate-v3 and gate-v4 were fitted here too (boosted stumps, depth-2 trees): see
this file's git history before issue 38.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cutout_data import SPLITS, make_set
from benchmarks.cutout_quality import subject_boxes
from benchmarks.gate_net_training import TRAIN_SEEDS
from harness.bench import log
from hitl_review.deployments.backends.base import make_segmenter
from hitl_review.deployments.quality.gate import policy, score_mask
from hitl_review.deployments.quality.metrics import mask_iou

FEATURES: dict[str, tuple[str, ...]] = {"gate-v5": ("net_bad",)}
LITERAL = {"gate-v5": "GATE_V5_SCORE"}
NET_TRAIN_SEEDS = {int(s) for s in TRAIN_SEEDS.split(",")}


def score_rows(seeds: list[int], n: int, gate: str = "gate-v5") -> list[dict[str, Any]]:
    segmenter = make_segmenter("classical")
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        t0 = time.perf_counter()
        for split in SPLITS:
            for sample in make_set(split, n // len(SPLITS), seed):
                sha = hashlib.sha256(sample.image.tobytes()).hexdigest()
                boxes = subject_boxes(sample, seed)
                found = segmenter.segment(
                    sample.image, sha, [{"box_id": str(j), "bbox": b} for j, b in enumerate(boxes)]
                )
                for subject, bbox, item in zip(sample.subjects, boxes, found, strict=True):
                    mask = np.asarray(item["mask"], bool)
                    scores = score_mask(sample.image, bbox, mask, gate=gate)
                    rows.append({"seed": seed, "split": split, "iou": mask_iou(mask, subject.mask), "scores": scores})
        log(f"seed {seed}: {sum(r['seed'] == seed for r in rows)} subjects in {time.perf_counter() - t0:.0f} s")
    return rows


def degenerate(scores: dict[str, float], gate: str = "gate-v5") -> bool:
    """What a learned policy fails before its score: an empty or box-filling mask, a sliver, pieces."""
    p = policy(gate)
    return bool(
        scores["fill"] < p.min_fill or scores["fill"] > p.max_fill or scores["largest_share"] < p.min_largest_share
    )


def at_recall(score: np.ndarray, bad: np.ndarray, recall: float) -> float:
    """The threshold that fails ``recall`` of the bad rows (the score of the bad one just below)."""
    return float(np.sort(score[bad])[int(np.floor((1 - recall) * bad.sum()))])


def figures(score: np.ndarray, bad: np.ndarray, threshold: float) -> tuple[float, float]:
    failed = score >= threshold
    return (failed & bad).sum() / max(1, bad.sum()), (failed & bad).sum() / max(1, failed.sum())


def net_score(x: np.ndarray, rule: np.ndarray) -> np.ndarray:
    """gate-v5's score of rows ``x`` (``net_bad`` in the first column): its log-odds; degenerate rows fail."""
    p = np.clip(x[:, 0], 1e-6, 1 - 1e-6)
    return np.where(rule, np.inf, np.log(p / (1 - p)))


def check(rows: list[dict[str, Any]], threshold: float, args: argparse.Namespace) -> None:
    """Recall and precision at ``threshold`` on each seed of ``rows`` (never used to set it)."""
    got = []
    for s in sorted({r["seed"] for r in rows}):
        part = [r for r in rows if r["seed"] == s]
        x = np.array([[r["scores"][k] for k in FEATURES[args.policy]] for r in part], float)
        bad = np.array([r["iou"] < args.bad_iou for r in part])
        score = net_score(x, np.array([degenerate(r["scores"], args.policy) for r in part]))
        recall, precision = figures(score, bad, threshold)
        got.append((recall, precision))
        log(
            f"seed {s} (checked): {len(part)} subjects, {int(bad.sum())} bad, "
            f"recall {recall:.3f}, precision {precision:.3f}"
        )
    r, p = np.array(got).T
    log(
        f"checked, mean (min-max): recall {r.mean():.3f} ({r.min():.3f}-{r.max():.3f}), "
        f"precision {p.mean():.3f} ({p.min():.3f}-{p.max():.3f})"
    )


def held_out(x: np.ndarray, bad: np.ndarray, rule: np.ndarray, seed: np.ndarray, args: argparse.Namespace) -> None:
    """Leave one calibration seed out: fit and fix the threshold on the others, then recall and precision
    on the one left out (at the threshold, and the ranking's precision at recall 0.95): how far a
    threshold fixed in advance moves on images it never saw."""
    got = []
    for s in np.unique(seed):
        train, test = seed != s, seed == s
        threshold = at_recall(net_score(x[train], rule[train]), bad[train], args.recall)
        score = net_score(x[test], rule[test])
        recall, precision = figures(score, bad[test], threshold)
        ranked = figures(score, bad[test], at_recall(score, bad[test], 0.95))[1]
        got.append((recall, precision, ranked))
        log(f"seed {s} held out: recall {recall:.3f}, precision {precision:.3f} (at recall 0.95: {ranked:.3f})")
    r, p, q = np.array(got).T
    log(
        f"held out, mean (min-max): recall {r.mean():.3f} ({r.min():.3f}-{r.max():.3f}), precision "
        f"{p.mean():.3f} ({p.min():.3f}-{p.max():.3f}), at recall 0.95 {q.mean():.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="gate-v5", choices=sorted(FEATURES), help="the learned policy to calibrate")
    ap.add_argument("--seeds", default="1,2,3,4,5", help="calibration seeds (never 0: the report's)")
    ap.add_argument("--n", type=int, default=300, help="images per seed, half per split")
    ap.add_argument("--recall", type=float, default=0.97, help="the calibration set's recall the threshold keeps")
    ap.add_argument("--bad-iou", type=float, default=0.85)
    ap.add_argument("--held-out", action="store_true", help="also leave each seed out in turn (see held_out)")
    ap.add_argument("--check-seeds", default="", help="gate-v5: seeds to report the threshold's figures on")
    ap.add_argument("--rows", type=Path, default=None, help="write the scored rows here (JSON)")
    ap.add_argument("--from-rows", type=Path, default=None, help="refit from rows written by --rows")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if 0 in seeds:
        ap.error("seed 0 is the report's: calibrate on others")
    check_seeds = [int(s) for s in args.check_seeds.split(",") if s.strip()]
    if set(seeds + check_seeds) & set(NET_TRAIN_SEEDS):
        ap.error(f"{args.policy}'s network was trained on seeds {sorted(NET_TRAIN_SEEDS)}: calibrate on others")
    rows = json.loads(args.from_rows.read_text()) if args.from_rows else score_rows(seeds, args.n, args.policy)
    rows = [r for r in rows if r["seed"] in seeds]
    if args.rows:
        args.rows.write_text(json.dumps(rows))
    features = FEATURES[args.policy]
    x = np.array([[r["scores"][k] for k in features] for r in rows], float)
    bad = np.array([r["iou"] < args.bad_iou for r in rows])
    rule = np.array([degenerate(r["scores"], args.policy) for r in rows])
    if args.held_out:
        held_out(x, bad, rule, np.array([r["seed"] for r in rows]), args)
    score = net_score(x, rule)
    threshold = at_recall(score, bad, args.recall)
    recall, precision = figures(score, bad, threshold)
    log(
        f"calibration: {len(rows)} subjects, {int(bad.sum())} bad; at threshold {threshold:.4f}: recall "
        f"{recall:.3f}, precision {precision:.3f}"
    )
    print(f"{LITERAL[args.policy]} = NetScore(threshold={threshold:.4f})")
    if check_seeds:
        check(score_rows(check_seeds, args.n, args.policy), threshold, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
