"""Hugging Face checkpoints: one layer's attention, its config read from config.json.

    --weights FOLDER (config.json + model.safetensors | model.safetensors.index.json (sharded) |
    pytorch_model.bin), or one weights file with its config.json beside it; --layer N.

One ``Family`` record per checkpoint layout (what varies is a registry entry): which model types
it serves, the layer's tensor names, the MHAConfig fields it reads from config.json (both the
transformers 4.x spellings — rope_theta, rope_scaling, rotary_pct, rotary_emb_base — and 5.x —
rope_parameters, partial_rotary_factor, layer_types), and how its tensors map onto one of our
layouts. Only the chosen layer's tensors are read: safetensors files are opened lazily, sharded
checkpoints open only the shards that hold them, and .bin files are memory-mapped.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ..errors import UsageError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# The context a checkpoint layer's export checks by default (max_seq_len): the checkpoint's
# max_position_embeddings, at most this (131072 for Llama 3 would be a sweep no machine runs);
# --max-seq-len sets it, and longer inputs work either way.
CHECKED_CONTEXT = 1024


@dataclass(frozen=True)
class Family:
    model_types: tuple
    layout: str  # the mha-export layout its tensors map onto
    keys: str  # regex of the layer's attention tensors after "...{N}.", group 1 = our name part
    layer_root: str  # regex before "{N}." ("layers" or "h")
    fields: Callable[[dict, int], dict]  # config.json, layer -> MHAConfig fields
    tensors: Callable[[dict, dict], dict]  # (config fields, {name: tensor}) -> our state dict
    layer_count: str = "num_hidden_layers"


def _rope(cfg: dict, partial_key: str = "partial_rotary_factor", partial_default: float = 1.0
          ) -> dict:
    """Rotary fields from 5.x rope_parameters or 4.x rope_theta / rope_scaling; an omitted key
    takes transformers' default for the model type."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    theta = params.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0)))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    extra = {k: v for k, v in {**scaling, **params}.items()
             if k not in ("rope_theta", "rope_type", "type", "partial_rotary_factor")}
    partial = params.get("partial_rotary_factor", cfg.get(partial_key, partial_default))
    return {"rope_theta": float(theta), "partial": float(partial),
            "rope_scaling": None if kind == "default" else {"rope_type": kind, **extra}}


def _window(cfg: dict, layer: int) -> Optional[int]:
    """The layer's sliding window: 5.x layer_types, else Qwen2's use_sliding_window rule, else
    Mistral's sliding_window (transformers' defaults where a key is omitted: Mistral 4096,
    Qwen2 max_window_layers 28)."""
    kind = cfg["model_type"]
    window = cfg.get("sliding_window", 4096 if kind in ("mistral", "qwen2") else None)
    if "layer_types" in cfg:
        types = cfg["layer_types"]
        if not isinstance(types, list) or len(types) <= layer:
            raise UsageError(f"config.json: layer_types has no entry for layer {layer}")
        return window if types[layer] == "sliding_attention" else None
    if kind == "qwen2":
        on = cfg.get("use_sliding_window", False) and layer >= cfg.get("max_window_layers", 28)
        return window if on else None
    return window if kind == "mistral" else None


def _llama_fields(cfg: dict, layer: int) -> dict:
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = _rope(cfg)
    bias = {"llama": cfg.get("attention_bias", False), "mistral": False, "qwen2": True}
    qkv_bias = bias[cfg["model_type"]]
    return {"dim": cfg["hidden_size"], "d_in": cfg["hidden_size"], "heads": heads,
            "head_dim": head_dim, "causal": True,
            "kv_heads": cfg.get("num_key_value_heads") or heads, "qkv_bias": qkv_bias,
            "out_bias": qkv_bias and cfg["model_type"] == "llama", "rotary": "half",
            "rotary_dim": int(head_dim * rope["partial"]), "rope_theta": rope["rope_theta"],
            "rope_scaling": rope["rope_scaling"], "sliding_window": _window(cfg, layer),
            "max_seq_len": cfg.get("max_position_embeddings", 1024)}


def _llama_tensors(fields: dict, t: dict) -> dict:
    names = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value", "o_proj": "out_proj"}
    return {f"{names[k.split('.')[0]]}.{k.split('.')[1]}": v for k, v in t.items()}


