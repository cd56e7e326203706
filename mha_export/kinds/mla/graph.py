"""Multi-head Latent Attention as an ONNX graph (layer.py's function), for every signature
kind; the attention core is a graph form's (forms.py: absorbed, expanded, or an If on T).

    x -> q (q_proj, or q_a_proj -> RMSNorm -> q_b_proj) -> [q_nope | q_rot], q_rot rotated
    x -> kv_a_proj_with_mqa -> [latent -> RMSNorm | k_rot rotated]       (this call's entries)
      full / masked   read this call's entries; causal (+ padding) mask
      kv-cache        past_key / past_value (latents, rotated keys) + this call's = present_*
      static-cache    written into the app's buffers at past_lengths (ScatterND: in place when
                      bound), each row's valid prefix read
    DSA (kinds/dsa/): the value cache holds [k_rot | the indexer's key]; each block's mask
      also hides the keys outside its queries' top-k by index score
    the form's core -> context (B, N, T, Hv) -> o_proj -> y

Standard ops only (opset 17). Shape legend: B = batch, T = this call, S = keys read, C = buffer
capacity, N = heads, R = kv_lora_rank, Hn = qk_nope_head_dim, Hr = qk_rope_head_dim,
Hv = v_head_dim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from torch import Tensor

from ...config import MHAConfig
from ...graph.builder import (GraphBuilder, additive, dim, merge_heads, row_masked_positions,
                              score_mask)
from ...graph.forms.base import GraphForm, valid_prefixes, write_index
from ...graph.norm import rms_norm
from ...graph.ops import Ops
from ...graph.rotary import cos_sin_at, rotate_heads
from ...signature import Signature
from ..dsa.graph import dropped_keys, given_dropped, index_keys, index_queries, kept_keys
from .settings import UNROTATED, MLAConfig

# (builder, first query's index in the call (), queries ()) -> additive bias (B|1, 1, t, S)
MaskBuilder = Callable[[GraphBuilder, str, str], str]


@dataclass(frozen=True)
class LatentIO:
    """What an MLA core reads: rotated queries, every key position the call reads, the mask."""

    q_nope: str  # (B, N, T, Hn)
    q_rot: str  # (B, N, T, Hr), rotated
    latents: str  # (B, 1, S, R), normalised
    k_rot: str  # (B, 1, S, Hr), rotated, shared by every head
    mask: MaskBuilder  # the bias of queries [start, start + t): built per block, never (T, S)
    weights: Mapping[str, Tensor]  # the layer's state dict (checkpoint names)

    def bias(self, g: GraphBuilder) -> str:
        """The whole call's additive bias (B|1, 1, T, S)."""
        return self.mask(g, g.ints("zero", 0), dim(g, self.q_nope, 2, "query_count"))


def build_latent(g: GraphBuilder, c: MHAConfig, w: Mapping[str, Tensor], form: GraphForm,
                 sig: Signature, opset: int = 17, kv_cache: None = None) -> dict[str, str]:
    """The layer's nodes; returns the graph values of y (and present_key / present_value)."""
    m = MLAConfig.of(c)
    cos, sin = ("", "") if m.rope_layout == UNROTATED else cos_sin_at(
        g, "position_ids", m.qk_rope_head_dim, m.rope_theta, m.rope_scaling)
    q_nope, q_rot, q_resid = _queries(g, c, w, cos, sin)  # (B, N, T, Hn), (B, N, T, Hr)
    latent, k_rot = _cache_entries(g, c, w, cos, sin)  # (B, 1, T, R), (B, 1, T, Hr[+Di])
    seq_len = dim(g, "x", 1, "seq_len")  # () T
    if sig.static_cache:
        latents, rope, present = _static_cache(g, latent, k_rot, seq_len)

        def masked(b: GraphBuilder, start: str, t: str) -> str:  # row b's query i: lengths[b]+i
            first = Ops(b).Add("past_lengths", start, name="rows_first_query")  # (B,)
            return row_masked_positions(b, first, t, dim(b, latents, 2, "key_len"))  # (B,1,t,S)
    else:
        latents, rope = latent, k_rot
        if sig.has_cache:  # [past | this call's] (names a test's fault looks up)
            op = Ops(g)
            latents = op.Concat("past_key", latent, axis=2, name="all_latents")  # (B, 1, S, R)
            rope = op.Concat("past_value", k_rot, axis=2, name="all_rope")  # (B, 1, S, Hr[+Di])
        present = {"present_key": latents, "present_value": rope} if sig.has_cache else {}

        def masked(b: GraphBuilder, start: str, t: str) -> str:  # query i at P + start + i
            keys, op = dim(b, latents, 2, "key_len"), Ops(b)  # () S
            first = op.Add(op.Sub(keys, seq_len), start, name="first_query")  # () P + start
            return score_mask(b, True, t, keys, "attention_mask" if sig.has_mask else None,
                              start=first)  # (.., t, S)
    rope, mask, selection = _sparse(g, m, w, q_resid, rope, masked, cos, sin)
    ctx = form.core(g, LatentIO(q_nope, q_rot, latents, rope, mask, w), c)  # (B, N, T, Hv)
    y = g.linear(merge_heads(g, ctx, m.heads * m.v_head_dim), "o_proj", w["o_proj.weight"],
                 w.get("o_proj.bias"))  # (B, T, dim)
    return {"y": y, **present, **selection}


