"""Node handlers: a node command's input in, the node's output out. Plain Python.

The same code runs inside the Ray Serve deployments (``deployments.serve``) and in the
control plane's local runner (threads, no Ray). It reads the image from the
ArtifactStore, calls a backend, writes masks and cut-outs back to the store and returns
only names; it never touches job state.

Outputs, as ``statecore.decide`` reads them:
- ``DETECT_SUBJECTS`` -> ``{"boxes": [{"bbox", "label", "score"}], "backend"}``
- ``VALIDATE_MANUAL_BOX_LIST`` -> ``{"results": [{"box_id", "passed", "score", "reason"}],
  "backend", "threshold", "policy_version"}``
- ``PROCESS_APPROVED_BOX_LIST`` -> ``{"subjects": [{"box_id", "status", "reason", "mask", "cutout"}],
  "backend"}``
"""
from __future__ import annotations

import hashlib
import io
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from PIL import Image

from statecore.errors import NodeExecutionError

from .backends.base import (DetectorBackend, SegmenterBackend, ValidatorBackend, make_detector, make_segmenter,
                            make_validator)

if TYPE_CHECKING:  # fsspec is imported when a store is built, so a bare GPU box can import this module
    from statecore.artifacts import ArtifactStore

log = logging.getLogger("hitl.executor")

MODEL_NODES = ("DETECT_SUBJECTS", "VALIDATE_MANUAL_BOX_LIST", "PROCESS_APPROVED_BOX_LIST")


@dataclass
class Models:
    """The backends one executor holds; a Serve deployment holds only its own."""

    detector: DetectorBackend | None = None
    validator: ValidatorBackend | None = None
    segmenter: SegmenterBackend | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.detector is not None:
            out["detector"] = self.detector.name
        if self.validator is not None:
            out["validator"] = self.validator.name
            out["validator_threshold"] = self.validator.threshold
            out["validator_policy"] = self.validator.policy_version
        if self.segmenter is not None:
            out["segmenter"] = self.segmenter.name
        encoders = {id(e): e for e in (getattr(b, "encoder", None) for b in (self.detector, self.validator,
                                                                              self.segmenter)) if e is not None}
        if encoders:  # SAM roles of one process share an encoder and its embedding cache
            out["embedding_cache"] = {k: sum(getattr(e, k) for e in encoders.values())
                                      for k in ("memory_hits", "store_hits", "misses", "encoder_forwards")}
        return out


# --------------------------------------------------------------------------- building backends

# Keys of backend_config() that belong to one backend family only.
_FAMILY_KEYS = {
    "sam": ("checkpoint", "model_type"),
    "torchvision": ("weights", "arch"),
}
_FAMILY_OF = {"sam": "sam", "sam-auto": "sam", "torchvision": "torchvision", "classical": "classical"}


