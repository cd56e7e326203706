"""Load attention weights from a file in any layout's key names, with any prefix.

Accepted: torch state dicts (.pt/.pth/.bin, read with ``weights_only=True``: plain tensors only,
never arbitrary pickled code) and .safetensors. Keys may carry a prefix (``attn.``,
``h.3.attn.``, ``transformer.h.3.attn.``); a full GPT-2 checkpoint needs ``layer`` to pick one
block, and its Conv1D weights ([in, out]) are transposed to nn.Linear orientation.
"""
from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import torch
from torch import Tensor

from ..config import MHAConfig
from ..errors import UsageError
from ..kinds.registry import ANCHORS, build_module, convert, kind_of
from ..layer.layouts import AttentionBase

# Buffers that checkpoints carry and the module rebuilds from the runtime shape.
IGNORED_BUFFER = re.compile(r"(^|\.)(mask|masked_bias)$|^bias$")
_GPT2_BLOCK = re.compile(r"(^|\.)h\.(\d+)\.attn\.$")


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Tensors of a .safetensors or torch state-dict file (a clear UsageError otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise UsageError(f"{path}: not a readable safetensors file ({_first_line(e)})"
                             ) from None
    if path.suffix not in (".pt", ".pth", ".bin"):
        raise UsageError(f"{path}: unsupported weights format "
                         "(use .safetensors, .pt, .pth or .bin)")
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if found:
            raise UsageError(f"{path}: refused to unpickle: the file holds more than plain "
                             f"tensors (it references {found.group(1)})") from None
        raise UsageError(f"{path}: not a readable torch state dict (corrupt pickle)") from None
    except Exception as e:  # corrupt files: torch raises RuntimeError / EOFError / zipfile errors
        raise UsageError(f"{path}: not a readable torch state dict ({_first_line(e)})") from None
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise UsageError(f"{path}: expected a mapping of names to tensors (a state dict)")
    return dict(obj)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def detect_layout(keys: list[str]) -> tuple[str, list[str]]:
    """(layout, prefixes) of the first layout whose anchor key is found."""
    for layout, anchor in ANCHORS.items():  # each kind's layouts' keys
        prefixes = sorted({k[: -len(anchor)] for k in keys if k.endswith(anchor)
                           and (k == anchor or k[: -len(anchor)].endswith("."))})
        if layout == "single":  # heads.{i}.W_query.weight also ends with W_query.weight
            prefixes = [p for p in prefixes if not re.search(r"(^|\.)heads\.\d+\.$", p)]
        if prefixes:
            return layout, prefixes
    raise UsageError("no attention weights found: expected keys like "
                     + ", ".join(ANCHORS.values()))


def select_prefix(prefixes: list[str], layer: Optional[int]) -> str:
    if layer is not None:
        hits = [p for p in prefixes if re.search(rf"(^|\.){layer}\.", p)]
        if not hits:
            raise UsageError(f"no attention weights for layer {layer} "
                             f"(found prefixes: {', '.join(repr(p) for p in prefixes)})")
        if len(hits) > 1:
            raise UsageError(f"layer {layer} is ambiguous: {', '.join(repr(p) for p in hits)}")
        return hits[0]
    if len(prefixes) > 1:
        shown = ", ".join(repr(p) for p in prefixes[:4]) + (" ..." if len(prefixes) > 4 else "")
        raise UsageError(f"the file holds {len(prefixes)} attention blocks ({shown}): "
                         "pick one with --layer N")
    return prefixes[0]


@dataclass(frozen=True)
class Block:
    """One attention block's tensors from a plain file: the file's layout, the key prefix that
    was stripped, and the tensors (buffers the module rebuilds left out)."""

    layout: str
    prefix: str
    tensors: dict[str, Tensor]


def read_block(path: str | Path, layer: Optional[int] = None) -> Block:
    """The file read once: the block of ``layer`` (or the only one)."""
    state = read_state_dict(path)
    layout, prefixes = detect_layout(list(state))
    prefix = select_prefix(prefixes, layer)
    tensors = {k[len(prefix):]: v for k, v in state.items()
               if k.startswith(prefix) and not IGNORED_BUFFER.search(k[len(prefix):])}
    return Block(layout, prefix, tensors)


def module_from_block(config: MHAConfig, block: Block) -> AttentionBase:
    """An eval-mode module of config.layout holding the block's weights (converted if needed)."""
    tensors = block.tensors
    gpt2_prefix = bool(_GPT2_BLOCK.search(block.prefix))
    if block.layout == "fused" and _is_conv1d(tensors, config, gpt2_prefix):
        tensors = {k: (v.t().contiguous() if k in ("c_attn.weight", "c_proj.weight") else v)
                   for k, v in tensors.items()}
    # the file's names in a layout of config's kind; else read as config's own layout (a
    # KV-shared layer's file holds the split layout's names less its keys'; strict loading
    # refuses what does not fit)
    layout = block.layout if block.layout in kind_of(config).layouts else config.layout
    try:
        source_config = config.replace(layout=layout)
    except UsageError as e:
        raise UsageError(f"weights are in layout {block.layout!r}, which does not fit: {e}"
                         ) from None
    module = build_module(source_config)
    load_strict(module, tensors, block.prefix)
    return module if layout == config.layout else convert(module, config.layout)


def load_module(config: MHAConfig, path: str | Path, layer: Optional[int] = None
                ) -> AttentionBase:
    """An eval-mode module of config.layout holding the file's weights (converted if needed)."""
    return module_from_block(config, read_block(path, layer))


def _is_conv1d(t: dict[str, Tensor], config: MHAConfig, gpt2_prefix: bool) -> bool:
    """GPT-2's Conv1D stores weights as [in, out]. Decide from c_attn's shape; only when that is
    square-ambiguous (d_in == q + k + v width) trust a GPT-2 block prefix (h.N.attn.)."""
    w = t.get("c_attn.weight")
    width = config.inner + 2 * config.kv_inner
    linear, conv1d = (width, config.d_in), (config.d_in, width)
    if w is None or linear == conv1d:
        return gpt2_prefix
    return tuple(w.shape) == conv1d


def load_strict(module: AttentionBase, tensors: Mapping[str, Tensor], prefix: str = "") -> None:
    """load_state_dict with errors that name the tensor (missing, unexpected, wrong shape)."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    if missing:
        hint = " (match the file with --qkv-bias / --no-out-bias)" if any(
            k.endswith("bias") for k in missing) else ""
        raise UsageError(f"missing tensor {prefix}{missing[0]}" + (
            f" (+{len(missing) - 1} more)" if len(missing) > 1 else "") + hint)
    if unexpected:
        hint = " (the file has biases: pass --qkv-bias)" if any(
            k.endswith("bias") for k in unexpected) else ""
        raise UsageError(f"unexpected tensor {prefix}{unexpected[0]}" + (
            f" (+{len(unexpected) - 1} more)" if len(unexpected) > 1 else "") + hint)
    for k, ref in expected.items():
        got = tensors[k]
        if tuple(got.shape) != tuple(ref.shape):
            raise UsageError(f"tensor {prefix}{k} has shape {list(got.shape)}, "
                             f"expected {list(ref.shape)} for this config")
        if not got.is_floating_point():
            raise UsageError(f"tensor {prefix}{k} has dtype {got.dtype}, expected a float tensor")
    module.load_state_dict({k: v.float() for k, v in tensors.items()})


def save_weights(module: AttentionBase, path: str | Path) -> None:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path))
