#!/usr/bin/env python
"""Cut-out quality (SPEC.md §13): segment, gate, refine, and count what still needs a person.

For each backend and split of the labelled set (``benchmarks/cutout_data.py``, exact masks): every
subject is segmented from its box — the true box grown by a seeded -1..5 px per side, as a
detector or a reviewer draws it — with the backend's segmenter (``make_segmenter``, all boxes
of an image in one ``segment`` call), then, under each policy of ``--policies`` in turn (default
``gate-v1`` and ``gate-v5``, side by side on the same first masks; a learned file when named), scored and
judged by the quality gate (``deployments.quality.gate``), and a failed mask is refined
(``deployments.quality.refine``, attempt 1, 2, …) and gated again, at most ``--max-refinements``
times. Reported per backend x split x policy, with each policy's ratios to the first (the JSON's
``ratios``; the table's last column, over all subjects):

- mean mask IoU and boundary F (2 px) of the first masks and of the masks kept: the production
  path, ``QualityGate.check`` (``deployments/quality/subject.py``), keeps the first refinement
  that passes, else the mask that fails by the least (the verdict's ``severity``);
- the gate's precision and recall at catching bad first masks (bad := IoU < ``--bad-iou``,
  0.85): recall is the share of bad masks that do not reach a customer unseen, precision the
  share of failed masks that were really bad (the rest cost a refinement or a person's look);
- ``escaped``: subjects whose final mask passed the gate and is bad (what reaches customers);
- the gated-out masks' mean IoU before and after refinement;
- the share of subjects sent to a person (failing after every refinement);
- milliseconds per subject: segmentation (shared by the policies), gate, refinement, all.

``classical`` always; ``sam`` (``--backends classical,sam``) runs the real SAM code path on the
random-weight ``vit_tiny`` the tests use: its figures mean nothing about SAM's quality, only that
the path runs, and its gate thresholds must be calibrated on real weights.

``gate-v1`` was calibrated on ``--seed 1`` (``--rows`` writes every subject's features and IoU),
the retired gate-v2's to gate-v4's learned scores on seeds 1-10 (``benchmarks/gate_calibration.py``
before issue 38), gate-v5's network on seeds 1-10 and 14-29 and its threshold on 11-13
(``benchmarks/gate_net_training.py``); the default report is on seed 0, images no calibration saw.

Stress splits (a shop none of them saw; ``cutout_data.py``'s docstring): ``--splits new,photos --loose
0.10,0.25`` (boxes 10-25 % loose per side), ``--grey`` adds each gate's figures with the picture
replaced by flat grey (the same masks: a gate that reads the picture does clearly worse there), a
policy file ``hitl learn gate`` wrote is named in ``--policies`` like a version:

    .venv/bin/python benchmarks/cutout_quality.py --splits new,photos --loose 0.10,0.25 --grey \
        --max-refinements 0 --n 200 --start 1000 --policies gate-v1,gate-v5,/tmp/gate.json

    .venv/bin/python benchmarks/cutout_quality.py                       # ~300 images, classical
    .venv/bin/python benchmarks/cutout_quality.py --backends classical,sam --n 40
    .venv/bin/python benchmarks/cutout_quality.py --quick --json /tmp/cq.json   # smoke, seconds
    # on a GPU machine with real weights (the figures that say something about SAM; calibrate its gate
    # on --seed 1 --rows, report on seed 0):
    python benchmarks/cutout_quality.py --backends sam --sam-checkpoint sam_vit_b_01ec64.pth --device cuda
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cutout_data import ALL_SPLITS, LOOSE, Sample, loose_box, make_set
from harness.bench import log
from hitl_review.deployments.backends.base import make_segmenter
from hitl_review.deployments.quality.gate import DEFAULT_POLICY, GatePolicy, judge, policy, score_mask
from hitl_review.deployments.quality.metrics import boundary_f, mask_iou
from hitl_review.deployments.quality.subject import QualityGate

SAM_NOTE = (
    "sam: random-weight vit_tiny (no download): its masks and figures say nothing about SAM's quality, only "
    "that the code path runs; calibrate the gate's SAM thresholds on real weights"
)


def given_box(bbox: list[float], width: int, height: int, rng: np.random.Generator) -> list[float]:
    """The true box as a detector or a reviewer draws it: each side moved out by -1..5 px."""
    d = [float(v) for v in rng.integers(-1, 6, size=4)]
    x1, y1, x2, y2 = bbox
    return [max(0.0, x1 - d[0]), max(0.0, y1 - d[1]), min(float(width), x2 + d[2]), min(float(height), y2 + d[3])]


def subject_boxes(sample: Sample, seed: int, loose: tuple[float, float] | None = None) -> list[list[float]]:
    """The boxes the benchmark prompts ``sample``'s subjects with (``given_box``, seeded per image), or with
    ``loose`` (lo, hi), ``cutout_data.loose_box``: each side out by that share of the box's side."""
    h, w = sample.image.shape[:2]
    rng = np.random.default_rng([seed, 7, ALL_SPLITS.index(sample.split), sample.index])
    if loose is not None:
        return [loose_box(s.bbox, w, h, rng, *loose) for s in sample.subjects]
    return [given_box(s.bbox, w, h, rng) for s in sample.subjects]


