"""DeepSeek-V4's kind record: what every stage asks of it (kinds/base.py). Eager, TorchScript
and ONNX (forms.py's form ``dsv4``: full-sequence, masked and --kv-cache calls) build every
layer type; AOTInductor and ExecuTorch the full-sequence and masked calls of every layer type
(CSA's indexer reads the k-th largest score of a fixed-k torch.topk and keeps rows by
comparisons, compressed.py's ``top_rows``: no sort, no size from min(k, n)), and by what they
lack of its ``call_needs`` the cached ones; the lossy steps are refused by ``unbuilt``."""
from __future__ import annotations

from torch import nn

from ...config import MHAConfig
from ..base import AttentionKind, WeightMap
from .forms import FORMS
from .module import dsv4_layer
from .settings import CSA, LAYOUT, NAME, SLIDING

def projections(c: MHAConfig) -> dict[str, tuple[int, int]]:
    """Every projection weight [out, in]: the query's low rank, the key = value row, the grouped
    output; a compressed layer's compressor, a CSA layer's indexer."""
    s = c.dsv4.shape(c)
    shapes = {"q_a_proj": (s.q_lora_rank, s.dim), "q_b_proj": (s.heads * s.head_dim,
                                                                 s.q_lora_rank),
              "kv_proj": (s.head_dim, s.dim), "o_a_proj": (s.o_groups * s.o_lora_rank,
                                                             s.group_width),
              "o_b_proj": (s.dim, s.o_groups * s.o_lora_rank)}
    if s.layer_type != SLIDING:
        series = 2 * s.head_dim if s.layer_type == CSA else s.head_dim
        shapes.update({f"compressor.{p}": (series, s.dim) for p in ("kv_proj", "gate_proj")})
    if s.layer_type == CSA:
        index = "compressor.indexer."
        shapes.update({f"{index}compressor.{p}": (2 * s.index_head_dim, s.dim)
                       for p in ("kv_proj", "gate_proj")})
        shapes.update({f"{index}q_b_proj": (s.index_heads * s.index_head_dim, s.q_lora_rank),
                       f"{index}scorer.weights_proj": (s.index_heads, s.dim)})
    return shapes


def call_flops(c: MHAConfig, seq: int, pairs: float, past: int) -> float:
    """The projections, and attention over the window and the pooled rows (an upper bound:
    every pooled row of the call for each query; the indexer's scores over them)."""
    s = c.dsv4.shape(c)
    weights = sum(o * i for o, i in projections(c).values())
    rows = (seq + past) // s.rate if s.rate else 0
    attention = 4 * s.heads * s.head_dim * (min(pairs, seq * s.window) + seq * rows)
    index = 2 * seq * rows * s.index_heads * s.index_head_dim
    return 2.0 * seq * weights + attention + index


# a compressed layer's cached call closes windows of its carried buffer and this call's tokens
CARRIED_WINDOWS = "windows closed from a carried buffer"


def call_needs(c: MHAConfig, kind: str) -> dict[str, tuple[str, str]]:
    """A compressed layer's --kv-cache call pools (past_buffer + seq) // rate rows, a count of
    its input's sizes (the eager layer branches on it: none closed, or some)."""
    if kind != "kv-cache" or c.dsv4.layer_type == SLIDING:
        return {}
    return {CARRIED_WINDOWS: (f"{NAME}'s {c.dsv4.layer_type} layer's --kv-cache call",
                              f"its compressor closes (past_buffer + seq) // {c.dsv4.rate} "
                              "windows of the carried buffer's and this call's tokens")}


def no_quantizable(c: MHAConfig) -> list[str]:
    return []


def unchanged(module: nn.Module, fn: WeightMap) -> nn.Module:
    """--quantize is refused (``unbuilt``): nothing is mapped."""
    return module


UNBUILT = {"quantize": f"--quantize is not built for {NAME} yet (its low-rank, grouped and "
                       "compressor projections have no quantized form here)",
           "int8-cache": f"--kv-cache-dtype int8 is not built for {NAME} yet (an int8 cache is "
                         "a static cache's, and its static cache is not built)"}
KIND = AttentionKind(
    name="dsv4", summary=NAME, layouts={LAYOUT: dsv4_layer},
    anchors={LAYOUT: "o_a_proj.weight"}, forms=FORMS,
    projections=projections, quantizable=no_quantizable, map_projections=unchanged,
    call_flops=call_flops, unbuilt=UNBUILT, call_needs=call_needs)
