"""Rotary position embeddings, as Hugging Face defines them: the inverse frequencies of every rope
type (default, linear, llama3, yarn, longrope — ``rope_tables``), cos/sin at this call's
positions (``cos_sin``), and their application to (B, heads, T, H) queries/keys in two layouts —
``half`` (GPT-NeoX / Llama ``rotate_half``: pairs (i, i + rd/2)) and ``interleaved`` (GPT-J:
pairs (2i, 2i + 1)) — on the first ``rotary_dim`` features of each head (partial rotary).

Angles are computed in float32 (position * inv_freq), as transformers does, whatever the model
dtype: that product is part of the function, and the float64 reference uses it too. yarn and
longrope multiply cos and sin by an attention factor (float32, before the cast to the model
dtype); longrope picks its short or long table once per call, from the call's largest position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import rope_types


@dataclass(frozen=True)
class RopeTables:
    """What cos_sin needs besides the positions (the eager module keeps the tables as buffers,
    the ONNX graph as initializers)."""

    inv_freq: Tensor  # (rd/2,) float32: the table, or longrope's short table
    long_inv_freq: Optional[Tensor] = None  # (rd/2,) float32: longrope's long table
    switch_len: int = 0  # longrope: original_max_position_embeddings; 0: no switch
    attention_factor: float = 1.0  # multiplies cos and sin (yarn, longrope)
    long_attention_factor: float = 1.0  # longrope: while the long table is in use

    def long_or_empty(self) -> Tensor:
        """The long table, or an empty (0,) tensor (a buffer TorchScript can hold)."""
        return torch.zeros(0) if self.long_inv_freq is None else self.long_inv_freq


def rope_tables(rotary_dim: int, theta: float, scaling: Optional[dict] = None) -> RopeTables:
    """The tables and factors of a rope type, computed exactly as transformers' rope init
    functions (``ROPE_INIT_FUNCTIONS``, 5.23); ``scaling`` as MHAConfig.rope_scaling."""
    scaling = rope_types.normalized_scaling(scaling, rotary_dim)
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "yarn":
        return RopeTables(_yarn(rotary_dim, theta, scaling),
                          attention_factor=rope_types.attention_factor(scaling))
    if kind == "longrope":
        return RopeTables(_longrope(rotary_dim, theta, scaling["short_factor"]),
                          _longrope(rotary_dim, theta, scaling["long_factor"]),
                          scaling["original_max_position_embeddings"],
                          rope_types.attention_factor(scaling),
                          rope_types.long_attention_factor(scaling))
    return RopeTables(_scaled(rotary_dim, theta, scaling))


def inv_freq(rotary_dim: int, theta: float, scaling: Optional[dict] = None) -> Tensor:
    """(rotary_dim / 2,) float32: the table (longrope: the short one)."""
    return rope_tables(rotary_dim, theta, scaling).inv_freq


def _default(rotary_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float()
                            / rotary_dim))  # (rd/2,)


def _proportional(rotary_dim: int, theta: float, scaling: dict) -> Tensor:
    """Gemma 4's proportional rope over a whole head (rotary_dim = head_dim): its first
    int(p * H // 2) frequencies (exponents over H), zeros for the rest, divided by factor."""
    rotated = int(float(scaling["partial_rotary_factor"]) * rotary_dim // 2)
    freq = 1.0 / (theta ** (torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float()
                            / rotary_dim))  # (rotated,)
    freq = torch.cat([freq, torch.zeros(rotary_dim // 2 - rotated)])  # (H/2,)
    return freq / float(scaling["factor"])


def _scaled(rotary_dim: int, theta: float, scaling: Optional[dict]) -> Tensor:
    """default, linear, llama3 and proportional."""
    freq = _default(rotary_dim, theta)
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return freq
    if kind == "proportional":
        return _proportional(rotary_dim, theta, scaling)
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


def _yarn(rotary_dim: int, theta: float, scaling: dict) -> Tensor:
    """YaRN: frequencies below the ramp kept, above it divided by factor, blended in between
    (transformers' _compute_yarn_parameters, operation for operation, in float32)."""
    factor = scaling["factor"]
    pos_freqs = theta ** (torch.arange(0, rotary_dim, 2).to(dtype=torch.float) / rotary_dim)
    extrapolation = 1.0 / pos_freqs  # (rd/2,)
    interpolation = 1.0 / (factor * pos_freqs)
    low, high = rope_types.yarn_ramp_bounds(rotary_dim, theta, scaling)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32) - low)
                       / (high - low), 0, 1)  # (rd/2,)
    keep = 1 - ramp  # weight of the unscaled frequency
    return interpolation * (1 - keep) + extrapolation * keep


def _longrope(rotary_dim: int, theta: float, factors: list) -> Tensor:
    """LongRoPE: each frequency divided by its own factor (short or long list)."""
    ext = torch.tensor(factors, dtype=torch.float32)  # (rd/2,)
    shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (ext * theta ** shape)


def cos_sin(position_ids: Tensor, inv_freq: Tensor, dtype: torch.dtype,
            long_inv_freq: Optional[Tensor] = None, switch_len: int = 0,
            attention_factor: float = 1.0, long_attention_factor: Optional[float] = None
            ) -> Tuple[Tensor, Tensor]:
    """position_ids (B, T) -> cos, sin (B, 1, T, rd/2) in dtype; angles in float32.

    With a (non-empty) long_inv_freq and switch_len > 0 (longrope), the whole call uses the long
    table when max(position_ids) + 1 > switch_len, the short one otherwise — transformers'
    longrope_frequency_update (a tensor condition: no host sync, traceable). cos and sin are
    multiplied by attention_factor in float32 before the cast, as transformers does (by
    long_attention_factor while the long table is in use: Phi-MoE's long_mscale)."""
    freq = inv_freq.float()
    long_factor = attention_factor if long_attention_factor is None else long_attention_factor
    factor = torch.tensor(attention_factor, device=position_ids.device)  # () float32
    if long_inv_freq is not None and long_inv_freq.numel() > 0 and switch_len > 0:
        use_long = position_ids.max() + 1 > switch_len  # () bool
        freq = torch.where(use_long, long_inv_freq.float(), freq)  # (rd/2,)
        factor = torch.where(use_long, torch.tensor(long_factor, device=position_ids.device),
                             factor)
    angles = position_ids.float().unsqueeze(-1) * freq  # (B, T, rd/2)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0 or long_factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


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
