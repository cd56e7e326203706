"""Rotary position embeddings in the ONNX graph: cos/sin at the call's position_ids (every rope
type: the tables come from ``layer/rotary.py``'s ``rope_tables``, so graph and eager module share
one computation), and the rotation of q/k — the standard RotaryEmbedding node (opset 23) or the
same rotation in plain ops.

Shape legend: B = batch, T = this call's length, H = head size, rd = rotary_dim.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..config import MHAConfig
from ..layer.rotary import rope_tables
from .builder import GraphBuilder
from .ops import Ops


def rotary_cos_sin(g: GraphBuilder, position_ids: str, config: MHAConfig) -> tuple[str, str]:
    """position_ids (B, T) int64 -> cos, sin (B, T, rd/2) in the model dtype (``cos_sin_at``
    of the config's rotary settings)."""
    return cos_sin_at(g, position_ids, config.rotary_dim, config.rope_theta, config.rope_scaling)


def cos_sin_at(g: GraphBuilder, position_ids: str, rotary_dim: int, theta: float,
               scaling: dict | None) -> tuple[str, str]:
    """position_ids (B, T) int64 -> cos, sin (B, T, rd/2) in the model dtype; the angles
    position * inv_freq in float32, as the eager module and transformers compute them, then
    cos and sin times the attention factor (yarn, longrope) in float32, then the cast."""
    tables = rope_tables(rotary_dim, theta, scaling)
    freq = g.const("rotary.inv_freq", tables.inv_freq.numpy(), float_dtype=False)  # (rd/2,)
    factor = None
    if tables.attention_factor != 1.0 or tables.long_attention_factor != 1.0:
        factor = g.const("rotary.attention_factor",
                         np.array(tables.attention_factor, dtype=np.float32), float_dtype=False)
    if tables.long_inv_freq is not None:
        use_long = _uses_long_table(g, position_ids, tables.switch_len)
        long = g.const("rotary.long_inv_freq", tables.long_inv_freq.numpy(), float_dtype=False)
        freq = Ops(g).Where(use_long, long, freq)  # (rd/2,)
        if tables.long_attention_factor != tables.attention_factor:  # Phi-MoE's long_mscale
            factor = Ops(g).Where(use_long, g.const("rotary.long_attention_factor", np.array(
                tables.long_attention_factor, dtype=np.float32), float_dtype=False), factor)
    op = Ops(g)
    pos = op.Cast(position_ids, to=TensorProto.FLOAT, name="positions")  # (B, T): tests edit it
    angles = op.Mul(op.Unsqueeze(pos, g.ints("axes_last", [2])), freq)  # (B, T, rd/2) float32
    out = []
    for fn in (op.Cos, op.Sin):
        v = fn(angles)
        if factor is not None:
            v = op.Mul(v, factor)
        if g.dtype != "float32":
            v = op.Cast(v, to=g.elem)
        out.append(v)  # (B, T, rd/2)
    return out[0], out[1]


def _uses_long_table(g: GraphBuilder, position_ids: str, switch_len: int) -> str:
    """() bool: longrope's long table is in use, max(position_ids) + 1 > switch_len over the
    whole call (transformers' longrope_frequency_update)."""
    op = Ops(g)
    length = op.Add(op.ReduceMax(position_ids, keepdims=0), g.ints("one", 1))  # () max + 1
    return op.Greater(length, g.ints("rotary.switch_len", switch_len))  # () bool


def rotary_op(g: GraphBuilder, x: str, heads: int, rotary_dim: int, interleaved: bool,
              cos: str, sin: str, name: str) -> str:
    """The standard RotaryEmbedding node (opset 23) on (B, T, heads*H), with cos/sin already
    taken at this call's positions (B, T, rd/2): no position table."""
    return Ops(g).named(name).RotaryEmbedding(x, cos, sin, num_heads=heads,
                                              rotary_embedding_dim=rotary_dim,
                                              interleaved=int(interleaved))  # (B, T, heads*H)


def rotate_heads(g: GraphBuilder, x: str, heads: int, head_dim: int, rotary_dim: int,
                 interleaved: bool, cos: str, sin: str, name: str,
                 halves_out: bool = False) -> str:
    """(B, T, heads*H): the first rotary_dim features of each head rotated, the rest kept.
    ``halves_out`` (with interleaved): pairs (2i, 2i+1) read, the rotated evens then the rotated
    odds written (DeepSeek-V3's rope_interleave)."""
    op = Ops(g).named(name)
    half = rotary_dim // 2
    cos, sin = (op.Unsqueeze(t, g.ints("axes2", [2])) for t in (cos, sin))  # (B, T, 1, rd/2)
    # named <name>_heads: the MLA graph's initializer q_rot_heads_1 is numbered after it
    x = op.Reshape(x, g.ints("heads_shape", [0, 0, heads, head_dim]),
                   name="heads")  # (B, T, heads, H)
    rest = None
    if rotary_dim < head_dim:
        x, rest = op.Split(x, g.ints("rotary_split", [rotary_dim, head_dim - rotary_dim]),
                           n_out=2, axis=3)  # (.., rd), (.., H - rd)
    if interleaved:  # pairs (2i, 2i+1)
        pairs = op.Reshape(x, g.ints("pairs_shape", [0, 0, heads, half, 2]))  # (B,T,heads,rd/2,2)
        x1, x2 = (op.Squeeze(p, g.ints("axes4", [4]))
                  for p in op.Split(pairs, g.ints("ones_split", [1, 1]), n_out=2, axis=4))
    else:  # pairs (i, i + rd/2): rotate_half; 2 x (B, T, heads, rd/2)
        x1, x2 = op.Split(x, g.ints("halves", [half, half]), n_out=2, axis=3)
    o1 = op.Sub(op.Mul(x1, cos), op.Mul(x2, sin))  # x1 cos - x2 sin
    o2 = op.Add(op.Mul(x2, cos), op.Mul(x1, sin))  # x2 cos + x1 sin
    if interleaved and not halves_out:
        o1, o2 = (op.Unsqueeze(o, g.ints("axes4", [4])) for o in (o1, o2))
        rot = op.Reshape(op.Concat(o1, o2, axis=4),
                         g.ints("rotated_shape", [0, 0, heads, rotary_dim]))  # (B, T, heads, rd)
    else:
        rot = op.Concat(o1, o2, axis=3)  # (B, T, heads, rd)
    if rest is not None:
        rot = op.Concat(rot, rest, axis=3)  # (B, T, heads, H)
    return op.Reshape(rot, g.ints("flat_shape", [0, 0, heads * head_dim]))  # (B, T, heads*H)
