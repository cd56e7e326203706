"""One loading path for export, check and bench: the eager module to export or to check against,
with its config and where its weights came from.

    no weights          -> random weights (seed)
    --weights FILE      -> a plain state dict in any layout (files.py), read once
    --weights FOLDER    -> a Hugging Face checkpoint's layer (huggingface.py, families/)
    --weights FILE.gguf -> a GGUF file's layer (gguf.py, through the same families)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..config import MHAConfig
from ..errors import UsageError
from ..kinds.registry import build_module, convert
from ..layer.layouts import AttentionBase
from .families.layer_types import why_left  # noqa: F401 (the fan-out's row text)
from .files import load_strict, module_from_block, read_block
from .gguf import gguf_layer_count, gguf_non_attention_layers, is_gguf, read_gguf_layer
from .huggingface import (hf_config_path, layer_count as hf_layer_count, merge_fields,
                          non_attention_layers as hf_non_attention, read_layer)


@dataclass
class Source:
    config: MHAConfig
    module: AttentionBase  # eval mode, config.layout
    description: dict[str, Any]  # recorded in config.json "weights.source"


def load_source(config: Optional[MHAConfig] = None, weights: str | Path | None = None,
                layer: Optional[int] = None, seed: int = 0,
                fields: Optional[dict[str, Any]] = None) -> Source:
    """The module and its config: ``config`` as given, or built here (the only place) from
    CLI-style ``fields``, a checkpoint's config.json, or the weights file's layout."""
    fields = {k: v for k, v in (fields or {}).items() if not (k == "layout" and v is None)}
    if config is not None and fields:
        raise UsageError("pass either a config or config fields, not both")
    if weights is None:
        if layer is not None:
            raise UsageError("--layer needs --weights")
        config = config or MHAConfig.from_dict(fields)
        return Source(config, build_module(config, seed=seed), {"kind": "random", "seed": seed})
    if is_gguf(weights):
        if config is not None:
            raise UsageError(f"{weights}: a GGUF file's layer takes its config from the file: "
                             "pass config fields, not an MHAConfig")
        return _checkpoint_layer(weights, layer, fields, read_gguf_layer)
    if config is None and hf_config_path(weights):
        return _checkpoint_layer(weights, layer, fields)
    if Path(weights).is_dir():
        raise UsageError(f"--weights {weights}: a folder without a Hugging Face config.json "
                         "naming its model_type (a checkpoint folder holds config.json and its "
                         "weights; a single weights file is given by its path)")
    block = read_block(weights, layer)
    config = config or MHAConfig.from_dict({"layout": block.layout, **fields})
    return Source(config, module_from_block(config, block),
                  {"kind": "file", "file": str(weights), "layer": layer})


Reader = Callable[[Any, Optional[int]], tuple[dict, dict, dict]]  # read_layer's signature


def _checkpoint_layer(path: str | Path, layer: Optional[int], fields: dict,
                      read: Reader = read_layer) -> Source:
    """One layer of a Hugging Face checkpoint (or a GGUF file): its config from config.json
    (given fields must agree), its weights in the checkpoint's layout, converted to the layout
    asked for."""
    found, state, description = read(path, layer)
    description = {**description, "layout": found["layout"]}  # the layout it stores
    config = MHAConfig.from_dict(merge_fields(found, fields))
    module = build_module(config.replace(layout=found["layout"]))
    load_strict(module, state, f"layer {layer}: ")
    if config.layout != found["layout"]:
        module = convert(module, config.layout)
    return Source(config, module, description)


def checkpoint_layers(weights: str | Path) -> int:
    """How many layers a whole checkpoint has (a Hugging Face folder or a .gguf file)."""
    if is_gguf(weights):
        return gguf_layer_count(weights)
    if hf_config_path(weights):
        return hf_layer_count(weights)
    raise UsageError(f"{weights}: every layer of a checkpoint needs a Hugging Face checkpoint "
                     "folder or a .gguf file")


def non_attention_layers(weights: str | Path, layers: Iterable[int],
                         kv_shared: bool = False) -> dict[int, str]:
    """Which of a checkpoint's ``layers`` are not softmax attention, by type (a hybrid
    model's linear_attention, conv, ... layers: left to the model); with ``kv_shared``, the
    KV-shared layers too (a GGUF file's read have none)."""
    if is_gguf(weights):
        return gguf_non_attention_layers(weights, layers)
    return hf_non_attention(weights, layers, kv_shared)


def weights_version(weights: str | Path | None) -> Any:
    """A checkpoint's identity for reusing what was made from it (as make does): each file's
    path, size and mtime (a folder: its config.json and weight files). Hashing a 140 GB
    checkpoint would cost minutes."""
    if weights is None:
        return None
    path = Path(weights).resolve()
    if path.is_dir():
        return [weights_version(f) for f in sorted(path.iterdir())
                if f.suffix in (".json", ".safetensors", ".bin", ".gguf")]
    if not path.is_file():
        return str(path)
    stat = path.stat()
    return [str(path), stat.st_size, stat.st_mtime_ns]


def select_layers(spec: str, count: int, flag: str = "--layers") -> list[int]:
    """``all``, ranges and indices (``0-3,7``) of a checkpoint's ``count`` layers, sorted."""
    if spec.strip() == "all":
        return list(range(count))
    chosen: set[int] = set()
    try:
        for part in (p.strip() for p in spec.split(",")):
            low, sep, high = part.partition("-")
            first, last = int(low), int(high) if sep else int(low)
            if first > last:
                raise ValueError(part)
            if first < 0 or last >= count:  # before the range is built: 0-10**12 is no hang
                raise UsageError(f"{flag} {spec}: the model has {count} layers "
                                 f"(0-{count - 1})")
            chosen.update(range(first, last + 1))
    except ValueError:
        raise UsageError(f"{flag}: expected all, A-B or comma-separated indices (0-3,7), "
                         f"got {spec!r}") from None
    if not chosen:
        raise UsageError(f"{flag}: expected all, A-B or comma-separated indices (0-3,7), "
                         f"got {spec!r}")
    return sorted(chosen)
