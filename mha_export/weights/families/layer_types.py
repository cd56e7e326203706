"""Layer types: which attention each layer of a model has."""
from __future__ import annotations

from typing import Callable, Union

from ...errors import NotAttentionLayer, UsageError
from .base import Settings

FULL, SLIDING = "full_attention", "sliding_attention"
CHUNKED = "chunked_attention"  # Llama 4: keys of the query's own chunk (attention_chunk_size)
ATTENTION_TYPES = (FULL, SLIDING, CHUNKED)  # softmax attention; another type (linear) is not
LayerType = Callable[[Settings, int], str]  # config.json, layer -> FULL | SLIDING | other


def full_layers(s: Settings, layer: int) -> str:
    return FULL


def sliding_layers(s: Settings, layer: int) -> str:
    """Mistral, Phi-3, Starcoder2: config.json's sliding_window (when set) on every layer."""
    return SLIDING


def upper_layers_sliding(s: Settings, layer: int) -> str:
    """Qwen2, Qwen3: sliding when use_sliding_window, on layers from max_window_layers on."""
    return SLIDING if s["use_sliding_window"] and layer >= s["max_window_layers"] else FULL


def switched_sliding(s: Settings, layer: int) -> str:
    """Qwen3-MoE: sliding on every layer when use_sliding_window."""
    return SLIDING if s["use_sliding_window"] else FULL


def periodic(period: Union[int, str], other: str = SLIDING) -> LayerType:
    """Layer i is full when i + 1 is a multiple of period (a number, or the config.json key that
    holds it), else `other` (Gemma 2, gpt-oss: every 2nd full; Gemma 3: sliding_window_pattern;
    Qwen3.5: full_attention_interval, the others linear attention)."""
    def layer_type(s: Settings, layer: int) -> str:
        n = s[period] if isinstance(period, str) else period
        return other if (layer + 1) % n else FULL
    return layer_type


def typed(rule: LayerType) -> LayerType:
    """5.x: layer_types names each layer's attention; without it, transformers' default rule
    (for the model types whose config has layer_types; Mistral's ignores it)."""
    def layer_type(s: Settings, layer: int) -> str:
        types = s.config.get("layer_types")
        if types is None:
            return rule(s, layer)
        if not isinstance(types, list) or len(types) <= layer:
            raise UsageError(f"config.json: layer_types has no entry for layer {layer}")
        return types[layer]
    return layer_type


def not_attention(s: Settings, layer: int, kind: str,
                  layer_type: LayerType) -> NotAttentionLayer:
    """`layer` is of type `kind`: an error naming the attention layers nearest it (below and
    above) and how many the model has."""
    count = s.get("num_hidden_layers") or 0
    ok = [i for i in range(count) if layer_type(s, i) in ATTENTION_TYPES]
    near = [str(i) for i in ([i for i in ok if i < layer][-1:] + [i for i in ok if i > layer][:1])]
    where = (f"the nearest are {' and '.join(near)} ({len(ok)} of its {count} layers are)"
             if near else "the model has none")
    return NotAttentionLayer(f"--layer {layer} is a {kind} layer, {why_left(kind)}: {where}",
                             layer, kind)


def why_left(kind: str) -> str:
    """Why a layer of this type is not exported (left to the model)."""
    return "not softmax attention"
