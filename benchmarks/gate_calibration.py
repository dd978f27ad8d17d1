#!/usr/bin/env python
"""Calibrate a learned gate policy's score (``--policy gate-v2``: ``deployments/quality/gate_v2.py``;
``gate-v3``: ``gate_v3.py``, gate-v2's features and its own) on the labelled set.

For each calibration seed (default 1-5; the report is on seed 0, which calibration never sees), every
subject of ``--n`` images is segmented by the classical segmenter from the benchmark's boxes
(``cutout_quality.subject_boxes``) and scored with the policy's features; a mask is bad at IoU < 0.85.
Masks the policy's degenerate-case thresholds already fail (fill, pieces) are left out; on the rest,
boosted decision stumps with a logistic loss (``--rounds`` of step ``--step``, each feature cut at
``--bins`` quantiles) are fitted and collapsed into one step function per feature, and the threshold
is the score of the bad mask at ``--recall``. Prints the ``GATE_V2_SCORE`` (``GATE_V3_SCORE``) literal
to paste into ``gate_v2.py`` (``gate_v3.py``), and the calibration's own recall and precision at that
threshold; ``--held-out`` first leaves each seed out in turn (fit and threshold on the others, figures
on it: how far a threshold fixed in advance moves on unseen images). ``--rows`` keeps the scored rows
(JSON), ``--from-rows`` refits from them without segmenting again.

    .venv/bin/python benchmarks/gate_calibration.py --rows /tmp/gate_rows.json    # ~10 min on 2 cores
    .venv/bin/python benchmarks/gate_calibration.py --from-rows /tmp/gate_rows.json --recall 0.97
    .venv/bin/python benchmarks/gate_calibration.py --policy gate-v3 --rows /tmp/gate_v3_rows.json --held-out
    .venv/bin/python benchmarks/gate_calibration.py --policy gate-v4 --seeds 1,2,3,4,5,6,7,8,9,10 --held-out

``gate-v4`` (``gate_v4.py``) is fitted as depth-2 trees (``fit_trees``: each round one split, then one
more on each side), printed as ``gate_v4_model.py``'s ``GATE_V4_SCORE``. Trees fit their own training
rows too well for a threshold read off them (leaving one seed out, a threshold at recall 0.98 on the
training scores kept only 0.95 on the seed left out), so its threshold is read off out-of-fold scores:
the calibration seeds in ``--folds`` groups, each scored by trees fitted on the others.
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
from hitl_review.deployments.quality.gate_v3 import V3_FEATURES
from hitl_review.deployments.quality.gate_v4 import GAP_FEATURES
from hitl_review.deployments.quality.metrics import mask_iou

FEATURES_V2 = (
    *("fill", "box_gap", "box_agreement", "edge_touch", "cut_off", "holes", "contrast", "edge_alignment", "bg_closer"),
    *("edge_share", "solidity", "recut_iou", "bg_like", "fg_iou_loose", "fg_iou_strict", "fg_stability", "bg_noise"),
    "outline_fit",
)
FEATURES: dict[str, tuple[str, ...]] = {"gate-v2": FEATURES_V2, "gate-v3": (*FEATURES_V2, *V3_FEATURES)}
FEATURES["gate-v4"] = (*FEATURES["gate-v3"], *GAP_FEATURES)
FEATURES["gate-v5"] = ("net_bad",)
LITERAL = {
    "gate-v2": "GATE_V2_SCORE",
    "gate-v3": "GATE_V3_SCORE",
    "gate-v4": "GATE_V4_SCORE",
    "gate-v5": "GATE_V5_SCORE",
}
NET_TRAIN_SEEDS = {int(s) for s in TRAIN_SEEDS.split(",")}
TREES = {"gate-v4"}  # policies scored by depth-2 trees (gate_v4.TreeScore), thresholded out of fold
NET = {"gate-v5"}  # the score is the mask checker's own log-odds (gate_net): nothing to fit, only a threshold


def score_rows(seeds: list[int], n: int, gate: str = "gate-v2") -> list[dict[str, Any]]:
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


def degenerate(scores: dict[str, float], gate: str = "gate-v2") -> bool:
    """What a learned policy fails before its score: an empty or box-filling mask, a sliver, pieces."""
    p = policy(gate)
    return bool(
        scores["fill"] < p.min_fill or scores["fill"] > p.max_fill or scores["largest_share"] < p.min_largest_share
    )


def fit(x: np.ndarray, y: np.ndarray, rounds: int, step: float, bins: int, min_leaf: int = 10) -> dict[str, Any]:
    """Boosted stumps (logistic loss, Newton steps, L2 1 on the leaves) on quantile bins, summed into
    one step function per feature: ``{"base", "edges": [...], "values": [...]}``."""
    n, d = x.shape
    cuts = np.linspace(100 / bins, 100 - 100 / bins, bins - 1)
    edges = [np.unique(np.round(np.percentile(x[:, j], cuts), 4)) for j in range(d)]
    index = [np.searchsorted(edges[j], x[:, j], side="left") for j in range(d)]
    values = [np.zeros(len(e) + 1) for e in edges]
    base = float(np.log(y.mean() / (1 - y.mean())))
    f = np.full(n, base)
    for _ in range(rounds):
        p = 1 / (1 + np.exp(-f))
        g, h = p - y, p * (1 - p)
        best: tuple[float, int, int, float, float] | None = None
        for j in range(d):
            nb = len(edges[j]) + 1
            cg = np.cumsum(np.bincount(index[j], g, nb))
            ch = np.cumsum(np.bincount(index[j], h, nb))
            cn = np.cumsum(np.bincount(index[j], minlength=nb))
            for k in range(nb - 1):
                if cn[k] < min_leaf or n - cn[k] < min_leaf:
                    continue
                gl, hl, gr, hr = cg[k], ch[k], cg[-1] - cg[k], ch[-1] - ch[k]
                gain = gl * gl / (hl + 1) + gr * gr / (hr + 1)
                if best is None or gain > best[0]:
                    best = (gain, j, k, -gl / (hl + 1), -gr / (hr + 1))
        if best is None:
            break
        _, j, k, left, right = best
        update = step * np.where(np.arange(len(edges[j]) + 1) <= k, left, right)
        values[j] += update
        f += update[index[j]]
    for j in range(d):  # centre each step function on the calibration set; the base takes the rest
        mean = float(values[j][index[j]].mean())
        values[j] -= mean
        base += mean
    return {"base": base, "edges": edges, "values": values}


def _bins(x: np.ndarray, bins: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    cuts = np.linspace(100 / bins, 100 - 100 / bins, bins - 1)
    edges = [np.unique(np.round(np.percentile(x[:, j], cuts), 4)) for j in range(x.shape[1])]
    return edges, [np.searchsorted(edges[j], x[:, j], side="left") for j in range(x.shape[1])]


def _split(
    index: list[np.ndarray], sizes: list[int], g: np.ndarray, h: np.ndarray, sel: np.ndarray, min_leaf: int
) -> tuple[float, int, int] | None:
    """The best split of the rows ``sel`` (gain, feature, bin; None when none leaves ``min_leaf`` a side)."""
    best: tuple[float, int, int] | None = None
    total_g, total_h, total_n = g[sel].sum(), h[sel].sum(), int(sel.sum())
    for j, idx in enumerate(index):
        cg = np.cumsum(np.bincount(idx[sel], g[sel], sizes[j]))[:-1]
        ch = np.cumsum(np.bincount(idx[sel], h[sel], sizes[j]))[:-1]
        cn = np.cumsum(np.bincount(idx[sel], minlength=sizes[j]))[:-1]
        gain = cg * cg / (ch + 1) + (total_g - cg) ** 2 / (total_h - ch + 1) - total_g**2 / (total_h + 1)
        gain[(cn < min_leaf) | (total_n - cn < min_leaf)] = -np.inf
        if gain.size and np.isfinite(gain.max()) and (best is None or gain.max() > best[0]):
            best = (float(gain.max()), j, int(gain.argmax()))
    return best


def fit_trees(x: np.ndarray, y: np.ndarray, rounds: int, step: float, bins: int, min_leaf: int = 10) -> dict[str, Any]:
    """Boosted depth-2 trees (logistic loss, Newton leaves, L2 1) on quantile bins: ``{"base", "trees"}``,
    each tree as ``gate_v4.Tree`` (feature indices into the columns of ``x``)."""
    edges, index = _bins(x, bins)
    sizes = [len(e) + 1 for e in edges]
    base = float(np.log(y.mean() / (1 - y.mean())))
    f = np.full(len(y), base)
    trees = []
    for _ in range(rounds):
        p = 1 / (1 + np.exp(-f))
        g, h = p - y, p * (1 - p)
        root = _split(index, sizes, g, h, np.ones(len(y), bool), min_leaf)
        if root is None:
            break
        low = index[root[1]] <= root[2]
        sides = []
        for side in (low, ~low):
            child = _split(index, sizes, g, h, side, min_leaf)
            parts = [side] if child is None or child[0] <= 0 else [side & (index[child[1]] <= child[2]), side]
            parts[-1] = parts[-1] & ~parts[0] if len(parts) == 2 else parts[-1]
            values = [step * -g[q].sum() / (h[q].sum() + 1) for q in parts]
            for q, v in zip(parts, values, strict=True):
                f[q] += v
            if child is None or child[0] <= 0:
                sides.append((-1, 0.0, round(values[0], 4), round(values[0], 4)))
            else:
                sides.append((child[1], float(edges[child[1]][child[2]]), round(values[0], 4), round(values[1], 4)))
        trees.append((root[1], float(edges[root[1]][root[2]]), sides[0], sides[1]))
    return {"base": base, "trees": trees}


def scored_trees(model: dict[str, Any], x: np.ndarray, rule: np.ndarray) -> np.ndarray:
    """``fit_trees``' score of rows ``x`` (as ``gate_v4.TreeScore.score``); the degenerate rows fail."""
    score = np.full(len(x), model["base"])
    for j, edge, lo, hi in model["trees"]:
        low = x[:, j] <= edge
        for side, (j2, edge2, below, above) in ((low, lo), (~low, hi)):
            score += np.where(side, np.where(x[:, j2] <= edge2, below, above) if j2 >= 0 else below, 0.0)
    score[rule] = np.inf
    return score


