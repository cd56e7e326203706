"""The QSA indexer, eager (transformers' ``Qwen4ExpTextQSAIndexer``, with the checkpoints'
tensor names under ``indexer.``): which keys each query keeps. Vectorized over queries:
transformers loops over them, taking each query's visible keys in order (``visible``, its row
of the causal and padding mask); this layer's masks are causal and padding only, so every
query's visible keys are a prefix of its row's last query's, and one block layout per row
serves all of its queries.

Shape legend: B = batch, T = this call's queries, S = keys, Hi = index heads, Di = their width,
NB = blocks (S // c), k = block_topk, c = compress_ratio.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor, nn

from ...layer.norm import QKNorm
from .settings import BlockIndex


def block_layout(visible: Tensor, c: int) -> Tuple[Tensor, Tensor, Tensor]:
    """visible (B', T, S) bool -> (each key's block (B', S), -1 where the row's last query
    does not see it; each query's complete blocks (B', T); each query's visible count
    (B', T))."""
    last = visible[:, -1]  # (B', S)
    rank = torch.cumsum(last.long(), dim=-1) - 1  # (B', S)
    block = torch.where(last, torch.div(rank, c, rounding_mode="floor"),
                        torch.full_like(rank, -1))  # (B', S)
    counts = visible.long().sum(dim=-1)  # (B', T)
    return block, torch.div(counts, c, rounding_mode="floor"), counts


# blocks past the last that can be complete (never usable, their keys zero): NB is never 0
# or 1, sizes a tracing export (torch.export) would otherwise specialise the call length to
SPARE_BLOCKS = 2


def block_keys(keys: Tensor, block: Tensor, c: int, spare: int = SPARE_BLOCKS) -> Tensor:
    """keys (B, 1, S, Di) raw, block (B', S) -> each block's mean key (B, NB, Di) (float32
    mean cast back, as transformers does), NB = S // c + spare."""
    blocks = keys.size(2) // c + spare
    ids = torch.arange(blocks, device=keys.device).view(1, blocks, 1)  # (1, NB, 1)
    members = (block.unsqueeze(1) == ids).float()  # (B', NB, S)
    return ((members @ keys.squeeze(1).float()) / c).to(keys.dtype)  # (B, NB, Di)


def kept_blocks(scores: Tensor, complete: Tensor, topk: int) -> Tensor:
    """scores (B, T, NB) float32, complete (B', T) -> (B, T, NB + 1) bool: each query's top
    ``topk`` complete blocks (the last column False). A block is kept when fewer than ``topk``
    complete blocks outrank it: a higher score, or an equal one earlier (ties to the earlier
    block, as a stable sort and ONNX's TopK order them). Comparisons, not a sort: every target
    has them (NB = S / c blocks: (B, T, NB, NB) of them)."""
    blocks = scores.size(-1)
    ids = torch.arange(blocks, device=scores.device)  # (NB,)
    usable = ids.view(1, 1, -1) < complete.unsqueeze(-1)  # (B', T, NB)
    ranked = scores.masked_fill(~usable, float("-inf"))  # (B, T, NB)
    mine, other = ranked.unsqueeze(-1), ranked.unsqueeze(-2)  # (B, T, NB, 1), (B, T, 1, NB)
    earlier = ids.view(1, -1) < ids.view(-1, 1)  # (NB, NB): [i, j] = j before i
    outranks = (other > mine) | ((other == mine) & earlier)  # (B, T, NB, NB)
    kept = (outranks & usable.unsqueeze(-2)).sum(dim=-1) < topk  # (B, T, NB)
    return torch.nn.functional.pad(kept & usable, (0, 1), value=False)


class QSAIndexer(nn.Module):
    def __init__(self, index: BlockIndex, d_in: int, eps: float, offset: float):
        super().__init__()
        self.heads, self.head_dim = index.heads, index.head_dim
        self.ratio, self.topk = index.compress_ratio, index.block_topk
        self.index_qk_proj = nn.Linear(d_in, (index.heads + 1) * index.head_dim, bias=False)
        self.q_layernorm = QKNorm((index.head_dim,), eps, offset)
        self.k_layernorm = QKNorm((index.head_dim,), eps, offset)

    def project(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """x (B, T, d_in) -> (normed index queries (B, Hi, T, Di), not rotated; raw index keys
        (B, 1, T, Di): what the cache keeps)."""
        b, t = x.size(0), x.size(1)
        qk = self.index_qk_proj(x)  # (B, T, (Hi + 1) * Di)
        q = qk[..., :self.heads * self.head_dim].view(b, t, self.heads,
                                                      self.head_dim)  # (B, T, Hi, Di)
        k = qk[..., self.heads * self.head_dim:].view(b, 1, t, self.head_dim)  # (B, 1, T, Di)
        return self.q_layernorm(q).transpose(1, 2), k  # (B, Hi, T, Di)

    def dropped(self, q: Tensor, block_k: Tensor, block: Tensor, complete: Tensor) -> Tensor:
        """q (B, Hi, T, Di) rotated, block_k (B, T, NB, Di) normed and rotated for each query
        -> (B, 1, T, S) bool, True at the keys a query does not keep: those of the complete
        blocks outside its top block_topk (its tail, the keys after its last complete block,
        always kept)."""
        scores = torch.relu(q.transpose(1, 2).float()
                            @ block_k.float().transpose(-2, -1))  # (B, T, Hi, NB)
        scores = scores.sum(dim=2) / (self.head_dim ** 0.5)  # (B, T, NB)
        chosen = kept_blocks(scores, complete, self.topk)  # (B, T, NB + 1)
        blocks = scores.size(-1)
        at = torch.where(block < 0, torch.full_like(block, blocks), block.clamp(max=blocks))
        at = at.unsqueeze(1).expand(chosen.size(0), chosen.size(1), at.size(-1))  # (B, T, S)
        kept = chosen.gather(-1, at) | (block.unsqueeze(1) >= complete.unsqueeze(-1))
        return (~kept).unsqueeze(1)  # (B, 1, T, S)
