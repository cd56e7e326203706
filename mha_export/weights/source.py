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

from ..address import Address, address_key, addresses, parse_address, split_address
from ..config import MHAConfig
from ..errors import UsageError
from ..kinds.registry import build_module, convert
from ..layer.layouts import AttentionBase
from .families.layer_types import why_left  # noqa: F401 (the fan-out's row text)
from .files import load_strict, module_from_block, read_block
from .gguf import gguf_layer_count, gguf_non_attention_layers, is_gguf, read_gguf_layer
from .huggingface import (hf_config_path, layer_count as hf_layer_count, merge_fields,
                          modules_per_layer, non_attention_layers as hf_non_attention,
                          read_layer)


@dataclass
class Source:
    config: MHAConfig
    module: AttentionBase  # eval mode, config.layout
    description: dict[str, Any]  # recorded in config.json "weights.source"


def load_source(config: Optional[MHAConfig] = None, weights: str | Path | None = None,
                layer: Optional[Address] = None, seed: int = 0,
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
    if isinstance(layer, str) and not (config is None and hf_config_path(weights)):
        raise UsageError(f"--layer {layer}: an N.M address picks one of a Hugging Face "
                         f"checkpoint layer's attention modules; {weights} takes --layer N")
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


Reader = Callable[[Any, Optional[Address]], tuple[dict, dict, dict]]  # read_layer's signature


def _checkpoint_layer(path: str | Path, layer: Optional[Address], fields: dict,
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


def checkpoint_modules(weights: str | Path) -> int:
    """How many attention modules each layer of a whole checkpoint holds (LongCat-Flash's 2,
    addressed N.M; a GGUF file's: one)."""
    return 1 if is_gguf(weights) else modules_per_layer(weights)


def non_attention_layers(weights: str | Path, layers: Iterable[Address],
                         kv_shared: bool = False) -> dict[Address, str]:
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


def select_layers(spec: str, count: int, flag: str = "--layers",
                  modules: int = 1) -> list[Address]:
    """``all``, ranges and indices (``0-3,7``) of a checkpoint's ``count`` layers, sorted: each
    layer's address, or, where layers hold several attention modules (``modules``), each
    module's ("N.M"; a layer or a range: all its modules; ``0,3.1``: 0.0, 0.1, 3.1)."""
    usage = (f"{flag}: expected all, A-B or comma-separated indices (0-3,7"
             + (", 3.1" if modules > 1 else "") + f"), got {spec!r}")
    if spec.strip() == "all":
        return addresses(range(count), modules)
    chosen: set[Address] = set()
    try:
        for part in (p.strip() for p in spec.split(",")):
            chosen.update(_chosen(part, count, modules, f"{flag} {spec}"))
    except ValueError:
        raise UsageError(usage) from None
    if not chosen:
        raise UsageError(usage)
    return sorted(chosen, key=address_key)


def _chosen(part: str, count: int, modules: int, what: str) -> list[Address]:
    """The addresses one part of a --layers list names: A, A-B or (modules > 1) A.M."""
    low, sep, high = part.partition("-")
    if not sep and "." in part:
        address = parse_address(part)
        layer, module = split_address(address)
        if modules == 1:
            raise UsageError(f"{what}: {part} picks a layer's attention module; the model's "
                             "layers hold one each")
        if module >= modules or layer >= count:
            raise UsageError(f"{what}: the model has {count} layers of {modules} attention "
                             f"modules (0.0-{count - 1}.{modules - 1})")
        return [address]
    first, last = int(low), int(high) if sep else int(low)
    if first > last:
        raise ValueError(part)
    if first < 0 or last >= count:  # before the range is built: 0-10**12 is no hang
        raise UsageError(f"{what}: the model has {count} layers (0-{count - 1})")
    return addresses(range(first, last + 1), modules)
