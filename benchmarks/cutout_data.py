#!/usr/bin/env python
"""A labelled, regenerable cut-out data set: product-like subjects on backgrounds, exact masks.

Every image is drawn from its own seeded generator, ``(seed, split, index)``, so a set is the same
on every machine and any one image can be rebuilt alone; nothing is downloaded (the textures and
the horse silhouette are scikit-image's bundled samples). Subjects are drawn as binary masks and
composited without anti-aliasing, so the ground truth is exact; a faint blur and sensor noise are
added to the picture afterwards, never to the masks. A subject painted over another hides it: the
hidden one's mask is what stays visible.

- ``easy``: one or two compact subjects (boxes, shoes, bottles, mugs, smooth blobs) in flat or
  mildly textured colours on a plain or gradient studio background, soft shadows, clear contrast,
  no overlap — what a product photographer delivers, and what the weight-free segmenter is for;
- ``hard``: one to four subjects, thin parts (lamps, horses), holes (rings, mug handles),
  photo and procedural textures, glossy highlights, on cluttered, low-contrast or gradient
  backgrounds with hard shadows, and overlapping subjects.

Stress splits (a shop no shipped gate was calibrated or trained on; ``benchmarks/cutout_quality.py
--splits new,photos --loose 0.10,0.25``, ``benchmarks/learning_loop.py``), never used by gate-v1 … v5:

- ``new``: outlines none of the above has (``NEW_SHAPES``: clothing, furniture, bags, plants,
  lettering) on backgrounds none has (``NEW_BACKGROUNDS``: wood, fabric, dark studio, tiles, a sharp
  photograph), placed far enough from the frame that a box 25 % loose per side still fits;
- ``photos``: scikit-image's bundled real photographs (``PHOTO_SOURCES``). ``coins`` (a real
  photograph of real coins): each coin's truth is *derived*, not exact — the watershed of the Sobel
  elevation from markers below 30 and above 150, holes filled (scikit-image's own coins tutorial;
  24 coins of 1,077-3,141 px, checked by eye); a window of it, scaled 1.5-2.5x. ``photo_cutout``:
  a new outline cut from one photograph (astronaut, coffee, chelsea, rocket, immunohistochemistry)
  and pasted, unblurred, on a sharp window of another: real photographic texture on both sides of
  the edge, exact truth by construction. No hand-drawn masks: none of the bundled photographs ships
  one, and an outline drawn here by eye would be a guess passed off as truth.

Boxes: ``loose_box`` moves each side of the true box out by a seeded share of the box's width
(left, right) or height (top, bottom), ``LOOSE`` = 10-25 % by default, clipped to the frame.

    python benchmarks/cutout_data.py --n 300 --seed 0 --out /tmp/cutout_set   # PNGs + labels.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np

SPLITS = ("easy", "hard")
STRESS_SPLITS = ("new", "photos")  # stable names: benchmarks/learning_loop.py imports them
ALL_SPLITS = SPLITS + STRESS_SPLITS  # the order seeds each image's generator: append only
NEW_SHAPES = ("tshirt", "trousers", "dress", "sofa", "table", "shelf", "handbag", "backpack", "plant", "lettering")
NEW_BACKGROUNDS = ("wood", "fabric", "dark", "tiles", "photo")
PHOTO_SOURCES = ("coins", "photo_cutout")
LOOSE = (0.10, 0.25)  # the stress boxes: each side out by this share of the box's side
EASY_SHAPES = ("box", "shoe", "bottle", "mug", "blob")
HARD_SHAPES = ("box", "shoe", "bottle", "mug", "blob", "lamp", "ring", "horse", "chair")
EASY_BACKGROUNDS = ("plain", "gradient")
HARD_BACKGROUNDS = ("plain", "gradient", "cluttered", "low_contrast")
_PHOTOS = ("coffee", "chelsea", "astronaut", "rocket", "immunohistochemistry", "colorwheel")
_GREYS = ("brick", "grass", "gravel", "camera", "coins", "moon")


class Subject(NamedTuple):
    mask: np.ndarray  # bool H x W, the visible subject
    bbox: list[float]  # [x1, y1, x2, y2], tight around ``mask`` (x2, y2 exclusive)
    label: str


@dataclass
class Sample:
    image: np.ndarray  # RGB uint8 H x W x 3
    subjects: list[Subject]
    split: str
    index: int
    background: str
    tags: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- textures


@functools.cache
def _photo(name: str) -> np.ndarray:
    from skimage import data

    img = getattr(data, name)()
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return np.ascontiguousarray(img[..., :3]).astype(np.float32)


@functools.cache
def _horse() -> np.ndarray:
    from skimage import data

    m = ~data.horse()
    ys, xs = np.nonzero(m)
    return np.ascontiguousarray(m[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]).astype(np.uint8)


def _crop(src: np.ndarray, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A random ``h x w`` window of ``src`` (scaled up first when ``src`` is too small)."""
    sh, sw = src.shape[:2]
    s = max(h / sh, w / sw, float(rng.uniform(0.5, 1.0)))
    if s > 1.0 or s < 1.0:
        src = cv2.resize(src, (max(w, round(sw * s)), max(h, round(sh * s))), interpolation=cv2.INTER_AREA)
    y = int(rng.integers(0, src.shape[0] - h + 1))
    x = int(rng.integers(0, src.shape[1] - w + 1))
    return src[y : y + h, x : x + w]


