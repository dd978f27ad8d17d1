"""SAM's image-encoder attention through ``torch.nn.functional.scaled_dot_product_attention``.

Same result as the original ``Attention.forward`` (the decomposed relative-position term
becomes an additive mask), but it lets CUDA pick a fused kernel.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from segment_anything.modeling.image_encoder import Attention, get_rel_pos


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
            module.forward = types.MethodType(_sdpa_attention_forward, module)
            n += 1
    return n
