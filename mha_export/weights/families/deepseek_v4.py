"""DeepSeek-V4 (``deepseek_v4``): its layers' shape read from config.json as transformers 5.23's
DeepseekV4Config writes it (the layer type, the main and compress ropes, the compressor's rate,
the indexer), and its family record: the attention kind ``dsv4`` (kinds/dsv4/), its tensors
under DeepSeek's names on disk or transformers'."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ...errors import UsageError
from ...kinds.dsv4.names import module_names
from ...kinds.dsv4.settings import CSA, SLIDING, DSV4Shape, config_fields
from .base import Family, Settings
from .rope import rope_scaling


def layer_type(cfg: Mapping[str, Any], layer: int) -> str:
    """The layer's type, or a one-line refusal (an index out of range)."""
    types = cfg.get("layer_types") or []
    if not 0 <= layer < len(types):
        raise UsageError(f"layer {layer} is not in this checkpoint: it has {len(types)} layers "
                         f"(0..{len(types) - 1})")
    return types[layer]


def _rope(cfg: Mapping[str, Any], kind: str) -> tuple[float, float, Optional[dict]]:
    """(theta, partial_rotary_factor, scaling) of the layer type's rope: "main" for sliding
    layers, "compress" (YaRN in the released checkpoints) for the others."""
    label = "main" if kind == SLIDING else "compress"
    rope = (cfg.get("rope_parameters") or {}).get(label) or {}
    factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if factor is None:
        raise UsageError("config.json has no partial_rotary_factor (nor rope_parameters')")
    default = cfg.get("rope_theta" if label == "main" else "compress_rope_theta", 10000.0)
    return float(rope.get("rope_theta", default)), factor, rope_scaling(Settings(cfg), rope)


def shape_from_config(cfg: Mapping[str, Any], layer: int) -> DSV4Shape:
    """The shape of a layer from a deepseek_v4 config.json (as transformers 5.23's
    DeepseekV4Config writes it)."""
    kind = layer_type(cfg, layer)
    theta, factor, scaling = _rope(cfg, kind)
    head_dim = cfg["head_dim"]
    index = {"index_heads": cfg["index_n_heads"], "index_head_dim": cfg["index_head_dim"],
             "index_topk": cfg["index_topk"]} if kind == CSA else {}
    return DSV4Shape(
        dim=cfg["hidden_size"], heads=cfg["num_attention_heads"], head_dim=head_dim,
        rope_dim=int(head_dim * factor), q_lora_rank=cfg["q_lora_rank"],
        o_groups=cfg["o_groups"], o_lora_rank=cfg["o_lora_rank"], window=cfg["sliding_window"],
        rope_theta=theta, eps=float(cfg.get("rms_norm_eps", 1e-6)), layer_type=kind,
        rope_scaling=scaling,
        rate=(cfg.get("compress_rates") or {}).get(kind, 0) if kind != SLIDING else 0, **index)


def v4_fields(s: Settings, layer: int) -> dict:
    """A DeepSeek-V4 layer's MHAConfig fields: its shape read from config.json."""
    return config_fields(shape_from_config(s.config, layer))


RECORDS = (
    Family("deepseek_v4", "dsv4", "layers.{layer}", module_names(), {}, v4_fields,
           summary="DeepSeek-V4's attention (kinds/dsv4/): layer_types (sliding_attention, "
                   "compressed_sparse_attention, heavily_compressed_attention), compress_rates, "
                   "q_lora_rank, o_groups, o_lora_rank, sliding_window, index_n_heads, "
                   "index_head_dim, index_topk, the main and compress ropes"),
)