def _neox_fields(cfg: dict, layer: int) -> dict:
    heads = cfg["num_attention_heads"]
    head_dim = cfg["hidden_size"] // heads
    rope = _rope(cfg, partial_key="rotary_pct", partial_default=0.25)
    bias = cfg.get("attention_bias", True)
    return {"dim": cfg["hidden_size"], "d_in": cfg["hidden_size"], "heads": heads,
            "head_dim": head_dim, "kv_heads": heads, "causal": True, "sliding_window": None,
            "qkv_bias": bias, "out_bias": bias,
            "rotary": "half", "rotary_dim": int(head_dim * rope["partial"]),
            "rope_theta": rope["rope_theta"], "rope_scaling": rope["rope_scaling"],
            "max_seq_len": cfg.get("max_position_embeddings", 1024)}


def _neox_tensors(fields: dict, t: dict) -> dict:
    """query_key_value holds, per head, [q_h; k_h; v_h] rows: (heads, 3, H, in) -> q | k | v."""
    heads, head_dim = fields["heads"], fields["dim"] // fields["heads"]
    out = {"out_proj.weight": t["dense.weight"]}
    if "dense.bias" in t:
        out["out_proj.bias"] = t["dense.bias"]
    for part in ("weight", "bias"):
        if f"query_key_value.{part}" not in t:
            continue
        qkv = t[f"query_key_value.{part}"]
        per_head = qkv.reshape(heads, 3, head_dim, *qkv.shape[1:])  # (N, 3, H[, in])
        for i, name in enumerate(("W_query", "W_key", "W_value")):
            out[f"{name}.{part}"] = per_head[:, i].reshape(heads * head_dim, *qkv.shape[1:])
    return out


def _gpt2_fields(cfg: dict, layer: int) -> dict:
    if not cfg.get("scale_attn_weights", True) or cfg.get("scale_attn_by_inverse_layer_idx"):
        raise UsageError("this GPT-2 checkpoint scales attention differently "
                         "(scale_attn_weights / scale_attn_by_inverse_layer_idx): not supported")
    heads = cfg.get("n_head", 12)
    dim = cfg.get("n_embd", 768)
    return {"dim": dim, "d_in": dim, "heads": heads, "head_dim": dim // heads, "kv_heads": heads,
            "causal": True, "sliding_window": None, "rotary": "none", "qkv_bias": True,
            "out_bias": True, "max_seq_len": cfg.get("n_positions", 1024)}


def _gpt2_tensors(fields: dict, t: dict) -> dict:
    """Conv1D stores [in, out]: transposed to nn.Linear's [out, in]."""
    return {k: (v.t().contiguous() if k.endswith("weight") else v) for k, v in t.items()}


FAMILIES = (
    Family(("llama", "mistral", "qwen2"), "split",
           r"self_attn\.((?:q|k|v|o)_proj\.(?:weight|bias))", r"layers", _llama_fields,
           _llama_tensors),
    Family(("gpt_neox",), "split", r"attention\.((?:query_key_value|dense)\.(?:weight|bias))",
           r"layers", _neox_fields, _neox_tensors),
    Family(("gpt2",), "fused", r"attn\.((?:c_attn|c_proj)\.(?:weight|bias))", r"h",
           _gpt2_fields, _gpt2_tensors, layer_count="n_layer"),
)
SUPPORTED = tuple(t for f in FAMILIES for t in f.model_types)


def hf_config_path(path: str | Path) -> Optional[Path]:
    """config.json of a Hugging Face checkpoint folder, or beside a weights file (one that names
    a model_type; an mha-export artifact's own config.json does not); else None."""
    path = Path(path)
    cfg = path / "config.json" if path.is_dir() else path.with_name("config.json")
    try:
        return cfg if "model_type" in json.loads(cfg.read_text()) else None
    except (OSError, ValueError, TypeError):
        return cfg if path.is_dir() and cfg.is_file() else None


def _read_config(cfg_path: Path) -> dict:
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise UsageError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{cfg_path}: expected a JSON object")
    kind = cfg.get("model_type")
    if kind not in SUPPORTED:
        raise UsageError(f"{cfg_path}: unsupported model type {kind!r} (supported: "
                         f"{', '.join(SUPPORTED)})")
    return cfg


