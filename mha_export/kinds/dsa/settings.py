"""The lightning indexer's settings (torch-free): ``SparseIndex``, nested in MLA's latent section
(``Latent.index``; set: the layer is DeepSeek Sparse Attention).

    index query   wq_b(q_resid) -> (B, T, Hi, Di), q_resid = q_a_layernorm(q_a_proj(x))
    index key     LayerNorm(wk(x)) -> (B, T, Di), one head, cached beside the latent
    (both rotated on their first qk_rope_head_dim features: halves for DeepSeek-V3.2, pairs
    read and written as halves for GLM-5)
    score         I[t, s] = sum_h w[t, h] * relu(q[t, h] . k[s] / sqrt(Di)),
                  w = weights_proj(x) / sqrt(Hi), in float32
    selection     each query keeps its top index_topk visible keys (all of them while fewer are
                  visible); attention masks the rest

Per token the cache holds Di more numbers: MLA's value cache [k_rot (Hr) | index key (Di)].

GLM-5's "shared" layers (``indexer_types``) run no indexer: ``source`` names the earlier layer
whose selection they reuse, given to the exported layer as the input ``topk_indices``
(B, T, K) int64, K = min(index_topk, S): the source layer's top-k key positions of each query,
as transformers' decoder loop passes them (``prev_topk_indices``). Such a layer caches no index
key; its weights are MLA's alone. The "full" layer they read (``feeds``) outputs its selection:
``topk_indices`` (B, T, K) int64, each query's kept key positions, best first, as transformers'
``GlmMoeDsaAttention`` returns them (K = min(index_topk, S); a query seeing fewer than K keys
fills its row with hidden positions, the earliest first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ...errors import UsageError, require_positive
from ..section import section_from_json

INDEX_ROPES = ("half", "deinterleaving")  # DeepSeek-V3.2's, GLM-5's (pairs -> halves)


@dataclass(frozen=True)
class SparseIndex:
    """DeepSeek-V3.2's defaults: 64 index heads of 128, the top 2048 keys."""

    topk: int = 2048  # index_topk
    heads: int = 64  # index_n_heads (Hi)
    head_dim: int = 128  # index_head_dim (Di)
    rope: str = "half"  # INDEX_ROPES
    source: Optional[int] = None  # a shared layer's: the layer whose top-k it reuses
    feeds: bool = False  # later shared layers read its top-k: an output (topk_indices)

    def __post_init__(self) -> None:
        for name in ("topk", "heads", "head_dim"):
            require_positive(f"index {name}", getattr(self, name))
        if self.source is not None and (isinstance(self.source, bool) or not isinstance(
                self.source, int) or self.source < 0):
            raise UsageError(f"index source must be a layer index >= 0, got {self.source!r}")
        if not isinstance(self.feeds, bool):
            raise UsageError(f"index feeds must be true or false, got {self.feeds!r}")
        if self.feeds and self.shared:
            raise UsageError("a shared-top-k layer (index source) has no selection of its own "
                             "to output (index feeds)")
        if self.rope not in INDEX_ROPES:
            raise UsageError(f"unknown index rope {self.rope!r}: choose one of "
                             f"{', '.join(INDEX_ROPES)}")

    def check(self, q_lora_rank: Any, rope_dim: int) -> None:
        """What the MLA layer around it must have: queries through q LoRA (the index query
        reads q_resid), index heads at least as wide as the rotated part."""
        if q_lora_rank is None and not self.shared:
            raise UsageError("DeepSeek Sparse Attention's index queries read q_a_layernorm's "
                             "output: it needs q_lora_rank")
        if self.head_dim < rope_dim:
            raise UsageError(f"index head_dim {self.head_dim} is narrower than "
                             f"qk_rope_head_dim {rope_dim} (its rotated part)")

    @property
    def shared(self) -> bool:
        """A layer reusing another layer's top-k (no indexer of its own)."""
        return self.source is not None

    @property
    def cached_width(self) -> int:
        """The index key's width the value cache holds after k_rot (0: a shared layer)."""
        return 0 if self.shared else self.head_dim

    def weight_shapes(self, dim: int, q_lora_rank: int) -> Dict[str, Tuple[int, int]]:
        """The indexer's projections, [out, in], by checkpoint name (none: a shared layer)."""
        if self.shared:
            return {}
        return {"indexer.wq_b": (self.heads * self.head_dim, q_lora_rank),
                "indexer.wk": (self.head_dim, dim), "indexer.weights_proj": (self.heads, dim)}

    def call_flops(self, seq: int, keys: int) -> float:
        """The index scores of ``seq`` queries over ``keys`` keys (the projections apart)."""
        if self.shared:
            return 0.0
        return 2.0 * seq * keys * self.heads * (self.head_dim + 1)

    @classmethod
    def from_value(cls, value: Any) -> "SparseIndex":
        """A SparseIndex, or config.json's object of one (unknown keys refused)."""
        return section_from_json(cls, value, "index")
