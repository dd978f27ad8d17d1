"""The cut-out set's stress splits (``benchmarks/cutout_data.py``'s docstring says what each holds and
how its truth was made): outlines, backgrounds and real photographs that no shipped gate was
calibrated or trained on. Kept apart from the original generator so that ``easy`` and ``hard`` stay
pixel for pixel what every recorded figure was measured on.
"""

from __future__ import annotations

import functools

import cv2
import numpy as np

from benchmarks.cutout_data import (
    HARD_SHAPES,
    NEW_BACKGROUNDS,
    NEW_SHAPES,
    PHOTO_SOURCES,
    Sample,
    Subject,
    _colour,
    _crop,
    _photo,
    _texture,
)

_REAL = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry")
_LETTERS = "ABCDEFGHKLMNPRSTUVWXYZ"
MARGIN = 0.27  # a subject stays this share of its size (and 2 px) inside the frame: a 25 % loose box fits


# --------------------------------------------------------------------------- outlines


def new_shape(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A silhouette (bool ``h x w``) of one of ``NEW_SHAPES``."""
    m = np.zeros((h, w), np.uint8)

    def poly(*pts: tuple[float, float], value: int = 1) -> None:
        cv2.fillPoly(m, [np.array([[round(x * (w - 1)), round(y * (h - 1))] for x, y in pts], np.int32)], value)

    if kind == "tshirt":
        poly((0.3, 0.0), (0.7, 0.0), (1.0, 0.18), (0.88, 0.38), (0.78, 0.3), (0.78, 1.0), (0.22, 1.0), (0.22, 0.3),
             (0.12, 0.38), (0.0, 0.18))  # fmt: skip
        cv2.ellipse(m, (w // 2, 0), (max(2, int(w * 0.12)), max(2, int(h * 0.08))), 0, 0, 180, 0, -1)  # the neck
    elif kind == "trousers":
        poly((0.1, 0.0), (0.9, 0.0), (1.0, 1.0), (0.62, 1.0), (0.5, 0.3), (0.38, 1.0), (0.0, 1.0))
    elif kind == "dress":
        strap = max(2, w // 20)
        poly((0.3, 0.15), (0.7, 0.15), (0.66, 0.45), (1.0, 1.0), (0.0, 1.0), (0.34, 0.45))
        for x in (int(w * 0.32), int(w * 0.66) - strap):
            cv2.rectangle(m, (x, 0), (x + strap, int(h * 0.16)), 1, -1)
    elif kind == "sofa":
        poly((0.0, 0.3), (0.14, 0.3), (0.14, 0.0), (0.86, 0.0), (0.86, 0.3), (1.0, 0.3), (1.0, 0.85), (0.0, 0.85))
        leg = max(2, w // 25)
        for x in (int(w * 0.04), int(w * 0.96) - leg):
            cv2.rectangle(m, (x, int(h * 0.85)), (x + leg, h - 1), 1, -1)
    elif kind == "table":
        top, leg = max(3, h // 8), int(rng.integers(2, 6))
        cv2.rectangle(m, (0, 0), (w - 1, top), 1, -1)
        for x in (int(w * 0.05), int(w * 0.95) - leg):
            cv2.rectangle(m, (x, top), (x + leg, h - 1), 1, -1)
    elif kind == "shelf":  # an open frame: the gaps between the boards show the background
        side, board = max(2, w // 14), max(2, h // 18)
        cv2.rectangle(m, (0, 0), (side, h - 1), 1, -1)
        cv2.rectangle(m, (w - 1 - side, 0), (w - 1, h - 1), 1, -1)
        for k in range(int(rng.integers(3, 6))):
            y = round(k * (h - 1 - board) / max(1, int(rng.integers(2, 5))))
            cv2.rectangle(m, (0, min(y, h - 1 - board)), (w - 1, min(y, h - 1 - board) + board), 1, -1)
        cv2.rectangle(m, (0, h - 1 - board), (w - 1, h - 1), 1, -1)
    elif kind == "handbag":  # a body and an arched handle with a hole
        poly((0.12, 0.4), (0.88, 0.4), (1.0, 1.0), (0.0, 1.0))
        t = max(2, w // 16)
        cv2.ellipse(m, (w // 2, int(h * 0.42)), (int(w * 0.28), int(h * 0.36)), 0, 180, 360, 1, t)
    elif kind == "backpack":
        cv2.rectangle(m, (int(w * 0.1), int(h * 0.12)), (int(w * 0.9), h - 1), 1, -1)
        cv2.ellipse(m, (w // 2, int(h * 0.2)), (int(w * 0.4), int(h * 0.16)), 0, 180, 360, 1, -1)
        cv2.ellipse(m, (w // 2, int(h * 0.06)), (int(w * 0.1), int(h * 0.06)), 0, 180, 360, 1, max(2, w // 30))
        cv2.rectangle(m, (0, int(h * 0.5)), (int(w * 0.1), int(h * 0.85)), 1, -1)
    elif kind == "plant":  # a pot, thin stems and leaves at random angles
        poly((0.3, 0.7), (0.7, 0.7), (0.64, 1.0), (0.36, 1.0))
        for _ in range(int(rng.integers(4, 8))):
            tip = (int(rng.uniform(0.1, 0.9) * w), int(rng.uniform(0.05, 0.45) * h))
            cv2.line(m, (w // 2, int(h * 0.7)), tip, 1, int(rng.integers(1, 4)))
            ax = (max(2, int(w * rng.uniform(0.06, 0.14))), max(2, int(h * rng.uniform(0.03, 0.07))))
            cv2.ellipse(m, tip, ax, float(rng.uniform(0, 180)), 0, 360, 1, -1)
    elif kind == "lettering":  # one to three bold letters, scaled to the canvas: pieces and holes
        text = "".join(str(rng.choice(list(_LETTERS))) for _ in range(int(rng.integers(1, 4))))
        font = cv2.FONT_HERSHEY_SIMPLEX if rng.random() < 0.5 else cv2.FONT_HERSHEY_DUPLEX
        thick = int(rng.integers(6, 12))
        (tw, th), base = cv2.getTextSize(text, font, 2.0, thick)
        canvas = np.zeros((th + base + 2 * thick, tw + 2 * thick), np.uint8)
        cv2.putText(canvas, text, (thick, th + thick), font, 2.0, 1, thick)
        ys, xs = np.nonzero(canvas)
        canvas = canvas[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
        m[:] = cv2.resize(canvas, (w, h), interpolation=cv2.INTER_NEAREST)
    else:
        raise ValueError(f"unknown new shape {kind!r}; choose one of {', '.join(NEW_SHAPES)}")
    return m.astype(bool)


# --------------------------------------------------------------------------- backgrounds


def new_background(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A float ``h x w x 3`` background of one of ``NEW_BACKGROUNDS``."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == "wood":  # warped grain
        warp = cv2.GaussianBlur(rng.normal(0, 1, (h, w)).astype(np.float32), (0, 0), 12) * 40
        grain = 0.5 + 0.5 * np.sin((yy + warp) / float(rng.uniform(3, 7)))
        a, b = np.array([150, 100, 60], np.float32), np.array([200, 150, 100], np.float32)
        a, b = a + rng.integers(-25, 25, 3), b + rng.integers(-25, 25, 3)
        return a * grain[..., None] + b * (1 - grain[..., None])
    if kind == "fabric":  # a weave
        p = float(rng.uniform(2.5, 5))
        weave = 0.5 + 0.25 * np.sin(xx / p) * np.sign(np.sin(yy / p)) + 0.1 * rng.normal(0, 1, (h, w))
        base = _colour(rng, 60, 220)
        return base * (0.75 + 0.5 * weave[..., None])
    if kind == "dark":  # a dark studio
        base = rng.integers(10, 45, 3).astype(np.float32)
        return base + 25 * (yy / h)[..., None]
    if kind == "tiles":
        c = int(rng.integers(25, 60))
        grout = ((yy % c) < 3) | ((xx % c) < 3)
        tile, line = _colour(rng, 120, 240), _colour(rng, 40, 140)
        return np.where(grout[..., None], line, tile + rng.normal(0, 4, (h, w, 1)))
    if kind == "photo":  # a sharp real photograph: every edge the gate may mistake for the subject's
        return _crop(_photo(str(rng.choice(_REAL))), h, w, rng).copy()
    raise ValueError(f"unknown new background {kind!r}; choose one of {', '.join(NEW_BACKGROUNDS)}")


# --------------------------------------------------------------------------- composition


def _place(h: int, w: int, sh: int, sw: int, taken: list[tuple[int, int, int, int]], rng: np.random.Generator):
    """A top-left corner keeping ``MARGIN`` of the subject's size free to the frame, boxes apart."""
    mx, my = int(MARGIN * sw) + 2, int(MARGIN * sh) + 2
    if w - sw - mx < mx or h - sh - my < my:
        return None
    for _ in range(30):
        x, y = int(rng.integers(mx, w - sw - mx + 1)), int(rng.integers(my, h - sh - my + 1))
        if all(x + sw <= a or b <= x or y + sh <= c or d <= y for a, c, b, d in taken):
            return x, y
    return None


def _compose(
    img: np.ndarray, kinds: list[str], tex_kinds: tuple[str, ...], rng: np.random.Generator, photo_tex: bool
) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    h, w = img.shape[:2]
    masks: list[np.ndarray] = []
    labels: list[str] = []
    taken: list[tuple[int, int, int, int]] = []
    for kind in kinds:
        frac = rng.uniform(0.3, 0.5) if len(kinds) == 1 else rng.uniform(0.22, 0.4)
        sh = int(h * frac * rng.uniform(0.8, 1.2))
        sw = int(sh * rng.uniform(0.6, 1.4))
        at = _place(h, w, sh, sw, taken, rng)
        if at is None:
            continue
        x, y = at
        if kind in NEW_SHAPES:
            sil = new_shape(kind, sh, sw, rng)
            shade = np.linspace(1.1, 0.85, sh, dtype=np.float32)[:, None] * np.ones((1, sw), np.float32)
        else:
            from benchmarks.cutout_data import _shape

            sil, shade = _shape(kind, sh, sw, rng)
        if photo_tex:
            tex = _crop(_photo(str(rng.choice(_REAL))), sh, sw, rng)
        else:
            tex = _texture(str(rng.choice(tex_kinds)), sh, sw, rng)
        full = np.zeros((h, w), bool)
        full[y : y + sh, x : x + sw] = sil
        off = (int(rng.integers(3, 9)), int(rng.integers(2, 8)))
        shadow = cv2.GaussianBlur(np.roll(full.astype(np.float32), off, (0, 1)), (0, 0), float(rng.uniform(2, 7)))
        img = img * (1 - float(rng.uniform(0.15, 0.4)) * shadow)[..., None]
        region = img[y : y + sh, x : x + sw]
        region[sil] = (tex * shade[..., None])[sil]
        masks.append(full)
        labels.append(kind)
        taken.append((x, y, x + sw, y + sh))
    return img, masks, labels


def _subjects(masks: list[np.ndarray], labels: list[str], min_px: int = 80) -> list[Subject]:
    out = []
    for m, lab in zip(masks, labels, strict=True):
        if m.sum() < min_px:
            continue
        ys, xs = np.nonzero(m)
        out.append(Subject(m, [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)], lab))
    return out


