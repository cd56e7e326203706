"""The lightning indexer, eager (transformers' ``DeepseekV32Indexer`` / ``GlmMoeDsaIndexer``,
with the checkpoints' tensor names under ``indexer.``): which keys each query keeps.

Shape legend: B = batch, T = this call's queries, S = keys, Hi = index heads, Di = their width,
Hr = the rotated part (MLA's qk_rope_head_dim).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ...layer.rotary import rotate
from .settings import SparseIndex


def rotate_part(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """x (B, heads, T, W): its first 2 * cos.size(-1) features rotated — halves ("half"), or
    pairs (2i, 2i+1) written as halves ("deinterleaving") — the rest kept."""
    if layout == "half":
        return rotate(x, cos, sin, False)
    rd = 2 * cos.size(-1)
    evens, odds = x[..., 0:rd:2], x[..., 1:rd:2]  # (B, heads, T, rd/2)
    return torch.cat([evens * cos - odds * sin, odds * cos + evens * sin, x[..., rd:]], dim=-1)


class Indexer(nn.Module):
    def __init__(self, index: SparseIndex, dim: int, q_lora_rank: int):
        super().__init__()
        self.heads, self.head_dim, self.topk, self.rope = (index.heads, index.head_dim,
                                                           index.topk, index.rope)
        self.wq_b = nn.Linear(q_lora_rank, index.heads * index.head_dim, bias=False)
        self.wk = nn.Linear(dim, index.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(index.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(dim, index.heads, bias=False)

    def keys(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """This call's index keys (B, 1, T, Di), rotated: what the cache keeps."""
        k = self.k_norm(self.wk(x)).unsqueeze(1)  # (B, 1, T, Di)
        return rotate_part(k, cos, sin, self.rope)

    def scores(self, x: Tensor, q_resid: Tensor, cos: Tensor, sin: Tensor, keys: Tensor,
               masked: Optional[Tensor]) -> Tensor:
        """(B, T, S) float32 index scores, -inf at the keys ``masked`` (B|1, 1, T, S) hides
        (what the layer hides anyway), computed as transformers does. keys (B, 1, S, Di): the
        cache's."""
        b, t = x.size(0), x.size(1)
        q = self.wq_b(q_resid).view(b, t, self.heads, self.head_dim)  # (B, T, Hi, Di)
        q = rotate_part(q, cos.transpose(1, 2), sin.transpose(1, 2), self.rope)
        scores = torch.relu(q.float() @ keys.float().transpose(-2, -1)
                            * self.head_dim ** -0.5)  # (B, T, Hi, S): (B, T, Hi, Di) @ (B,1,Di,S)
        weights = self.weights_proj(x).float() * self.heads ** -0.5  # (B, T, Hi)
        index = (weights.unsqueeze(-2) @ scores).squeeze(-2)  # (B, T, S): summed over heads
        if masked is not None:
            index = index.masked_fill(masked.squeeze(1), float("-inf"))
        return index

    def selected(self, x: Tensor, q_resid: Tensor, cos: Tensor, sin: Tensor,
                 keys: Tensor, masked: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """(B, 1, T, S) bool, True at the keys a query does not keep: all but its top-k
        visible keys by index score (``scores``); and the kept positions (B, T, K), best
        first, K = min(topk, S): transformers' top-k (a query seeing fewer than K keys fills
        its row with hidden positions, the earliest first)."""
        index = self.scores(x, q_resid, cos, sin, keys, masked)  # (B, T, S)
        # topk columns of -inf after the keys: every row then has at least topk to keep,
        # with no min(topk, S) (a guard on S under torch.export); equal scores keep the
        # earlier key (ONNX TopK's rule; torch.topk leaves ties unspecified, and a query whose
        # head weights are all negative scores many keys 0)
        count = index.size(-1)
        padded = torch.nn.functional.pad(index, (0, self.topk), value=float("-inf"))
        order = torch.sort(padded, dim=-1, descending=True, stable=True).indices  # (B,T,S+k)
        kept = order[..., :self.topk]  # (B, T, k)
        dropped = torch.ones(padded.shape, dtype=torch.bool, device=x.device)
        dropped = dropped.scatter(-1, kept, False)[..., :count]  # (B, T, S)
        return dropped.unsqueeze(1), order[..., :at_most(self.topk, count)]  # (B,1,T,S),(B,T,K)


def at_most(topk: int, keys: int) -> int:
    """min(topk, keys): torch.sym_min under torch.export (no guard on the keys' count)."""
    if torch.jit.is_scripting():
        return min(topk, keys)
    return torch.sym_min(topk, keys)


def unselected_by(indices: Tensor, keys: int) -> Tensor:
    """(B, 1, T, S) bool, True at the keys outside each query's given top-k (a GLM-5 shared
    layer's: its source layer's selection, indices (B, T, K) of key positions; one at S or
    beyond keeps nothing)."""
    b, t = indices.size(0), indices.size(1)
    dropped = torch.ones(b, t, keys + 1, dtype=torch.bool, device=indices.device)
    dropped = dropped.scatter(-1, indices.clamp(max=keys), False)  # (B, T, S + 1)
    return dropped[..., :keys].unsqueeze(1)  # (B, 1, T, S)


class NoIndexer(nn.Module):
    """Dense MLA's and a shared-top-k layer's stand-in (no weights): TorchScript compiles the
    sparse branch's calls."""

    def keys(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        raise RuntimeError("a dense layer has no indexer")

    def selected(self, x: Tensor, q_resid: Tensor, cos: Tensor, sin: Tensor,
                 keys: Tensor, masked: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        raise RuntimeError("a dense layer has no indexer")