def _sparse(g: GraphBuilder, m: MLAConfig, w: Mapping[str, Tensor], q_resid: str, values: str,
            masked: Callable[[GraphBuilder, str, str], str], cos: str, sin: str
            ) -> tuple[str, MaskBuilder, dict[str, str]]:
    """The rotated keys (B, 1, S, Hr) the cores read, the mask builder, and the outputs it
    adds: a block's causal and padding mask; DeepSeek Sparse Attention's (the value cache
    [k_rot | index key]): each query's keys outside its top-k too (kinds/dsa/graph.py), a
    shared layer's by the given topk_indices; a layer whose selection shared layers read
    outputs it (topk_indices (B, T, K))."""
    if m.index is None:
        return values, lambda b, start, t: additive(b, masked(b, start, t), "bias"), {}
    if m.index.shared:  # GLM-5's shared layers: the selection is an input (topk_indices)
        def given(b: GraphBuilder, start: str, t: str) -> str:
            hidden = masked(b, start, t)  # (.., t, S)
            dropped = given_dropped(b, start, t, hidden)  # (B, 1, t, S)
            hides = Ops(b).Or(hidden, dropped, name="given_hides")  # (B, 1, t, S)
            return additive(b, hides, "bias")
        return values, given, {}
    op, hr = Ops(g), m.qk_rope_head_dim
    k_rot, keys = op.Split(values, g.ints("index_split", [hr, m.index.head_dim]), n_out=2,
                           axis=3)  # (B, 1, S, Hr), (B, 1, S, Di)
    iq = index_queries(g, m.index, w, q_resid, keys, hr, cos, sin)

    def mask(b: GraphBuilder, start: str, t: str) -> str:
        hidden = masked(b, start, t)  # (.., t, S)
        dropped = dropped_keys(b, iq, start, t, hidden)  # (B, 1, t, S)
        return additive(b, Ops(b).Or(hidden, dropped), "bias")  # (B, 1, t, S)
    if not m.index.feeds:
        return k_rot, mask, {}
    queries = dim(g, "x", 1, "selection_queries")  # () T
    kept = kept_keys(g, iq, queries, masked(g, g.ints("zero", 0), queries))  # (B, T, K)
    return k_rot, mask, {"topk_indices": kept}


def _static_cache(g: GraphBuilder, latent: str, k_rot: str, seq_len: str
                  ) -> tuple[str, str, dict[str, str]]:
    """This call's entries written at past_lengths[b] + i of row b; the valid prefix
    [0, max(past_lengths) + T) that attention reads (row b's query i then sees positions
    <= past_lengths[b] + i: the mask's)."""
    index = write_index(g, "past_lengths", latent, seq_len)  # (B, 1, T, 3)
    op = Ops(g)  # the writes named as the standard layer's key_write / value_write
    present_key = op.ScatterND("past_key", index, latent, name="latent_write")  # (B, 1, C, R)
    present_value = op.ScatterND("past_value", index, k_rot, name="rope_write")  # (B, 1, C, Hr)
    latents, rope = valid_prefixes(g, "past_lengths", seq_len, (present_key, "valid_latents"),
                                   (present_value, "valid_rope"))  # (B, 1, S, R), (B, 1, S, Hr)
    return latents, rope, {"present_key": present_key, "present_value": present_value}


