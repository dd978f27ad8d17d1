"""The model backend interface: protocols, shared geometry and the name -> class registry.

Three roles, each a small protocol so a backend is any object with the method and
attributes below. Everything here is plain Python (numpy only): importing it pulls in
neither Ray nor torch, so the control plane, the tests and the GPU benchmark can use
the backends without a Ray cluster. Backend modules import this one and register their
classes; this one imports none of them: the factories import a backend's module by name
on first use (``BACKEND_MODULES``).

Shapes shared by every backend:
- ``image``: ``np.ndarray`` RGB ``uint8`` ``H x W x 3``; ``image_sha``: the image's sha256,
  used as a cache key (SAM keeps the image embedding under it).
- ``bbox``: ``[x1, y1, x2, y2]`` floats, pixels of the original image.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)

DEFAULT_BACKEND = "classical"


class ModelLoadError(RuntimeError):
    """A model file is missing, unreadable or does not fit the architecture asked for."""


@runtime_checkable
class DetectorBackend(Protocol):
    name: str

    def detect(self, image: np.ndarray, image_sha: str) -> list[dict[str, Any]]:
        """Return ``[{"bbox": [x1, y1, x2, y2], "label": str, "score": float in [0, 1]}]``, best first."""
        ...


@runtime_checkable
class ValidatorBackend(Protocol):
    name: str
    threshold: float
    policy_version: str

    def validate(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """For ``[{"box_id", "bbox", "label"}]`` return ``[{"box_id", "passed", "score", "reason"}]``
        in the same order; ``passed`` is ``score >= threshold`` and ``reason`` is None when passed."""
        ...


@runtime_checkable
class SegmenterBackend(Protocol):
    name: str

    def segment(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """For ``[{"box_id", "bbox"}]`` return ``[{"box_id", "mask"}]`` (``mask``: bool ``H x W``,
        the image's size), all boxes of the image in one call. A result may also carry
        ``"alpha"`` (uint8 ``H x W``, a feathered edge for the cut-out) and ``"reason"``."""
        ...


@runtime_checkable
class PromptedSegmenter(Protocol):
    """Segmentation from a box plus a reviewer's clicks (SPEC §13: ``REFINE``, the live preview,
    and ``REFINE_SUBJECT``'s prompt strategies)."""

    name: str

    def segment_prompt(
        self,
        image: np.ndarray,
        image_sha: str,
        bbox: list[float],
        points: list[dict[str, Any]],
        *,
        multimask: bool = False,
    ) -> list[dict[str, Any]]:
        """``points``: ``[{"x", "y", "positive"}]`` in image pixels (positive: the subject, negative:
        not the subject). Returns candidates ``[{"mask", "predicted_iou", "stability"}]``, best
        first (several with ``multimask``): ``mask`` bool ``H x W`` (the image's size), the scores
        floats in [0, 1] or None when the backend has none. A bad box or a point off the image
        raises ``ValueError``."""
        ...


# --------------------------------------------------------------------------- shared helpers


def check_image(image: np.ndarray) -> np.ndarray:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError("image must be an RGB uint8 array of shape HxWx3")
    if image.shape[0] < 2 or image.shape[1] < 2:
        raise ValueError("image is too small")
    return image


def box_problem(bbox: Any, width: int, height: int) -> str | None:
    """Why ``bbox`` cannot be used on a ``width x height`` image, or None when it can."""
    try:
        x1, y1, x2, y2 = (float(v) for v in bbox)
    except (TypeError, ValueError):
        return "bbox must be four numbers [x1, y1, x2, y2]"
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        return "bbox coordinates must be finite"
    if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
        return f"bbox lies outside the {width}x{height} image"
    if x2 - x1 < 2 or y2 - y1 < 2:
        return "bbox is too small (under 2 pixels wide or high)"
    return None


def check_points(points: Any, width: int, height: int) -> list[tuple[float, float, bool]]:
    """``[{"x", "y", "positive"}]`` as ``(x, y, positive)`` tuples, or ``ValueError`` saying which point
    is wrong. A point lies on the image when ``0 <= x <= width`` and ``0 <= y <= height``."""
    if not isinstance(points, list | tuple):
        raise ValueError('points must be a list of {"x", "y", "positive"}')
    out = []
    for i, p in enumerate(points):
        if not isinstance(p, dict) or not {"x", "y", "positive"} <= set(p):
            raise ValueError(f'point {i} must be {{"x", "y", "positive"}}, got {p!r}')
        try:
            x, y = float(p["x"]), float(p["y"])
        except (TypeError, ValueError):
            raise ValueError(f"point {i}: x and y must be numbers, got {p['x']!r}, {p['y']!r}") from None
        if not (math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"point {i}: x and y must be finite")
        if not (0.0 <= x <= width and 0.0 <= y <= height):
            raise ValueError(f"point {i} ({x:g}, {y:g}) lies outside the {width}x{height} image")
        if not isinstance(p["positive"], bool | np.bool_):
            raise ValueError(f"point {i}: positive must be true or false, got {p['positive']!r}")
        out.append((x, y, bool(p["positive"])))
    return out


def int_box(bbox: Any, width: int, height: int) -> tuple[int, int, int, int]:
    """Pixel bounds covering ``bbox`` (x2, y2 exclusive), clipped to the image."""
    x1, y1, x2, y2 = (float(v) for v in bbox)
    return (
        max(0, int(math.floor(x1))),
        max(0, int(math.floor(y1))),
        min(width, int(math.ceil(x2))),
        min(height, int(math.ceil(y2))),
    )


def box_iou(a: Any, b: Any) -> float:
    ax1, ay1, ax2, ay2 = (float(v) for v in a)
    bx1, by1, bx2, by2 = (float(v) for v in b)
    iw = max(0.0, min(ax2, bx2) - max(ax1, bx1))
    ih = max(0.0, min(ay2, by2) - max(ay1, by1))
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def mask_bbox(mask: np.ndarray) -> list[float] | None:
    """Tight ``[x1, y1, x2, y2]`` of a bool mask (x2, y2 exclusive), None when empty."""
    ys = np.flatnonzero(mask.any(axis=1))
    if ys.size == 0:
        return None
    xs = np.flatnonzero(mask.any(axis=0))
    return [float(xs[0]), float(ys[0]), float(xs[-1] + 1), float(ys[-1] + 1)]


def invalid_result(box_id: str, reason: str) -> dict[str, Any]:
    return {"box_id": box_id, "passed": False, "score": 0.0, "reason": reason}


class DelayedDetector:
    """Adds a fixed sleep before each detection: the ``--detector-delay-ms`` knob for demos and
    load tests, so queueing and autoscaling can be watched without a real model's cost."""

    def __init__(self, inner: DetectorBackend, delay_ms: float) -> None:
        self.inner = inner
        self.delay_ms = float(delay_ms)
        self.name = inner.name

    def detect(self, image: np.ndarray, image_sha: str) -> list[dict[str, Any]]:
        time.sleep(self.delay_ms / 1000.0)
        return self.inner.detect(image, image_sha)

    def __getattr__(self, item: str) -> Any:
        if item == "inner":  # not set yet (copy, unpickle): no recursion
            raise AttributeError(item)
        return getattr(self.inner, item)


class DelayedSegmenter:
    """The same for segmentation (``--segmenter-delay-ms``): a slow segmenter makes review bursts
    queue on the Segmenter deployment, so its autoscaling can be watched."""

    def __init__(self, inner: SegmenterBackend, delay_ms: float) -> None:
        self.inner = inner
        self.delay_ms = float(delay_ms)
        self.name = inner.name

    def segment(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        time.sleep(self.delay_ms / 1000.0)
        return self.inner.segment(image, image_sha, boxes)

    def __getattr__(self, item: str) -> Any:
        if item == "inner":  # not set yet (copy, unpickle): no recursion
            raise AttributeError(item)
        return getattr(self.inner, item)


# --------------------------------------------------------------------------- registry

Role = Literal["detector", "validator", "segmenter"]
T = TypeVar("T")

# Where each backend lives, by role and name. The module is imported on first use (by name,
# so this file imports no backend and choosing the classical default never imports torch);
# on import it registers its classes with ``register``.
_CLASSICAL = "hitl_review.deployments.backends.classical"
_SAM = "hitl_review.deployments.backends.sam.backends"
_TORCHVISION = "hitl_review.deployments.backends.tv_detector"
_NULL = "hitl_review.deployments.backends.null"  # no compute: measures the control plane alone
BACKEND_MODULES: dict[Role, dict[str, str]] = {
    "detector": {"classical": _CLASSICAL, "sam-auto": _SAM, "sam": _SAM, "torchvision": _TORCHVISION, "null": _NULL},
    "validator": {"classical": _CLASSICAL, "sam": _SAM, "sam-auto": _SAM, "null": _NULL, "torchvision": _TORCHVISION},
    "segmenter": {"classical": _CLASSICAL, "sam": _SAM, "sam-auto": _SAM, "null": _NULL},
}
DETECTORS = tuple(BACKEND_MODULES["detector"])
VALIDATORS = tuple(BACKEND_MODULES["validator"])
SEGMENTERS = tuple(BACKEND_MODULES["segmenter"])


@dataclass(frozen=True)
class _Entry:
    cls: Callable[..., Any]
    takes_artifacts: bool


_REGISTRY: dict[tuple[Role, str], _Entry] = {}


def register(role: Role, *names: str, takes_artifacts: bool = False) -> Callable[[type[T]], type[T]]:
    """Class decorator: the backend for ``role`` under ``names``. ``takes_artifacts``: its
    constructor wants the ArtifactStore (``artifacts=``), e.g. to persist SAM embeddings."""

    def deco(cls: type[T]) -> type[T]:
        for name in names:
            _REGISTRY[(role, name)] = _Entry(cls, takes_artifacts)
        return cls

    return deco


def backend_class(role: Role, name: str) -> Callable[..., Any]:
    """The class registered for ``role`` and ``name``, importing its module on first use."""
    return _entry(role, name.lower()).cls


def _entry(role: Role, name: str) -> _Entry:
    if (role, name) not in _REGISTRY:
        module = BACKEND_MODULES[role].get(name)
        if module is None:
            raise ValueError(f"unknown {role} backend {name!r}; choose one of {', '.join(BACKEND_MODULES[role])}")
        importlib.import_module(module)
    try:
        return _REGISTRY[(role, name)]
    except KeyError:
        raise ValueError(f"{BACKEND_MODULES[role][name]} registers no {role} backend {name!r}") from None


def make_backend(role: Role, name: str | None = None, *, artifacts: Any = None, **cfg: Any) -> Any:
    """A backend for ``role`` by name (default ``classical``); the detector and the segmenter also
    take ``delay_ms``."""
    if role == "detector":
        return make_detector(name, artifacts=artifacts, **cfg)
    if role == "validator":
        return make_validator(name, artifacts=artifacts, **cfg)
    return make_segmenter(name, artifacts=artifacts, **cfg)


def _build(role: Role, name: str | None, artifacts: Any, cfg: dict[str, Any]) -> Any:
    entry = _entry(role, (name or DEFAULT_BACKEND).lower())
    if entry.takes_artifacts:
        cfg = {**cfg, "artifacts": artifacts}
    return entry.cls(**cfg)


def make_detector(
    name: str | None = None, *, delay_ms: float = 0, artifacts: Any = None, **cfg: Any
) -> DetectorBackend:
    """``classical`` (default, weight-free), ``sam-auto``/``sam`` (SamAutomaticMaskGenerator proposals,
    needs ``checkpoint``), ``torchvision`` (needs ``weights``; ``arch`` picks the architecture).

    ``artifacts`` (an ArtifactStore) is where SAM persists image embeddings; the other
    backends keep nothing and ignore it."""
    backend: DetectorBackend = _build("detector", name, artifacts, cfg)
    if delay_ms and delay_ms > 0:
        backend = DelayedDetector(backend, delay_ms)
    log.info("detector backend: %s", backend.name)
    return backend


def make_validator(name: str | None = None, *, artifacts: Any = None, **cfg: Any) -> ValidatorBackend:
    """``classical`` (default) or ``sam`` (the decoder's predicted IoU for the box prompt)."""
    backend: ValidatorBackend = _build("validator", name, artifacts, cfg)
    log.info(
        "validator backend: %s (threshold %.2f, policy %s)", backend.name, backend.threshold, backend.policy_version
    )
    return backend


def make_segmenter(
    name: str | None = None, *, delay_ms: float = 0, artifacts: Any = None, **cfg: Any
) -> SegmenterBackend:
    """``classical`` (default, GrabCut seeded by the box) or ``sam`` (batched box prompts)."""
    backend: SegmenterBackend = _build("segmenter", name, artifacts, cfg)
    if delay_ms and delay_ms > 0:
        backend = DelayedSegmenter(backend, delay_ms)
    log.info("segmenter backend: %s", backend.name)
    return backend
