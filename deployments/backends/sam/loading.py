"""Loading a Segment Anything model: the architecture by name, the user's checkpoint into it.

``segment_anything.sam_model_registry`` builds ``vit_b``, ``vit_l`` and ``vit_h``; ``vit_tiny``
is a small random-weight architecture for tests and CI benchmarks, built from the same
classes. Every failure is a ``ModelLoadError`` that names the file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from segment_anything import sam_model_registry
from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

from ..base import ModelLoadError


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
            depth=2,
            embed_dim=64,
            img_size=image_size,
            mlp_ratio=4,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            num_heads=2,
            patch_size=patch,
            qkv_bias=True,
            use_rel_pos=True,
            global_attn_indexes=(),
            window_size=14,
            out_chans=prompt_dim,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=prompt_dim,
            image_embedding_size=(image_size // patch, image_size // patch),
            input_image_size=(image_size, image_size),
            mask_in_chans=16,
        ),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(depth=2, embedding_dim=prompt_dim, mlp_dim=256, num_heads=2),
            transformer_dim=prompt_dim,
            iou_head_depth=3,
            iou_head_hidden_dim=64,
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


def file_fingerprint(path: Path, model_type: str) -> str:
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
        raise ModelLoadError(
            f"the SAM backend needs a checkpoint file for {model_type} (--sam-checkpoint); "
            "without one use the classical backends"
        )
    path = Path(checkpoint).expanduser()
    if not path.is_file():
        raise ModelLoadError(
            f"SAM checkpoint {str(path)!r} does not exist (model_type {model_type}); "
            "download sam_vit_b_01ec64.pth / sam_vit_l_0b3195.pth / sam_vit_h_4b8939.pth "
            "beforehand and pass its path"
        )
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
        raise ModelLoadError(
            f"SAM checkpoint {str(path)!r} does not match model_type {model_type!r}{guess}: "
            f"{' '.join(detail[:3])[:400]}"
        ) from exc
    return model.eval()
