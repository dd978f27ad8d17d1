"""A loaded SAM on a device (``SamModel``) and its image-embedding cache (``SamEncoder``).

The image encoder is the expensive part (ViT-H: most of a GPU second per image), the
prompt decoder is cheap. So ``SamEncoder`` keeps each embedding under the image's hash:
an LRU in process, plus a persisted copy in the ``ArtifactStore`` so that the validator
replica, the segmenter replica and a restarted process reuse the embedding the detector
(or the first of them) computed. The persisted name mixes the model's fingerprint into
the hash, so switching checkpoints never serves another model's embedding.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from segment_anything import SamPredictor
from segment_anything.modeling import Sam
from segment_anything.utils.transforms import ResizeLongestSide

from ..base import check_image
from .attention import use_sdpa_attention
from .loading import file_fingerprint, load_sam, resolve_device

log = logging.getLogger(__name__)


@dataclass
class SamEmbedding:
    """One image's encoder output and the geometry needed to map prompts and masks."""

    features: torch.Tensor  # (1, C, 64, 64) on the model's device, float32 (C = 256 for vit_b/l/h)
    original_size: tuple[int, int]  # (H, W) of the image
    input_size: tuple[int, int]  # (H, W) after ResizeLongestSide, before padding


class SamModel:
    """A loaded SAM on a device with its precision policy.

    ``precision``: ``auto`` (bf16 autocast on CUDA, fp32 elsewhere), ``fp32`` or ``bf16``;
    ``sdpa``: None (on for CUDA) or a bool; ``compile``: ``torch.compile`` the encoder."""

    def __init__(
        self,
        sam: Sam,
        model_type: str,
        fingerprint: str,
        device: str | None = None,
        precision: str = "auto",
        sdpa: bool | None = None,
        compile: bool = False,
    ) -> None:
        self.device = resolve_device(device)
        self.model_type = model_type
        self.fingerprint = fingerprint
        self.sam = sam.to(self.device).eval()
        if precision not in ("auto", "fp32", "bf16"):
            raise ValueError("precision must be auto, fp32 or bf16")
        on_cuda = self.device.type == "cuda"
        self.amp_dtype = torch.bfloat16 if precision == "bf16" or (precision == "auto" and on_cuda) else None
        self.sdpa = on_cuda if sdpa is None else bool(sdpa)
        if self.sdpa:
            use_sdpa_attention(self.sam.image_encoder)
        self.compiled = bool(compile)
        # Default dynamic=None: the first recompile (a new @serve.batch size) makes the batch
        # dimension dynamic instead of compiling once per size.
        self._encode_fn: Callable[[torch.Tensor], torch.Tensor] = (
            torch.compile(self.sam.image_encoder) if compile else self.sam.image_encoder
        )
        self.transform = ResizeLongestSide(self.sam.image_encoder.img_size)
        self.encoder_forwards = 0
        if not on_cuda:
            log.warning(
                "SAM %s runs on %s: expect seconds per image (vit_b) to minutes (vit_h); "
                "give the deployment a GPU for real use",
                model_type,
                self.device,
            )

    @classmethod
    def from_checkpoint(
        cls, checkpoint: str | os.PathLike[str] | None, model_type: str = "vit_b", **kw: Any
    ) -> SamModel:
        sam = load_sam(checkpoint, model_type)
        return cls(sam, model_type, file_fingerprint(Path(str(checkpoint)).expanduser(), model_type), **kw)

    @property
    def describe(self) -> str:
        prec = "bf16" if self.amp_dtype is not None else "fp32"
        return (
            f"sam-{self.model_type} on {self.device} ({prec}{', sdpa' if self.sdpa else ''}"
            f"{', compiled' if self.compiled else ''})"
        )

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """``inference_mode`` plus the autocast policy; every forward runs inside it."""
        with torch.inference_mode():
            if self.amp_dtype is not None:
                with torch.autocast(self.device.type, dtype=self.amp_dtype):
                    yield
            else:
                yield

    def preprocess(self, images: list[np.ndarray]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Resize (long side 1024), normalise and pad each image; one (B, 3, 1024, 1024) batch."""
        batch, input_sizes = [], []
        for image in images:
            resized = self.transform.apply_image(image)
            x = torch.as_tensor(resized, device=self.device).permute(2, 0, 1).contiguous()[None].float()
            input_sizes.append((int(x.shape[-2]), int(x.shape[-1])))
            batch.append(self.sam.preprocess(x))
        return torch.cat(batch, dim=0), input_sizes

    def encode(self, batch: torch.Tensor) -> torch.Tensor:
        """One encoder forward over a preprocessed batch; float32 features (B, C, 64, 64)."""
        with self.inference():
            feats = self._encode_fn(batch)
        self.encoder_forwards += 1
        return feats.float()

    def predict_boxes(
        self, emb: SamEmbedding, boxes: np.ndarray, multimask: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """All box prompts of one image in ONE decoder call.

        ``boxes``: (N, 4) xyxy in original-image pixels. Returns bool masks (N, H, W) at the
        image's size and the decoder's predicted IoU (N,); with ``multimask`` the best of
        the three candidates per box."""
        predictor = self._predictor(emb)
        with self.inference():
            bt = torch.as_tensor(np.asarray(boxes, dtype=np.float32).reshape(-1, 4), device=self.device)
            bt = predictor.transform.apply_boxes_torch(bt, emb.original_size)
            masks, iou, _ = predictor.predict_torch(None, None, boxes=bt, multimask_output=multimask)
            if multimask:
                best = iou.argmax(dim=1)
                idx = torch.arange(masks.shape[0], device=masks.device)
                masks, iou = masks[idx, best], iou[idx, best]
            else:
                masks, iou = masks[:, 0], iou[:, 0]
            return masks.cpu().numpy().astype(bool), iou.float().cpu().numpy()

    def _predictor(self, emb: SamEmbedding) -> SamPredictor:
        """segment-anything's predictor on an embedding already computed (no image encoder run)."""
        predictor = SamPredictor(self.sam)
        predictor.features = emb.features
        predictor.original_size = emb.original_size
        predictor.input_size = emb.input_size
        predictor.is_image_set = True
        return predictor

    def predict_prompt(
        self,
        emb: SamEmbedding,
        box: np.ndarray,
        point_coords: np.ndarray,
        point_labels: np.ndarray,
        multimask: bool = False,
        stability_offset: float = 1.0,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One box plus points (``point_coords`` (N, 2) xy in original-image pixels, ``point_labels``
        (N,) 1 positive / 0 negative; N may be 0) in one decoder call.

        Returns bool masks (C, H, W) at the image's size (C = 3 with ``multimask``, else 1), the
        decoder's predicted IoU (C,) and the stability score (C,): the IoU of the logits
        thresholded at ``mask_threshold +/- stability_offset``, as ``SamAutomaticMaskGenerator``
        computes it."""
        predictor = self._predictor(emb)
        with self.inference():
            bt = torch.as_tensor(np.asarray(box, dtype=np.float32).reshape(1, 4), device=self.device)
            bt = predictor.transform.apply_boxes_torch(bt, emb.original_size)
            coords = labels = None
            if len(point_coords):
                pc = torch.as_tensor(np.asarray(point_coords, np.float32).reshape(1, -1, 2), device=self.device)
                coords = predictor.transform.apply_coords_torch(pc, emb.original_size)
                labels = torch.as_tensor(np.asarray(point_labels, np.int64).reshape(1, -1), device=self.device)
            logits, iou, _ = predictor.predict_torch(
                coords, labels, boxes=bt, multimask_output=multimask, return_logits=True
            )
            logits = logits[0].float()
            thr = self.sam.mask_threshold
            inter = (logits > thr + stability_offset).flatten(1).sum(1).float()
            union = (logits > thr - stability_offset).flatten(1).sum(1).float()
            stability = torch.where(union > 0, inter / union.clamp(min=1), torch.zeros_like(union))
            return (
                (logits > thr).cpu().numpy(),
                iou[0].float().cpu().numpy(),
                stability.cpu().numpy(),
            )


# --------------------------------------------------------------------------- embedding cache


class SamEncoder:
    """Image embeddings keyed by image hash: in-process LRU, then the ArtifactStore, then the encoder.

    Counters: ``memory_hits``, ``store_hits``, ``misses`` (images that needed the encoder),
    and the model's ``encoder_forwards`` (batched forwards run)."""

    def __init__(self, model: SamModel, artifacts: Any = None, cache_size: int = 16) -> None:
        self.model = model
        self.artifacts = artifacts
        self.cache_size = max(1, int(cache_size))
        self._lru: OrderedDict[str, SamEmbedding] = OrderedDict()
        self._lock = threading.Lock()
        self.memory_hits = 0
        self.store_hits = 0
        self.misses = 0

    @property
    def encoder_forwards(self) -> int:
        return self.model.encoder_forwards

    def artifact_name(self, image_sha: str) -> str:
        digest = hashlib.sha256(f"{self.model.fingerprint}:{image_sha}".encode()).hexdigest()
        return f"emb_{digest[:32]}.pt"

    def embed(self, image: np.ndarray, image_sha: str) -> SamEmbedding:
        return self.embed_batch([image], [image_sha])[0]

    def embed_batch(self, images: list[np.ndarray], image_shas: list[str]) -> list[SamEmbedding]:
        """Embeddings for several images; the ones not cached go through ONE encoder forward."""
        if len(images) != len(image_shas):
            raise ValueError("images and image_shas differ in length")
        out: dict[str, SamEmbedding] = {}
        todo: dict[str, np.ndarray] = {}
        for image, sha in zip(images, image_shas, strict=True):
            if sha in out or sha in todo:
                continue
            emb = self._lookup(sha)
            if emb is not None:
                out[sha] = emb
            else:
                todo[sha] = check_image(image)
        if todo:
            with self._lock:
                self.misses += len(todo)
            batch, input_sizes = self.model.preprocess(list(todo.values()))
            feats = self.model.encode(batch)
            for i, (sha, image) in enumerate(todo.items()):
                emb = SamEmbedding(
                    feats[i : i + 1].contiguous(), (int(image.shape[0]), int(image.shape[1])), input_sizes[i]
                )
                self._remember(sha, emb)
                self._persist(sha, emb)
                out[sha] = emb
        return [out[sha] for sha in image_shas]

    def _lookup(self, sha: str) -> SamEmbedding | None:
        with self._lock:
            emb = self._lru.get(sha)
            if emb is not None:
                self._lru.move_to_end(sha)
                self.memory_hits += 1
                return emb
        emb = self._load(sha)
        if emb is not None:
            with self._lock:
                self.store_hits += 1
            self._remember(sha, emb)
        return emb

    def _remember(self, sha: str, emb: SamEmbedding) -> None:
        with self._lock:
            self._lru[sha] = emb
            self._lru.move_to_end(sha)
            while len(self._lru) > self.cache_size:
                self._lru.popitem(last=False)

    def _persist(self, sha: str, emb: SamEmbedding) -> None:
        """Store as float16 (2 MiB instead of 4 per image); a failing store only costs a recompute."""
        if self.artifacts is None:
            return
        buf = io.BytesIO()
        torch.save(
            {
                "features": emb.features.to("cpu", torch.float16),
                "original_size": list(emb.original_size),
                "input_size": list(emb.input_size),
                "fingerprint": self.model.fingerprint,
            },
            buf,
        )
        try:
            self.artifacts.put_named(self.artifact_name(sha), buf.getvalue())
        except Exception as exc:  # the store is a cache here, never a reason to fail the node
            log.warning("could not persist the SAM embedding of %s: %s", sha[:12], exc)

    def _load(self, sha: str) -> SamEmbedding | None:
        if self.artifacts is None:
            return None
        name = self.artifact_name(sha)
        try:
            if not self.artifacts.exists(name):
                return None
            data = torch.load(io.BytesIO(self.artifacts.get(name)), map_location="cpu", weights_only=True)
        except Exception as exc:
            log.warning("unreadable persisted SAM embedding %s, recomputing: %s", name, exc)
            return None
        if data.get("fingerprint") != self.model.fingerprint:
            return None
        return SamEmbedding(
            data["features"].to(self.model.device, torch.float32),
            tuple(data["original_size"]),
            tuple(data["input_size"]),
        )


_SHARED: dict[tuple[Any, ...], SamEncoder] = {}
_SHARED_LOCK = threading.Lock()


def get_encoder(
    checkpoint: str | None = None,
    model_type: str = "vit_b",
    device: str | None = None,
    precision: str = "auto",
    sdpa: bool | None = None,
    compile: bool = False,
    artifacts: Any = None,
    cache_size: int = 16,
    share: bool = True,
) -> SamEncoder:
    """The process-wide encoder for this checkpoint and settings, so the detector, validator and
    segmenter of one process hold one model and one embedding cache. ``share=False`` builds a
    private one (tests: a second replica)."""
    dev = resolve_device(device)
    key = (
        str(Path(str(checkpoint)).expanduser().resolve()) if checkpoint else None,
        model_type,
        str(dev),
        precision,
        sdpa,
        compile,
        getattr(artifacts, "root", None),
        cache_size,
    )
    with _SHARED_LOCK:
        if share and key in _SHARED:
            return _SHARED[key]
        model = SamModel.from_checkpoint(
            checkpoint, model_type, device=str(dev), precision=precision, sdpa=sdpa, compile=compile
        )
        encoder = SamEncoder(model, artifacts, cache_size)
        if share:
            _SHARED[key] = encoder
        return encoder


def clear_shared() -> None:
    with _SHARED_LOCK:
        _SHARED.clear()


def encoder_from(encoder: SamEncoder | None, cfg: dict[str, Any]) -> SamEncoder:
    if encoder is not None:
        cfg = {k: v for k, v in cfg.items() if v is not None}
        if cfg:
            raise TypeError(f"pass either encoder= or model settings, not both ({', '.join(cfg)})")
        return encoder
    return get_encoder(**cfg)
