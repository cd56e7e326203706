"""The eager attention core that every weight layout runs: masks from the runtime shapes, torch's
fused SDPA as the fast path, the textbook scores -> mask -> softmax as the plain path.

Shape legend: B = batch, N = heads, Tq = queries, Tk = keys (past + this call), H = head size.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


class Scoring(NamedTuple):
    """How a layer scores its keys, fixed per layer: the softmax scale, causal or not, a sliding
    window or chunks (0: none), softcapping (0.0: none), the sinks' logits (N,) and ALiBi's
    slopes (N,) (None: none). A NamedTuple: torch.jit.script compiles it."""
    scale: float
    causal: bool = True
    window: int = 0
    chunk: int = 0
    softcap: float = 0.0
    sinks: Optional[Tensor] = None
    alibi: Optional[Tensor] = None


def causal_mask(t_q: int, t_k: int, device: torch.device, window: int = 0) -> Tensor:
    """(t_q, t_k) bool, True where a query may NOT attend (key after query), built from the
    runtime shape: no stored [max_seq, max_seq] buffer. Bottom-right alignment: query i sits at
    key position (t_k - t_q) + i, as in a cached decode step."""
    q_pos = torch.arange(t_k - t_q, t_k, device=device).unsqueeze(1)  # (Tq, 1)
    k_pos = torch.arange(t_k, device=device).unsqueeze(0)  # (1, Tk)
    if window > 0:  # sliding window: also keys at or beyond `window` positions back
        return (k_pos > q_pos) | (k_pos <= q_pos - window)
    return k_pos > q_pos


def row_causal_mask(query_start: Tensor, t_q: int, t_k: int, window: int = 0) -> Tensor:
    """(B, 1, t_q, t_k) bool, True where a query may NOT attend: row b's query i sits at key
    position query_start[b] + i (a static cache: each row's own valid length)."""
    q_pos = (query_start.view(-1, 1) + torch.arange(t_q, device=query_start.device)).view(
        -1, 1, t_q, 1)  # (B, 1, Tq, 1)
    k_pos = torch.arange(t_k, device=query_start.device).view(1, 1, 1, t_k)  # (1, 1, 1, Tk)
    if window > 0:
        return (k_pos > q_pos) | (k_pos <= q_pos - window)
    return k_pos > q_pos


def query_positions(t_q: int, t_k: int, device: torch.device,
                    query_start: Optional[Tensor] = None) -> Tensor:
    """(B|1, 1, Tq, 1): the key position of each query, (t_k - t_q) + i (bottom-right), or
    query_start[b] + i."""
    steps = torch.arange(t_q, device=device)  # (Tq,)
    if query_start is None:
        return (steps + (t_k - t_q)).view(1, 1, t_q, 1)  # (1, 1, Tq, 1)
    return (query_start.view(-1, 1) + steps).view(-1, 1, t_q, 1)  # (B, 1, Tq, 1)


def other_chunks(t_q: int, t_k: int, chunk: int, device: torch.device,
                 query_start: Optional[Tensor] = None,
                 first: Optional[Tensor] = None) -> Tensor:
    """(B|1, 1, Tq, Tk) bool, True at keys before the query's own chunk (Llama 4): query i sits
    at key position (t_k - t_q) + i (or query_start[b] + i); its chunk starts at
    i - ((i - first[b]) mod chunk), first[b] the slot of row b's first token (0 when None)."""
    q_pos = query_positions(t_q, t_k, device, query_start)  # (B|1, 1, Tq, 1)
    offset = q_pos
    if first is not None:
        offset = q_pos - first.view(-1, 1, 1, 1)  # (B, 1, Tq, 1)
    chunk_start = q_pos - torch.remainder(offset, chunk)  # (B|1, 1, Tq, 1)
    return torch.arange(t_k, device=device).view(1, 1, 1, t_k) < chunk_start


def first_tokens(attention_mask: Tensor) -> Tensor:
    """(B,) the slot of each row's first token: the left padding before it (transformers'
    chunked mask counts chunks from there)."""
    return (torch.cumsum(attention_mask, dim=-1) == 0).sum(dim=-1)  # (B,)


def alibi_bias(slopes: Tensor, t_q: int, t_k: int, query_start: Optional[Tensor] = None
               ) -> Tensor:
    """(B|1, N, Tq, Tk): slopes[h] * (j - i), query i at key position (t_k - t_q) + i (or
    query_start[b] + i)."""
    q_pos = query_positions(t_q, t_k, slopes.device, query_start)  # (B|1, 1, Tq, 1)
    k_pos = torch.arange(t_k, device=slopes.device).view(1, 1, 1, t_k)  # (1, 1, 1, Tk)
    return slopes.view(1, -1, 1, 1) * (k_pos - q_pos).to(slopes.dtype)  # (B|1, N, Tq, Tk)


def score_mask(t_q: int, t_k: int, causal: bool, attention_mask: Optional[Tensor],
               device: torch.device, window: int = 0, query_start: Optional[Tensor] = None,
               chunk: int = 0) -> Optional[Tensor]:
    """bool (B|1, 1, Tq, Tk), True where a score is masked: bottom-right causal (or from each
    row's ``query_start``), keys outside the query's window or chunk, and/or padding keys
    (attention_mask (B, Tk), 1 = token); None when nothing is masked."""
    masked: Optional[Tensor] = None
    if query_start is not None:
        masked = row_causal_mask(query_start, t_q, t_k, window)  # (B, 1, Tq, Tk)
    elif causal:
        masked = causal_mask(t_q, t_k, device, window).view(1, 1, t_q, t_k)
    if chunk > 0:
        first = None if attention_mask is None else first_tokens(attention_mask)
        behind = other_chunks(t_q, t_k, chunk, device, query_start, first)
        masked = behind if masked is None else masked | behind
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


def attention(q: Tensor, k: Tensor, v: Tensor, scoring: Scoring,
              attention_mask: Optional[Tensor] = None, query_start: Optional[Tensor] = None,
              dropout_p: float = 0.0, need_weights: bool = False
              ) -> Tuple[Tensor, Optional[Tensor]]:
    """Scaled dot-product attention: q (B, N, Tq, H), k/v (B, K, Tk, H) -> ((B, N, Tq, H), probs);
    with K < N heads, query head h reads key/value head h // (N / K) (grouped-query).

    Fast path: torch's fused SDPA with is_causal (memory linear in T on CPU), only where its
    top-left causal alignment is right (Tq == Tk) and nothing is padded. Otherwise SDPA with an
    explicit bottom-right + padding mask filled with the dtype's lowest finite value (a row with
    nothing to attend stays finite). Plain path: scores -> softcap -> mask -> softmax (with the
    sinks' column) -> dropout, when the probabilities are wanted or SDPA cannot compute the layer
    (softcapping, sinks, ALiBi). ``query_start`` (B,): row b's queries sit at key positions
    query_start[b] + i (a static cache), instead of bottom-right alignment; ``scoring.chunk``:
    keys of the query's own chunk only (``other_chunks``); ``scoring.alibi`` (N,): each head's
    slope of a linear bias on the scores (``alibi_bias``, plain path).
    """
    scale, causal, window, chunk = scoring.scale, scoring.causal, scoring.window, scoring.chunk
    softcap, sinks, alibi = scoring.softcap, scoring.sinks, scoring.alibi
    t_q, t_k = q.size(-2), k.size(-2)
    gqa = q.size(1) != k.size(1)  # SDPA reads the shared heads in place (no copies)
    plain = need_weights or softcap > 0.0 or sinks is not None or alibi is not None
    aligned = query_start is None and (t_q == t_k or not causal)
    if not plain and attention_mask is None and window == 0 and chunk == 0 and aligned:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal,
                                              scale=scale, enable_gqa=gqa), None
    masked = score_mask(t_q, t_k, causal, attention_mask, q.device, window,
                        query_start, chunk)  # (B|1, 1, Tq, Tk)
    lowest = lowest_value(q.dtype)
    if not plain:
        bias: Optional[Tensor] = None
        if masked is not None:
            bias = torch.zeros(masked.shape, dtype=q.dtype, device=q.device).masked_fill(
                masked, lowest)  # (B|1, 1, Tq, Tk)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p,
                                              scale=scale, enable_gqa=gqa), None
    bias: Optional[Tensor] = None
    if alibi is not None:
        bias = alibi_bias(alibi, t_q, t_k, query_start)  # (B|1, N, Tq, Tk)
    probs = attention_probs(q, k, scale, masked, softcap, sinks, bias)  # (B, N, Tq, Tk)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    if gqa:
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)  # (B, N, Tk, H)
    return probs @ v, probs  # (B, N, Tq, H)


