#!/usr/bin/env python
"""Train ``gate-v5``'s mask checker (``deployments/quality/gate_net.py``) on the labelled set.

Every subject of ``--n`` images per seed (half per split) is segmented by the classical segmenter
from the benchmark's boxes (``cutout_quality.subject_boxes``), as the gate sees it in service; the
network's input is cut around it (``gate_net.net_input``) and labelled with the mask's true IoU. The
network is fitted on ``--train-seeds`` (flips and quarter turns drawn at random, AdamW, one-cycle
learning rate, ``--epochs``), then its precision at recall 0.95 (its ranking, before any threshold)
is printed on ``--check-seeds``, which it never saw; the threshold is set by
``benchmarks/gate_calibration.py --policy gate-v5`` on seeds the network was not trained on. Seed 0
is the report's (``cutout_quality.py``) and is never used here.

    .venv/bin/python benchmarks/gate_net_training.py --data /tmp/gate_net_data    # ~35 min on 2 cores
    .venv/bin/python benchmarks/gate_net_training.py --data /tmp/gate_net_data --out /tmp/w.npz --epochs 5

``--data`` keeps each seed's inputs and labels (``seed-<n>.npz``) and reads them back on the next run
instead of segmenting again. Single-threaded torch with a fixed seed: the same command writes the
same weights on the same machine.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import numpy as np

from benchmarks.cutout_data import SPLITS, make_set
from benchmarks.cutout_quality import subject_boxes
from harness.bench import log
from hitl_review.deployments.backends.base import make_segmenter
from hitl_review.deployments.quality import gate_net
from hitl_review.deployments.quality.metrics import mask_iou

BAD_IOU = 0.85
TRAIN_SEEDS = ",".join(str(s) for s in [*range(1, 11), *range(14, 30)])
CHECK_SEEDS = "11,12,13"


def seed_data(seed: int, n: int, cache: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """The inputs (``uint8``-quantised, ``N x 4 x S x S``) and true IoUs of seed ``seed``'s subjects."""
    path = cache / f"seed-{seed}-n{n}.npz" if cache else None
    if path and path.is_file():
        with np.load(path) as z:
            return z["x"], z["iou"]
    segmenter = make_segmenter("classical")
    xs, ious = [], []
    t0 = time.perf_counter()
    for split in SPLITS:
        for sample in make_set(split, n // len(SPLITS), seed):
            sha = hashlib.sha256(sample.image.tobytes()).hexdigest()
            boxes = subject_boxes(sample, seed)
            found = segmenter.segment(sample.image, sha, [{"box_id": str(j), "bbox": b} for j, b in enumerate(boxes)])
            for subject, bbox, item in zip(sample.subjects, boxes, found, strict=True):
                mask = np.asarray(item["mask"], bool)
                xs.append(np.round((gate_net.net_input(sample.image, bbox, mask) + 0.5) * 255).astype(np.uint8))
                ious.append(mask_iou(mask, subject.mask))
    x, iou = np.stack(xs), np.asarray(ious, np.float32)
    log(f"seed {seed}: {len(iou)} subjects, {int((iou < BAD_IOU).sum())} bad, {time.perf_counter() - t0:.0f} s")
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, x=x, iou=iou)
    return x, iou


def as_float(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) / 255.0 - 0.5


def precision_at(p_bad: np.ndarray, bad: np.ndarray, recall: float = 0.95) -> float:
    """Precision when the threshold is set to catch ``recall`` of the bad masks (the ranking's quality);
    NaN without a bad mask."""
    if not bad.any():
        return float("nan")
    s = np.sort(p_bad[bad])[::-1]
    t = s[int(np.ceil(recall * len(s))) - 1]
    flagged = p_bad >= t
    return float((flagged & bad).sum() / flagged.sum())


def train(x: np.ndarray, iou: np.ndarray, epochs: int, batch: int = 64, lr: float = 3e-3) -> object:
    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    net = gate_net.build()
    opt = torch.optim.AdamW(net.parameters(), lr, weight_decay=1e-4)
    steps = epochs * ((len(x) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps)
    target = torch.from_numpy(iou)
    bce = nn.BCEWithLogitsLoss()
    net.train()
    for epoch in range(epochs):
        t0 = time.perf_counter()
        order = rng.permutation(len(x))
        total = 0.0
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            b = torch.from_numpy(as_float(x[idx]))
            b = torch.rot90(b, int(rng.integers(4)), (2, 3))
            if rng.random() < 0.5:
                b = torch.flip(b, (3,))
            out = net(b)
            y = target[idx]
            loss = nn.functional.smooth_l1_loss(torch.sigmoid(out[:, 0]), y, beta=0.05)
            loss = loss + bce(out[:, 1], (y < BAD_IOU).float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        log(f"epoch {epoch + 1}/{epochs}: loss {total / len(x):.4f}, {time.perf_counter() - t0:.0f} s")
    return net.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-seeds", default=TRAIN_SEEDS, help="seeds the network is fitted on (never 0)")
    ap.add_argument("--check-seeds", default=CHECK_SEEDS, help="seeds it is checked on (never trained on)")
    ap.add_argument("--n", type=int, default=300, help="images per seed, half per split")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--data", type=Path, default=None, help="cache each seed's inputs here")
    ap.add_argument("--out", type=Path, default=gate_net.WEIGHTS, help="where the weights go")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (seeded: the same weights each run; the committed: 2)"
    )
    args = ap.parse_args(argv)
    train_seeds = [int(s) for s in args.train_seeds.split(",") if s.strip()]
    check_seeds = [int(s) for s in args.check_seeds.split(",") if s.strip()]
    if 0 in train_seeds or 0 in check_seeds:
        ap.error("seed 0 is the report's: train and check on others")
    if set(train_seeds) & set(check_seeds):
        ap.error("a check seed must not be trained on")
    import torch

    torch.set_num_threads(args.threads)
    parts = [seed_data(s, args.n, args.data) for s in train_seeds]
    x, iou = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    log(f"training on {len(iou)} subjects ({int((iou < BAD_IOU).sum())} bad) from seeds {args.train_seeds}")
    net = train(x, iou, args.epochs)
    gate_net.save(net, args.out)
    log(f"weights written to {args.out} ({args.out.stat().st_size // 1024} KiB)")
    print(f"{'seed':>6} {'subjects':>9} {'bad':>5} {'precision at recall 0.95':>25} {'IoU error (mean abs)':>21}")
    for s in check_seeds:
        cx, ciou = seed_data(s, args.n, args.data)
        p_bad, p_iou = gate_net.predict(net, as_float(cx))
        bad = ciou < BAD_IOU
        err = float(np.abs(p_iou - ciou).mean())
        print(f"{s:>6} {len(ciou):>9} {int(bad.sum()):>5} {precision_at(p_bad, bad):>25.3f} {err:>21.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