def new_sample(index: int, rng: np.random.Generator) -> Sample:
    """``new``: one to three of ``NEW_SHAPES`` on one of ``NEW_BACKGROUNDS``, boxes apart, room for loose boxes."""
    h, w = int(rng.integers(240, 301)), int(rng.integers(320, 401))
    bg_kind = str(rng.choice(NEW_BACKGROUNDS))
    img = new_background(bg_kind, h, w, rng)
    kinds = [str(rng.choice(NEW_SHAPES)) for _ in range(int(rng.integers(1, 4)))]
    tex = ("flat", "photo", "grey", "stripes", "checker", "noise")
    img, masks, labels = _compose(img, kinds, tex, rng, photo_tex=False)
    img = cv2.GaussianBlur(img.astype(np.float32), (0, 0), 0.6) + rng.normal(0, 2.5, img.shape)
    image = np.clip(img, 0, 255).round().astype(np.uint8)
    return Sample(image, _subjects(masks, labels), "new", index, bg_kind, [bg_kind, *labels])


@functools.cache
def coins_truth() -> tuple[np.ndarray, np.ndarray]:
    """scikit-image's coins photograph and its derived per-coin labels (the docstring of cutout_data)."""
    from scipy import ndimage as ndi
    from skimage import data, filters, segmentation

    coins = data.coins()
    markers = np.zeros_like(coins)
    markers[coins < 30], markers[coins > 150] = 1, 2
    fg = ndi.binary_fill_holes(segmentation.watershed(filters.sobel(coins), markers) == 2)
    labels, _ = ndi.label(fg)
    sizes = np.bincount(labels.ravel())
    labels[sizes[labels] < 500] = 0  # specks, not coins
    return coins, labels


