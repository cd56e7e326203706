"""One loading path for export, check and bench: the eager module to export or to check against,
with its config and where its weights came from.

    no weights          -> random weights (seed)
    --weights FILE      -> a plain state dict in any layout (files.py), read once
    --weights FOLDER    -> a Hugging Face checkpoint's layer (huggingface.py, families.py)
    --weights FILE.gguf -> a GGUF file's layer (gguf.py, through the same families)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..config import MHAConfig
from ..errors import UsageError
from ..kinds.registry import build_module, convert
from ..layer.layouts import AttentionBase
from .files import load_strict, module_from_block, read_block
from .gguf import is_gguf, read_gguf_layer
from .huggingface import hf_config_path, merge_fields, read_layer


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
    config = MHAConfig.from_dict(merge_fields(found, fields))
    module = build_module(config.replace(layout=found["layout"]))
    load_strict(module, state, f"layer {layer}: ")
    if config.layout != found["layout"]:
        module = convert(module, config.layout)
    return Source(config, module, description)
