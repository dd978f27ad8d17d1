"""Sample images for `hitl demo` and the tests: product composites on plain
backgrounds (made here, deterministic) and real photographs shipped by scikit-image."""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
from PIL import Image


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def product_composite(seed: int = 0, width: int = 640, height: int = 480, n: int = 2) -> tuple[bytes, list[list[int]]]:
    """``n`` shaded objects ("shoes", "boxes") on a light studio background with soft shadows.

    Returns the PNG bytes and the true boxes [x1, y1, x2, y2].
    """
    rng = np.random.default_rng(seed)
    bg = np.array([236, 236, 232]) + rng.integers(-6, 6, size=3)
    img = np.empty((height, width, 3), np.float32)
    img[:] = bg
    yy = np.linspace(-8, 8, height)[:, None, None]
    img += yy  # a gentle studio gradient
    boxes: list[list[int]] = []
    slot_w = width // n
    for i in range(n):
        w = int(rng.integers(slot_w // 3, int(slot_w * 0.7)))
        h = int(rng.integers(height // 4, height // 2))
        cx = slot_w * i + slot_w // 2 + int(rng.integers(-slot_w // 10, slot_w // 10 + 1))
        cy = height // 2 + int(rng.integers(-height // 10, height // 10 + 1))
        colour = tuple(int(c) for c in rng.integers(20, 200, size=3))
        mask = np.zeros((height, width), np.uint8)
        if i % 2 == 0:
            cv2.ellipse(mask, (cx, cy), (w // 2, h // 3), float(rng.integers(-20, 20)), 0, 360, 255, -1)
        else:
            cv2.rectangle(mask, (cx - w // 2, cy - h // 2), (cx + w // 2, cy + h // 2), 255, -1)
        shadow = cv2.GaussianBlur(np.roll(mask, (8, 6), (0, 1)), (31, 31), 0).astype(np.float32) / 255
        img *= (1 - 0.25 * shadow)[..., None]
        shade = np.linspace(1.15, 0.8, height)[:, None]
        obj = np.array(colour, np.float32)[None, None, :] * shade[..., None]
        m = mask.astype(bool)
        img[m] = obj.repeat(width, 1)[m]
        ys, xs = np.nonzero(mask)
        boxes.append([int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1])
    img += rng.normal(0, 2.0, img.shape)
    return _png(np.clip(img, 0, 255).astype(np.uint8)), boxes


def photographs() -> dict[str, bytes]:
    """Real photographs that scikit-image ships (no download)."""
    from skimage import data

    out = {}
    for name in ("coffee", "chelsea", "astronaut"):
        out[f"{name}.png"] = _png(getattr(data, name)())
    return out


def write_samples(folder: Path, composites: int = 3) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(composites):
        png, _ = product_composite(seed=i, n=2 + i % 2)
        p = folder / f"product_{i:02d}.png"
        p.write_bytes(png)
        paths.append(p)
    for name, png in photographs().items():
        p = folder / name
        p.write_bytes(png)
        paths.append(p)
    return paths
