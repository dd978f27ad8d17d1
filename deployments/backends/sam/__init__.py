"""Segment Anything backends: one model, one embedding per image, batched box prompts.

- ``loading``: architectures by name and the user's checkpoint (``load_sam``);
- ``attention``: the encoder's attention through SDPA;
- ``encoder``: the model on its device and the image-embedding cache (``SamModel``, ``SamEncoder``);
- ``backends``: ``SamValidator``, ``SamSegmenter``, ``SamAutoDetector``, registered under
  ``sam`` and ``sam-auto`` in ``deployments.backends.base``.

Importing this package imports torch and ``segment_anything``; the backend factories do it
only when a SAM backend is asked for.
"""

from __future__ import annotations

from segment_anything import sam_model_registry

from .attention import use_sdpa_attention
from .backends import SamAutoDetector, SamSegmenter, SamValidator
from .encoder import SamEmbedding, SamEncoder, SamModel, clear_shared, encoder_from, get_encoder
from .loading import SAM_BUILDERS, build_sam_vit_tiny, load_sam, register_sam_builder, resolve_device

__all__ = [
    "SAM_BUILDERS",
    "SamAutoDetector",
    "SamEmbedding",
    "SamEncoder",
    "SamModel",
    "SamSegmenter",
    "SamValidator",
    "build_sam_vit_tiny",
    "clear_shared",
    "encoder_from",
    "get_encoder",
    "load_sam",
    "register_sam_builder",
    "resolve_device",
    "sam_model_registry",
    "use_sdpa_attention",
]
