"""Segment Anything backends: one model, one embedding per image, batched box prompts.

Loading is the real thing: ``segment_anything.sam_model_registry`` builds the architecture
and the user's checkpoint file fills it (``vit_b``, ``vit_l``, ``vit_h``; ``vit_tiny`` is a
small random-weight architecture for tests and CI benchmarks, built by the same code).

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
import types
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from segment_anything import SamAutomaticMaskGenerator, SamPredictor, sam_model_registry
from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer
from segment_anything.modeling.image_encoder import Attention, get_rel_pos
from segment_anything.utils.transforms import ResizeLongestSide

from .base import ModelLoadError, box_iou, box_problem, check_image, int_box, invalid_result, mask_bbox
from .postprocess import clean_mask, feather

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- architectures


def build_sam_vit_tiny(checkpoint: str | None = None) -> Sam:
    """A narrow SAM (2 windowed encoder blocks of width 64, a 64-wide prompt decoder; about
    1.5 M parameters) for tests and CI benchmarks: the real classes and interfaces at CPU
    cost. Image size (1024), patch size (16), window size and relative positions are
    those of the released models, so every transform and geometry downstream is the
    production one; only the channel widths are smaller."""
    if checkpoint is not None:
        raise ValueError("load checkpoints through load_sam(), not the builder")
    prompt_dim, image_size, patch = 64, 1024, 16
    return Sam(
        image_encoder=ImageEncoderViT(
            depth=2, embed_dim=64, img_size=image_size, mlp_ratio=4,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), num_heads=2, patch_size=patch,
            qkv_bias=True, use_rel_pos=True, global_attn_indexes=(), window_size=14, out_chans=prompt_dim,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=prompt_dim, image_embedding_size=(image_size // patch, image_size // patch),
            input_image_size=(image_size, image_size), mask_in_chans=16,
        ),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(depth=2, embedding_dim=prompt_dim, mlp_dim=256, num_heads=2),
            transformer_dim=prompt_dim, iou_head_depth=3, iou_head_hidden_dim=64,
        ),
        pixel_mean=[123.675, 116.28, 103.53],
        pixel_std=[58.395, 57.12, 57.375],
    ).eval()


SAM_BUILDERS: dict[str, Callable[..., Sam]] = {**sam_model_registry, "vit_tiny": build_sam_vit_tiny}
_EMBED_DIM_TO_TYPE = {768: "vit_b", 1024: "vit_l", 1280: "vit_h", 64: "vit_tiny"}


def register_sam_builder(model_type: str, builder: Callable[..., Sam]) -> None:
    """Make another SAM-shaped architecture loadable by name (e.g. a distilled encoder)."""
    SAM_BUILDERS[model_type] = builder


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but torch sees no CUDA device")
    return dev


def _file_fingerprint(path: Path, model_type: str) -> str:
    """Cheap identity of a (possibly multi-GB) checkpoint: type, size, first and last MiB."""
    h = hashlib.sha256(model_type.encode())
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read())
    return h.hexdigest()[:16]


def load_sam(checkpoint: str | os.PathLike[str] | None, model_type: str = "vit_b") -> Sam:
    """Build ``model_type`` and load ``checkpoint`` into it (on CPU; the caller moves it).

    Loads the state dict with ``map_location="cpu"`` and ``weights_only=True`` rather than
    letting the registry's builder load it: the released files deserialize to CUDA
    otherwise, and a pickle should not run code. Every failure is a ``ModelLoadError``
    that names the file and, for a mismatch, the architecture the file looks like."""
    if model_type not in SAM_BUILDERS:
        raise ModelLoadError(f"unknown SAM model_type {model_type!r}; choose one of {', '.join(sorted(SAM_BUILDERS))}")
    if not checkpoint:
        raise ModelLoadError(f"the SAM backend needs a checkpoint file for {model_type} (--sam-checkpoint); "
                             "without one use the classical backends")
    path = Path(checkpoint).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"SAM checkpoint {str(path)!r} does not exist (model_type {model_type}); "
                             "download sam_vit_b_01ec64.pth / sam_vit_l_0b3195.pth / sam_vit_h_4b8939.pth "
                             "beforehand and pass its path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated download, an HTML error page, a foreign pickle
        raise ModelLoadError(f"cannot read SAM checkpoint {str(path)!r}: {exc}") from exc
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict):
        raise ModelLoadError(f"SAM checkpoint {str(path)!r} holds a {type(state).__name__}, not a state dict")
    model = SAM_BUILDERS[model_type]()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        guess = ""
        pos = state.get("image_encoder.pos_embed")
        if isinstance(pos, torch.Tensor) and pos.ndim == 4:
            other = _EMBED_DIM_TO_TYPE.get(int(pos.shape[-1]))
            if other and other != model_type:
                guess = f"; it looks like a {other} checkpoint (pass model_type={other!r})"
        detail = str(exc).splitlines()
        raise ModelLoadError(f"SAM checkpoint {str(path)!r} does not match model_type {model_type!r}{guess}: "
                             f"{' '.join(detail[:3])[:400]}") from exc
    return model.eval()


# --------------------------------------------------------------------------- SDPA attention


def _sdpa_attention_forward(self: Attention, x: torch.Tensor) -> torch.Tensor:
    """``Attention.forward`` with ``scaled_dot_product_attention``; the decomposed relative
    position term becomes an additive mask, so the result equals the original's."""
    b, h, w, _ = x.shape
    qkv = self.qkv(x).reshape(b, h * w, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each (B, heads, N, C)
    bias = None
    if self.use_rel_pos:
        c = q.shape[-1]
        rh = get_rel_pos(h, h, self.rel_pos_h)
        rw = get_rel_pos(w, w, self.rel_pos_w)
        r_q = q.reshape(b * self.num_heads, h, w, c)
        rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, rh.to(r_q.dtype))
        rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, rw.to(r_q.dtype))
        bias = (rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(b, self.num_heads, h * w, h * w)
        bias = bias.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out = out.view(b, self.num_heads, h, w, -1).permute(0, 2, 3, 1, 4).reshape(b, h, w, -1)
    return self.proj(out)


def use_sdpa_attention(encoder: torch.nn.Module) -> int:
    """Switch every attention block of ``encoder`` (this instance only) to SDPA; returns how many."""
    n = 0
    for module in encoder.modules():
        if isinstance(module, Attention):
            module.forward = types.MethodType(_sdpa_attention_forward, module)  # type: ignore[method-assign]
            n += 1
    return n


# --------------------------------------------------------------------------- the model


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

    def __init__(self, sam: Sam, model_type: str, fingerprint: str, device: str | None = None,
                 precision: str = "auto", sdpa: bool | None = None, compile: bool = False) -> None:
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
            torch.compile(self.sam.image_encoder) if compile else self.sam.image_encoder)
        self.transform = ResizeLongestSide(self.sam.image_encoder.img_size)
        self.encoder_forwards = 0
        if not on_cuda:
            log.warning("SAM %s runs on %s: expect seconds per image (vit_b) to minutes (vit_h); "
                        "give the deployment a GPU for real use", model_type, self.device)

    @classmethod
    def from_checkpoint(cls, checkpoint: str | os.PathLike[str] | None, model_type: str = "vit_b",
                        **kw: Any) -> SamModel:
        sam = load_sam(checkpoint, model_type)
        return cls(sam, model_type, _file_fingerprint(Path(str(checkpoint)).expanduser(), model_type), **kw)

    @property
    def describe(self) -> str:
        prec = "bf16" if self.amp_dtype is not None else "fp32"
        return (f"sam-{self.model_type} on {self.device} ({prec}{', sdpa' if self.sdpa else ''}"
                f"{', compiled' if self.compiled else ''})")

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

    def predict_boxes(self, emb: SamEmbedding, boxes: np.ndarray,
                      multimask: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """All box prompts of one image in ONE decoder call.

        ``boxes``: (N, 4) xyxy in original-image pixels. Returns bool masks (N, H, W) at the
        image's size and the decoder's predicted IoU (N,); with ``multimask`` the best of
        the three candidates per box."""
        predictor = SamPredictor(self.sam)
        predictor.features = emb.features
        predictor.original_size = emb.original_size
        predictor.input_size = emb.input_size
        predictor.is_image_set = True
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
        for image, sha in zip(images, image_shas):
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
                emb = SamEmbedding(feats[i:i + 1].contiguous(), (int(image.shape[0]), int(image.shape[1])),
                                   input_sizes[i])
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
        torch.save({"features": emb.features.to("cpu", torch.float16), "original_size": list(emb.original_size),
                    "input_size": list(emb.input_size), "fingerprint": self.model.fingerprint}, buf)
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
        return SamEmbedding(data["features"].to(self.model.device, torch.float32),
                            tuple(data["original_size"]), tuple(data["input_size"]))  # type: ignore[arg-type]


_SHARED: dict[tuple[Any, ...], SamEncoder] = {}
_SHARED_LOCK = threading.Lock()


def get_encoder(checkpoint: str | None = None, model_type: str = "vit_b", device: str | None = None,
                precision: str = "auto", sdpa: bool | None = None, compile: bool = False,
                artifacts: Any = None, cache_size: int = 16, share: bool = True) -> SamEncoder:
    """The process-wide encoder for this checkpoint and settings, so the detector, validator and
    segmenter of one process hold one model and one embedding cache. ``share=False`` builds a
    private one (tests: a second replica)."""
    dev = resolve_device(device)
    key = (str(Path(str(checkpoint)).expanduser().resolve()) if checkpoint else None, model_type, str(dev),
           precision, sdpa, compile, getattr(artifacts, "root", None), cache_size)
    with _SHARED_LOCK:
        if share and key in _SHARED:
            return _SHARED[key]
        model = SamModel.from_checkpoint(checkpoint, model_type, device=str(dev), precision=precision,
                                         sdpa=sdpa, compile=compile)
        encoder = SamEncoder(model, artifacts, cache_size)
        if share:
            _SHARED[key] = encoder
        return encoder


def clear_shared() -> None:
    with _SHARED_LOCK:
        _SHARED.clear()


def _encoder_from(encoder: SamEncoder | None, cfg: dict[str, Any]) -> SamEncoder:
    if encoder is not None:
        cfg = {k: v for k, v in cfg.items() if v is not None}
        if cfg:
            raise TypeError(f"pass either encoder= or model settings, not both ({', '.join(cfg)})")
        return encoder
    return get_encoder(**cfg)


# --------------------------------------------------------------------------- backends


class SamSegmenter:
    """Masks from box prompts: every box of an image in one decoder call, then clean-up
    (clip to the box, largest component, small holes filled, optional feathered alpha)."""

    def __init__(self, encoder: SamEncoder | None = None, *, multimask: bool = False, clip_to_box: bool = True,
                 max_hole_frac: float = 0.1, feather_px: float = 0.0, **model_cfg: Any) -> None:
        self.encoder = _encoder_from(encoder, model_cfg)
        self.name = f"sam-{self.encoder.model.model_type}"
        self.multimask = multimask
        self.clip_to_box = clip_to_box
        self.max_hole_frac = float(max_hole_frac)
        self.feather_px = float(feather_px)

    def segment(self, image: np.ndarray, image_sha: str,
                boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        h, w = check_image(image).shape[:2]
        problems = {b["box_id"]: box_problem(b.get("bbox"), w, h) for b in boxes}
        good = [b for b in boxes if problems[b["box_id"]] is None]
        masks: dict[str, np.ndarray] = {}
        if good:
            emb = self.encoder.embed(image, image_sha)
            raw, _ = self.encoder.model.predict_boxes(emb, np.array([b["bbox"] for b in good], np.float32),
                                                      self.multimask)
            for b, m in zip(good, raw):
                if self.clip_to_box:
                    x1, y1, x2, y2 = int_box(b["bbox"], w, h)
                    clip = np.zeros_like(m)
                    clip[y1:y2, x1:x2] = True
                    m = m & clip
                masks[b["box_id"]] = clean_mask(m, self.max_hole_frac)
        out = []
        for b in boxes:
            mask = masks.get(b["box_id"])
            if mask is None:
                out.append({"box_id": b["box_id"], "mask": np.zeros((h, w), bool), "reason": problems[b["box_id"]]})
                continue
            item: dict[str, Any] = {"box_id": b["box_id"], "mask": mask}
            if not mask.any():
                item["reason"] = "the model found no object inside the box"
            elif self.feather_px > 0:
                item["alpha"] = feather(mask, self.feather_px)
            out.append(item)
        return out


class SamValidator:
    """``score = predicted IoU x box agreement`` for the box prompt, both in [0, 1].

    The decoder's IoU head says how good it thinks its mask is; the agreement (IoU of the
    mask's bounding box with the drawn box) says whether that mask is the object the box
    frames, rather than a fragment of it or something bigger."""

    def __init__(self, encoder: SamEncoder | None = None, *, threshold: float = 0.5,
                 **model_cfg: Any) -> None:
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError("threshold must lie in [0, 1]")
        self.encoder = _encoder_from(encoder, model_cfg)
        self.threshold = float(threshold)
        self.name = f"sam-{self.encoder.model.model_type}"
        self.policy_version = f"sam-{self.encoder.model.model_type}-iou-x-boxagree-v1"

    def validate(self, image: np.ndarray, image_sha: str,
                 boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        h, w = check_image(image).shape[:2]
        problems = {b["box_id"]: box_problem(b.get("bbox"), w, h) for b in boxes}
        good = [b for b in boxes if problems[b["box_id"]] is None]
        verdicts: dict[str, dict[str, Any]] = {}
        if good:
            emb = self.encoder.embed(image, image_sha)
            masks, ious = self.encoder.model.predict_boxes(emb, np.array([b["bbox"] for b in good], np.float32))
            for b, m, iou in zip(good, masks, ious):
                verdicts[b["box_id"]] = self._verdict(b, m, float(iou))
        return [verdicts.get(b["box_id"]) or invalid_result(b["box_id"], str(problems[b["box_id"]]))
                for b in boxes]

    def _verdict(self, box: dict[str, Any], mask: np.ndarray, iou_pred: float) -> dict[str, Any]:
        q = float(np.clip(iou_pred, 0.0, 1.0))
        mb = mask_bbox(clean_mask(mask)) if mask.any() else None
        agree = box_iou(mb, box["bbox"]) if mb else 0.0
        score = q * agree
        reason = None
        if score < self.threshold:
            if mb is None:
                why = "the model found no object inside the box"
            elif agree < q:
                why = "the object the model found does not fill the box: draw it around the whole subject"
            else:
                why = "the model is not confident there is one clear subject in the box"
            reason = f"{why} (score {score:.2f} < {self.threshold:.2f})"
        return {"box_id": box["box_id"], "passed": reason is None, "score": round(score, 4), "reason": reason}


def _same_pixels(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` is ``b`` or a full-size view of it (the generator's layer-0 "crop")."""
    return a.shape == b.shape and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


class _CachedPredictor(SamPredictor):
    """A ``SamPredictor`` whose ``set_image`` serves the full image from the shared embedding
    cache (crops of ``crop_n_layers`` > 0 still go through the encoder)."""

    def __init__(self, encoder: SamEncoder) -> None:
        super().__init__(encoder.model.sam)
        self.encoder = encoder
        self.current: tuple[np.ndarray, str] | None = None

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        if self.current is not None and _same_pixels(image, self.current[0]):
            emb = self.encoder.embed(image, self.current[1])
            self.reset_image()
            self.features, self.original_size, self.input_size = emb.features, emb.original_size, emb.input_size
            self.is_image_set = True
            return
        super().set_image(image, image_format)


class SamAutoDetector:
    """Proposals from ``SamAutomaticMaskGenerator``: one box per mask, ``score = predicted IoU x
    stability``, near-duplicates removed by NMS, frame-filling masks (the background) dropped,
    at most ``max_detections``."""

    def __init__(self, encoder: SamEncoder | None = None, *, points_per_side: int = 16,
                 points_per_batch: int = 64, pred_iou_thresh: float = 0.8, stability_score_thresh: float = 0.9,
                 nms_iou: float = 0.5, max_area_frac: float = 0.95, min_area_frac: float = 0.002,
                 max_detections: int = 10, min_score: float = 0.0, label: str = "object",
                 **model_cfg: Any) -> None:
        self.encoder = _encoder_from(encoder, model_cfg)
        self.name = f"sam-auto-{self.encoder.model.model_type}"
        self.nms_iou = float(nms_iou)
        self.max_area_frac = float(max_area_frac)
        self.min_area_frac = float(min_area_frac)
        self.max_detections = int(max_detections)
        self.min_score = float(min_score)
        self.label = label
        self.generator = SamAutomaticMaskGenerator(
            self.encoder.model.sam, points_per_side=points_per_side, points_per_batch=points_per_batch,
            pred_iou_thresh=pred_iou_thresh, stability_score_thresh=stability_score_thresh)
        self._predictor = _CachedPredictor(self.encoder)
        self.generator.predictor = self._predictor
        self._lock = threading.Lock()  # the generator keeps per-image state in its predictor

    def detect(self, image: np.ndarray, image_sha: str) -> list[dict[str, Any]]:
        from torchvision.ops import nms

        h, w = check_image(image).shape[:2]
        with self._lock:
            self._predictor.current = (image, image_sha)
            try:
                # No autocast here: the generator hands bf16 tensors to numpy, which has no bf16.
                # The full-image embedding still comes from the (autocast) encoder via the cache.
                with torch.inference_mode():
                    records = self.generator.generate(image)
            finally:
                self._predictor.current = None
        boxes, scores = [], []
        for r in records:
            # The generator's XYWH comes from inclusive pixel indices: the mask spans w + 1 columns.
            x, y, bw, bh = (float(v) for v in r["bbox"])
            bw, bh = bw + 1.0, bh + 1.0
            area_frac = (bw * bh) / float(h * w)
            if bw < 2 or bh < 2 or area_frac > self.max_area_frac or r["area"] < self.min_area_frac * h * w:
                continue
            score = float(np.clip(r["predicted_iou"], 0, 1) * np.clip(r["stability_score"], 0, 1))
            if score < self.min_score:
                continue
            boxes.append([x, y, min(float(w), x + bw), min(float(h), y + bh)])
            scores.append(score)
        if not boxes:
            return []
        keep = nms(torch.tensor(boxes, dtype=torch.float32), torch.tensor(scores, dtype=torch.float32),
                   self.nms_iou).tolist()[: self.max_detections]
        return [{"bbox": [round(v, 2) for v in boxes[i]], "label": self.label, "score": round(scores[i], 4)}
                for i in keep]
