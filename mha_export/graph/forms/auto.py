"""``auto`` (the default): an ``If`` on the runtime T of the call: one ``Attention`` node for
T < 512 (fastest for short calls and single-token decode steps, where it appends to the cache
itself; its (N, T, S) scores are small there), the ``blocked`` loop from 512 on (memory linear
in T).

The threshold was measured (benchmarks/blocked_sweep.py, 2-core Xeon, noisy: T=128 one node
3.8-4.2 ms vs loop 3.9-4.3; T=300 9.1 vs 10.6; T=512 23.0 vs 18.9; T=2048 176 vs 91-98)."""
from __future__ import annotations

import functools

from onnx import helper

from ...config import MHAConfig
from ..builder import GraphBuilder, dim
from .attention_op import attention_op_core
from .base import ATTENTION_NODE_FEATURES, AttentionIO, AttentionOut, GraphForm, Memory
from .blocked import BLOCK, BLOCK_EDGES, blocked_core

AUTO_THRESHOLD = 512


def auto_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig,
              threshold: int = AUTO_THRESHOLD, block: int = BLOCK) -> AttentionOut:
    t = dim(g, io.q, 1, "auto_seq_len")  # () T
    short = g.op("Less", [t, g.ints("auto_threshold", threshold)], name="auto_is_short")  # ()
    branches = []
    for tag, core in (("short", attention_op_core),
                      ("long", functools.partial(blocked_core, block=block))):
        s = g.sub(f"{tag}/")
        out = core(s, io, c)  # context (B, T, D) [+ present (B, K, S, H)]
        values = [out.context] + ([out.present_key, out.present_value] if io.has_cache else [])
        branches.append(s.subgraph(g.name(f"auto_{tag}"), [], [
            helper.make_tensor_value_info(v, g.elem, None) for v in values]))
    outs = g.op("If", [short], n_out=3 if io.has_cache else 1, then_branch=branches[0],
                else_branch=branches[1], name="auto_attention")
    return AttentionOut(*outs) if io.has_cache else AttentionOut(outs)


FORM = GraphForm(
    name="auto", core=auto_core, min_opset=23, memory=Memory(linear_from=AUTO_THRESHOLD),
    summary=f"an If on the runtime T: the attention-op node for T < {AUTO_THRESHOLD}, the "
            f"blocked loop for T >= {AUTO_THRESHOLD}",
    switch_seq_lens=(AUTO_THRESHOLD - 1, AUTO_THRESHOLD) + tuple(
        AUTO_THRESHOLD + e for e in BLOCK_EDGES),
    supports=ATTENTION_NODE_FEATURES)
