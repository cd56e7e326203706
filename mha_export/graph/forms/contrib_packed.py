"""``contrib-gqa-packed``: ONNX Runtime's GroupQueryAttention as its CUDA decode kernel (XQA)
takes it, the layer onnxruntime-genai builds (../shared/notes/gpu-decode-step.md):

    x (B, T, d_in) -> ONE MatMul of [W_q; W_k; W_v] (+ [b_q; b_k; b_v]) -> qkv (B, T, (N+2K)*H)
      -> GroupQueryAttention(qkv, -, -, past_key, past_value, seqlens_k, total, cos, sin,
                             position_ids; do_rotary=1) -> context (B, T, N*H), the cache
                             written in place

q/k/v are unpacked, rotated and appended to the cache inside the node (CUDA: one
``UnpackRoPEAppend`` kernel); the layer's rotary is baked into the cos/sin tables of
``max_seq_len`` positions (its base, scaling and attention factor; partial rotary where
rotary_dim / 2 is a multiple of 8, ONNX Runtime's own limit; ``rotary_interleaved`` for GPT-J's
pairs). The node reads cos/sin rows up to total_sequence_length, which is the buffer's length
for a decode step: a static buffer longer than ``max_seq_len`` is refused by ONNX Runtime
(an error, never a wrong number), and the check keeps its calls within it (``max_cache``).

Static-cache models only: without a cache the node takes every call as a first prompt, whose
rotary ONNX Runtime 1.31's CPU kernel took at positions 0 .. T-1 rather than position_ids
(measured: a call of 300 tokens whose positions jump, 2e-2 off). A batch of prompts
(T > 1 at batch > 1) is NaN, never a wrong number: ONNX Runtime 1.31's CPU
kernel writes the keys of rows after the first at other positions than their position_ids
there (measured: y right, the cache wrong), and the decode step is the form's purpose; auto
sends such calls to the blocked loop.

Past and present are one buffer (the caller binds present to past's memory: XQA needs it,
and the cache is then only read by the attention and written at the new entries). Lengths
and the NaN of a call the node cannot run are contrib-gqa's (``gqa_lengths``). Quantized
projections: one MatMulNBits of the three weights' rows where their blocks stack, else three
nodes and a Concat that says why (graph/model.py's ``packed_projection``).

``xqa_problem`` says why ONNX Runtime's CUDA kernel would not take XQA for a layer (head size,
group size; softcap and sliding windows are refused by the form itself): ``auto`` then keeps
its other forms for the decode step.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...config import MHAConfig
from ...layer.rotary import cos_sin, rope_tables
from ..builder import CONTRIB, GraphBuilder
from ..ops import Ops
from .base import QUADRATIC, AttentionIO, AttentionOut, Feature, GraphForm, packed_qkv
from .contrib import gqa_cache, gqa_lengths, gqa_out

XQA_HEAD_SIZES = (64, 128, 256)
XQA_GROUP_SIZES = (1, 2, 4, 5, 8, 16, 32)


def packed_gqa_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    """io.qkv (B, T, (N+2K)*H), unrotated -> the node (rotary inside) -> (B, T, N*H)."""
    lengths = gqa_lengths(g, io, io.qkv, batch_prompts=False)
    y, present_key, present_value = Ops(g).GroupQueryAttention(
        io.qkv, "", "", *gqa_cache(io), lengths.seqlens, lengths.total, *_rotary_inputs(g, io, c),
        n_out=3, domain=CONTRIB, num_heads=c.heads, kv_num_heads=c.kv_heads, scale=c.scale,
        **_rotary_attributes(c))  # (B, T, N*H), 2 x (B, K, C, H)
    return gqa_out(g, io, lengths, y, present_key, present_value)


def _rotary_inputs(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> list[str]:
    """cos_cache, sin_cache (L, rd/2) and the call's position_ids (B, T); none unrotated."""
    if c.rotary == "none":
        return []
    cos, sin = rotary_tables(c)  # (L, rd/2) each
    return [g.const("rotary.cos_cache", cos), g.const("rotary.sin_cache", sin), io.position_ids]