def build_segmenter(backend: str, workdir: Path, checkpoint: Path | None = None, **sam: Any) -> Any:
    """The backend's segmenter; ``sam`` with ``checkpoint`` loads real weights (``sam``: ``model_type``,
    ``device``), else the random-weight ``vit_tiny``."""
    if backend == "classical":
        return make_segmenter("classical")
    if backend == "sam" and checkpoint is not None:
        return make_segmenter("sam", checkpoint=str(checkpoint), **sam)
    if backend == "sam":
        import torch

        from hitl_review.deployments.backends.sam import build_sam_vit_tiny

        torch.manual_seed(0)
        ckpt = workdir / "sam_vit_tiny_random.pth"
        torch.save(build_sam_vit_tiny().state_dict(), ckpt)
        return make_segmenter("sam", checkpoint=str(ckpt), model_type="vit_tiny", device="cpu")
    raise ValueError(f"unknown backend {backend!r}; choose classical or sam")


class _Failures(logging.Handler):
    """Refinements that raised: ``QualityGate.check`` logs them and goes on, as production does;
    the benchmark counts them."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.messages.append(f"{record.getMessage()}: {exc!r}")


def run_subjects(
    segmenter: Any,
    samples: list[Sample],
    gates: list[GatePolicy],
    max_refinements: int,
    seed: int,
    loose: tuple[float, float] | None = None,
    grey: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Per policy, one row per subject: the first mask's IoU / boundary F and verdict, then the production
    path (``QualityGate.check``: refinements, the mask kept and its verdict), with times. Each image is
    segmented once; every policy judges the same first masks. ``loose``: the boxes' looseness
    (``subject_boxes``); ``grey``: each policy also judges the same masks with the picture replaced by flat
    grey (``grey_passed``): a gate that reads the picture must do clearly worse there."""
    quality = [QualityGate(g.version, max_refinements) for g in gates]
    failures = _Failures()
    logging.getLogger("hitl.quality").addHandler(failures)
    rows: dict[str, list[dict[str, Any]]] = {g.version: [] for g in gates}
    try:
        for sample in samples:
            for version, got in _run_image(segmenter, sample, gates, quality, failures, seed, loose, grey).items():
                rows[version] += got
    finally:
        logging.getLogger("hitl.quality").removeHandler(failures)
    return rows