def _colour(rng: np.random.Generator, lo: int = 20, hi: int = 200) -> np.ndarray:
    return rng.integers(lo, hi, size=3).astype(np.float32)


def _texture(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An ``h x w x 3`` float appearance for a subject."""
    base = _colour(rng)
    if kind == "photo":
        return _crop(_photo(str(rng.choice(_PHOTOS))), h, w, rng)
    if kind == "grey":
        g = _crop(_photo(str(rng.choice(_GREYS))), h, w, rng)
        return (g / 255.0) * (0.5 * base + 90)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == "stripes":
        period = float(rng.uniform(6, 18))
        angle = float(rng.uniform(0, math.pi))
        t = (np.cos(angle) * xx + np.sin(angle) * yy) / period
        other = _colour(rng, 60, 240)
        a = (np.sin(2 * math.pi * t) > 0).astype(np.float32)[..., None]
        return a * base + (1 - a) * other
    if kind == "checker":
        c = int(rng.integers(6, 16))
        a = (((yy // c) + (xx // c)) % 2).astype(np.float32)[..., None]
        return a * base + (1 - a) * (base * 0.55 + 50)
    if kind == "noise":
        n = cv2.GaussianBlur(rng.normal(0, 1, (h, w)).astype(np.float32), (0, 0), float(rng.uniform(1.5, 4)))
        amp = 0.18 / max(1e-6, float(n.std()))
        return base[None, None, :] * (1 + amp * n[..., None])
    return np.broadcast_to(base, (h, w, 3)).copy()  # flat


# --------------------------------------------------------------------------- silhouettes


def _shape(kind: str, h: int, w: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A silhouette filling roughly an ``h x w`` canvas, and a shading map (faces, roundness)."""
    m = np.zeros((h, w), np.uint8)
    shade = np.broadcast_to(np.linspace(1.12, 0.82, h, dtype=np.float32)[:, None], (h, w)).copy()
    if kind == "box":  # a carton seen from above the front: front face, top and side faces
        d = int(min(h, w) * rng.uniform(0.12, 0.25))
        front = np.array([[0, d], [w - d - 1, d], [w - d - 1, h - 1], [0, h - 1]], np.int32)
        top = np.array([[0, d], [d, 0], [w - 1, 0], [w - d - 1, d]], np.int32)
        side = np.array([[w - d - 1, d], [w - 1, 0], [w - 1, h - d - 1], [w - d - 1, h - 1]], np.int32)
        for poly, s in ((front, 1.0), (top, 1.18), (side, 0.78)):
            cv2.fillPoly(m, [poly], 1)
            face = np.zeros_like(m)
            cv2.fillPoly(face, [poly], 1)
            shade[face > 0] = s
    elif kind == "shoe":
        sole = max(3, h // 7)
        cv2.ellipse(m, (int(w * 0.58), int(h * 0.62)), (int(w * 0.4), int(h * 0.3)), 0, 180, 360, 1, -1)
        cv2.ellipse(m, (int(w * 0.3), int(h * 0.4)), (int(w * 0.26), int(h * 0.38)), 0, 0, 360, 1, -1)
        cv2.rectangle(m, (int(w * 0.06), int(h * 0.55)), (w - 2, h - sole - 1), 1, -1)
        cv2.rectangle(m, (0, h - sole), (w - 1, h - 1), 1, -1)
        shade[h - sole :, :] = 0.55
    elif kind == "bottle":
        neck = max(3, w // 4)
        cv2.rectangle(m, (w // 2 - neck // 2, 0), (w // 2 + neck // 2, h // 3), 1, -1)
        cv2.ellipse(m, (w // 2, h // 3 + h // 10), (w // 2 - 1, h // 10), 0, 180, 360, 1, -1)
        cv2.rectangle(m, (0, h // 3 + h // 10), (w - 1, h - 1), 1, -1)
        xx = np.linspace(-1, 1, w, dtype=np.float32)[None, :]
        shade = shade * (1.1 - 0.35 * xx**2)
    elif kind == "mug":  # a body and a handle with a hole
        bw = int(w * 0.72)
        cv2.rectangle(m, (0, 0), (bw, h - 1), 1, -1)
        t = max(3, w // 14)
        cv2.ellipse(m, (bw, h // 2), (w - bw - 1, h // 4), 0, -90, 90, 1, t)
    elif kind == "ring":
        r = min(h, w) // 2 - 1
        cv2.ellipse(m, (w // 2, h // 2), (w // 2 - 1, h // 2 - 1), 0, 0, 360, 1, -1)
        cv2.ellipse(m, (w // 2, h // 2), (int(w * 0.27), int(h * 0.27)), 0, 0, 360, 0, -1)
        del r
    elif kind == "lamp":  # a base, a thin stem and a shade: the stem is 2-4 px wide
        stem = int(rng.integers(2, 5))
        cv2.ellipse(m, (w // 2, h - h // 16 - 1), (w // 3, h // 16), 0, 0, 360, 1, -1)
        cv2.rectangle(m, (w // 2 - stem // 2, h // 3), (w // 2 - stem // 2 + stem - 1, h - h // 16), 1, -1)
        shade_poly = np.array([[w // 5, 0], [w - w // 5, 0], [w - 1, h // 3], [0, h // 3]], np.int32)
        cv2.fillPoly(m, [shade_poly], 1)
    elif kind == "chair":  # a seat, a back and four thin legs: thin parts and gaps
        leg = int(rng.integers(2, 5))
        cv2.rectangle(m, (0, int(h * 0.5)), (w - 1, int(h * 0.6)), 1, -1)
        cv2.rectangle(m, (0, 0), (max(leg, w // 10), int(h * 0.55)), 1, -1)
        for x in (0, w // 3, 2 * w // 3, w - leg):
            cv2.rectangle(m, (x, int(h * 0.6)), (x + leg - 1, h - 1), 1, -1)
    elif kind == "horse":
        m[:] = cv2.resize(_horse(), (w, h), interpolation=cv2.INTER_NEAREST)
    else:  # blob: a smooth random star
        k = int(rng.integers(5, 10))
        ang = np.linspace(0, 2 * math.pi, 64, endpoint=False)
        rad = np.ones_like(ang)
        for j in range(2, k):
            rad += rng.uniform(-0.12, 0.12) * np.cos(j * ang + rng.uniform(0, 6.3))
        rad /= rad.max()
        pts = np.stack([w / 2 + (w / 2 - 1) * rad * np.cos(ang), h / 2 + (h / 2 - 1) * rad * np.sin(ang)], 1)
        cv2.fillPoly(m, [pts.round().astype(np.int32)], 1)
    return m.astype(bool), shade


# --------------------------------------------------------------------------- backgrounds


def _background(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "gradient":
        a, b = _colour(rng, 150, 250), _colour(rng, 150, 250)
        ang = float(rng.uniform(0, math.pi))
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        t = np.cos(ang) * xx / w + np.sin(ang) * yy / h
        t = (t - t.min()) / max(1e-6, float(np.ptp(t)))
        return a * (1 - t[..., None]) + b * t[..., None]
    if kind == "cluttered":  # a blurred photograph, with objects strewn over it
        bg = cv2.GaussianBlur(_crop(_photo(str(rng.choice(_PHOTOS + _GREYS))), h, w, rng), (0, 0), 1.0)
        for _ in range(int(rng.integers(4, 10))):
            c = tuple(float(v) for v in _colour(rng, 0, 255))
            x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
            r = int(rng.integers(4, max(6, min(h, w) // 8)))
            if rng.random() < 0.5:
                cv2.circle(bg, (x, y), r, c, -1)
            else:
                cv2.rectangle(bg, (x, y), (x + 2 * r, y + r), c, -1)
        return bg
    base = np.array([236, 236, 232], np.float32) + rng.integers(-12, 12, size=3)
    return np.broadcast_to(base, (h, w, 3)).copy()  # plain (and the base of low_contrast)


# --------------------------------------------------------------------------- composition


def _place(
    h: int, w: int, sh: int, sw: int, taken: list[tuple[int, int, int, int]], overlap: float, rng: np.random.Generator
) -> tuple[int, int] | None:
    """A top-left corner for an ``sh x sw`` subject, at least 3 px inside the frame, whose box
    overlaps each taken box by at most ``overlap`` of the smaller one."""
    for _ in range(30):
        x, y = int(rng.integers(3, max(4, w - sw - 3))), int(rng.integers(3, max(4, h - sh - 3)))
        ok = True
        for tx1, ty1, tx2, ty2 in taken:
            iw = max(0, min(x + sw, tx2) - max(x, tx1))
            ih = max(0, min(y + sh, ty2) - max(y, ty1))
            if iw * ih > overlap * min(sw * sh, (tx2 - tx1) * (ty2 - ty1)) or (overlap == 0 and iw * ih > 0):
                ok = False
                break
        if ok:
            return x, y
    return None


def make_sample(split: str, index: int, seed: int) -> Sample:
    """Image ``index`` of ``split`` (one of ``ALL_SPLITS``) for ``seed``: the same pixels every time."""
    if split not in ALL_SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(ALL_SPLITS)}")
    hard = split == "hard"
    rng = np.random.default_rng([seed, ALL_SPLITS.index(split), index])
    if split in STRESS_SPLITS:
        from benchmarks.cutout_stress import new_sample, photos_sample

        return (new_sample if split == "new" else photos_sample)(index, rng)
    h, w = int(rng.integers(240, 301)), int(rng.integers(320, 401))
    bg_kind = str(rng.choice(HARD_BACKGROUNDS if hard else EASY_BACKGROUNDS))
    img = _background(bg_kind, h, w, rng)
    n = int(rng.integers(1, 5 if hard else 3))
    masks: list[np.ndarray] = []
    labels: list[str] = []
    taken: list[tuple[int, int, int, int]] = []
    tags: list[str] = []
    for _ in range(n):
        kind = str(rng.choice(HARD_SHAPES if hard else EASY_SHAPES))
        frac = rng.uniform(0.3, 0.6) if n == 1 else rng.uniform(0.22, 0.45)
        sh = int(h * frac * rng.uniform(0.8, 1.2))
        sw = int(sh * (rng.uniform(1.3, 2.0) if kind == "shoe" else rng.uniform(0.55, 1.3)))
        sh, sw = min(sh, h - 8), min(sw, w - 8)
        at = _place(h, w, sh, sw, taken, 0.25 if hard else 0.0, rng)
        if at is None:
            continue
        x, y = at
        sil, shade = _shape(kind, sh, sw, rng)
        tex_kinds = ("flat", "photo", "grey", "stripes", "checker", "noise") if hard else ("flat", "flat", "noise")
        tex = _texture(str(rng.choice(tex_kinds)), sh, sw, rng)
        if bg_kind == "low_contrast":  # the subject a few Delta E off the background
            bgc = img[y : y + sh, x : x + sw].reshape(-1, 3).mean(axis=0)
            tex = bgc + (tex - tex.mean(axis=(0, 1))) * 0.25 + rng.choice([-1.0, 1.0]) * rng.uniform(14, 30)
        elif not hard and float(np.abs(tex.mean(axis=(0, 1)) - img[y, x]).max()) < 60:
            tex = tex * 0.45  # easy: keep clear contrast with the light studio background
        app = tex * shade[..., None]
        if hard and rng.random() < 0.5:  # glossy highlights
            tags.append("highlight")
            for _ in range(int(rng.integers(1, 4))):
                hl = np.zeros((sh, sw), np.float32)
                cv2.circle(hl, (int(rng.integers(0, sw)), int(rng.integers(0, sh))), int(max(2, sw // 10)), 1.0, -1)
                glow = cv2.GaussianBlur(hl, (0, 0), max(1.0, sw / 25))
                app = app + glow[..., None] * (255 - app) * 0.9
        full = np.zeros((h, w), bool)
        full[y : y + sh, x : x + sw] = sil
        # a drop shadow: soft on easy images, darker and closer on hard ones
        off = (int(rng.integers(3, 9)), int(rng.integers(2, 8)))
        blur = float(rng.uniform(4, 9) if not hard else rng.uniform(1.5, 6))
        strength = float(rng.uniform(0.12, 0.3) if not hard else rng.uniform(0.2, 0.5))
        shadow = cv2.GaussianBlur(np.roll(full.astype(np.float32), off, (0, 1)), (0, 0), blur)
        img = img * (1 - strength * shadow)[..., None]
        region = img[y : y + sh, x : x + sw]
        region[sil] = app[sil]
        for k in range(len(masks)):  # the new subject hides what it covers
            masks[k] &= ~full
        masks.append(full)
        labels.append(kind)
        taken.append((x, y, x + sw, y + sh))
        tags.append(kind)
    img = cv2.GaussianBlur(img.astype(np.float32), (0, 0), 0.6)
    img = img + rng.normal(0, 3.0 if hard else 2.0, img.shape)
    subjects = []
    for m, lab in zip(masks, labels, strict=True):
        if m.sum() < 80:
            continue  # almost entirely hidden
        ys, xs = np.nonzero(m)
        subjects.append(Subject(m, [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)], lab))
    image = np.clip(img, 0, 255).round().astype(np.uint8)
    return Sample(image, subjects, split, index, bg_kind, [bg_kind, *tags])


def make_set(split: str, n: int, seed: int, start: int = 0) -> list[Sample]:
    """Images ``start`` … ``start + n - 1`` of ``split`` (one of ``ALL_SPLITS``); images without a visible
    subject are skipped (rare), so a set may hold a few fewer than ``n``. Disjoint ``start`` ranges (or
    seeds) give disjoint images: train on one, evaluate on another."""
    out = [make_sample(split, i, seed) for i in range(start, start + n)]
    return [s for s in out if s.subjects]


def loose_box(
    bbox: list[float], width: int, height: int, rng: np.random.Generator, lo: float = LOOSE[0], hi: float = LOOSE[1]
) -> list[float]:
    """The true box with each side moved out by a share drawn uniformly in [``lo``, ``hi``] of the box's
    width (left, right) or height (top, bottom), clipped to the frame (``new`` and ``photos`` leave room
    for 25 %, so there it never is)."""
    x1, y1, x2, y2 = bbox
    bw, bh = x2 - x1, y2 - y1
    d = rng.uniform(lo, hi, size=4)
    return [
        max(0.0, x1 - d[0] * bw),
        max(0.0, y1 - d[1] * bh),
        min(float(width), x2 + d[2] * bw),
        min(float(height), y2 + d[3] * bh),
    ]


def write_set(folder: Path, n: int, seed: int) -> dict[str, int]:
    """Write ``n`` images (half per split) as PNGs, one mask PNG per subject and ``labels.json``."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    labels = []
    counts = {}
    for split in SPLITS:
        samples = make_set(split, n // 2, seed)
        counts[split] = len(samples)
        for s in samples:
            name = f"{split}_{s.index:04d}"
            Image.fromarray(s.image).save(folder / f"{name}.png")
            subs = []
            for j, sub in enumerate(s.subjects):
                Image.fromarray(sub.mask.astype(np.uint8) * 255).save(folder / f"{name}_mask{j}.png")
                subs.append({"mask": f"{name}_mask{j}.png", "bbox": sub.bbox, "label": sub.label})
            labels.append({"image": f"{name}.png", "split": split, "background": s.background, "subjects": subs})
    (folder / "labels.json").write_text(json.dumps({"seed": seed, "images": labels}, indent=1))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="images in all, half per split")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs and labels.json")
    args = ap.parse_args()
    counts = write_set(args.out, args.n, args.seed)
    print(f"wrote {counts} images to {args.out}")


if __name__ == "__main__":
    main()
