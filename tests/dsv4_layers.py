"""DeepSeek-V4's eager layer of a checkpoint folder's layer, as every stage reads it (the
family record, weights/families/deepseek_v4.py), and the queries whose indexer top-k is tied
(transformers' torch.topk picks among them in no specified order)."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn

from mha_export.kinds.dsv4 import compressed
from mha_export.weights.source import load_source


def read_layer(folder: str | Path, layer: int) -> nn.Module:
    return load_source(weights=folder, layer=layer).module


def boundary_tie(scores: Tensor, closed: Tensor, k: int) -> Tensor:
    """scores, closed (B, T, n) -> (B, T) bool: the k-th and (k + 1)-th largest closed scores
    are equal (which of the equal rows is kept: the tie-break's choice)."""
    if scores.size(-1) <= k:
        return torch.zeros(scores.shape[:2], dtype=torch.bool)
    ordered = scores.masked_fill(~closed, float("-inf")).sort(dim=-1, descending=True).values
    kth, after = ordered[..., k - 1], ordered[..., k]  # (B, T) each
    return (kth == after) & torch.isfinite(after)


def with_ties(layer: nn.Module, x: Tensor, *args: Any, **kwargs: Any) -> tuple[Any, Tensor]:
    """(the eager layer's outputs for (x, *args, **kwargs), (B, T) bool: the queries with a
    tie on their indexer's top-k boundary; none for a layer without an indexer)."""
    seen = []
    pick = compressed.top_rows

    def recorded(scores: Tensor, closed: Tensor, k: int) -> Tensor:
        seen.append(boundary_tie(scores, closed, k))
        return pick(scores, closed, k)
    with mock.patch.object(compressed, "top_rows", recorded), torch.no_grad():
        out = layer(x, *args, **kwargs)
    return out, seen[0] if seen else torch.zeros(x.shape[:2], dtype=torch.bool)
