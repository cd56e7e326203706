"""``auto`` (the default): an ``If`` on the runtime T of the call: one ``Attention`` node for
T < 512 (fastest for short calls and single-token decode steps, where it appends to the cache
itself; its (N, T, S) scores are small there), the ``blocked`` loop from 512 on (memory linear
in T).

A static cache: ``GroupQueryAttention`` on the app's buffer (its kernel reads only each row's
valid length; an int8 cache: its own, kv_cache_bit_width=8) for a single token, or for T < 512
at batch 1 — the calls it can run — and the ``blocked`` loop over the same buffer (an int8
cache: standard ops, quantized on write and each block dequantized on read) for every other
call (a long prefill, in memory linear in T; several tokens at batch > 1, which the node
refuses). Where the node cannot build the layer
(head_dim % 8, a sliding window, softcapping, not causal), ``decomposed`` takes the short calls.

The threshold was measured (benchmarks/blocked_sweep.py, 2-core Xeon, noisy: T=128 one node
3.8-4.2 ms vs loop 3.9-4.3; T=300 9.1 vs 10.6; T=512 23.0 vs 18.9; T=2048 176 vs 91-98).

A float16 / bfloat16 model is a GPU model: its full-sequence call without a padding mask takes
the one ``Attention`` node (causal, no bias tensor) at every T (no If). ONNX Runtime's CUDA
kernels for it are memory-linear (flash / memory-efficient attention); the loop was 5-36x
slower (H200, 2026-11-27, fp16
prefill, benchmarks/results/gpu-speed-h200-2026-11-27.json: 12 x 768 T=16384 1.95 ms vs the
loop's 52.6; the 8B shape T=4096 1.34 vs 6.12)."""
from __future__ import annotations

import functools

from onnx import helper

from ...config import MHAConfig
from ...signature import STATIC, make_signature
from ..builder import GraphBuilder, dim
from ..ops import Ops
from .attention_op import FORM as ATTENTION_OP, attention_op_core
from .base import (ATTENTION_NODE_FEATURES, AttentionIO, AttentionOut, Feature, GraphForm, Memory,
                   per_branch, separate_qkv)
from .blocked import BLOCK, BLOCK_EDGES, blocked_core
from .contrib import CONTRIB_GQA, contrib_gqa_core
from .contrib_packed import CONTRIB_GQA_PACKED, xqa_problem
from .decomposed import FORM as DECOMPOSED

AUTO_THRESHOLD = 512
GPU_DTYPES = ("float16", "bfloat16")  # models for the GPU: the node at every T (above)


def auto_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig,
              threshold: int = AUTO_THRESHOLD, block: int = BLOCK) -> AttentionOut:
    """Each branch projects q, k and v itself (io.project) from x, sharing the weights: what
    the If captures stays small, and the long branch frees k and v once it has used them."""
    if g.dtype in GPU_DTYPES and not (io.has_cache or io.attention_mask):  # the node, any T
        return attention_op_core(g, separate_qkv(g, io), c)
    op = Ops(g)
    t = dim(g, "x", 1, "auto_seq_len")  # () T
    short = op.Less(t, g.ints("auto_threshold", threshold))  # () T < threshold
    short_form, why = ATTENTION_OP, ""
    if io.past_lengths is not None:  # the node's calls: one token, or a short call at batch 1
        single = op.Equal(t, g.ints("auto_one", 1))  # () T == 1
        batch_1 = op.Equal(dim(g, "x", 0, "auto_batch"), g.ints("auto_one", 1))  # () B == 1
        short = op.Or(single, op.And(short, batch_1))  # ()
        short_form, why = decode_form(g.dtype, c)
        if short_form.max_cache:  # and a buffer within its cos/sin table
            capacity = dim(g, io.past_key, 2, "auto_capacity")  # () C
            short = op.And(short, op.LessOrEqual(capacity, g.ints(
                "auto_max_cache", short_form.max_cache(c))))  # ()
    branches = []
    for tag, core, inputs in (("short", short_form.core, short_form.inputs),
                              ("long", functools.partial(blocked_core, block=block),
                               separate_qkv)):
        s = g.sub(f"{tag}/", share_constants=True)
        out = core(s, inputs(s, io), c)  # context (B, T, D) [+ present]: q/k/v inside
        results = [(out.context, g.elem)] + ([(out.present_key, io.cache_elem(g)),
                                              (out.present_value, io.cache_elem(g))]
                                             if io.has_cache else [])
        branches.append(s.subgraph(g.name(f"auto_{tag}"), [], [
            helper.make_tensor_value_info(r, elem, None) for r, elem in results]))
    outs = op.If(short, n_out=3 if io.has_cache else 1, then_branch=branches[0],
                 else_branch=branches[1])
    g.nodes[-1].doc_string = f"short calls: {short_form.name}" + (f" ({why})" if why else "")
    return AttentionOut(*outs) if io.has_cache else AttentionOut(outs)


def _gqa_builds(c: MHAConfig) -> bool:
    """contrib-gqa's own record can build this layer's static-cache model (causal, no window,
    no softcap, head_dim % 8 == 0): with an int8 cache too (the node's own int8 buffers)."""
    return CONTRIB_GQA.problem(c, make_signature(c, STATIC)) is None


def decode_form(dtype: str, c: MHAConfig) -> tuple[GraphForm, str]:
    """The form of a static cache's short calls (one token, or a short call at batch 1), and
    why: contrib-gqa-packed for a float16 / bfloat16 model (the CUDA decode step) whose layer
    it builds and XQA takes; else contrib-gqa where it builds the layer; else decomposed."""
    packed = CONTRIB_GQA_PACKED.problem(c, make_signature(c, STATIC)) or xqa_problem(c)
    if dtype in GPU_DTYPES and not packed:
        return CONTRIB_GQA_PACKED, "the CUDA decode step as XQA takes it"
    why = f"not {CONTRIB_GQA_PACKED.name}: " + (packed or f"{dtype} is not a GPU dtype")
    if _gqa_builds(c):
        return CONTRIB_GQA, why
    gqa_problem = CONTRIB_GQA.problem(c, make_signature(c, STATIC))
    return DECOMPOSED, f"{why}; not {CONTRIB_GQA.name}: {gqa_problem}"


FORM = GraphForm(
    name="auto", core=auto_core, min_opset=23, memory=Memory(linear_from=AUTO_THRESHOLD),
    summary=f"an If on the runtime T: the attention-op node for T < {AUTO_THRESHOLD}, the "
            f"blocked loop for T >= {AUTO_THRESHOLD} (a static cache: GroupQueryAttention for "
            f"its calls, the blocked loop for the rest); float16 / bfloat16 without a mask or "
            f"cache: the node at every T (memory-linear on ONNX Runtime's CUDA kernels)",
    switch_seq_lens=(AUTO_THRESHOLD - 1, AUTO_THRESHOLD) + tuple(
        AUTO_THRESHOLD + e for e in BLOCK_EDGES),
    supports=ATTENTION_NODE_FEATURES | {Feature.STATIC_CACHE, Feature.INT8_CACHE},
    inputs=per_branch)
