"""Rotary position embeddings, as Hugging Face defines them: the inverse frequencies (default,
linear and llama3 scaling), and their application to (B, heads, T, H) queries/keys in two
layouts — ``half`` (GPT-NeoX / Llama ``rotate_half``: pairs (i, i + rd/2)) and ``interleaved``
(GPT-J: pairs (2i, 2i + 1)) — on the first ``rotary_dim`` features of each head (partial rotary).

Angles are computed in float32 (position * inv_freq), as transformers does, whatever the model
dtype: that product is part of the function, and the float64 reference uses it too.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

def inv_freq(rotary_dim: int, theta: float, scaling: Optional[dict] = None) -> Tensor:
    """(rotary_dim / 2,) float32, computed exactly as transformers' rope init functions."""
    freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float()
                            / rotary_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return freq
    if kind == "linear":
        return freq / float(scaling["factor"])
    factor = float(scaling["factor"])  # llama3
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / factor, freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin(position_ids: Tensor, freq: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """position_ids (B, T) -> cos, sin (B, 1, T, rd/2) in dtype; angles in float32."""
    angles = position_ids.float().unsqueeze(-1) * freq.float()  # (B, T, rd/2)
    return angles.cos().to(dtype).unsqueeze(1), angles.sin().to(dtype).unsqueeze(1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """x (B, heads, T, H): its first rd = 2 * cos.size(-1) features rotated, the rest kept."""
    rd = 2 * cos.size(-1)
    rot, rest = x[..., :rd], x[..., rd:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]  # (B, heads, T, rd/2)
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., : rd // 2], rot[..., rd // 2:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([out, rest], dim=-1)  # (B, heads, T, H)