def out_of_fold(
    x: np.ndarray, bad: np.ndarray, rule: np.ndarray, seed: np.ndarray, args: argparse.Namespace
) -> np.ndarray:
    """Every row's score from trees fitted without its seed's fold (``--folds`` groups of seeds)."""
    seeds = sorted(set(seed.tolist()))
    score = np.zeros(len(x))
    for k in range(min(args.folds, len(seeds))):
        test = np.isin(seed, seeds[k :: args.folds])
        train = ~test & ~rule
        model = fit_trees(x[train], bad[train].astype(float), args.rounds, args.step, args.bins)
        score[test] = scored_trees(model, x[test], rule[test])
    return score


def tree_literal(model: dict[str, Any], threshold: float, gate: str) -> str:
    """``gate_v4_model.py``'s score literal: the features, then one tree a line (no reformatting)."""
    lines = ["# fmt: off", f"{LITERAL[gate]} = TreeScore(", "    names=("]
    lines += [f'        "{n}",' for n in FEATURES[gate]]
    lines += ["    ),", f"    base={model['base']:.4f},", f"    threshold={threshold:.4f},", "    words=WORDS,"]
    lines.append("    trees=(")
    for j, edge, lo, hi in model["trees"]:
        lo_, hi_ = (f"({s[0]}, {s[1]:.4f}, {float(s[2]):.4f}, {float(s[3]):.4f})" for s in (lo, hi))
        lines.append(f"        ({j}, {edge:.4f}, {lo_}, {hi_}),")
    lines += ["    ),", ")", "# fmt: on"]
    return "\n".join(lines)