def coins_sample(index: int, rng: np.random.Generator) -> Sample:
    """A window of the coins photograph, scaled up; the coins that lie inside it with room for a loose box."""
    coins, labels = coins_truth()
    H, W = coins.shape
    s = float(rng.uniform(1.5, 2.5))
    wh, ww = min(H, int(rng.integers(120, 180))), min(W, int(rng.integers(160, 230)))
    y0, x0 = int(rng.integers(0, H - wh + 1)), int(rng.integers(0, W - ww + 1))
    win = coins[y0 : y0 + wh, x0 : x0 + ww]
    lab = labels[y0 : y0 + wh, x0 : x0 + ww]
    size = (round(ww * s), round(wh * s))
    image = cv2.resize(np.repeat(win[..., None], 3, axis=2), size, interpolation=cv2.INTER_LINEAR)
    lab = cv2.resize(lab.astype(np.int32).astype(np.float32), size, interpolation=cv2.INTER_NEAREST).astype(int)
    h, w = lab.shape
    masks, names = [], []
    ids = [int(v) for v in np.unique(lab) if v]
    rng.shuffle(ids)
    for v in ids:
        m = lab == v
        ys, xs = np.nonzero(m)
        bw, bh = xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()
        mx, my = MARGIN * bw + 1, MARGIN * bh + 1
        if xs.min() < mx or ys.min() < my or xs.max() + 1 + mx > w or ys.max() + 1 + my > h:
            continue  # cut by the window, or too near its edge for a loose box
        masks.append(m)
        names.append("coin")
        if len(masks) == 4:
            break
    return Sample(image, _subjects(masks, names), "photos", index, "coins", ["coins", "derived_truth"])


