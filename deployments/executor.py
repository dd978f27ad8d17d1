"""Node handlers: a node command's input in, the node's output out. Plain Python.

The same code runs inside the Ray Serve deployments (``deployments.serve``) and in the
control plane's local runner (threads, no Ray). It reads the image from the
ArtifactStore, calls a backend, writes masks and cut-outs back to the store and returns
only names; it never touches job state.

Inputs and outputs are the models of ``statecore.nodes`` (docs/protocol.md § Executors and
the outbox): ``DETECT_SUBJECTS`` ``DetectInput -> DetectOutput``, ``VALIDATE_MANUAL_BOX_LIST``
``ValidateInput -> ValidateOutput``, ``PROCESS_APPROVED_BOX_LIST`` ``ProcessInput ->
ProcessOutput``. ``run_node`` takes and returns their JSON form, as the outbox and Ray carry it.
A backend answer that does not fit the contract fails the node for good (``INVALID_NODE_OUTPUT``).
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image
from pydantic import ValidationError

from hitl_review.statecore.errors import NodeExecutionError
from hitl_review.statecore.models import QualityVerdict, Refinement
from hitl_review.statecore.nodes import (
    INVALID_NODE_INPUT,
    INVALID_NODE_OUTPUT,
    MODEL_NODES,
    NAME_THIS_BOX,
    UNSUPPORTED_NODE_TYPE,
    DetectInput,
    Detection,
    DetectOutput,
    NodeBox,
    NodeInput,
    ProcessInput,
    ProcessOutput,
    SubjectOutcome,
    ValidateInput,
    ValidateOutput,
    Verdict,
    parse_input,
    spec_of,
)
from hitl_review.statecore.states import NodeType

from .backends.base import DetectorBackend, Role, SegmenterBackend, ValidatorBackend, make_backend
from .backends.naming import NAMING_THRESHOLD, BoxNamer
from .quality.gate import judge, score_mask
from .quality.subject import QualityGate

if TYPE_CHECKING:  # fsspec is imported when a store is built, so a bare GPU box can import this module
    from hitl_review.statecore.artifacts import ArtifactStore

log = logging.getLogger("hitl.executor")


@dataclass
class Models:
    """The backends one executor holds; a Serve deployment holds only its own."""

    detector: DetectorBackend | None = None
    validator: ValidatorBackend | None = None
    segmenter: SegmenterBackend | None = None
    quality: QualityGate | None = None  # the gate on the segmenter's masks (None: off)

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
            out["quality_gate"] = self.quality.describe() if self.quality is not None else "off"
        encoders = {
            id(e): e
            for e in (getattr(b, "encoder", None) for b in (self.detector, self.validator, self.segmenter))
            if e is not None
        }
        if encoders:  # SAM roles of one process share an encoder and its embedding cache
            out["embedding_cache"] = {
                k: sum(getattr(e, k) for e in encoders.values())
                for k in ("memory_hits", "store_hits", "misses", "encoder_forwards")
            }
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
    from hitl_review.statecore.artifacts import ArtifactStore

    return ArtifactStore(artifacts)


def build_backend(role: Role, config: Mapping[str, Any], artifacts: Any = None) -> Any:
    """One backend (``role``: detector, validator or segmenter) from ``Settings.backend_config()``."""
    deployment = {"detector": "Detector", "validator": "BoxValidator", "segmenter": "Segmenter"}[role]
    name, kwargs = backend_kwargs(config.get(role) or {}, deployment_overrides(config, role, deployment))
    store = _store(artifacts if artifacts is not None else config.get("artifacts"))
    if role == "validator":
        kwargs.pop("delay_ms", None)
    return make_backend(role, name, artifacts=store, **kwargs)


def build_models(
    config: Mapping[str, Any], roles: tuple[Role, ...] = ("detector", "validator", "segmenter"), artifacts: Any = None
) -> Models:
    """All backends of one process (the local runner): SAM roles share one model and cache."""
    quality = QualityGate.from_config(config.get("quality")) if "segmenter" in roles else None
    return Models(**{role: build_backend(role, config, artifacts) for role in roles}, quality=quality)


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
        raise NodeExecutionError(
            f"image artifact {name!r} is not in the store", code="ARTIFACT_NOT_FOUND", retryable=False
        ) from exc
    except OSError as exc:  # the store itself hiccupped (network, S3): worth another try
        raise NodeExecutionError(
            f"could not read image artifact {name!r}: {exc}", code="ARTIFACT_READ_FAILED", retryable=True
        ) from exc
    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except Exception as exc:
        raise NodeExecutionError(
            f"image artifact {name!r} cannot be decoded: {exc}", code="IMAGE_UNREADABLE", retryable=False
        ) from exc


def _image_of(
    inp: DetectInput | ValidateInput | ProcessInput, artifacts: ArtifactStore, image: np.ndarray | None
) -> tuple[np.ndarray, str]:
    if image is None:
        image = load_image(artifacts, inp.image.url)
    return image, inp.image.sha256 or hashlib.sha256(image.tobytes()).hexdigest()


def _backend_boxes(boxes: list[NodeBox]) -> list[dict[str, Any]]:
    """The plain ``{"box_id", "bbox", "label"}`` dicts the backend protocols take."""
    return [{"box_id": b.box_id, "bbox": list(b.bbox), "label": b.label} for b in boxes]


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
        raise NodeExecutionError(
            f"this executor has no {role} backend for {node_type}", code="BACKEND_NOT_CONFIGURED", retryable=False
        )
    return backend


def _models(models: Any) -> Models:
    if isinstance(models, Models):
        return models
    if isinstance(models, Mapping):
        return Models(
            detector=models.get("detector"),
            validator=models.get("validator"),
            segmenter=models.get("segmenter"),
            quality=models.get("quality"),
        )
    return Models(
        detector=getattr(models, "detector", None),
        validator=getattr(models, "validator", None),
        segmenter=getattr(models, "segmenter", None),
        quality=getattr(models, "quality", None),
    )


def detect_subjects(
    inp: DetectInput, models: Models, artifacts: ArtifactStore, image: np.ndarray | None = None
) -> DetectOutput:
    detector = _need(models.detector, "detector", NodeType.DETECT_SUBJECTS)
    img, sha = _image_of(inp, artifacts, image)
    boxes = detector.detect(img, sha)
    return DetectOutput(boxes=[Detection.model_validate(b) for b in boxes], backend=detector.name)


def validate_boxes(
    inp: ValidateInput, models: Models, artifacts: ArtifactStore, image: np.ndarray | None = None
) -> ValidateOutput:
    validator = _need(models.validator, "validator", NodeType.VALIDATE_MANUAL_BOX_LIST)
    out = ValidateOutput(
        results=[], backend=validator.name, threshold=validator.threshold, policy_version=validator.policy_version
    )
    if not inp.items_to_validate:
        return out
    img, sha = _image_of(inp, artifacts, image)
    answers = validator.validate(img, sha, _backend_boxes(inp.items_to_validate))
    verdicts = {v.box_id: v for v in (Verdict.model_validate(r) for r in answers)}
    unlabelled = [b for b in inp.items_to_validate if not (b.label or "").strip()]
    names = _names(validator, img, sha, unlabelled) if unlabelled and inp.round <= 1 else {}
    unnamed = {b.box_id for b in unlabelled}
    for b in inp.items_to_validate:
        v = verdicts.get(b.box_id) or Verdict(
            box_id=b.box_id, passed=False, score=0.0, reason="the validator returned no verdict for this box"
        )
        out.results.append(_named(v, validator, inp.round, names.get(b.box_id)) if b.box_id in unnamed else v)
    return out


def _names(validator: Any, img: np.ndarray, sha: str, boxes: list[NodeBox]) -> dict[str, tuple[str | None, float]]:
    """The validator backend's name for each unlabelled box: ``{box_id: (label, confidence)}``; empty
    when the backend cannot name boxes (``naming.BoxNamer``)."""
    if not isinstance(validator, BoxNamer):
        return {}
    answers = validator.name_boxes(img, sha, _backend_boxes(boxes))
    return {str(a["box_id"]): (a.get("label") or None, float(a.get("score") or 0.0)) for a in answers}


def _named(v: Verdict, validator: Any, round_: int, name: tuple[str | None, float] | None) -> Verdict:
    """The verdict of a box sent without a label (docs/protocol.md § Second round): in round 1 the
    backend's name when it is sure enough (recorded with its confidence and source), else "name this
    box"; in round 2 the reviewer names it, and a box still unlabelled fails with that reason."""
    threshold = float(getattr(validator, "naming_threshold", NAMING_THRESHOLD))
    label, confidence = name or (None, 0.0)
    if round_ <= 1 and label and confidence >= threshold:
        named = {"label": label, "label_score": round(confidence, 4), "label_source": validator.name}
        return v.model_copy(update=named)
    if round_ > 1:
        why = "round 2 takes the reviewer's label"
    elif not isinstance(validator, BoxNamer):
        why = f"the {validator.name} validator cannot name boxes"
    elif label:
        why = f"the {validator.name} validator's best guess, {label!r}, is {confidence:.2f} sure (< {threshold:.2f})"
    else:
        why = f"the {validator.name} validator found nothing it could name"
    reason = f"{NAME_THIS_BOX}: {why}" + (f"; {v.reason}" if v.reason else "")
    return v.model_copy(update={"passed": False, "reason": reason})


