"""Hugging Face checkpoints: one layer's attention, its config read from config.json.

    --weights FOLDER (config.json + model.safetensors | model.safetensors.index.json (sharded) |
    pytorch_model.bin), or one weights file with its config.json beside it; --layer N (--layer
    N.M: module M of layer N, where the model type's layers hold several: LongCat-Flash's).

What varies by model type is a record in ``families`` (tensor names, config.json fields and their
defaults, conversion to our layout); this module reads: it finds config.json, picks the record
for its model_type, and reads only the chosen layer's tensors — safetensors files are opened
lazily, sharded checkpoints open only the shards that hold them, and .bin files are
memory-mapped.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Optional

import torch
from torch import Tensor

from ..address import Address, split_address
from ..config import SECTIONS
from ..errors import NotAttentionLayer, UsageError
from .families import FAMILIES, INDEXED, NOT_YET, Family, Settings, supported_types
from .quantized import Decoded, QuantFormat, checkpoint_format

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# The context a checkpoint layer's export checks by default (max_seq_len): the checkpoint's
# max_position_embeddings, at most this (131072 for Llama 3 would be a sweep no machine runs);
# --max-seq-len sets it, and longer inputs work either way.
CHECKED_CONTEXT = 1024
FLOAT8 = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                      "float8_e5m2fnuz") if hasattr(torch, n)}


def _config_file(path: str | Path) -> Path:
    """Where a checkpoint's config.json is: in its folder, or beside its weights file."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path.with_name("config.json")