def attention_probs(q: Tensor, k: Tensor, scale: float, masked: Optional[Tensor],
                    softcap: float = 0.0, sinks: Optional[Tensor] = None,
                    bias: Optional[Tensor] = None) -> Tensor:
    """The textbook path, in transformers' order: scores * scale -> cap * tanh(s / cap) ->
    + bias (ALiBi) -> masked -> softmax over the keys and one sink logit per head (dropped
    afterwards)."""
    if q.size(1) != k.size(1):  # each query head gets its kv head's copy
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, N, Tk, H)
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, N, Tq, Tk)
    if softcap > 0.0:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if masked is not None:
        scores = scores.masked_fill(masked, lowest_value(q.dtype))
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(
        scores.size(0), scores.size(1), scores.size(2), 1)  # (B, N, Tq, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, N, Tq, Tk)


def merge_heads(ctx: Tensor) -> Tensor:
    b, nh, t, hs = ctx.shape
    return ctx.transpose(1, 2).reshape(b, t, nh * hs)  # (B, T, N*H)


def grouped_attention(q: Tensor, keys_t: Tensor, values: Tensor, scoring: Scoring,
                      query_start: Tensor) -> Tensor:
    """One row's queries over a whole static buffer, the query heads grouped per kv head so
    that the buffer is read where it lies (no expand, no transpose of it): q (N, T, H), keys
    stored transposed (K, H, C), values (K, C, Hv) -> (N, T, Hv). Query i sits at key position
    query_start + i (query_start (1,)); the entries past it are masked (they must be finite).
    The same function as ``attention`` over a static cache (causal); G = N / K query heads per
    kv head.
    """
    scale, window, chunk = scoring.scale, scoring.window, scoring.chunk
    softcap, sinks, alibi = scoring.softcap, scoring.sinks, scoring.alibi
    n, t, h = q.shape
    k_heads, _, c = keys_t.shape
    g = n // k_heads
    scores = torch.bmm(q.contiguous().view(k_heads, g * t, h), keys_t) * scale  # (K, G*T, C)
    scores = scores.view(k_heads, g, t, c)  # (K, G, T, C)
    if softcap > 0.0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi is not None:
        scores = scores + alibi_bias(alibi, t, c, query_start).view(
            k_heads, g, t, c).to(scores.dtype)  # (1, N, T, C) -> (K, G, T, C)
    masked = score_mask(t, c, True, None, q.device, window, query_start, chunk)  # (1, 1, T, C)
    assert masked is not None
    bias = torch.zeros(masked.shape, dtype=scores.dtype, device=q.device).masked_fill(
        masked, lowest_value(q.dtype))  # (1, 1, T, C): filled once, added over the heads
    scores = scores + bias
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)  # (K, G, T, C)
    else:
        sink = sinks.to(scores.dtype).view(k_heads, g, 1, 1).expand(k_heads, g, t, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :c]
    ctx = torch.bmm(probs.reshape(k_heads, g * t, c), values)  # (K, G*T, Hv)
    # (K, G*T, Hv) -> (K, G, T, Hv) -> (N, T, Hv); in two steps: one view to (N, T, Hv) makes
    # torch.export (2.13) guard T with a bound it cannot prove
    return ctx.view(k_heads, g, t, values.size(-1)).flatten(0, 1)