def process_boxes(
    inp: ProcessInput, models: Models, artifacts: ArtifactStore, image: np.ndarray | None = None
) -> ProcessOutput:
    segmenter = _need(models.segmenter, "segmenter", NodeType.PROCESS_APPROVED_BOX_LIST)
    out = ProcessOutput(subjects=[], backend=segmenter.name)
    if not inp.approved_box_list:
        return out
    img, sha = _image_of(inp, artifacts, image)
    h, w = img.shape[:2]
    if inp.prompts:  # a reviewer's REFINE (a mask review): box + points, final, not gated again
        return _process_prompted(inp, models, artifacts, img, sha)
    results = {r["box_id"]: r for r in segmenter.segment(img, sha, _backend_boxes(inp.approved_box_list))}
    for b in inp.approved_box_list:
        r = results.get(b.box_id) or {}
        mask = r.get("mask")
        if not isinstance(mask, np.ndarray) or mask.shape != (h, w) or not mask.any():
            reason = r.get("reason") or "the segmenter returned no mask for this box"
            out.subjects.append(SubjectOutcome(box_id=b.box_id, status="FAILED", reason=str(reason)))
            continue
        mask = mask.astype(bool)
        alpha = r.get("alpha")
        gated = models.quality.check(segmenter, img, sha, list(b.bbox), r) if models.quality else None
        if gated is not None and gated.refined:  # a refinement's mask: its own alpha
            mask, alpha = gated.mask, None
            if not mask.any():
                reason = "every refinement of this box's mask came out empty"
                out.subjects.append(SubjectOutcome(box_id=b.box_id, status="FAILED", reason=reason))
                continue
        if not isinstance(alpha, np.ndarray) or alpha.shape != (h, w):
            alpha = np.where(mask, 255, 0).astype(np.uint8)
        mask_name = artifacts.put("mask", mask_png(mask), "png")
        cutout_name = artifacts.put("cutout", cutout_png(img, alpha), "png")
        outcome = SubjectOutcome(box_id=b.box_id, status="SUCCEEDED", mask=mask_name, cutout=cutout_name)
        if gated is not None:
            outcome.quality = QualityVerdict.model_validate(gated.quality)
            outcome.refinements = [Refinement.model_validate(x) for x in gated.refinements]
        out.subjects.append(outcome)
    return out


