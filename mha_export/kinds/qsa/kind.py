"""QSA's kind record: what every stage asks of it (kinds/base.py). Eager, TorchScript, ONNX
(its one graph form, graph.py's ``qsa-masked``: every call kind), AOTInductor and ExecuTorch
build it (its selection ranks blocks by comparisons: no sort, which ExecuTorch lacks)."""
from __future__ import annotations

from ...config import MHAConfig
from .. import standard
from ..base import AttentionKind
from .graph import FORMS
from .layer import QSAttention
from .settings import LAYOUT, NAME


def projections(c: MHAConfig) -> dict[str, tuple[int, int]]:
    """The standard layer's, and the indexer's query-and-key projection."""
    index = c.qsa
    return {**standard.projections(c),
            "indexer.index_qk_proj": ((index.heads + 1) * index.head_dim, c.d_in)}


def call_flops(c: MHAConfig, seq: int, pairs: float, past: int) -> float:
    """The standard layer's over every causal pair (an upper bound: the indexer's selection
    keeps fewer), and the index scores of each query over the blocks."""
    index = c.qsa
    blocks = (seq + past) // index.compress_ratio
    return (standard.call_flops(c, seq, pairs, past)
            + 2.0 * seq * c.d_in * (index.heads + 1) * index.head_dim
            + 2.0 * seq * blocks * index.heads * index.head_dim)


def example_seq(c: MHAConfig) -> int:
    """More complete blocks than a query keeps, and a tail: every path of the selection."""
    return (c.qsa.block_topk + 1) * c.qsa.compress_ratio + 1


KIND = AttentionKind(
    name="qsa", summary=NAME, layouts={LAYOUT: QSAttention}, anchors={}, forms=FORMS,
    projections=projections, quantizable=standard.quantizable,
    map_projections=standard.map_projections, call_flops=call_flops,
    example_seq=example_seq,
    unbuilt={"int8-cache": f"--kv-cache-dtype int8 is not built for {NAME} yet (its value "
                           "cache holds the raw index keys)",
             "quantize": f"--quantize is not built for {NAME} yet (the indexer's projection "
                         "stays the checkpoint's)"})