def _queries(g: GraphBuilder, c: MHAConfig, w: Mapping[str, Tensor], cos: str, sin: str
             ) -> tuple[str, str, str]:
    """q_nope (B, N, T, Hn), the rotated q_rot (B, N, T, Hr) and q LoRA's normalised
    bottleneck ("" without q LoRA)."""
    m = MLAConfig.of(c)
    q_resid = ""  # q LoRA's normalised bottleneck (B, T, q_lora_rank): the index queries'
    if m.q_lora_rank is None:
        q = g.linear("x", "q_proj", w["q_proj.weight"], None)
    else:
        q = g.linear("x", "q_a_proj", w["q_a_proj.weight"], w.get("q_a_proj.bias"))
        q_resid = rms_norm(g, q, w["q_a_layernorm.weight"], m.norm_eps, 0.0, "q_a_layernorm")
        q = g.linear(q_resid, "q_b_proj", w["q_b_proj.weight"], None)  # (B, T, N*(Hn+Hr))
    op, n, hr = Ops(g), m.heads, m.qk_rope_head_dim
    q = op.Reshape(q, g.ints("q_heads_shape", [0, 0, n, m.qk_head_dim]))  # (B, T, N, Hn+Hr)
    q_nope, q_rot = op.Split(q, g.ints("q_split", [m.qk_nope_head_dim, hr]), n_out=2,
                             axis=3)  # (B, T, N, Hn), (B, T, N, Hr)
    q_rot = op.Reshape(q_rot, g.ints("q_rot_flat", [0, 0, -1]))  # (B, T, N*Hr)
    q_rot = _rotate(g, c, q_rot, n, cos, sin, "q_rot")  # (B, T, N*Hr)
    q_rot = op.Reshape(q_rot, g.ints("q_rot_heads", [0, 0, n, hr]))  # (B, T, N, Hr)
    q_nope, q_rot = (op.Transpose(x, perm=[0, 2, 1, 3]) for x in (q_nope, q_rot))  # (B,N,T,H.)
    return q_nope, q_rot, q_resid


def _cache_entries(g: GraphBuilder, c: MHAConfig, w: Mapping[str, Tensor], cos: str, sin: str
                   ) -> tuple[str, str]:
    """The normalised latent (B, 1, T, R) and the rotated shared key (B, 1, T, Hr), DSA's
    rotated index key after it (B, 1, T, Hr + Di)."""
    m = MLAConfig.of(c)
    kv = g.linear("x", "kv_a_proj_with_mqa", w["kv_a_proj_with_mqa.weight"],
                  w.get("kv_a_proj_with_mqa.bias"))  # (B, T, R+Hr)
    op = Ops(g)  # kv_parts (its output kv_parts_0) and latent_4d: a test's fault rewires them
    latent, k_rot = op.Split(kv, g.ints("kv_split", [m.kv_lora_rank, m.qk_rope_head_dim]),
                             n_out=2, axis=2, name="kv_parts")  # (B, T, R), (B, T, Hr)
    latent = rms_norm(g, latent, w["kv_a_layernorm.weight"], m.norm_eps, 0.0, "kv_a_layernorm")
    k_rot = _rotate(g, c, k_rot, 1, cos, sin, "k_rot")  # (B, T, Hr)
    one_head = g.ints("axes1", [1])
    latent, k_rot = (op.Unsqueeze(latent, one_head, name="latent_4d"),  # (B, 1, T, R)
                     op.Unsqueeze(k_rot, one_head))  # (B, 1, T, Hr)
    if m.index is not None and not m.index.shared:  # DSA: the value cache [k_rot | index key]
        k_rot = op.Concat(k_rot, index_keys(g, m.index, w, m.qk_rope_head_dim, cos, sin),
                          axis=3, name="index_cached")  # (B, 1, T, Hr + Di)
    return latent, k_rot


def _rotate(g: GraphBuilder, c: MHAConfig, x: str, heads: int, cos: str, sin: str,
            name: str) -> str:
    """(B, T, heads*Hr) rotated in the layer's rope layout."""
    m = MLAConfig.of(c)
    hr, layout = m.qk_rope_head_dim, m.rope_layout
    if layout == UNROTATED:  # Kimi Linear: NoPE
        return x
    return rotate_heads(g, x, heads, hr, hr, layout != "half", cos, sin, name,
                        halves_out=layout == "deinterleaving")