def merged(edges: np.ndarray, values: np.ndarray) -> tuple[list[float], list[float]]:
    """The same step function without the edges between two equal steps."""
    e, v = [], [round(float(values[0]), 4)]
    for edge, value in zip(edges, values[1:], strict=True):
        if round(float(value), 4) != v[-1]:
            e.append(round(float(edge), 4))
            v.append(round(float(value), 4))
    return e, v


def literal(model: dict[str, Any], threshold: float, gate: str = "gate-v2") -> str:
    """The score's source (``GATE_V2_SCORE``, ``GATE_V3_SCORE``): one feature's edges and values a line
    each (no reformatting)."""
    lines = ["# fmt: off", f"{LITERAL[gate]} = LearnedScore(", f"    base={model['base']:.4f},"]
    lines += [f"    threshold={threshold:.4f},", *(["    words=WORDS,"] if gate != "gate-v2" else []), "    tables={"]
    for name, edges, values in zip(FEATURES[gate], model["edges"], model["values"], strict=True):
        e, v = merged(edges, values)
        if not e:
            continue  # never chosen: no say in the score
        lines.append(f'        "{name}": (')
        lines.append(f"            ({', '.join(f'{x:.4f}' for x in e)},),")
        lines.append(f"            ({', '.join(f'{x:.4f}' for x in v)},),")
        lines.append("        ),")
    lines += ["    },", ")", "# fmt: on"]
    return "\n".join(lines)


