"""DeepSeek-V4's attention tensor names (torch-free): DeepSeek's on disk
(``layers.L.attn.wq_a.weight``, ``attn.attn_sink``: what ``save_pretrained`` writes) and
transformers' (``layers.L.self_attn.q_a_proj.weight``), which the eager layers' parameters
carry. The family record (weights/families/deepseek_v4.py) reads them."""
from __future__ import annotations

# DeepSeek's tensor name (after layers.L.attn.) -> the layer's (transformers') name
DISK_NAMES = {"wq_a.weight": "q_a_proj.weight", "q_norm.weight": "q_a_norm.weight",
              "wq_b.weight": "q_b_proj.weight", "wkv.weight": "kv_proj.weight",
              "norm.weight": "kv_norm.weight", "wo_a.weight": "o_a_proj.weight",
              "wo_b.weight": "o_b_proj.weight", "attn_sink": "sinks"}
COMPRESSOR = {"wkv.weight": "kv_proj.weight", "wgate.weight": "gate_proj.weight",
              "ape": "position_bias", "norm.weight": "kv_norm.weight"}
DISK_NAMES.update({f"compressor.{a}": f"compressor.{b}" for a, b in COMPRESSOR.items()})
DISK_NAMES.update({f"indexer.compressor.{a}": f"compressor.indexer.compressor.{b}"
                   for a, b in COMPRESSOR.items()})
DISK_NAMES.update({"indexer.wq_b.weight": "compressor.indexer.q_b_proj.weight",
                   "indexer.weights_proj.weight": "compressor.indexer.scorer.weights_proj.weight"})
OUR_NAMES = tuple(DISK_NAMES.values())


def module_names() -> dict[str, str]:
    """The family record's ``tensors``: the checkpoint's module (or bare parameter) after
    ``layers.L.`` -> the layer's, under either spelling (``attn.wq_a`` and
    ``self_attn.q_a_proj`` -> ``q_a_proj``)."""
    disk = {f"attn.{_module(a)}": _module(b) for a, b in DISK_NAMES.items()}
    return {**disk, **{f"self_attn.{_module(b)}": _module(b) for b in OUR_NAMES}}


def _module(tensor: str) -> str:
    """A weight's module ("q_a_proj.weight" -> "q_a_proj"); a bare parameter's own name."""
    return tensor[: -len(".weight")] if tensor.endswith(".weight") else tensor