def _process_prompted(
    inp: ProcessInput, models: Models, artifacts: ArtifactStore, img: np.ndarray, sha: str
) -> ProcessOutput:
    """Each box from its box and the reviewer's points through the segmenter's prompted path (SAM's
    point and box prompt; the classical backend's GrabCut seeded by the points). The gate's verdict is
    recorded for the reviewer's information; the reviewer decided, so it is not gated again."""
    segmenter = _need(models.segmenter, "segmenter", NodeType.PROCESS_APPROVED_BOX_LIST)
    prompt = getattr(segmenter, "segment_prompt", None)
    out = ProcessOutput(subjects=[], backend=segmenter.name)
    for b in inp.approved_box_list:
        points = [p.model_dump() for p in inp.prompts.get(b.box_id, [])]
        if not callable(prompt):
            reason = f"the {segmenter.name} segmenter has no prompted path (box and points) to refine with"
            out.subjects.append(SubjectOutcome(box_id=b.box_id, status="FAILED", reason=reason))
            continue
        [best, *_] = prompt(img, sha, list(b.bbox), points)
        mask = np.asarray(best["mask"], bool)
        if mask.shape != img.shape[:2] or not mask.any():
            reason = "the mask from the reviewer's points came out empty"
            out.subjects.append(SubjectOutcome(box_id=b.box_id, status="FAILED", reason=reason))
            continue
        mask_name = artifacts.put("mask", mask_png(mask), "png")
        cutout_name = artifacts.put("cutout", cutout_png(img, np.where(mask, 255, 0).astype(np.uint8)), "png")
        outcome = SubjectOutcome(box_id=b.box_id, status="SUCCEEDED", mask=mask_name, cutout=cutout_name)
        if models.quality is not None:
            gate = models.quality.policy
            best_scores = {"predicted_iou": best.get("predicted_iou"), "stability": best.get("stability")}
            scores = score_mask(img, list(b.bbox), mask, gate=gate, **best_scores)
            outcome.quality = QualityVerdict.model_validate(judge(scores, gate).to_dict())
        out.subjects.append(outcome)
    return out


