"""DeepSeek-V4's eager layer of a checkpoint folder's layer, as every stage reads it (the
family record, weights/families/deepseek_v4.py)."""
from __future__ import annotations

from pathlib import Path

from torch import nn

from mha_export.weights.source import load_source


def read_layer(folder: str | Path, layer: int) -> nn.Module:
    return load_source(weights=folder, layer=layer).module