def scored(model: dict[str, Any], x: np.ndarray, rule: np.ndarray) -> np.ndarray:
    """The model's score of rows ``x``; the degenerate ones (``rule``) fail whatever it says."""
    score = np.full(len(x), model["base"])
    for j, (edges, values) in enumerate(zip(model["edges"], model["values"], strict=True)):
        score += values[np.searchsorted(edges, x[:, j], side="left")]
    score[rule] = np.inf
    return score


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
        if args.policy in NET:
            threshold = at_recall(net_score(x[train], rule[train]), bad[train], args.recall)
            score = net_score(x[test], rule[test])
        elif args.policy in TREES:
            oof = out_of_fold(x[train], bad[train], rule[train], seed[train], args)
            threshold = at_recall(oof, bad[train], args.recall)
            model = fit_trees(x[train & ~rule], bad[train & ~rule].astype(float), args.rounds, args.step, args.bins)
            score = scored_trees(model, x[test], rule[test])
        else:
            model = fit(x[train & ~rule], bad[train & ~rule].astype(float), args.rounds, args.step, args.bins)
            threshold = at_recall(scored(model, x[train], rule[train]), bad[train], args.recall)
            score = scored(model, x[test], rule[test])
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
    ap.add_argument("--policy", default="gate-v2", choices=sorted(FEATURES), help="the learned policy to calibrate")
    ap.add_argument("--seeds", default="1,2,3,4,5", help="calibration seeds (never 0: the report's)")
    ap.add_argument("--n", type=int, default=300, help="images per seed, half per split")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--step", type=float, default=0.1)
    ap.add_argument("--bins", type=int, default=12)
    ap.add_argument("--recall", type=float, default=0.97, help="the calibration set's recall the threshold keeps")
    ap.add_argument("--folds", type=int, default=3, help="trees: seed groups for the out-of-fold threshold")
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
    if args.policy in NET and set(seeds + check_seeds) & set(NET_TRAIN_SEEDS):
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
    if args.policy in NET:
        score = net_score(x, rule)
    elif args.policy in TREES:  # the threshold on scores of images each model was not fitted on
        score = out_of_fold(x, bad, rule, np.array([r["seed"] for r in rows]), args)
        model = fit_trees(x[~rule], bad[~rule].astype(float), args.rounds, args.step, args.bins)
    else:
        model = fit(x[~rule], bad[~rule].astype(float), args.rounds, args.step, args.bins)
        score = scored(model, x, rule)
    threshold = at_recall(score, bad, args.recall)
    recall, precision = figures(score, bad, threshold)
    log(
        f"calibration: {len(rows)} subjects, {int(bad.sum())} bad; at threshold {threshold:.4f}: recall "
        f"{recall:.3f}, precision {precision:.3f}{' (out of fold)' if args.policy in TREES else ''}"
    )
    if args.policy in NET:
        print(f"{LITERAL[args.policy]} = NetScore(threshold={threshold:.4f})")
        if check_seeds:
            check(score_rows(check_seeds, args.n, args.policy), threshold, args)
        return 0
    print(
        tree_literal(model, threshold, args.policy) if args.policy in TREES else literal(model, threshold, args.policy)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
