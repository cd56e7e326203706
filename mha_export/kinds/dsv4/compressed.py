"""DeepSeek-V4's compressed layers, eager, full-sequence and cached calls (docs/deepseek-v4.md):
``heavily_compressed_attention`` (HCA: every ``rate`` tokens pooled into one more key = value
row) and ``compressed_sparse_attention`` (CSA: overlapping windows of 2 * rate slots, and a
lightning indexer keeping each query's top ``index_topk`` rows, ties to the earlier row as
ONNX TopK: ``top_rows``). Parameter names are transformers' (``self_attn.compressor.*``,
``self_attn.compressor.indexer.*``). A full-sequence call (``spare``) pools SPARE more rows,
never seen, so that torch.export keeps seq dynamic (AOTInductor, ExecuTorch).

Shape legend: B batch, T this call, n = T // rate closed windows, w a row's width (d, or the
indexer's di), m = rate.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ...layer.rotary import cos_sin
from .layer import DSV4SlidingAttention, WeightedRMSNorm, rotate_tail
from .settings import CSA, DSV4Shape

SPARE = 3  # a full-sequence call's never-closed rows: torch.export guards sizes 0 and 1


def overlapped(t: Tensor, width: int, fill: float, prior: Optional[Tensor] = None) -> Tensor:
    """t (B, n, m, 2w) -> (B, n, 2m, w): window i's slots are window i - 1's first series
    ([..., :w]; window 0: ``prior`` (B, m, w), the last call's last window's, else ``fill``)
    then its own second series ([..., w:])."""
    earlier = t[..., :width]  # (B, n, m, w)
    before = torch.full_like(earlier[:, :1], fill) if prior is None else prior.unsqueeze(1)
    first = torch.cat([before.to(t.dtype), earlier[:, :-1]], dim=1)
    return torch.cat([first, t[..., width:]], dim=2)


class Compressor(nn.Module):
    """Closed windows of ``rate`` tokens pooled into rows of ``width``: a softmax over each
    window's slots (per channel, the gate plus a per-slot bias), the weighted sum, an RMSNorm,
    the rotary at the window's first position."""

    def __init__(self, dim: int, width: int, rate: int, overlap: bool, eps: float):
        super().__init__()
        self.width, self.rate, self.overlap, self.spare = width, rate, overlap, SPARE
        series = 2 * width if overlap else width
        self.kv_proj = nn.Linear(dim, series, bias=False)
        self.gate_proj = nn.Linear(dim, series, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(rate, series))
        self.kv_norm = WeightedRMSNorm(width, eps)

    def forward(self, x: Tensor, inv_freq: Tensor, state: Dict[str, Tensor], name: str,
                spare: bool = False) -> Tensor:
        """x (B, T, D) -> every row pooled so far (B, N, w), rotated at positions 0, m, 2m,
        ...; ``state`` (transformers' cache, under ``name``): buffer_kv / buffer_gate the
        projections of the tokens since the last closed window (B, < m, w or 2w),
        compressed_kv the rows (B, N, w), overlap_kv / overlap_gate (overlapping windows) the
        last closed window's first series (B, m, w). ``spare`` (a full-sequence call, the
        state not kept): SPARE more rows, of the open window's and zero tokens, never closed
        (``closed_by``), so torch.export keeps seq dynamic (N, N - 1 >= 2; no branch on N; no
        tail kept)."""
        b = x.size(0)
        kv, gate = self.kv_proj(x), self.gate_proj(x)  # (B, T, w or 2w)
        if spare:
            return self.spared(kv, gate, inv_freq, state, name)
        if name + ".buffer_kv" in state:
            kv = torch.cat([state[name + ".buffer_kv"], kv], dim=1)
            gate = torch.cat([state[name + ".buffer_gate"], gate], dim=1)
        n = kv.size(1) // self.rate
        usable = n * self.rate
        state[name + ".buffer_kv"], state[name + ".buffer_gate"] = kv[:, usable:], gate[:, usable:]
        rows = state.get(name + ".compressed_kv", kv.new_zeros(b, 0, self.width))
        if n > 0:
            kv = kv[:, :usable].view(b, n, self.rate, -1)  # (B, n, m, w or 2w)
            gate = gate[:, :usable].view(b, n, self.rate, -1) + self.position_bias
            rows = torch.cat([rows, self.pool(kv, gate, state, name, rows.size(1), inv_freq)], 1)
        state[name + ".compressed_kv"] = rows
        return rows

    def spared(self, kv: Tensor, gate: Tensor, inv_freq: Tensor, state: Dict[str, Tensor],
               name: str) -> Tensor:
        """kv, gate (B, T, w or 2w) -> the rows of every closed window and three spare ones
        (B, T // m + 3, w): the open window's tokens and zero ones; the state is written (not
        kept by the caller)."""
        b, m, series = kv.size(0), self.rate, kv.size(2)
        n = kv.size(1) // m + self.spare
        slots = (torch.arange(n, device=kv.device).unsqueeze(1) * m
                 + torch.arange(m, device=kv.device))  # (n, m): gathered, no size from T % m
        zeros = kv.new_zeros(b, self.spare * m, series)
        kv, gate = torch.cat([kv, zeros], 1)[:, slots], torch.cat([gate, zeros], 1)[:, slots]
        rows = self.pool(kv, gate + self.position_bias, state, name, 0, inv_freq)
        state[name + ".compressed_kv"] = rows
        return rows

    def pool(self, kv: Tensor, gate: Tensor, state: Dict[str, Tensor], name: str, first: int,
             inv_freq: Tensor) -> Tensor:
        """kv, gate (B, n, m, w or 2w) -> rows first .. first + n - 1 (B, n, w)."""
        b, n = kv.size(0), kv.size(1)
        if self.overlap:
            last_kv, last_gate = kv[:, -1, :, : self.width], gate[:, -1, :, : self.width]
            kv = overlapped(kv, self.width, 0.0, state.get(name + ".overlap_kv"))  # B,n,2m,w
            gate = overlapped(gate, self.width, float("-inf"), state.get(name + ".overlap_gate"))
            state[name + ".overlap_kv"], state[name + ".overlap_gate"] = last_kv, last_gate
        weights = gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)
        pooled = self.kv_norm((kv * weights).sum(dim=2))  # (B, n, w)
        starts = (torch.arange(first, first + n, device=kv.device) * self.rate)
        cos, sin = cos_sin(starts.unsqueeze(0).expand(b, n), inv_freq, torch.float32)
        return rotate_tail(pooled.unsqueeze(1).float(), cos, sin).squeeze(1).to(kv.dtype)


