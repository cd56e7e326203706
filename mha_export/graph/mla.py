"""Multi-head Latent Attention's static-cache step as an ONNX graph (layer/mla.py's
``forward_static``), in the absorbed form: the latent cache is read as stored, never expanded.

    x -> q (q_proj, or q_a_proj -> RMSNorm -> q_b_proj) -> [q_nope | q_rot], q_rot rotated
      -> q_latent = q_nope @ W_UK                       (each head's slice of kv_b_proj)
    x -> kv_a_proj_with_mqa -> [latent -> RMSNorm | k_rot rotated]
      -> written into the app's buffers at past_lengths (ScatterND: in place when bound)
    softmax(q_latent . latent + q_rot . k_rot) @ latent over each row's valid prefix
      -> context @ W_UV^T -> o_proj -> y

The core is multi-query attention (one key/value head, a value head R narrower than the key's
R + Hr) in plain MatMul / Softmax / MatMul with every head's queries as rows of one matrix, so
that the latent cache is read once per step (opset 17). Foundation of issue 23: built and proven
against the eager layer (tests/test_mla.py); not yet an export (no signature, artifact or CLI).

Shape legend: B = batch, T = this call, C = buffer capacity, S = valid prefix, N = heads,
R = kv_lora_rank, Hn = qk_nope_head_dim, Hr = qk_rope_head_dim, Hv = v_head_dim.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ..layer.mla import MLAConfig, MLAttention
from .builder import GraphBuilder, additive, as_1d, dim, merge_heads, row_masked_positions
from .forms.base import write_index
from .norm import rms_norm
from .rotary import cos_sin_at, rotate_heads

OPSET = 17  # standard ops only
INPUTS = ("x", "past_key", "past_value", "past_lengths", "position_ids")
OUTPUTS = ("y", "present_key", "present_value")


def build_mla_static(module: MLAttention, dtype: str = "float32") -> onnx.ModelProto:
    """x (B, T, dim), past_key = the latent buffer (B, 1, C, R), past_value = the rotated-key
    buffer (B, 1, C, Hr), past_lengths (B,), position_ids (B, T) -> y (B, T, dim),
    present_key, present_value (the buffers, written in place when bound to past's memory)."""
    c, g = module.config, GraphBuilder(dtype=dtype)
    cos, sin = cos_sin_at(g, "position_ids", c.qk_rope_head_dim, c.rope_theta, c.rope_scaling)
    queries = _queries(g, module, cos, sin)  # (B, N, T, R), (B, N, T, Hr)
    latent, k_rot = _cache_entries(g, module, cos, sin)  # (B, 1, T, R), (B, 1, T, Hr)
    seq_len = dim(g, "x", 1, "seq_len")  # () T
    index = write_index(g, "past_lengths", latent, seq_len)  # (B, 1, T, 3)
    present_key = g.op("ScatterND", ["past_key", index, latent], name="latent_write")
    present_value = g.op("ScatterND", ["past_value", index, k_rot], name="rope_write")
    end = g.op("Add", [g.op("ReduceMax", ["past_lengths"], keepdims=0, name="longest_past"),
                       seq_len], name="valid_end")  # () max(past_lengths) + T
    prefix = [g.ints("zero_1d", [0]), as_1d(g, end, "valid_end_1d"), g.ints("axes2_1d", [2])]
    latents = g.op("Slice", [present_key, *prefix], name="valid_latents")  # (B, 1, S, R)
    rope = g.op("Slice", [present_value, *prefix], name="valid_rope")  # (B, 1, S, Hr)
    masked = row_masked_positions(g, "past_lengths", seq_len,
                                  dim(g, latents, 2, "valid_len"))  # (B, 1, T, S)
    ctx = _latent_attention(g, c, *queries, latents, rope, additive(g, masked, "row_bias"))
    _, w_uv = module.kv_b_heads()  # (N, Hv, R)
    ctx = g.op("MatMul", [ctx, g.const("kv_b_proj.w_uv_t", w_uv.transpose(1, 2))],
               name="context_out_of_latent")  # (B, N, T, Hv)
    y = g.linear(merge_heads(g, ctx, c.heads * c.v_head_dim), "o_proj", module.o_proj.weight,
                 module.o_proj.bias)  # (B, T, dim)
    g.nodes.append(helper.make_node("Identity", [y], ["y"], name="y_out"))
    for tensor, name in ((present_key, "present_key"), (present_value, "present_value")):
        _rename(g, tensor, name)
    return _model(g, c, dtype)


def _latent_attention(g: GraphBuilder, c: MLAConfig, q_latent: str, q_rot: str,
                      latents: str, k_rot: str, bias: str) -> str:
    """Multi-query attention with every head's queries as rows of one matrix: scores =
    q_latent . latent + q_rot . k_rot, context = p @ latents — the one key/value head is read
    once, never repeated per head, nor concatenated into one key. Measured on a DeepSeek-V2-Lite
    shape at past 4096 (AMD EPYC, benchmarks/mla_step.py): one Attention node 16.0 ms, a
    concatenated key 6.8, this 4.8 (scores as keys @ queries^T: the GEMM packs the few query
    columns, not the cache: 1.34 -> 0.69 ms; the context the other way round was slower).
    q_latent (B, N, T, R), q_rot (B, N, T, Hr), latents (B, 1, S, R), k_rot (B, 1, S, Hr),
    bias (B, 1, T, S)."""
    def rows(q: str, width: int, name: str) -> str:
        return g.op("Reshape", [q, g.ints(f"{name}_rows_shape", [0, 1, -1, width])],
                    name=f"{name}_rows")  # (B, 1, N*T, width)

    def transposed(k: str, name: str) -> str:
        return g.op("Transpose", [k], perm=[0, 1, 3, 2], name=f"{name}_t")  # (B, 1, w, S)

    # keys as the streamed left operand (the queries, few rows, are what a GEMM packs):
    # (S, R) @ (R, N*T), then the small result transposed
    scores_t = g.op("Add", [
        g.op("MatMul", [latents, transposed(rows(q_latent, c.kv_lora_rank, "q_latent"),
                                            "q_latent_rows")], name="latent_scores"),
        g.op("MatMul", [k_rot, transposed(rows(q_rot, c.qk_rope_head_dim, "q_rot"),
                                          "q_rot_rows")], name="rope_scores")],
        name="scores_t")  # (B, 1, S, N*T)
    scores = g.op("Transpose", [scores_t], perm=[0, 1, 3, 2], name="scores")  # (B,1,N*T,S)
    heads = g.op("Concat", [g.ints("bn", [0, c.heads]), g.ints("minus_one_1d", [-1]),
                            g.op("Shape", [latents], start=2, end=3, name="key_count")],
                 axis=0, name="score_heads_shape")  # [B, N, -1, S]
    scores = g.op("Reshape", [scores, heads], name="scores_by_head")  # (B, N, T, S)
    scaled = g.op("Add", [g.op("Mul", [scores, g.const("softmax_scale", c.scale)],
                               name="scaled_scores"), bias], name="masked_scores")
    probs = g.op("Softmax", [scaled], axis=-1, name="probs")  # (B, N, T, S)
    probs = g.op("Reshape", [probs, g.ints("prob_rows", [0, 1, -1, 0])],
                 name="prob_rows_3d")  # (B, 1, N*T, S)
    ctx = g.op("MatMul", [probs, latents], name="latent_context")  # (B, 1, N*T, R)
    return g.op("Reshape", [ctx, g.ints("ctx_heads", [0, c.heads, -1, c.kv_lora_rank])],
                name="latent_context_heads")  # (B, N, T, R)


def _queries(g: GraphBuilder, module: MLAttention, cos: str, sin: str) -> tuple[str, str]:
    """q_nope @ W_UK (B, N, T, R) and the rotated q_rot (B, N, T, Hr)."""
    c = module.config
    if c.q_lora_rank is None:
        q = g.linear("x", "q_proj", module.q_proj.weight, None)
    else:
        q = g.linear("x", "q_a_proj", module.q_a_proj.weight, module.q_a_proj.bias)
        q = rms_norm(g, q, module.q_a_layernorm.weight, c.norm_eps, 0.0, "q_a_layernorm")
        q = g.linear(q, "q_b_proj", module.q_b_proj.weight, None)  # (B, T, N*(Hn+Hr))
    q = g.op("Reshape", [q, g.ints("q_heads_shape", [0, 0, c.heads, c.qk_head_dim])],
             name="q_heads")  # (B, T, N, Hn+Hr)
    q_nope, q_rot = g.op("Split", [q, g.ints("q_split", [c.qk_nope_head_dim,
                                                          c.qk_rope_head_dim])],
                         n_out=2, axis=3, name="q_parts")  # (B, T, N, Hn), (B, T, N, Hr)
    q_rot = _rotate(g, c, g.op("Reshape", [q_rot, g.ints("q_rot_flat", [0, 0, -1])],
                               name="q_rot_flat"), c.heads, cos, sin, "q_rot")  # (B, T, N*Hr)
    q_rot = g.op("Transpose", [g.op("Reshape", [q_rot, g.ints("q_rot_heads", [
        0, 0, c.heads, c.qk_rope_head_dim])], name="q_rot_heads")], perm=[0, 2, 1, 3],
        name="q_rot_bnth")  # (B, N, T, Hr)
    w_uk, _ = module.kv_b_heads()  # (N, Hn, R)
    q_latent = g.op("MatMul", [g.op("Transpose", [q_nope], perm=[0, 2, 1, 3], name="q_nope_bnth"),
                               g.const("kv_b_proj.w_uk", w_uk)], name="q_latent")  # (B, N, T, R)
    return q_latent, q_rot


def _cache_entries(g: GraphBuilder, module: MLAttention, cos: str, sin: str
                   ) -> tuple[str, str]:
    """The normalised latent (B, 1, T, R) and the rotated shared key (B, 1, T, Hr)."""
    c = module.config
    kv = g.linear("x", "kv_a_proj_with_mqa", module.kv_a_proj_with_mqa.weight,
                  module.kv_a_proj_with_mqa.bias)  # (B, T, R+Hr)
    latent, k_rot = g.op("Split", [kv, g.ints("kv_split", [c.kv_lora_rank, c.qk_rope_head_dim])],
                         n_out=2, axis=2, name="kv_parts")  # (B, T, R), (B, T, Hr)
    latent = rms_norm(g, latent, module.kv_a_layernorm.weight, c.norm_eps, 0.0, "kv_a_layernorm")
    k_rot = _rotate(g, c, k_rot, 1, cos, sin, "k_rot")  # (B, T, Hr)
    one_head = g.ints("axes1", [1])
    return (g.op("Unsqueeze", [latent, one_head], name="latent_4d"),
            g.op("Unsqueeze", [k_rot, one_head], name="k_rot_4d"))


def _rotate(g: GraphBuilder, c: MLAConfig, x: str, heads: int, cos: str, sin: str,
            name: str) -> str:
    """(B, T, heads*Hr) rotated in the config's rope layout."""
    layout = c.rope_layout
    return rotate_heads(g, x, heads, c.qk_rope_head_dim, c.qk_rope_head_dim,
                        layout != "half", cos, sin, name, halves_out=layout == "deinterleaving")


def _rename(g: GraphBuilder, tensor: str, name: str) -> None:
    """The node that computes ``tensor`` writes ``name`` (no Identity copy of a buffer)."""
    for node in g.nodes:
        node.input[:] = [name if i == tensor else i for i in node.input]
        node.output[:] = [name if o == tensor else o for o in node.output]


def _model(g: GraphBuilder, c: MLAConfig, dtype: str) -> onnx.ModelProto:
    elem = g.elem
    shapes = {"x": (elem, ["batch", "seq", c.dim]),
              "past_key": (elem, ["batch", 1, "max_cache", c.kv_lora_rank]),
              "past_value": (elem, ["batch", 1, "max_cache", c.qk_rope_head_dim]),
              "past_lengths": (TensorProto.INT64, ["batch"]),
              "position_ids": (TensorProto.INT64, ["batch", "seq"]),
              "y": (elem, ["batch", "seq", c.dim])}
    shapes["present_key"], shapes["present_value"] = shapes["past_key"], shapes["past_value"]
    value_info = {n: helper.make_tensor_value_info(n, *shapes[n]) for n in shapes}
    graph = helper.make_graph(g.nodes, "mla_static", [value_info[n] for n in INPUTS],
                              [value_info[n] for n in OUTPUTS], initializer=g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="mha-export", ir_version=10)
