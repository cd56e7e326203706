"""QSA's settings (torch-free): ``BlockIndex``, the section MHAConfig nests (``MHAConfig.qsa``,
set: the layer is Qwen4-exp's indexed attention, layout "qsa").

    index query   index_qk_proj(x)[:, :Hi*Di] -> (B, T, Hi, Di) -> RMSNorm (1 + w) -> rotary
    index key     index_qk_proj(x)[:, Hi*Di:] -> (B, T, Di), one head, cached raw
    blocks        each row's visible keys, in order, in groups of compress_ratio (c): a block's
                  key is RMSNorm (1 + w) of its keys' mean, rotated at its first key's position
    score         I[t, n] = sum_h relu(q[t, h] . k[n]) / sqrt(Di), in float32
    selection     each query keeps the tokens of its top block_topk = budget / c complete
                  blocks and the tail (its visible keys after the last complete block)

The attention around it is Qwen3.5's gated attention (q/k norms, partial rotary, output gate).
Per token the cache holds Di more numbers: each value head's [value (Hv) | index key (Di)].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ...errors import UsageError, require_positive
from ...layer_option import refused_by
from ..section import ConfigOnlySection

NAME = "Qwen4-exp QSA (block top-k sparse attention)"
LAYOUT = "qsa"  # its one weight layout: the split layout's projections and the indexer
ROTARY = ("none", "half", "interleaved")  # config.ROTARY (config imports this module)


@dataclass(frozen=True)
class BlockIndex(ConfigOnlySection):
    """config.json's indexer_n_heads, indexer_head_dim, indexer_budget,
    indexer_compress_ratio (indexer_kv_heads is 1: checked by the family record)."""

    json_name = "qsa"  # MHAConfig's field, config.json's key (no annotation: not a field)

    heads: int = 16  # Hi
    head_dim: int = 128  # Di
    budget: int = 2048  # tokens kept from complete blocks
    compress_ratio: int = 64  # c: keys a block pools

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "budget", "compress_ratio"):
            require_positive(f"qsa {name}", getattr(self, name))
        if self.budget % self.compress_ratio:
            raise UsageError(f"qsa budget {self.budget} is not a multiple of its "
                             f"compress_ratio {self.compress_ratio}")

    @property
    def block_topk(self) -> int:
        return self.budget // self.compress_ratio

    @property
    def reach(self) -> int:
        """The most keys a query attends: its top blocks and a tail short of a block."""
        return self.budget + self.compress_ratio - 1

    def resolve(self, c: Any) -> Dict[str, Any]:
        """The layout it decides; the options QSA's layer does not have refused."""
        refused = {**refused_by(c, "qsa"), "a sliding window": c.sliding_window,
                   "attention chunks": c.attention_chunk, "sinks": c.sinks, "alibi": c.alibi,
                   "softcap": c.softcap, "a non-causal layer": not c.causal,
                   "qk_norm_after_rope": c.qk_norm_after_rope,
                   "layout " + repr(c.layout): c.layout not in (None, LAYOUT)}
        for name, on in refused.items():
            if on:
                raise UsageError(f"{name} does not apply to {NAME}")
        rotary_dim = c.rotary_dim or (c.head_dim or c.dim // c.heads)
        if c.rotary != "none" and rotary_dim > self.head_dim:
            raise UsageError(f"qsa head_dim {self.head_dim} is narrower than rotary_dim "
                             f"{rotary_dim} (the index heads rotate as many features)")
        return {"layout": LAYOUT}

    rotary_choices = ROTARY

    def check_rope(self, scaling: Optional[dict]) -> None:
        return None

    def cache_shape(self, c: Any) -> Tuple[int, int, int]:
        """(kv heads, key width, value width): each value head holds the index key after it."""
        return c.kv_heads, c.head_dim, c.value_dim + self.head_dim

    def attended_kv_width(self, c: Any) -> int:
        return c.kv_inner

    def scale(self, c: Any) -> float:
        return c.softmax_scale or 1.0 / math.sqrt(c.head_dim)

    def slug(self, c: Any) -> str:
        """The split slug with the layout 'qsa' and the budget: 'qsa-h4-d64-kv2-b8c4'."""
        plain = c.replace(qsa=None, layout="split").slug()
        return f"{LAYOUT}{plain[len('split'):]}-b{self.budget}c{self.compress_ratio}"

    @property
    def cache_docs(self) -> Dict[str, str]:
        return {"past_value": "[value | raw index key] per kv head (the index key, one head, "
                              "repeated in each)"}
