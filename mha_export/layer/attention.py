"""The eager attention core that every weight layout runs: masks from the runtime shapes, torch's
fused SDPA as the fast path, the textbook scores -> mask -> softmax as the plain path.

Shape legend: B = batch, N = heads, Tq = queries, Tk = keys (past + this call), H = head size.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_mask(t_q: int, t_k: int, device: torch.device, window: int = 0) -> Tensor:
    """(t_q, t_k) bool, True where a query may NOT attend (key after query), built from the
    runtime shape: no stored [max_seq, max_seq] buffer. Bottom-right alignment: query i sits at
    key position (t_k - t_q) + i, as in a cached decode step."""
    q_pos = torch.arange(t_k - t_q, t_k, device=device).unsqueeze(1)  # (Tq, 1)
    k_pos = torch.arange(t_k, device=device).unsqueeze(0)  # (1, Tk)
    if window > 0:  # sliding window: also keys at or beyond `window` positions back
        return (k_pos > q_pos) | (k_pos <= q_pos - window)
    return k_pos > q_pos


def score_mask(t_q: int, t_k: int, causal: bool, attention_mask: Optional[Tensor],
                  device: torch.device, window: int = 0) -> Optional[Tensor]:
    """bool (B|1, 1, Tq, Tk), True where a score is masked: bottom-right causal and/or padding
    keys (attention_mask (B, Tk), 1 = token); None when nothing is masked."""
    masked: Optional[Tensor] = None
    if causal:
        masked = causal_mask(t_q, t_k, device, window).view(1, 1, t_q, t_k)
    if attention_mask is not None:
        pad = (attention_mask == 0).view(attention_mask.size(0), 1, 1, t_k)  # (B, 1, 1, Tk)
        masked = pad if masked is None else masked | pad
    return masked


def lowest_value(dtype: torch.dtype) -> float:
    """The dtype's lowest finite value (torch.finfo, which TorchScript cannot compile)."""
    if dtype == torch.float16:
        return -65504.0
    if dtype == torch.bfloat16:
        return -3.3895313892515355e38
    if dtype == torch.float64:
        return -1.7976931348623157e308
    return -3.4028234663852886e38


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, dropout_p: float,
              need_weights: bool, attention_mask: Optional[Tensor] = None, window: int = 0
              ) -> Tuple[Tensor, Optional[Tensor]]:
    """Scaled dot-product attention: q (B, N, Tq, H), k/v (B, K, Tk, H) -> ((B, N, Tq, H), probs);
    with K < N heads, query head h reads key/value head h // (N / K) (grouped-query).

    Fast path: torch's fused SDPA with is_causal (memory linear in T on CPU), only where its
    top-left causal alignment is right (Tq == Tk) and nothing is padded. Otherwise SDPA with an
    explicit bottom-right + padding mask filled with the dtype's lowest finite value (a row with
    nothing to attend stays finite). Plain path: scores -> mask -> softmax -> dropout, when the
    attention probabilities are wanted.
    """
    t_q, t_k = q.size(-2), k.size(-2)
    gqa = q.size(1) != k.size(1)  # SDPA reads the shared heads in place (no copies)
    if not need_weights and attention_mask is None and window == 0 and (t_q == t_k or not causal):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal,
                                              scale=scale, enable_gqa=gqa), None
    masked = score_mask(t_q, t_k, causal, attention_mask, q.device, window)  # (B|1, 1, Tq, Tk)
    lowest = lowest_value(q.dtype)
    if not need_weights:
        bias: Optional[Tensor] = None
        if masked is not None:
            bias = torch.zeros(masked.shape, dtype=q.dtype, device=q.device).masked_fill(
                masked, lowest)  # (B|1, 1, Tq, Tk)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p,
                                              scale=scale, enable_gqa=gqa), None
    if gqa:  # the plain path: each query head gets its kv head's copy
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, N, Tk, H)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, N, Tq, Tk)
    if masked is not None:
        scores = scores.masked_fill(masked, lowest)
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs @ v, probs  # (B, N, Tq, H)


def merge_heads(ctx: Tensor) -> Tensor:
    b, nh, t, hs = ctx.shape
    return ctx.transpose(1, 2).reshape(b, t, nh * hs)  # (B, T, N*H)