def _weights_file(path: Path) -> Path:
    if path.is_file():
        return path
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
    raise UsageError(f"{path}: no weights found (expected one of {', '.join(WEIGHT_FILES)})")


def _layer_tensors(file: Path, pattern: re.Pattern) -> dict[str, Tensor]:
    """Only the tensors whose names match: lazily from safetensors (only the shards that hold
    them), memory-mapped from .bin."""
    from safetensors import safe_open
    if file.name.endswith(".index.json"):
        weight_map = json.loads(file.read_text())["weight_map"]
        shards: dict[str, list[str]] = {}
        for key, shard in weight_map.items():
            if pattern.search(key):
                shards.setdefault(shard, []).append(key)
        out = {}
        for shard, keys in shards.items():
            with safe_open(str(file.parent / shard), "pt") as f:
                out.update({k: f.get_tensor(k) for k in keys})
        return out
    if file.suffix == ".safetensors":
        with safe_open(str(file), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys() if pattern.search(k)}
    # memory-mapped where the format allows it (the zip format torch.save writes since 1.6)
    state = torch.load(str(file), map_location="cpu", weights_only=True,
                       mmap=zipfile.is_zipfile(file))
    if not isinstance(state, dict):
        raise ValueError("expected a state dict")
    return {k: v for k, v in state.items() if pattern.search(k)}


def read_layer(path: str | Path, layer: Optional[int]) -> tuple[dict, dict, dict]:
    """(MHAConfig fields, state dict in their layout, source description) of one layer."""
    path = Path(path)
    cfg_path = hf_config_path(path)
    cfg = _read_config(cfg_path)
    family = next(f for f in FAMILIES if cfg["model_type"] in f.model_types)
    count = cfg.get(family.layer_count)
    if not isinstance(count, int) or count <= 0:
        raise UsageError(f"{cfg_path}: no layer count ({family.layer_count})")
    if layer is None:
        raise UsageError(f"{path} is a {cfg['model_type']} checkpoint with {count} layers: "
                         "pick one with --layer N")
    if not 0 <= layer < (count or 0):
        raise UsageError(f"--layer {layer} is out of range: the checkpoint has {count} layers "
                         f"(0-{(count or 1) - 1})")
    try:
        fields = {**family.fields(cfg, layer), "layout": family.layout}
    except (KeyError, TypeError, ZeroDivisionError) as e:
        raise UsageError(f"{cfg_path}: missing or malformed attention setting ({e})") from None
    fields["max_seq_len"] = min(fields["max_seq_len"], CHECKED_CONTEXT)
    pattern = re.compile(rf"(^|\.){family.layer_root}\.{layer}\.{family.keys}$")
    file = _weights_file(path)
    try:
        found = _layer_tensors(file, pattern)
    except UsageError:
        raise
    except Exception as e:  # corrupt safetensors header, truncated pickle, ...
        text = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UsageError(f"{file}: not a readable checkpoint ({text})") from None
    if not found:
        raise UsageError(f"{path}: no attention tensors for layer {layer}")
    tensors = {pattern.search(k).group(2): v.float() for k, v in found.items()}
    source = {"kind": "huggingface", "path": str(path), "model_type": cfg["model_type"],
              "layer": layer, "max_position_embeddings": cfg.get(
                  "max_position_embeddings", cfg.get("n_positions"))}
    return fields, family.tensors(fields, tensors), source


def merge_fields(from_checkpoint: dict, given: dict[str, Any]) -> dict:
    """The checkpoint's fields; a given field that contradicts one is an error. max_seq_len (the
    checked context length) and layout (a conversion target) may be chosen freely."""
    free = {"max_seq_len", "layout", "dropout"}
    for name, value in given.items():
        if name in free:
            continue
        if name not in from_checkpoint:
            raise UsageError(f"--{name.replace('_', '-')} cannot be set for a checkpoint layer: "
                             "config.json decides it")
        if from_checkpoint[name] != value:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {value} contradicts the checkpoint's config.json "
                             f"({name} = {from_checkpoint[name]})")
    return {**from_checkpoint, **given}
