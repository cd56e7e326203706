"""One DeepSeek-V4 sliding_attention layer read from a checkpoint folder (config.json and its
weights, one file or shards): the eager layer holding the layer's tensors. The tensors carry
DeepSeek's names on disk (``layers.L.attn.wq_a.weight``, ``attn.attn_sink``: what
``save_pretrained`` writes) or transformers' (``layers.L.self_attn.q_a_proj.weight``); both
are read."""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import Tensor

from ...errors import UsageError
from ...weights.huggingface import _layer_tensors, _weights_file
from .compressed import DSV4CompressedAttention
from .layer import DSV4SlidingAttention
from .names import DISK_NAMES, OUR_NAMES
from .settings import SLIDING, shape_from_config



def _config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise UsageError(f"{folder}: no config.json")
    cfg = json.loads(path.read_text())
    if cfg.get("model_type") != "deepseek_v4":
        raise UsageError(f"{folder}: model_type {cfg.get('model_type')!r} is not deepseek_v4")
    return cfg


def layer_tensors(folder: Path, layer: int, wanted: set[str]) -> dict[str, Tensor]:
    """The layer's attention tensors by the layer's names (``wanted``: all of them)."""
    disk = "|".join(re.escape(n) for n in DISK_NAMES)
    ours = "|".join(re.escape(n) for n in OUR_NAMES)
    pattern = re.compile(rf"(?:^|\.)layers\.{layer}\.(?:attn\.(?P<disk>{disk})|"
                         rf"self_attn\.(?P<ours>{ours}))$")
    found = {}
    for key, t in _layer_tensors(_weights_file(folder), pattern).items():
        match = pattern.search(key)
        name = match["ours"] or DISK_NAMES[match["disk"]]
        if name in wanted:
            found[name] = t
    missing = sorted(wanted - set(found))
    if missing:
        raise UsageError(f"{folder}: layer {layer}'s attention lacks {', '.join(missing)}")
    return found


def read_layer(folder: str | Path, layer: int, dtype: torch.dtype = torch.float32
               ) -> DSV4SlidingAttention:
    """The eager layer of a deepseek_v4 checkpoint's layer ``layer`` (a compressed layer's
    class, DSV4CompressedAttention, for a compressed layer type)."""
    folder = Path(folder)
    shape = shape_from_config(_config(folder), layer)
    layer_class = DSV4SlidingAttention if shape.layer_type == SLIDING else DSV4CompressedAttention
    module = layer_class(shape)
    expected = module.state_dict()
    tensors = layer_tensors(folder, layer, set(expected))
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise UsageError(f"{folder}: layer {layer}'s {name} is {tuple(t.shape)}, config.json "
                             f"says {tuple(expected[name].shape)}")
    module.load_state_dict({k: t.to(dtype) for k, t in tensors.items()})
    return module.to(dtype).eval()
