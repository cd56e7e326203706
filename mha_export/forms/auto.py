"""``auto`` (the default): an ``If`` on the runtime T of the call: one ``Attention`` node for
T < 512 (fastest for short calls and single-token decode steps; its (N, T, S) scores are small
there), the ``blocked`` loop from 512 on (memory linear in T).

The threshold was measured (benchmarks/blocked_sweep.py, 2-core Xeon, noisy: T=128 one node
3.8-4.2 ms vs loop 3.9-4.3; T=300 9.1 vs 10.6; T=512 23.0 vs 18.9; T=2048 176 vs 91-98)."""
from __future__ import annotations

import dataclasses
import functools

from onnx import helper

from ..config import MHAConfig
from ..graph import GraphBuilder, dim
from .attention_op import attention_op_core
from .base import AttentionIO, AttentionOut, GraphForm, cache_out, keys_values
from .blocked import BLOCK, BLOCK_EDGES, blocked_core

AUTO_THRESHOLD = 512


def auto_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig,
              threshold: int = AUTO_THRESHOLD, block: int = BLOCK) -> AttentionOut:
    t = dim(g, io.q, 1, "auto_seq_len")  # () T
    short = g.op("Less", [t, g.ints("auto_threshold", threshold)], name="auto_is_short")  # ()
    if io.has_cache or io.attention_mask is not None:  # the present is built once, outside
        keys, values = keys_values(g, io, c)  # (B, K, S, H)
        io = dataclasses.replace(io, keys=keys, values=values)
    branches = []
    for tag, core in (("short", attention_op_core),
                      ("long", functools.partial(blocked_core, block=block))):
        s = g.sub(f"{tag}/")
        out = core(s, io, c).context  # (B, T, D)
        branches.append(s.subgraph(g.name(f"auto_{tag}"), [],
                                   [helper.make_tensor_value_info(out, g.elem, None)]))
    ctx = g.op("If", [short], then_branch=branches[0], else_branch=branches[1],
               name="auto_attention")  # (B, T, D)
    return cache_out(io, ctx, io.keys, io.values)


FORM = GraphForm(
    name="auto", core=auto_core, min_opset=23, memory="linear in T above 512",
    summary=f"an If on the runtime T: the attention-op node for T < {AUTO_THRESHOLD}, the "
            f"blocked loop for T >= {AUTO_THRESHOLD}",
    switch_seq_lens=(AUTO_THRESHOLD - 1, AUTO_THRESHOLD) + tuple(
        AUTO_THRESHOLD + e for e in BLOCK_EDGES),
    supports=frozenset({"non-causal", "kv-cache", "attention-mask"}))
