"""The graph forms of Multi-head Latent Attention (graph.py builds the rest of the layer:
projections, rotary, the latent cache, the mask), each a core from queries to context:

    ``latent-absorbed``  W_UK moves q_nope into latent space, W_UV brings the context out:
                         multi-query attention over the cache as stored (one key [latent |
                         k_rot] of width R + Hr, one value latent of width R), never expanded
    ``latent-expanded``  transformers' computation: kv_b_proj expands every latent read into each
                         head's k_nope and v once, then a Loop over blocks of <= 256 queries
                         (memory linear in T: one block's (N, bs, S) scores at a time)
    ``latent``           (the default for MLA layers) an If on the runtime T: absorbed below
                         LATENT_THRESHOLD tokens (every decode step), expanded from there

FLOPs per (query, key) pair and head: absorbed 2R + Hr, expanded Hn + Hr + Hv, plus the
expansion's R (Hn + Hv) per key; equal at T = R (Hn + Hv) / (2R - Hn - Hv), 171 for DeepSeek-V2/V3
(R 512, Hn = Hv = 128): the threshold rounds that up to 192 (computed, not measured). Standard
ops only (MatMul, Softmax, Loop; opset 17). The absorbed core materialises its (N, T, S) scores:
below the threshold only, in ``latent``.

Shape legend: B = batch, T = this call, S = keys read, N = heads, R = kv_lora_rank,
Hn = qk_nope_head_dim, Hr = qk_rope_head_dim, Hv = v_head_dim.
"""
from __future__ import annotations

from typing import Mapping

from onnx import helper
from torch import Tensor

from ...config import MHAConfig
from ...graph.builder import GraphBuilder, as_1d, ceil_div, dim
from ...graph.forms.base import LINEAR, QUADRATIC, Feature, GraphForm, Memory
from ...graph.forms.blocked import BLOCK, BLOCK_EDGES, pad_axis, run_loop
from ...graph.ops import Ops
from .graph import LatentIO, build_latent
from .settings import LAYOUT, MLAConfig

LATENT_THRESHOLD = 192


