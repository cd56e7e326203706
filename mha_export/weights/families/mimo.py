"""MiMo-V2-Flash: sliding layers with twice the key/value heads and sinks, value heads narrower
than the keys (v_head_dim) and scaled (attention_value_scale), a partial rope per layer type."""
from __future__ import annotations

from .base import Family, Settings
from .decoder import ATTN, DECODER_DEFAULTS, DECODER_TENSORS, decoder_fields
from .gguf_common import FROM_HF
from .layer_types import FULL, SLIDING, typed
from .rope import rope_scaling

# transformers' defaults when config.json has no rope_parameters (MiMo-V2-Flash's thetas)
MIMO_ROPE = {FULL: {"rope_type": "default", "rope_theta": 5_000_000.0,
                    "partial_rotary_factor": 0.334},
             SLIDING: {"rope_type": "default", "rope_theta": 10_000.0,
                       "partial_rotary_factor": 0.334}}


def mimo_layers(s: Settings, layer: int) -> str:
    """Full attention on the first layer and every 6th; sliding on the rest."""
    return FULL if layer == 0 or (layer + 1) % 6 == 0 else SLIDING


def mimo_window(s: Settings) -> int:
    """sliding_window, or the original config's sliding_window_size + 1 (the query itself)."""
    size = s.config.get("sliding_window_size")
    return size + 1 if size is not None else s["sliding_window"]


def mimo_attention(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Sliding layers: twice the kv heads, sinks; every layer: v_head_dim, the value scale, the
    rope of its layer type (rotary_dim int(head_dim * partial_rotary_factor), default 0.334)."""
    params = (s.get("rope_parameters") or MIMO_ROPE)[kind]
    sliding = kind == SLIDING
    scale = s["attention_value_scale"]
    return {"kv_heads": fields["kv_heads"] * (2 if sliding else 1), "sinks": sliding,
            "sliding_window": mimo_window(s) if sliding else None,
            "v_head_dim": s["v_head_dim"],
            "value_multiplier": None if scale is None else float(scale),
            "rotary_dim": int(fields["head_dim"] * params.get("partial_rotary_factor", 0.334)),
            "rope_theta": float(params["rope_theta"]), "rope_scaling": rope_scaling(s, params)}


RECORDS = (
    # sinks: the checkpoints' attention_sink_bias (transformers renames it when loading)
    Family("mimo_v2_flash", "split", ATTN,
           {**DECODER_TENSORS, "attention_sink_bias": "sinks", "sinks": "sinks"},
           {**DECODER_DEFAULTS, "head_dim": 192, "v_head_dim": 128, "num_key_value_heads": 4,
            "sliding_window": 129, "attention_bias": False, "attention_value_scale": 0.707},
           decoder_fields(typed(mimo_layers), "attention_bias", False, mimo_attention),
           summary="layer_types (or the first and every 6th full) + sliding_window; sliding "
                   "layers: twice num_key_value_heads, sinks; v_head_dim, "
                   "attention_value_scale, a partial rope per layer type (rope_parameters)"),
)

GGUF_REFUSED = {  # GGUF (llama.cpp's files)
    "mimo2": ("llama.cpp's mimo2 never applies MiMo's attention_value_scale, which "
              "transformers does" + FROM_HF),
}