def _rotary_attributes(c: MHAConfig) -> dict:
    if c.rotary == "none":
        return {}
    return dict(do_rotary=1, rotary_interleaved=int(c.rotary == "interleaved"))


def rotary_tables(c: MHAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (L, rd/2) float32 at positions 0 .. L-1, L = max_seq_len: the eager module's
    own ``cos_sin`` (angles in float32, times the attention factor), cast to the model dtype
    where they become initializers, as the eager module casts them."""
    tables = rope_tables(c.rotary_dim, c.rope_theta, c.rope_scaling)
    positions = torch.arange(table_length(c))[None]  # (1, L)
    cos, sin = cos_sin(positions, tables.inv_freq, torch.float32,
                       attention_factor=tables.attention_factor)  # (1, 1, L, rd/2)
    return cos[0, 0], sin[0, 0]


def table_length(c: MHAConfig) -> int:
    """Positions in the cos/sin tables: the layer's context, the longest static buffer."""
    return c.max_seq_len


def packed_problem(c: MHAConfig) -> Optional[str]:
    """Why the node cannot build this layer (beyond the record's features), or None."""
    if c.head_dim % 8:
        return f"needs head_dim % 8 == 0 (ONNX Runtime's kernel), got {c.head_dim}"
    if c.rotary != "none" and c.rotary_dim < c.head_dim and c.rotary_dim % 16:
        return (f"partial rotary needs rotary_dim % 16 == 0 (ONNX Runtime: cos_cache's width a "
                f"multiple of 8), got {c.rotary_dim}")
    if c.rotary != "none" and _switches_tables(c):
        return ("longrope switches its table per call past original_max_position_embeddings: "
                "one cos/sin table cannot hold both")
    before = [name for name, on in (("a q/k norm", c.qk_norm != "none"),
                                    ("a value norm", bool(c.v_norm_eps)),
                                    ("a value multiplier", bool(c.value_multiplier)),
                                    ("query scaling by position", bool(c.query_scale_beta)))
              if on]
    if before:
        return (f"cannot place {', '.join(before)} between the packed projection and the "
                f"node's rotary")
    return None


def _switches_tables(c: MHAConfig) -> bool:
    tables = rope_tables(c.rotary_dim, c.rope_theta, c.rope_scaling)
    return tables.long_inv_freq is not None and table_length(c) > tables.switch_len


def xqa_problem(c: MHAConfig) -> Optional[str]:
    """Why ONNX Runtime's CUDA GroupQueryAttention would not run this layer's decode step on
    XQA (docs/contrib_ops/cuda/gqa.md: head size, group size), or None. (Softcap, sliding
    windows and non-causal layers: the form does not build them at all.)"""
    if c.head_dim not in XQA_HEAD_SIZES:
        return f"XQA takes head sizes {XQA_HEAD_SIZES}, not {c.head_dim}"
    if c.groups not in XQA_GROUP_SIZES:
        return f"XQA takes groups of {XQA_GROUP_SIZES} query heads per kv head, not {c.groups}"
    return None


CONTRIB_GQA_PACKED = GraphForm(
    name="contrib-gqa-packed", core=packed_gqa_core, min_opset=17, memory=QUADRATIC,
    summary="ONNX Runtime's com.microsoft.GroupQueryAttention as its CUDA decode kernel (XQA) "
            "takes it: q/k/v packed by one projection, rotary inside the node (do_rotary, "
            "cos/sin tables of max_seq_len positions), past and present one buffer",
    supports=frozenset({Feature.GQA, Feature.STATIC_CACHE}),
    requires=frozenset({Feature.STATIC_CACHE}), refuse=packed_problem,
    standard=False, static_chunks=False, batch_prompts=False, inputs=packed_qkv,
    max_cache=table_length)