def closed_by(positions: Tensor, rows: int, rate: int) -> Tensor:
    """(B, T, n) bool: row i's window is closed by the query's position (i < (pos + 1) // m)."""
    threshold = torch.div(positions + 1, rate, rounding_mode="floor")  # (B, T)
    return torch.arange(rows, device=positions.device).view(1, 1, -1) < threshold.unsqueeze(-1)


def additive(seen: Tensor) -> Tensor:
    """(B, T, n) bool -> (B, 1, T, n) float32: 0 where seen, float32's lowest elsewhere."""
    zero = torch.zeros([1], dtype=torch.float32, device=seen.device)  # broadcast
    return torch.where(seen, zero, torch.full_like(zero, -3.4028234663852886e38)).unsqueeze(1)


class Scorer(nn.Module):
    """The indexer's per-head weights (transformers' ``indexer.scorer``)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.weights_proj = nn.Linear(dim, heads, bias=False)


class Indexer(nn.Module):
    """The lightning indexer: score[t, s] = sum_h w[t, h] * ReLU(q[t, h] . K[s]) / sqrt(di)
    over the rows its own compressor pools (di wide), each query keeping its top k closed
    rows."""

    def __init__(self, s: DSV4Shape):
        super().__init__()
        self.heads, self.head_dim, self.topk, self.rate = (
            s.index_heads, s.index_head_dim, s.index_topk, s.rate)
        self.compressor = Compressor(s.dim, s.index_head_dim, s.rate, True, s.eps)
        self.q_b_proj = nn.Linear(s.q_lora_rank, s.index_heads * s.index_head_dim, bias=False)
        self.scorer = Scorer(s.dim, s.index_heads)

    def forward(self, x: Tensor, residual: Tensor, positions: Tensor, inv_freq: Tensor,
                state: Dict[str, Tensor], spare: bool = False) -> Tensor:
        """x (B, T, D), residual (B, T, Rq), positions (B, T) -> (B, T, n) bool: the rows
        each query keeps, its top k closed rows (``top_rows``: ties to the earlier row);
        ``spare`` (a full-sequence call): SPARE more rows (the compressor's), never kept."""
        b, t = x.size(0), x.size(1)
        keys = self.compressor(x, inv_freq, state, "indexer", spare)  # (B, n, di)
        cos, sin = cos_sin(positions, inv_freq, torch.float32)  # (B, 1, T, rd/2)
        q = self.q_b_proj(residual).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        q = rotate_tail(q.float(), cos, sin).to(x.dtype).transpose(1, 2)  # (B, T, Hi, di)
        dots = torch.matmul(q.float(), keys.transpose(-1, -2).float().unsqueeze(1))  # B,T,Hi,n
        weights = self.scorer.weights_proj(x).float() * self.heads ** -0.5  # (B, T, Hi)
        scores = (torch.relu(dots) * self.head_dim ** -0.5 * weights.unsqueeze(-1)).sum(2)
        closed = closed_by(positions, keys.size(1), self.rate)  # (B, T, n)
        if spare:
            closed = closed & unspared(keys.size(1), t, self.rate, x.device)
        return top_rows(scores, closed, self.topk)


def top_rows(scores: Tensor, closed: Tensor, k: int) -> Tensor:
    """scores (B, T, n) float32, closed (B, T, n) bool -> (B, T, n) bool: each query's top k
    closed rows, ties to the earlier row (as ONNX TopK breaks them). A closed row is kept when
    it scores above the k-th largest closed score, or equals it and is among the first
    k - (how many score above) rows that do. The k-th score is torch.topk's value, whatever
    order it picks equal rows in; k is fixed (k columns of -inf appended), so no size depends
    on min(k, n) and torch.export keeps n dynamic; no sort."""
    lowest = float("-inf")
    ranked = scores.masked_fill(~closed, lowest)  # (B, T, n)
    padded = torch.nn.functional.pad(ranked, [0, k], value=lowest)  # (B, T, n + k)
    kth = padded.topk(k, dim=-1).values.min(dim=-1, keepdim=True).values  # (B, T, 1)
    above = closed & (ranked > kth)  # (B, T, n)
    level = closed & (ranked == kth)  # (B, T, n): -inf (fewer than k closed) never closed
    room = k - above.sum(dim=-1, keepdim=True)  # (B, T, 1)
    return above | (level & (level.cumsum(dim=-1) <= room))


def unspared(rows: int, t: int, rate: int, device: torch.device) -> Tensor:
    """(n,) bool: a full-sequence call's rows that are a closed window's (the first T // m),
    not its SPARE ones, whatever the positions."""
    return torch.arange(rows, device=device) < t // rate


class NoIndexer(nn.Module):
    """HCA's stand-in for the indexer (parameter-free, so TorchScript compiles one call):
    every closed row."""

    def __init__(self, rate: int):
        super().__init__()
        self.rate = rate

    def forward(self, x: Tensor, residual: Tensor, positions: Tensor, inv_freq: Tensor,
                state: Dict[str, Tensor], spare: bool = False) -> Tensor:
        """(B, T, n) bool; ``spare``: the spare rows never, whatever the positions."""
        rows = state["compressor.compressed_kv"].size(1)
        seen = closed_by(positions, rows, self.rate)  # (B, T, n)
        if spare:
            seen = seen & unspared(rows, x.size(1), self.rate, x.device)
        return seen


class DSV4CompressedAttention(DSV4SlidingAttention):
    """A compressed layer: the sliding layer's attention over its sliding rows and the pooled
    ones (HCA: every closed row; CSA: the indexer's picks), full-sequence or cached."""

    def __init__(self, shape: DSV4Shape):
        super().__init__(shape)
        self.sparse = shape.layer_type == CSA
        self.compressor = Compressor(shape.dim, shape.head_dim, shape.rate, self.sparse,
                                     shape.eps)
        self.compressor.indexer = Indexer(shape) if self.sparse else NoIndexer(shape.rate)

    def extra_rows(self, x: Tensor, residual: Tensor, positions: Tensor,
                   state: Dict[str, Tensor], spare: bool = False) -> Tuple[Tensor, Tensor]:
        """The pooled rows (B, 1, n, d) and their mask (B, 1, T, n)."""
        rows = self.compressor(x, self.inv_freq, state, "compressor", spare)  # (B, n, d)
        seen = self.compressor.indexer(x, residual, positions, self.inv_freq, state,
                                       spare)  # (B, T, n)
        return rows.unsqueeze(1), additive(seen)
