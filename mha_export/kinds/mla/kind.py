"""Multi-head Latent Attention's kind record: what every stage asks of it (kinds/base.py)."""
from __future__ import annotations

from torch import nn

from ...config import MHAConfig
from ..base import AttentionKind, WeightMap
from .forms import FORMS
from .layer import MLAttention
from .settings import LAYOUT, NAME, MLAConfig


def projections(c: MHAConfig) -> dict[str, tuple[int, int]]:
    """Its checkpoint-named projections, [out, in]."""
    return MLAConfig.of(c).weight_shapes()


def quantizable(c: MHAConfig) -> list[str]:
    """Every projection but kv_b_proj (its per-head W_UK / W_UV and the expansion stay float)
    and the sparse indexer's (its top-k selection stays the checkpoint's)."""
    return [name for name in projections(c)
            if name != "kv_b_proj" and not name.startswith("indexer.")]


def map_projections(module: nn.Module, fn: WeightMap) -> nn.Module:
    """A module of the same config whose quantizable projections hold fn(name, weight), through
    the state dict (the checkpoints' names)."""
    state = module.state_dict()
    for name in quantizable(module.config):
        state[f"{name}.weight"] = fn(name, state[f"{name}.weight"])
    out = MLAttention(module.config).eval()
    out.load_state_dict(state)
    return out.train(module.training)


def call_flops(c: MHAConfig, seq: int, pairs: float, past: int) -> float:
    """Its cheaper form's (absorbed or expanded) over the call's pairs and T*P cached ones."""
    return MLAConfig.of(c).call_flops(seq, pairs + seq * past, seq + past)


# DeepSeek Sparse Attention's indexer keeps each query's top keys by a stable sort
SORTED_TOP_KEYS = ("DeepSeek Sparse Attention (--index-topk)",
                   "its indexer keeps each query's top keys by a stable sort (ties to the "
                   "earlier key, as ONNX's TopK)")


def needs(c: MHAConfig) -> dict[str, tuple[str, str]]:
    """A sparse latent layer with its own indexer (DSA) sorts its indexer's scores (a GLM-5
    shared-top-k layer is given its selection: none)."""
    index = MLAConfig.of(c).index
    return {"aten.sort": SORTED_TOP_KEYS} if index and not index.shared else {}


KIND = AttentionKind(
    name=LAYOUT, summary=NAME, layouts={LAYOUT: MLAttention},
    anchors={LAYOUT: "kv_a_proj_with_mqa.weight"}, forms=FORMS, projections=projections,
    quantizable=quantizable, map_projections=map_projections, call_flops=call_flops,
    needs=needs,
    unbuilt={"int8-cache": f"--kv-cache-dtype int8 is not built for {NAME} yet (its latent "
                           "cache is float)"})