def photo_cutout_sample(index: int, rng: np.random.Generator) -> Sample:
    """One or two outlines cut from real photographs, pasted unblurred on a sharp window of another."""
    h, w = int(rng.integers(240, 301)), int(rng.integers(320, 401))
    img = new_background("photo", h, w, rng)
    kinds = [str(rng.choice(NEW_SHAPES + HARD_SHAPES)) for _ in range(int(rng.integers(1, 3)))]
    img, masks, labels = _compose(img, kinds, (), rng, photo_tex=True)
    image = np.clip(img, 0, 255).round().astype(np.uint8)
    return Sample(image, _subjects(masks, labels), "photos", index, "photo_cutout", ["photo_cutout", *labels])


def photos_sample(index: int, rng: np.random.Generator) -> Sample:
    """``photos``: a third coins (derived truth), the rest photo cut-outs (exact truth)."""
    source = PHOTO_SOURCES[0] if rng.random() < 1 / 3 else PHOTO_SOURCES[1]
    return coins_sample(index, rng) if source == "coins" else photo_cutout_sample(index, rng)


def looseness(given: list[float], true: list[float]) -> list[float]:
    """How far each side of ``given`` lies outside ``true`` (left, top, right, bottom), as a share of
    the true box's width or height: what ``loose_box`` draws, measured back."""
    bw, bh = max(1e-9, true[2] - true[0]), max(1e-9, true[3] - true[1])
    return [(true[0] - given[0]) / bw, (true[1] - given[1]) / bh, (given[2] - true[2]) / bw, (given[3] - true[3]) / bh]