def _unsupported(node_type: str) -> NodeExecutionError:
    return NodeExecutionError(
        f"unsupported workflow node type: {node_type}", code=UNSUPPORTED_NODE_TYPE, retryable=False
    )


def model_input(node_type: str, input: Mapping[str, Any] | NodeInput) -> NodeInput:
    """``input`` parsed for a node that a model runs. ``UNSUPPORTED_NODE_TYPE`` for any other
    type (the control plane's own nodes, types without a contract: there is no "wait for a
    person" node); ``INVALID_NODE_INPUT`` when it does not fit."""
    if spec_of(node_type).node_type not in MODEL_NODES:
        raise _unsupported(node_type)
    return parse_input(node_type, input)


def execute_node(
    node_type: str, inp: NodeInput, models: Any, artifacts: ArtifactStore, image: np.ndarray | None = None
) -> DetectOutput | ValidateOutput | ProcessOutput:
    """The typed core of ``run_node``: a model node's parsed input in, its output out."""
    m = _models(models)
    if isinstance(inp, DetectInput):
        return detect_subjects(inp, m, artifacts, image)
    if isinstance(inp, ValidateInput):
        return validate_boxes(inp, m, artifacts, image)
    if isinstance(inp, ProcessInput):
        return process_boxes(inp, m, artifacts, image)
    raise _unsupported(node_type)


def run_node(
    node_type: str,
    input: Mapping[str, Any] | NodeInput,
    models: Any,
    artifacts: ArtifactStore,
    *,
    image: np.ndarray | None = None,
) -> dict[str, Any]:
    """Run one node; ``image`` lets a caller that already decoded the image skip the reload.

    Unknown node types fail at once and for good (``UNSUPPORTED_NODE_TYPE``). Bad input,
    unusable artifacts and backend answers outside the contract are not retryable; an
    unexpected backend error is (a CUDA OOM, a flaky store)."""
    inp = model_input(node_type, input)
    t0 = time.perf_counter()
    try:
        out = execute_node(node_type, inp, models, artifacts, image)
    except NodeExecutionError:
        raise
    except ValidationError as exc:  # a backend answered outside the contract: no retry makes it fit
        log.error("%s: backend output does not fit the node contract: %s", node_type, exc)
        raise NodeExecutionError(
            f"{node_type}: the model's output does not fit the node contract: {exc}",
            code=INVALID_NODE_OUTPUT,
            retryable=False,
        ) from exc
    except ValueError as exc:
        raise NodeExecutionError(f"{node_type}: {exc}", code=INVALID_NODE_INPUT, retryable=False) from exc
    except Exception as exc:
        log.exception("%s failed", node_type)
        raise NodeExecutionError(
            f"{node_type}: {type(exc).__name__}: {exc}", code="MODEL_ERROR", retryable=True
        ) from exc
    log.info("%s done in %.0f ms (backend %s)", node_type, 1000 * (time.perf_counter() - t0), out.backend)
    return out.model_dump(mode="json")