def _head_weights(c: MHAConfig, w: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """kv_b_proj per head: W_UK (N, Hn, R), W_UV (N, Hv, R)."""
    m = MLAConfig.of(c)
    per_head = w["kv_b_proj.weight"].reshape(m.heads, m.qk_nope_head_dim + m.v_head_dim,
                                             m.kv_lora_rank)  # (N, Hn+Hv, R)
    return per_head[:, :m.qk_nope_head_dim], per_head[:, m.qk_nope_head_dim:]


def _softmax(g: GraphBuilder, scores: str, c: MHAConfig, bias: str) -> str:
    """(B, N, T, S) scores -> probabilities: scaled, masked additively, softmax over S."""
    op = Ops(g)
    scaled = op.Mul(scores, g.const("softmax_scale", c.scale))  # (B, N, T, S)
    return op.Softmax(op.Add(scaled, bias), axis=-1, name="probs")  # (B, N, T, S)


def absorbed_core(g: GraphBuilder, io: LatentIO, c: MHAConfig) -> str:
    """Scores = (q_nope W_UK) . latent + q_rot . k_rot with every head's queries as rows of one
    matrix, so that the latent cache is read once (never repeated per head, nor concatenated
    into one key); context = p @ latent, then W_UV^T. Measured on a DeepSeek-V2-Lite shape at
    past 4096 (AMD EPYC, benchmarks/mla_step.py): one Attention node 16.0 ms, a concatenated
    key 6.8, this 4.8 (the scores as keys @ queries^T: the GEMM packs the few query columns,
    not the cache: 1.34 -> 0.69 ms)."""
    m = MLAConfig.of(c)
    op = Ops(g)
    w_uk, w_uv = _head_weights(c, io.weights)  # (N, Hn, R), (N, Hv, R)
    w_uk = g.const("kv_b_proj.key_heads.weight", w_uk)
    q_latent = op.MatMul(io.q_nope, w_uk)  # (B, N, T, R) = q_nope W_UK

    def rows_t(q: str, width: int, name: str) -> str:  # (B, N, T, w) -> (B, 1, w, N*T)
        rows = op.Reshape(q, g.ints(f"{name}_rows_shape", [0, 1, -1, width]))  # (B, 1, N*T, w)
        return op.Transpose(rows, perm=[0, 1, 3, 2])

    # scores^T = latents q_latent^T + k_rot q_rot^T: the cache as the GEMM's left operand
    latent_scores = op.MatMul(io.latents, rows_t(q_latent, m.kv_lora_rank, "q_latent"))
    rope_scores = op.MatMul(io.k_rot, rows_t(io.q_rot, m.qk_rope_head_dim, "q_rot"))
    scores = op.Transpose(op.Add(latent_scores, rope_scores),
                          perm=[0, 1, 3, 2])  # (B, 1, S, N*T) -> (B, 1, N*T, S)
    heads = op.Concat(g.ints("bn", [0, m.heads]), g.ints("minus_one_1d", [-1]),
                      op.Shape(io.latents, start=2, end=3), axis=0)  # [B, N, -1, S]
    scores = op.Reshape(scores, heads)  # (B, N, T, S)
    probs = _softmax(g, scores, c, io.bias(g))  # (B, N, T, S)
    probs = op.Reshape(probs, g.ints("prob_rows", [0, 1, -1, 0]))  # (B, 1, N*T, S)
    ctx = op.MatMul(probs, io.latents)  # (B, 1, N*T, R): p @ latent
    ctx = op.Reshape(ctx, g.ints("ctx_heads", [0, m.heads, -1, m.kv_lora_rank]))  # (B, N, T, R)
    w_uv_t = g.const("kv_b_proj.value_heads_t.weight", w_uv.transpose(1, 2))  # (N, R, Hv)
    return op.MatMul(ctx, w_uv_t)  # (B, N, T, Hv) = ctx W_UV^T


def expanded_core(g: GraphBuilder, io: LatentIO, c: MHAConfig, block: int = BLOCK) -> str:
    """kv_b_proj over every latent read, once: each head's k_nope and v; then a Loop over blocks
    of <= ``block`` queries (bs = ceil(T / ceil(T / block)), the last padded), each block's
    scores q_nope . k_nope + q_rot . k_rot (the shared rotated key broadcast over the heads,
    never copied) over every key, masked by its own rows' bias."""
    m = MLAConfig.of(c)
    op = Ops(g)
    width = m.qk_nope_head_dim + m.v_head_dim
    w_kv_b = g.const("kv_b_proj.t.weight", io.weights["kv_b_proj.weight"].t())  # (R, N*width)
    kv = op.MatMul(io.latents, w_kv_b)  # (B, 1, S, N*(Hn+Hv))
    kv = op.Reshape(kv, g.ints("kv_heads_shape", [0, -1, m.heads, width]))  # (B, S, N, Hn+Hv)
    kv = op.Transpose(kv, perm=[0, 2, 1, 3])  # (B, N, S, Hn+Hv)
    k_nope, v = op.Split(kv, g.ints("kv_b_split", [m.qk_nope_head_dim, m.v_head_dim]),
                         n_out=2, axis=3)  # (B, N, S, Hn), (B, N, S, Hv)
    k_nope_t, k_rot_t = (op.Transpose(k, perm=[0, 1, 3, 2])
                         for k in (k_nope, io.k_rot))  # (B, N|1, H., S)
    seq_len = dim(g, io.q_nope, 2, "exp_seq_len")  # () T
    n_blocks = ceil_div(g, seq_len, g.ints("exp_block", block), "exp_count")  # ()
    block_size = ceil_div(g, seq_len, n_blocks, "exp_size")  # () <= block
    padding = op.Sub(op.Mul(n_blocks, block_size), seq_len)  # () rows added to the last block
    q_nope, q_rot = (pad_axis(g, q, padding, 2) for q in (io.q_nope, io.q_rot))  # (B,N,nb*bs,.)
    b = g.sub("exp/", share_constants=True)  # weights and scale stored once, in the graph
    iteration, cond = b.name("iter"), b.name("cond_in")
    body = Ops(b)
    start = body.Mul(iteration, block_size)  # () the block's first query
    rows = [as_1d(b, start, "start_1d"), as_1d(b, body.Add(start, block_size), "end_1d"),
            b.ints("axes2", [2])]  # queries [start, start + bs) of axis 2
    qn, qr = (body.Slice(q, *rows) for q in (q_nope, q_rot))  # (B, N, bs, H.)
    scores = body.Add(body.MatMul(qn, k_nope_t), body.MatMul(qr, k_rot_t))  # (B, N, bs, S)
    ctx = body.MatMul(_softmax(b, scores, c, io.mask(b, start, block_size)), v)  # (B,N,bs,Hv)
    ctx = run_loop(g, b, n_blocks, iteration, cond, ctx, io.q_nope,
                   [m.heads, -1, m.v_head_dim])  # (nb, B, N, bs, Hv)
    ctx = op.Transpose(ctx, perm=[1, 2, 0, 3, 4])  # (B, N, nb, bs, Hv)
    ctx = op.Reshape(ctx, g.ints("exp_ctx_shape", [0, m.heads, -1,
                                                   m.v_head_dim]))  # (B, N, nb*bs, Hv)
    return op.Slice(ctx, g.ints("zero_1d", [0]), as_1d(g, seq_len, "exp_seq_len_1d"),
                    g.ints("axes2_1d", [2]))  # (B, N, T, Hv): the padded rows dropped


def auto_core(g: GraphBuilder, io: LatentIO, c: MHAConfig,
              threshold: int = LATENT_THRESHOLD) -> str:
    """An If on the runtime T: the absorbed core below ``threshold``, the expanded from it."""
    op = Ops(g)
    t = dim(g, "x", 1, "latent_seq_len")  # () T
    short = op.Less(t, g.ints("latent_threshold", threshold))  # () T < threshold
    branches = []
    for tag, core in (("absorbed", absorbed_core), ("expanded", expanded_core)):
        s = g.sub(f"{tag}/", share_constants=True)
        ctx = core(s, io, c)  # (B, N, T, Hv)
        branches.append(s.subgraph(g.name(f"latent_{tag}"), [], [
            helper.make_tensor_value_info(ctx, g.elem, None)]))
    return op.If(short, then_branch=branches[0], else_branch=branches[1])  # (B, N, T, Hv)


# What an MLA form supports: its caches, padding, and the one shared key head (GQA's feature);
# each builds MLA layers (kind) inside graph.py's layer
LATENT_FEATURES = frozenset({Feature.KV_CACHE, Feature.STATIC_CACHE, Feature.ATTENTION_MASK,
                             Feature.GQA})
OF_MLA = dict(kind=LAYOUT, layer=build_latent, supports=LATENT_FEATURES)
LATENT_AUTO = GraphForm(
    name="latent", core=auto_core, min_opset=17, memory=Memory(linear_from=LATENT_THRESHOLD),
    summary=f"Multi-head Latent Attention (the default for it): an If on the runtime T, the "
            f"absorbed core for T < {LATENT_THRESHOLD} (every decode step: the latent cache "
            f"read as stored), the expanded loop from {LATENT_THRESHOLD}",
    switch_seq_lens=(LATENT_THRESHOLD - 1, LATENT_THRESHOLD) + BLOCK_EDGES, **OF_MLA)
LATENT_ABSORBED = GraphForm(
    name="latent-absorbed", core=absorbed_core, min_opset=17, memory=QUADRATIC,
    summary="Multi-head Latent Attention, every call absorbed: multi-query attention over the "
            "latent cache as stored (MatMul, Softmax, MatMul)",
    **OF_MLA)
LATENT_EXPANDED = GraphForm(
    name="latent-expanded", core=expanded_core, min_opset=17, memory=LINEAR,
    summary="Multi-head Latent Attention, every call expanded as transformers computes it "
            f"(kv_b_proj over every latent read), then a Loop over blocks of <= {BLOCK} queries",
    switch_seq_lens=BLOCK_EDGES, **OF_MLA)
FORMS = (LATENT_AUTO, LATENT_ABSORBED, LATENT_EXPANDED)
