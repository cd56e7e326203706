"""QSA's kind record: what every stage asks of it (kinds/base.py). Eager and TorchScript build
it; the ONNX graph, AOTInductor and ExecuTorch refuse it in one line."""
from __future__ import annotations

from typing import Optional

from ...config import MHAConfig
from .. import standard
from ..base import AttentionKind
from .layer import QSAttention
from .settings import LAYOUT, NAME

REFUSED = {
    "onnx": f"{NAME} is not built as an ONNX graph yet (its block pooling and block top-k "
            "have no graph form here): export it with `mha-export torchscript`",
    "aoti": f"{NAME} is not built for AOTInductor: torch 2.13's Inductor compiles the "
            "indexer's block selection but its program's y differs from the eager layer's "
            "from the first complete block on: export it with `mha-export torchscript`",
    "executorch": f"{NAME} is not built for ExecuTorch: its indexer keeps each query's top "
                  "blocks by a stable sort, and ExecuTorch's edge dialect refuses aten.sort "
                  "(not core ATen): export it with `mha-export torchscript`",
}


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


def unexported(c: MHAConfig, target: str) -> Optional[str]:
    return REFUSED.get(target)


KIND = AttentionKind(
    name="qsa", summary=NAME, layouts={LAYOUT: QSAttention}, anchors={}, forms=(),
    projections=projections, quantizable=standard.quantizable,
    map_projections=standard.map_projections, call_flops=call_flops, unexported=unexported,
    unbuilt={"int8-cache": f"--kv-cache-dtype int8 is not built for {NAME} yet (its value "
                           "cache holds the raw index keys)",
             "quantize": f"--quantize is not built for {NAME} yet (the indexer's projection "
                         "stays the checkpoint's)"})