def _run_image(
    segmenter: Any,
    sample: Sample,
    gates: list[GatePolicy],
    quality: list[QualityGate],
    failures: _Failures,
    seed: int,
    loose: tuple[float, float] | None = None,
    grey: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    image = sample.image
    sha = hashlib.sha256(image.tobytes()).hexdigest()
    boxes = subject_boxes(sample, seed, loose)
    flat = np.full_like(image, 128)
    t0 = time.perf_counter()
    results = segmenter.segment(image, sha, [{"box_id": f"s{j}", "bbox": b} for j, b in enumerate(boxes)])
    seg_ms = 1000 * (time.perf_counter() - t0) / len(boxes)
    out: dict[str, list[dict[str, Any]]] = {g.version: [] for g in gates}
    for subject, bbox, found in zip(sample.subjects, boxes, results, strict=True):
        mask = np.asarray(found["mask"], bool)
        iou, bf = mask_iou(mask, subject.mask), boundary_f(mask, subject.mask, 2)
        for gate, gated in zip(gates, quality, strict=True):
            t1 = time.perf_counter()
            scores = score_mask(
                image, bbox, mask, predicted_iou=found.get("predicted_iou"), stability=found.get("stability"), gate=gate
            )
            verdict = judge(scores, gate)
            gate_ms = 1000 * (time.perf_counter() - t1)
            grey_passed = judge(score_mask(flat, bbox, mask, gate=gate), gate).passed if grey else None
            failures.messages.clear()
            t2 = time.perf_counter()
            kept = gated.check(segmenter, image, sha, bbox, found)
            check_ms = 1000 * (time.perf_counter() - t2)
            out[gate.version].append(
                {
                    "split": sample.split,
                    "image": sample.index,
                    "label": subject.label,
                    "background": sample.background,
                    "iou": iou,
                    "bf": bf,
                    "passed": verdict.passed,
                    "grey_passed": grey_passed,
                    "reasons": verdict.reasons,
                    "scores": scores,
                    "strategies": [r["strategy"] for r in kept.refinements],
                    "refine_errors": list(failures.messages),
                    "final_iou": mask_iou(kept.mask, subject.mask),
                    "final_bf": boundary_f(kept.mask, subject.mask, 2),
                    "final_passed": kept.quality["verdict"] == "PASS",
                    "seg_ms": seg_ms,
                    "gate_ms": gate_ms,
                    "refine_ms": max(0.0, check_ms - gate_ms),  # check() gates the first mask again
                }
            )
            for message in failures.messages:
                log(f"a refinement raised on {sample.split} image {sample.index}, box {bbox}: {message}")
    return out


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def _bound(k: int, n: int) -> str | None:
    """The two-sided 95 % exact (Clopper–Pearson) interval of ``k`` in ``n``, as ``lo-hi``."""
    if not n:
        return None
    from hitl_review.statecore.autoapprove import lower_bound, upper_bound

    return f"{lower_bound(k, n, 0.975):.3f}-{upper_bound(k, n, 0.975):.3f}"


def summarize(rows: list[dict[str, Any]], bad_iou: float) -> dict[str, Any]:
    bad = [r["iou"] < bad_iou for r in rows]
    failed = [not r["passed"] for r in rows]
    tp = sum(b and f for b, f in zip(bad, failed, strict=True))
    out_rows = [r for r in rows if not r["passed"]]
    n = len(rows)
    grey = [r.get("grey_passed") is not None for r in rows]
    g_failed = [r.get("grey_passed") is False for r in rows]
    g_tp = sum(b and f for b, f in zip(bad, g_failed, strict=True))
    return {
        "subjects": n,
        "mean_iou": _mean([r["iou"] for r in rows]),
        "mean_bf_2px": _mean([r["bf"] for r in rows]),
        "mean_iou_after_refinement": _mean([r["final_iou"] for r in rows]),
        "mean_bf_2px_after_refinement": _mean([r["final_bf"] for r in rows]),
        "bad_masks": sum(bad),
        "gate_failed": sum(failed),
        "gate_precision": round(tp / sum(failed), 4) if sum(failed) else None,
        "gate_recall": round(tp / sum(bad), 4) if sum(bad) else None,
        # the same masks judged with the picture replaced by flat grey (--grey): reading the picture shows here
        "grey_gate_precision": round(g_tp / sum(g_failed), 4) if all(grey) and n and sum(g_failed) else None,
        "grey_gate_recall": round(g_tp / sum(bad), 4) if all(grey) and n and sum(bad) else None,
        "gate_recall_bound": _bound(tp, sum(bad)),
        "gate_precision_bound": _bound(tp, sum(failed)),
        "escaped": sum(r["final_passed"] and r["final_iou"] < bad_iou for r in rows),
        "gated_out_mean_iou_before": _mean([r["iou"] for r in out_rows]),
        "gated_out_mean_iou_after": _mean([r["final_iou"] for r in out_rows]),
        "refined_and_passed": sum(r["final_passed"] for r in out_rows),
        "refinements": sum(len(r["strategies"]) for r in rows),
        "refinement_errors": sum(len(r["refine_errors"]) for r in rows),
        "to_person_share": round(sum(not r["final_passed"] for r in rows) / n, 4) if n else None,
        "ms_per_subject": {
            "segment": _mean([r["seg_ms"] for r in rows]),
            "gate": _mean([r["gate_ms"] for r in rows]),
            "refine": _mean([r["refine_ms"] for r in rows]),
            "total": _mean([r["seg_ms"] + r["gate_ms"] + r["refine_ms"] for r in rows]),
        },
    }


def targets(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The classical backend's targets, measured (not asserted): the gate and refinement over every
    subject (the easy split alone has hardly any bad masks), the easy split's mean IoU."""
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, value: Any, met: bool | None) -> None:
        out.append({"name": name, "target": target, "value": value, "met": met})

    per = results.get("classical", {})
    overall = per.get("all") or next(iter(per.values()), None)
    if overall is None:
        return out
    for key, label in (("gate_recall", "gate recall at IoU < 0.85"), ("gate_precision", "gate precision")):
        value = overall[key]
        floor = 0.95 if key == "gate_recall" else 0.7
        add(f"classical, all subjects: {label}", f">= {floor}", value, None if value is None else value >= floor)
    before, after = overall["gated_out_mean_iou_before"], overall["gated_out_mean_iou_after"]
    met = None if before is None or overall["refinements"] == 0 else after > before
    add("classical, all subjects: refinement raises the gated-out masks' IoU", "after > before", after, met)
    easy = per.get("easy")
    if easy is not None:
        add("classical easy: mean IoU", ">= 0.9", easy["mean_iou"], easy["mean_iou"] >= 0.9)
    return out


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


# The figures compared against the baseline policy (``ratios`` in the JSON): value / baseline's value.
RATIO_KEYS = (
    "gate_failed",
    "gate_precision",
    "gate_recall",
    "escaped",
    "gated_out_mean_iou_after",
    "mean_iou_after_refinement",
    "to_person_share",
)
RATIO_MS = ("gate", "refine", "total")


def ratios(mine: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    def div(a: Any, b: Any) -> float | None:
        return None if a is None or not b else round(a / b, 3)

    out = {k: div(mine[k], base[k]) for k in RATIO_KEYS}
    out.update({f"ms_{k}": div(mine["ms_per_subject"][k], base["ms_per_subject"][k]) for k in RATIO_MS})
    return out


TABLE_ROWS: tuple[tuple[str, Any], ...] = (
    ("subjects", lambda r: r["subjects"]),
    ("mean IoU, first mask", lambda r: r["mean_iou"]),
    ("mean IoU, after refinement", lambda r: r["mean_iou_after_refinement"]),
    ("mean boundary F (2 px), first", lambda r: r["mean_bf_2px"]),
    ("mean boundary F (2 px), after", lambda r: r["mean_bf_2px_after_refinement"]),
    ("bad first masks", lambda r: r["bad_masks"]),
    ("gate failed", lambda r: r["gate_failed"]),
    ("gate precision", lambda r: r["gate_precision"]),
    ("gate recall", lambda r: r["gate_recall"]),
    ("gate recall, 95% CI", lambda r: r.get("gate_recall_bound")),
    ("gate precision, 95% CI", lambda r: r.get("gate_precision_bound")),
    ("gate precision, picture grey", lambda r: r.get("grey_gate_precision")),
    ("gate recall, picture grey", lambda r: r.get("grey_gate_recall")),
    ("gated out: mean IoU before", lambda r: r["gated_out_mean_iou_before"]),
    ("gated out: mean IoU after (kept mask)", lambda r: r["gated_out_mean_iou_after"]),
    ("gated out, then passed after refining", lambda r: r["refined_and_passed"]),
    ("refinements run", lambda r: r["refinements"]),
    ("refinements that raised", lambda r: r["refinement_errors"]),
    ("sent to a person (share)", lambda r: r["to_person_share"]),
    ("escaped: passed but bad", lambda r: r["escaped"]),
    ("ms/subject: segment", lambda r: r["ms_per_subject"]["segment"]),
    ("ms/subject: gate", lambda r: r["ms_per_subject"]["gate"]),
    ("ms/subject: refine", lambda r: r["ms_per_subject"]["refine"]),
    ("ms/subject: total", lambda r: r["ms_per_subject"]["total"]),
)


def print_table(out: dict[str, Any]) -> None:
    """Per backend, every split under every policy side by side, then each policy's ratios to the
    baseline over the last split (``all`` with two splits)."""
    base, policies = out["baseline"], out["policies"]
    for backend in out["results"][base]:
        per = {p: out["results"][p][backend] for p in policies}
        splits = list(per[base])
        cols = [(f"{s} {p}", per[p][s]) for s in splits for p in policies]
        lines: list[list[str]] = [["", *[c for c, _ in cols]]]
        others = [p for p in policies if p != base]
        lines[0] += [f"{splits[-1]} {p}/{base}" for p in others]
        for name, get in TABLE_ROWS:
            line = [name, *[fmt(get(r)) for _, r in cols]]
            for p in others:
                a, b = get(per[p][splits[-1]]), get(per[base][splits[-1]])
                numbers = isinstance(a, int | float) and isinstance(b, int | float)
                line.append(f"{a / b:.2f}x" if numbers and b and name != "subjects" else "-")
            lines.append(line)
        widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
        print(
            f"\ncut-out quality, {backend}, seed {out['args']['seed']}, bad: IoU < {out['args']['bad_iou']}, "
            f"max refinements {out['args']['max_refinements']}, policies {', '.join(policies)}"
        )
        for line in lines:
            cells = zip(line, widths, strict=True)
            print("  ".join(c.ljust(wd) if i == 0 else c.rjust(wd) for i, (c, wd) in enumerate(cells)))
    print()
    for p in policies:
        for t in out["targets"][p]:
            met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
            print(f"  target {t['name']} ({p}): {fmt(t['value'])} (target {t['target']}) met: {met}")
    for note in out["notes"]:
        print(f"  note: {note}")


def write_decisions(path: Path, rows: list[dict[str, Any]], seed: int, bad_iou: float) -> None:
    """The simulated reviewers' mask decisions, as ``archive.learn_gate.dataset`` reads them from an archive."""
    with path.open("w") as f:
        for i, r in enumerate(rows):
            good = r["iou"] >= bad_iou
            row = {
                "job_id": f"{r['split']}:{seed}:{r['image']}",
                "box_id": f"s{i}",
                "scores": r["scores"],
                "verdict": "PASS" if r["passed"] else "FAIL",
                "decision": "ACCEPT" if good else "REFINE",
                "good": good,
            }
            f.write(json.dumps(row) + "\n")
    log(f"wrote {len(rows)} mask decisions to {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="classical", help="comma-separated: classical, sam")
    ap.add_argument(
        "--splits", default="easy,hard", help="of cutout_data.ALL_SPLITS; the stress splits: new, photos (with --loose)"
    )
    ap.add_argument("--n", type=int, default=300, help="images in all, half per split")
    ap.add_argument("--seed", type=int, default=0, help="the data set's seed (the gates are calibrated on others)")
    ap.add_argument("--max-refinements", type=int, default=2)
    ap.add_argument(
        "--policies",
        default="gate-v1,gate-v5",
        help="quality-gate policy versions, side by side; the first is the baseline of the ratios",
    )
    ap.add_argument("--bad-iou", type=float, default=0.85, help="a mask below this IoU is bad")
    ap.add_argument(
        "--loose",
        default=None,
        metavar="LO,HI",
        help=f"boxes loose by LO..HI of their side per side (cutout_data.loose_box; the stress runs: "
        f"{LOOSE[0]},{LOOSE[1]}); default: -1..5 px",
    )
    ap.add_argument("--grey", action="store_true", help="also judge every mask with the picture flat grey (ablation)")
    ap.add_argument("--start", type=int, default=0, help="the first image index of each split (disjoint ranges)")
    ap.add_argument(
        "--decisions",
        type=Path,
        default=None,
        metavar="FILE",
        help="write `hitl learn gate --dataset` rows: each first mask, the first policy's scores and a simulated "
        "reviewer's decision (ACCEPT at IoU >= --bad-iou against the truth, else REFINE)",
    )
    ap.add_argument("--quick", action="store_true", help="a tiny set (6 images per split): a smoke run")
    ap.add_argument("--rows", action="store_true", help="also write every subject's features and IoU (calibration)")
    ap.add_argument(
        "--sam-checkpoint",
        type=Path,
        default=None,
        help="real SAM weights (.pth) for the sam backend, e.g. on a GPU machine (default: the random vit_tiny)",
    )
    ap.add_argument("--sam-model-type", default="vit_b", help="the checkpoint's architecture (vit_b, vit_l, vit_h)")
    ap.add_argument("--device", default="cpu", help="where SAM runs with --sam-checkpoint: cpu or cuda")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/out/cutout_quality.json"))
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    gates = [policy(p.strip()) for p in args.policies.split(",") if p.strip()]
    versions = [g.version for g in gates]
    per_split = 6 if args.quick else max(1, args.n // len(splits))
    loose: tuple[float, float] | None = None
    if args.loose:
        lo, _, hi = args.loose.partition(",")
        loose = (float(lo), float(hi or lo))
        if not 0 <= loose[0] <= loose[1]:
            ap.error("--loose LO,HI with 0 <= LO <= HI, e.g. 0.10,0.25")
    out: dict[str, Any] = {
        "benchmark": "cutout_quality",
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "args": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "per_split": per_split},
        "policies": versions,
        "baseline": versions[0],
        "default_policy": DEFAULT_POLICY,
        "results": {v: {} for v in versions},
        "notes": [],
    }
    all_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            sam = {"model_type": args.sam_model_type, "device": args.device}
            seg = build_segmenter(backend, Path(tmp), args.sam_checkpoint, **sam)
            if backend == "sam" and args.sam_checkpoint is None:
                out["notes"].append(SAM_NOTE)
            for v in versions:
                out["results"][v][backend] = {}
            for split in splits:
                samples = make_set(split, per_split, args.seed, args.start)
                log(f"{backend} {split}: {len(samples)} images, {sum(len(s.subjects) for s in samples)} subjects")
                t0 = time.perf_counter()
                rows = run_subjects(seg, samples, gates, args.max_refinements, args.seed, loose, args.grey)
                for v in versions:
                    out["results"][v][backend][split] = summarize(rows[v], args.bad_iou)
                    all_rows += [{"backend": backend, "policy": v, **r} for r in rows[v]]
                log(f"{backend} {split}: done in {time.perf_counter() - t0:.1f} s")
            if len(splits) > 1:
                for v in versions:
                    mine = [r for r in all_rows if r["backend"] == backend and r["policy"] == v]
                    out["results"][v][backend]["all"] = summarize(mine, args.bad_iou)
    base = out["results"][versions[0]]
    out["ratios"] = {
        v: {b: {s: ratios(r, base[b][s]) for s, r in per.items()} for b, per in out["results"][v].items()}
        for v in versions[1:]
    }
    out["targets"] = {v: targets(out["results"][v]) for v in versions}
    if args.rows:
        out["rows"] = all_rows
    if args.decisions:
        write_decisions(args.decisions, [r for r in all_rows if r["policy"] == versions[0]], args.seed, args.bad_iou)
    print_table(out)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