def hf_config_path(path: str | Path) -> Optional[Path]:
    """config.json of a Hugging Face checkpoint folder, or beside a weights file (one that names
    a model_type; an mha-export artifact's own config.json does not); else None."""
    cfg = _config_file(path)
    try:
        return cfg if "model_type" in json.loads(cfg.read_text()) else None
    except (OSError, ValueError, TypeError):
        return cfg if Path(path).is_dir() and cfg.is_file() else None


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint's config.json says, read once: its family, its text model's config,
    and its quantization (``fmt`` None: a float checkpoint)."""

    cfg_path: Path
    family: Family
    cfg: dict
    fmt: Optional[QuantFormat]
    qcfg: dict


def _read_config(path: str | Path) -> Checkpoint:
    """The checkpoint's config.json: the family of its model_type, and its text model's config:
    config.json, or the part a multimodal wrapper nests (text_config; omitted: all of
    transformers' defaults)."""
    cfg_path = _config_file(path)
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise UsageError(f"{cfg_path}: not valid JSON ({e})") from None
    except OSError as e:
        raise UsageError(f"{cfg_path}: cannot be read ({e.strerror})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{cfg_path}: expected a JSON object")
    kind = cfg.get("model_type")
    family = FAMILIES.get(kind) if isinstance(kind, str) else None
    if family is None and kind in NOT_YET:
        raise UsageError(f"{cfg_path}: model type {kind!r} is not read yet: its attention "
                         f"needs {NOT_YET[kind]}")
    if family is None:
        raise UsageError(f"{cfg_path}: unsupported model type {kind!r} (supported: "
                         f"{supported_types()})")
    qcfg = cfg.get("quantization_config") or {}
    fmt = checkpoint_format(qcfg, str(cfg_path))  # refusals first
    if family.nested is None:
        return Checkpoint(cfg_path, family, cfg, fmt, qcfg)
    text = cfg.get(family.nested)
    if not isinstance(text, (dict, type(None))):
        raise UsageError(f"{cfg_path}: {family.nested} must be a JSON object")
    return Checkpoint(cfg_path, family, text or {}, fmt, qcfg)


def quantization(cfg_path: Path) -> tuple[Optional[QuantFormat], dict]:
    """The checkpoint's quantization format (None: a float checkpoint) and its config."""
    qcfg = json.loads(cfg_path.read_text()).get("quantization_config") or {}
    return checkpoint_format(qcfg, str(cfg_path)), qcfg


def _layer_pattern(family: Family, layer: Address, parts: tuple[str, ...] = ()) -> re.Pattern:
    """Names of the layer's attention tensors after the family's prefix (by default any), e.g.
    model.layers.2.self_attn.q_proj.weight (LongCat-Flash's layer 2.1:
    model.layers.2.self_attn.1.q_b_proj.weight): groups "module" (the checkpoint's) and "part"
    (weight or bias, or a quantization format's ``parts``; none for a bare parameter such as
    gpt-oss's self_attn.sinks)."""
    index, module = split_address(layer)
    attention = re.escape(family.attention.format(layer=index, module=module))
    modules = "|".join(re.escape(m[:-len(INDEXED)]) + r"\.\d+" if m.endswith(INDEXED)
                       else re.escape(m) for m in family.tensors)
    names = "|".join(map(re.escape, sorted({"weight", "bias", *parts}, key=len, reverse=True)))
    return re.compile(rf"{family.prefix}{attention}\.(?P<module>{modules})"
                      rf"(?:\.(?P<part>{names}))?$")


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


def layer_fields(cfg_path: Path, family: Family, cfg: dict, layer: Address) -> dict:
    """MHAConfig fields of the layer (of its decoder layer: the modules of one share them): the
    family's, its layout (a layer's own where its fields say: a KV-shared layer's), and the
    checked context."""
    settings = Settings(cfg, family.defaults)
    try:
        return {"layout": family.layout, **family.fields(settings, split_address(layer)[0]),
                "max_seq_len": min(settings.get(family.context, CHECKED_CONTEXT),
                                   CHECKED_CONTEXT)}
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise UsageError(f"{cfg_path}: missing or malformed attention setting ({e})") from None


Modules = dict[str, tuple[str, dict[str, Tensor]]]  # checkpoint module -> (full name, parts)


def _layer_modules(path: Path, family: Family, layer: Address,
                   fmt: Optional[QuantFormat]) -> Modules:
    """The layer's attention tensors grouped by checkpoint module: {"q_proj": (its full name,
    {"weight": ..., "bias": ...} or a quantization format's parts)}."""
    pattern = _layer_pattern(family, layer, fmt.parts if fmt else ())
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
    modules: Modules = {}
    for name, tensor in found.items():
        match = pattern.search(name)
        part = match["part"] or ""
        full = name[: len(name) - len(part) - 1] if part else name
        modules.setdefault(match["module"], (full, {}))[1][part] = tensor
    return modules


class DecodedModule(NamedTuple):
    module: str  # the checkpoint's module name (in a layer: "q_proj")
    full: str  # its full name
    weight: Optional[Decoded]  # its weight as its format decodes it; None: stored as floats
    parts: dict[str, Tensor]  # its float tensors by part (a quantized module's: its bias)


def _decoded_modules(modules: Modules, fmt: Optional[QuantFormat],
                    qcfg: dict) -> Iterator[DecodedModule]:
    """Each module, a quantized one's weight decoded by its format (``fmt`` None: a float
    checkpoint)."""
    for module, (full, parts) in modules.items():
        if fmt is None or not any(marker in parts for marker in fmt.markers):
            yield DecodedModule(module, full, None, parts)
            continue
        float_parts = {p: t for p, t in parts.items() if p == "bias"}
        yield DecodedModule(module, full, fmt.decode(parts, qcfg, full), float_parts)


def _read_tensors(path: Path, ckpt: Checkpoint, layer: Address) -> dict[str, Tensor]:
    """The layer's attention tensors, float32, under our module names: a quantized module's
    weight as its format's own dequantization."""
    named = {}
    modules = _layer_modules(path, ckpt.family, layer, ckpt.fmt)
    for module, full, weight, parts in _decoded_modules(modules, ckpt.fmt, ckpt.qcfg):
        ours = _our_name(ckpt.family, module)
        if weight is not None:
            named[ours + ".weight"] = torch.from_numpy(weight.dequantized())
        for part, tensor in parts.items():
            if tensor.dtype in FLOAT8:
                raise UsageError(f"{full}.{part} is {tensor.dtype} (a quantized checkpoint's "
                                 "codes) without a quantization_config that reads it")
            if part in ("", "weight", "bias"):
                named[ours + (f".{part}" if part else "")] = tensor.float()
    return named


def _our_name(family: Family, module: str) -> str:
    """Our name of a checkpoint module: the record's; an indexed one's with its index."""
    if module in family.tensors:
        return family.tensors[module]
    stem, index = module.rsplit(".", 1)
    return f"{family.tensors[stem + INDEXED]}.{index}"


def checkpoint_activations(path: str | Path) -> str:
    """The activation quantization a quantized folder's scheme applies at run time, in words
    ("" if none): what an export of its weights does not reproduce."""
    fmt, qcfg = quantization(_config_file(path))
    return fmt.activations(qcfg) if fmt else ""


def kept_weights(path: str | Path, layer: Address) -> tuple[str, dict[str, Decoded]]:
    """(the format's name, our module weight name -> the decoded weight) of a quantized
    checkpoint's layer: what ``--quantize source`` keeps. Modules the checkpoint stores as
    floats are not among them."""
    path = Path(path)
    ckpt = _read_config(path)
    if ckpt.fmt is None:
        raise UsageError(f"{path} is not a quantized checkpoint (no quantization_config): "
                         "--quantize source has nothing to keep")
    modules = _layer_modules(path, ckpt.family, layer, ckpt.fmt)
    return ckpt.fmt.name, {_our_name(ckpt.family, m.module) + ".weight": m.weight
                           for m in _decoded_modules(modules, ckpt.fmt, ckpt.qcfg)
                           if m.weight is not None}


def dequantized_state(path: str | Path) -> tuple[str, dict[str, Tensor]]:
    """(the format's name, every tensor of a quantized checkpoint folder) with each quantized
    module's weight its format's own dequantization (float32): the float model the folder
    stores, for loaders that cannot read the format on this machine (transformers needs
    GPTQModel for GPTQ and AWQ, and refuses FP8 blocks that do not divide the weight)."""
    path = Path(path)
    fmt, qcfg = quantization(_config_file(path))
    if fmt is None:
        raise UsageError(f"{path} is not a quantized checkpoint (no quantization_config)")
    tensors = _layer_tensors(_weights_file(path), re.compile(""))
    parts = re.compile(rf"^(?P<module>.+)\.(?P<part>{'|'.join(map(re.escape, fmt.parts))})$")
    modules: Modules = {}
    state = {}
    for name, tensor in tensors.items():
        match = parts.match(name)
        if match:
            modules.setdefault(match["module"], (match["module"], {}))[1][match["part"]] = tensor
        else:
            state[name] = tensor
    for module, _, weight, found in _decoded_modules(modules, fmt, qcfg):
        if weight is not None:
            state[f"{module}.weight"] = torch.from_numpy(weight.dequantized())
        state.update({f"{module}.{part}": t for part, t in found.items()})
    return fmt.name, state


def require_layer(layer: Optional[int], count: int, what: str, holder: str,
                  form: str = "N") -> None:
    """--layer given and in range: ``what`` names the checkpoint ("x is a llama checkpoint"),
    ``holder`` what has the layers ("checkpoint", "file"), ``form`` the address it takes."""
    if layer is None:
        raise UsageError(f"{what} with {count} layers: pick one with --layer {form}")
    if not 0 <= layer < count:
        raise UsageError(f"--layer {layer} is out of range: the {holder} has {count} layers "
                         f"(0-{count - 1})")


def _require_address(ckpt: Checkpoint, layer: Optional[Address], what: str) -> None:
    """--layer given, of the form the checkpoint's layers take (N, or N.M where they hold
    several attention modules: LongCat-Flash's), and in range."""
    kind, modules, count = ckpt.family.model_type, ckpt.family.modules, _layer_count(ckpt)
    if layer is None or modules == 1:
        if isinstance(layer, str):
            raise UsageError(f"--layer {layer}: each layer of a {kind} checkpoint holds one "
                             f"attention module: --layer {split_address(layer)[0]}")
        return require_layer(layer, count, what, "checkpoint", "N" if modules == 1 else "N.M")
    index, module = split_address(layer)
    if module is None:
        raise UsageError(f"--layer {layer}: each layer of a {kind} checkpoint holds {modules} "
                         f"attention modules: --layer {layer}.0 to {layer}.{modules - 1}")
    if module >= modules:
        raise UsageError(f"--layer {layer}: layer {index}'s attention modules are {index}.0 to "
                         f"{index}.{modules - 1}")
    if index >= count:
        raise UsageError(f"--layer {layer} is out of range: the checkpoint has {count} layers "
                         f"(0.0-{count - 1}.{modules - 1})")


def read_layer(path: str | Path, layer: Optional[Address]) -> tuple[dict, dict, dict]:
    """(MHAConfig fields, state dict in their layout, source description) of one layer."""
    path = Path(path)
    ckpt = _read_config(path)
    family = ckpt.family
    _require_address(ckpt, layer, f"{path} is a {family.model_type} checkpoint")
    fields = layer_fields(ckpt.cfg_path, family, ckpt.cfg, layer)
    state = family.convert(fields, _read_tensors(path, ckpt, layer))
    source = {"kind": "huggingface", "path": str(path), "model_type": family.model_type,
              "layer": layer, "max_position_embeddings": ckpt.cfg.get(family.context)}
    if ckpt.fmt is not None:  # the weights are the format's own dequantization
        source["quantization"] = ckpt.fmt.name
    return fields, state, source


def non_attention_layers(path: str | Path, layers: Iterable[Address],
                         kv_shared: bool = False) -> dict[Address, str]:
    """Which of ``layers`` are not softmax attention (a hybrid model's linear-attention or
    convolution layers), by their type; with ``kv_shared``, the KV-shared layers too (what
    ``eval`` leaves to the model: their keys come from another layer) and those the family
    says eval leaves (a GLM-5 layer whose top-k later layers read); config.json alone."""
    ckpt = _read_config(path)
    kinds = {}
    for layer in layers:
        try:
            fields = layer_fields(ckpt.cfg_path, ckpt.family, ckpt.cfg, layer)
        except NotAttentionLayer as e:
            kinds[layer] = e.kind
            continue
        if kv_shared and fields.get("kv_shared"):
            source = fields["kv_shared"]["kv_shared_layer"]
            kinds[layer] = f"kv_shared_attention (layer {source}'s keys and values)"
        left = ckpt.family.eval_left(Settings(ckpt.cfg, ckpt.family.defaults),
                                     split_address(layer)[0]) if kv_shared else ""
        if left:
            kinds[layer] = left
    return kinds


def layer_count(path: str | Path) -> int:
    """How many decoder layers a checkpoint folder's config.json declares."""
    return _layer_count(_read_config(path))


def modules_per_layer(path: str | Path) -> int:
    """How many attention modules each of its decoder layers holds (LongCat-Flash: 2)."""
    return _read_config(path).family.modules


def _layer_count(ckpt: Checkpoint) -> int:
    family = ckpt.family  # the count as written: a guessed count would pick a wrong layer
    count = ckpt.cfg.get(family.layer_count)
    if not isinstance(count, int) or count <= 0:
        where = f"{family.nested}.{family.layer_count}" if family.nested else family.layer_count
        raise UsageError(f"{ckpt.cfg_path}: no layer count ({where})")
    return count


def merge_fields(from_checkpoint: dict, given: dict[str, Any]) -> dict:
    """The checkpoint's fields; a given field that contradicts one is an error. max_seq_len (the
    checked context length) and layout (a conversion target) may be chosen freely. The options
    of an attention kind's section (config.SECTIONS: MLA's) are compared one by one."""
    free = {"max_seq_len", "layout", "dropout"}
    checkpoint = _flat(from_checkpoint)
    for name, value in _flat(given).items():
        if name in free:
            continue
        flag = "--" + name.replace("_", "-")
        if name not in checkpoint:
            raise UsageError(f"{flag} cannot be set for a checkpoint layer: config.json decides "
                             "it")
        if checkpoint[name] != value:
            raise UsageError(f"{flag} {value} contradicts the checkpoint's config.json "
                             f"({name} = {checkpoint[name]})")
    return {**from_checkpoint, **{k: v for k, v in given.items() if k not in SECTIONS}}


def _flat(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields with each section's own spread among them."""
    spread = {k: v for k, v in fields.items() if k not in SECTIONS}
    for section in SECTIONS:
        spread.update(fields.get(section) or {})
    return spread
