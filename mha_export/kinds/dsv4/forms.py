"""DeepSeek-V4's ONNX graph form: graph.py's layer built from the signature's inputs, as
graph/model.py builds a form's layer (``GraphForm.layer``).

    signature          graph.py's inputs
    x                  x (B, T, D)
    attention_mask     keep (B, T) int64, 1 = token; a call without one: every token kept
    position_ids       positions (B, T) int64
    -> y (B, T, D)
    kv-cache: attention_mask (B, P + T), past_key (B, 1, P, d) and a compressed layer's
    past_<state> (settings.py's cache_tensors) -> y, present_key, present_<state>
    (graph.py's dsv4_cached)

The whole layer is the form's (its ``core`` is never called on its own: the layer builder
reads the form only for its name). Standard ops only, opset 17. Every layer type: sliding,
HCA and CSA (its indexer's TopK keeps the earlier of equal scores, as the eager layer's
``top_rows``, so the check compares every query, the tied ones too).
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from ...config import MHAConfig
from ...graph.builder import GraphBuilder
from ...graph.forms.base import QUADRATIC, AttentionIO, AttentionOut, Feature, GraphForm
from ...graph.ops import Ops
from ...signature import Signature
from .graph import dsv4_cached, dsv4_full_sequence
from .settings import LAYOUT, NAME, PAST, PRESENT, state_keys


def build_dsv4(g: GraphBuilder, c: MHAConfig, w: Mapping[str, Tensor], form: GraphForm,
               sig: Signature, opset: int = 17, kv_cache: Any = None) -> dict[str, str]:
    """The layer's nodes for the signature's inputs (``w``: the eager layer's ``to_weights()``,
    transformers' names); returns the graph value of y."""
    keep = "attention_mask" if sig.has_mask else _all_kept(g)  # (B, T) int64
    shape = c.dsv4.shape(c)
    if not sig.has_cache:
        return {"y": dsv4_full_sequence(g, shape, w, "x", keep, "position_ids")}
    state = {key: PAST + key for key in state_keys(shape.layer_type)}  # the signature's names
    y, present, after = dsv4_cached(g, shape, w, "x", keep, "position_ids", "past_key", state)
    return {"y": y, "present_key": present, **{PRESENT + k: v for k, v in after.items()}}


def _all_kept(g: GraphBuilder) -> str:
    """(B, T) int64 ones: a call without a padding mask keeps every token."""
    op = Ops(g).named("keep")
    return op.Expand(g.ints("keep_token", 1), op.Shape("x", start=0, end=2),
                     name="all")  # (B, T)


def _whole_layer(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    """Never called: build_dsv4 builds the whole layer (GraphForm's core field is required)."""
    raise NotImplementedError(f"{NAME}'s form builds its whole layer (build_dsv4)")


# its one key = value head (GQA's feature), its sliding window, its sinks, a padding mask, its
# growing cache (settings.py's cache_tensors)
DSV4_FEATURES = frozenset({Feature.ATTENTION_MASK, Feature.GQA, Feature.SLIDING_WINDOW,
                           Feature.SINKS, Feature.KV_CACHE})
DSV4_FORM = GraphForm(
    name="dsv4", kind=LAYOUT, layer=build_dsv4, core=_whole_layer, min_opset=17,
    memory=QUADRATIC, supports=DSV4_FEATURES,
    summary=f"{NAME} (the only form for it; sliding, CSA and HCA layers): the sliding "
            "window's rows and the compressor's pooled rows (CSA: the indexer's top-k by "
            "TopK, ties to the earlier row) as one key = value head, softmax with the head's "
            "sink (standard ops)")
FORMS = (DSV4_FORM,)