def backend_kwargs(spec: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """``(name, kwargs)`` for a factory from one role of ``Settings.backend_config()``.

    The control plane sends every model setting to every role (a detector spec carries the
    SAM checkpoint too); keep the ones the chosen backend understands, drop unset ones,
    and apply ``overrides["options"]`` from the ``--config`` file on top."""
    name = str(spec.get("name") or "classical").lower()
    family = _FAMILY_OF.get(name, name)
    foreign = {k for fam, keys in _FAMILY_KEYS.items() if fam != family for k in keys}
    kwargs = {k: v for k, v in spec.items() if k != "name" and k not in foreign and v is not None}
    if overrides and isinstance(overrides.get("options"), Mapping):
        kwargs.update(overrides["options"])
    return name, kwargs


def deployment_overrides(config: Mapping[str, Any], role: str, deployment: str) -> dict[str, Any]:
    """The ``--config`` section for one deployment, found by deployment name or role."""
    section = config.get("deployments") or {}
    if isinstance(section.get("deployments"), Mapping):  # the whole file was passed through
        section = section["deployments"]
    for key in (deployment, role):
        if isinstance(section.get(key), Mapping):
            return dict(section[key])
    return {}


def _store(artifacts: Any) -> ArtifactStore | None:
    """An ArtifactStore from a root URL; an object that already is a store passes through."""
    if artifacts is None or not isinstance(artifacts, str):
        return artifacts
    from statecore.artifacts import ArtifactStore

    return ArtifactStore(artifacts)


def build_backend(role: str, config: Mapping[str, Any], artifacts: Any = None) -> Any:
    """One backend (``role``: detector, validator or segmenter) from ``Settings.backend_config()``."""
    deployment = {"detector": "Detector", "validator": "BoxValidator", "segmenter": "Segmenter"}[role]
    name, kwargs = backend_kwargs(config.get(role) or {}, deployment_overrides(config, role, deployment))
    store = _store(artifacts if artifacts is not None else config.get("artifacts"))
    factory = {"detector": make_detector, "validator": make_validator, "segmenter": make_segmenter}[role]
    if role != "detector":
        kwargs.pop("delay_ms", None)
    return factory(name, artifacts=store, **kwargs)


def build_models(config: Mapping[str, Any], roles: tuple[str, ...] = ("detector", "validator", "segmenter"),
                 artifacts: Any = None) -> Models:
    """All backends of one process (the local runner): SAM roles share one model and cache."""
    return Models(**{role: build_backend(role, config, artifacts) for role in roles})


# --------------------------------------------------------------------------- images


def artifact_name(url_or_name: str) -> str:
    """``/api/v1/artifacts/img_ab12….png`` -> ``img_ab12….png``."""
    return str(url_or_name).rstrip("/").rsplit("/", 1)[-1]


def load_image(artifacts: ArtifactStore, name: str) -> np.ndarray:
    """The stored image as RGB uint8 ``H x W x 3`` (alpha dropped, palette and grey expanded).

    EXIF orientation is not applied: the control plane measured width and height on the
    stored pixels as they are, and box coordinates refer to those."""
    name = artifact_name(name)
    try:
        data = artifacts.get(name)
    except (FileNotFoundError, ValueError) as exc:
        raise NodeExecutionError(f"image artifact {name!r} is not in the store", code="ARTIFACT_NOT_FOUND",
                                 retryable=False) from exc
    except OSError as exc:  # the store itself hiccupped (network, S3): worth another try
        raise NodeExecutionError(f"could not read image artifact {name!r}: {exc}", code="ARTIFACT_READ_FAILED",
                                 retryable=True) from exc
    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except Exception as exc:
        raise NodeExecutionError(f"image artifact {name!r} cannot be decoded: {exc}", code="IMAGE_UNREADABLE",
                                 retryable=False) from exc


def _image_of(input: Mapping[str, Any], artifacts: ArtifactStore,
              image: np.ndarray | None) -> tuple[np.ndarray, str]:
    ref = input.get("image")
    if not isinstance(ref, Mapping) or not ref.get("url"):
        raise NodeExecutionError("node input has no image reference (input.image.url)", code="INVALID_NODE_INPUT",
                                 retryable=False)
    if image is None:
        image = load_image(artifacts, str(ref["url"]))
    sha = str(ref.get("sha256") or hashlib.sha256(image.tobytes()).hexdigest())
    return image, sha


def _boxes(input: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    items = input.get(key)
    if not isinstance(items, list) or not all(isinstance(b, Mapping) and "box_id" in b and "bbox" in b
                                              for b in items):
        raise NodeExecutionError(f"node input {key!r} must be a list of boxes with box_id and bbox",
                                 code="INVALID_NODE_INPUT", retryable=False)
    return [{"box_id": str(b["box_id"]), "bbox": [float(v) for v in b["bbox"]], "label": b.get("label")}
            for b in items]


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def mask_png(mask: np.ndarray) -> bytes:
    """Mode ``L``, the image's size, 0 or 255."""
    return _png(Image.fromarray(np.where(mask, 255, 0).astype(np.uint8), mode="L"))


def cutout_png(image: np.ndarray, alpha: np.ndarray) -> bytes:
    """RGBA at the image's size (not cropped to the box), the mask (or feathered alpha) as alpha.

    Pixels outside the subject are zeroed so the PNG compresses and no background colour
    survives under alpha 0."""
    rgb = np.where(alpha[..., None] > 0, image, 0).astype(np.uint8)
    return _png(Image.fromarray(np.dstack([rgb, alpha.astype(np.uint8)]), mode="RGBA"))


# --------------------------------------------------------------------------- nodes


def _need(backend: Any, role: str, node_type: str) -> Any:
    if backend is None:
        raise NodeExecutionError(f"this executor has no {role} backend for {node_type}",
                                 code="BACKEND_NOT_CONFIGURED", retryable=False)
    return backend


def _models(models: Any) -> Models:
    if isinstance(models, Models):
        return models
    if isinstance(models, Mapping):
        return Models(detector=models.get("detector"), validator=models.get("validator"),
                      segmenter=models.get("segmenter"))
    return Models(detector=getattr(models, "detector", None), validator=getattr(models, "validator", None),
                  segmenter=getattr(models, "segmenter", None))


def detect_subjects(input: Mapping[str, Any], models: Models, artifacts: ArtifactStore,
                    image: np.ndarray | None = None) -> dict[str, Any]:
    detector = _need(models.detector, "detector", "DETECT_SUBJECTS")
    img, sha = _image_of(input, artifacts, image)
    boxes = detector.detect(img, sha)
    return {"boxes": [{"bbox": [float(v) for v in b["bbox"]], "label": b.get("label"),
                       "score": float(b["score"]) if b.get("score") is not None else None} for b in boxes],
            "backend": detector.name}


def validate_boxes(input: Mapping[str, Any], models: Models, artifacts: ArtifactStore,
                   image: np.ndarray | None = None) -> dict[str, Any]:
    validator = _need(models.validator, "validator", "VALIDATE_MANUAL_BOX_LIST")
    boxes = _boxes(input, "items_to_validate")
    out = {"results": [], "backend": validator.name, "threshold": validator.threshold,
           "policy_version": validator.policy_version}
    if not boxes:
        return out
    img, sha = _image_of(input, artifacts, image)
    verdicts = {r["box_id"]: r for r in validator.validate(img, sha, boxes)}
    for b in boxes:
        r = verdicts.get(b["box_id"]) or {"passed": False, "score": 0.0,
                                         "reason": "the validator returned no verdict for this box"}
        out["results"].append({"box_id": b["box_id"], "passed": bool(r["passed"]), "score": float(r["score"]),
                               "reason": r.get("reason")})
    return out


def process_boxes(input: Mapping[str, Any], models: Models, artifacts: ArtifactStore,
                  image: np.ndarray | None = None) -> dict[str, Any]:
    segmenter = _need(models.segmenter, "segmenter", "PROCESS_APPROVED_BOX_LIST")
    boxes = _boxes(input, "approved_box_list")
    out: dict[str, Any] = {"subjects": [], "backend": segmenter.name}
    if not boxes:
        return out
    img, sha = _image_of(input, artifacts, image)
    h, w = img.shape[:2]
    results = {r["box_id"]: r for r in segmenter.segment(img, sha, boxes)}
    for b in boxes:
        r = results.get(b["box_id"])
        mask = None if r is None else r.get("mask")
        if mask is None or mask.shape != (h, w) or not mask.any():
            reason = (r or {}).get("reason") or "the segmenter returned no mask for this box"
            out["subjects"].append({"box_id": b["box_id"], "status": "FAILED", "reason": reason,
                                    "mask": None, "cutout": None})
            continue
        mask = mask.astype(bool)
        alpha = r.get("alpha")
        if alpha is None or alpha.shape != (h, w):
            alpha = np.where(mask, 255, 0).astype(np.uint8)
        mask_name = artifacts.put("mask", mask_png(mask), "png")
        cutout_name = artifacts.put("cutout", cutout_png(img, alpha), "png")
        out["subjects"].append({"box_id": b["box_id"], "status": "SUCCEEDED", "reason": None,
                                "mask": mask_name, "cutout": cutout_name})
    return out


HANDLERS = {
    "DETECT_SUBJECTS": detect_subjects,
    "VALIDATE_MANUAL_BOX_LIST": validate_boxes,
    "PROCESS_APPROVED_BOX_LIST": process_boxes,
}


def run_node(node_type: str, input: Mapping[str, Any], models: Any, artifacts: ArtifactStore, *,
             image: np.ndarray | None = None) -> dict[str, Any]:
    """Run one node; ``image`` lets a caller that already decoded the image skip the reload.

    Unknown node types fail at once and for good (``UNSUPPORTED_NODE_TYPE``): there is no
    "wait for a person" handler here. Bad input and unusable artifacts are not retryable;
    an unexpected backend error is (a CUDA OOM, a flaky store)."""
    handler = HANDLERS.get(node_type)
    if handler is None:
        raise NodeExecutionError(f"unsupported workflow node type: {node_type}", code="UNSUPPORTED_NODE_TYPE",
                                 retryable=False)
    t0 = time.perf_counter()
    try:
        out = handler(input, _models(models), artifacts, image)
    except NodeExecutionError:
        raise
    except ValueError as exc:
        raise NodeExecutionError(f"{node_type}: {exc}", code="INVALID_NODE_INPUT", retryable=False) from exc
    except Exception as exc:
        log.exception("%s failed", node_type)
        raise NodeExecutionError(f"{node_type}: {type(exc).__name__}: {exc}", code="MODEL_ERROR",
                                 retryable=True) from exc
    log.info("%s done in %.0f ms (backend %s)", node_type, 1000 * (time.perf_counter() - t0), out.get("backend"))
    return out
