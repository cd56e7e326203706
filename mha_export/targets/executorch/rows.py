"""The static cache an ExecuTorch program holds, one key and one value buffer per row, and the
step that reads them where they lie: a step reads the weights and each row's buffers once and
writes only the new entries, in place.

Why this shape (executorch 1.5.1, ../docs/executorch.md): in its edge dialect a slice, select,
expand or permute of a buffer is a copy, and a view of a buffer written in place is planned as a
tensor of its own (a wrong answer); a dynamic batch would slice the buffers on every call. So the
program runs a static batch of M rows (``--max-batch``), each row's buffers are whole tensors
of their own, written with one index over their slot axis (re-inplaced into ``index_put_``, no
write-back copy), and read whole by a batched matrix product per row: never expanded,
transposed or sliced. Two kernel sets (``ROW_KERNELS``):

    aten  the keys stored transposed, (K, H, C), the values (K, C, Hv); the query heads grouped
          per kv head (``grouped_attention``: two bmm's, XNNPACK's): every ATen op, so the
          program runs on the runtime any app links (C++ included)
    llm   ExecuTorch's own LLM kernels (``llama::update_cache``, ``llama::custom_sdpa``,
          grouped-query inside the kernel, reading only each row's valid entries): buffers
          (1, C, K, H); the kernels live in the executorch wheel's Python-side library

K = kv heads, C = the capacity (max_seq_len), H / Hv = key / value width, M = rows, T = seq.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ...config import MHAConfig
from ...kinds.registry import kind_of
from ...layer.attention import grouped_attention


class CacheRows(nn.Module):
    """M rows of key and value buffers (``key_<m>``, ``value_<m>``), the program's mutable
    buffers, in the kernel set's layout; ``standard``/``load`` convert a row to and from the
    signature's (K, C, H)."""

    kernels = ""

    def __init__(self, rows: int, kv_heads: int, capacity: int, head_dim: int,
                 value_dim: int, dtype: torch.dtype):
        super().__init__()
        self.rows, self.capacity = rows, capacity
        for m in range(rows):
            self.register_buffer(f"key_{m}", torch.zeros(
                self.key_shape(kv_heads, capacity, head_dim), dtype=dtype))
            self.register_buffer(f"value_{m}", torch.zeros(
                self.value_shape(kv_heads, capacity, value_dim), dtype=dtype))

    def key(self, m: int) -> Tensor:
        return getattr(self, f"key_{m}")

    def value(self, m: int) -> Tensor:
        return getattr(self, f"value_{m}")

    def buffers_of(self) -> list[Tensor]:
        return [t for m in range(self.rows) for t in (self.key(m), self.value(m))]

    @staticmethod
    def key_shape(kv_heads: int, capacity: int, width: int) -> tuple:
        raise NotImplementedError

    @staticmethod
    def value_shape(kv_heads: int, capacity: int, width: int) -> tuple:
        raise NotImplementedError

    def standard(self, m: int) -> tuple[Tensor, Tensor]:
        """Row m's key and value as the signature holds them, (K, C, H) each."""
        raise NotImplementedError

    def load(self, m: int, key: Tensor, value: Tensor) -> None:
        """Row m's buffers replaced by key, value (K, C, H)."""
        raise NotImplementedError

    def step_row(self, inner: nn.Module, m: int, q: Tensor, k: Tensor, v: Tensor,
                 start: Tensor) -> Tensor:
        """Row m's call: k, v (K, T, H) written at slots start ... start + T - 1 (start (1,)),
        then q (N, T, H) attends over the row's buffers -> (N, T, Hv)."""
        raise NotImplementedError


class AtenRows(CacheRows):
    kernels = "aten"

    @staticmethod
    def key_shape(kv_heads: int, capacity: int, width: int) -> tuple:
        return kv_heads, width, capacity  # (K, H, C): the keys transposed, as bmm reads them

    @staticmethod
    def value_shape(kv_heads: int, capacity: int, width: int) -> tuple:
        return kv_heads, capacity, width  # (K, C, Hv)

    def standard(self, m: int) -> tuple[Tensor, Tensor]:
        return self.key(m).transpose(1, 2), self.value(m)  # (K, C, H), (K, C, Hv)

    def load(self, m: int, key: Tensor, value: Tensor) -> None:
        self.key(m).copy_(key.transpose(1, 2))  # (K, C, H) -> (K, H, C)
        self.value(m).copy_(value)

    def step_row(self, inner: nn.Module, m: int, q: Tensor, k: Tensor, v: Tensor,
                 start: Tensor) -> Tensor:
        keys, values = self.key(m), self.value(m)
        slots = start + torch.arange(k.size(1), device=k.device)  # (T,)
        keys[:, :, slots] = k.transpose(1, 2).contiguous().to(keys.dtype)  # (K, H, T)
        values[:, slots] = v.to(values.dtype)  # (K, T, Hv)
        return grouped_attention(q, keys, values, inner.scoring(), start)


class LlmRows(CacheRows):
    kernels = "llm"

    @staticmethod
    def key_shape(kv_heads: int, capacity: int, width: int) -> tuple:
        return 1, capacity, kv_heads, width  # (1, C, K, H): the kernels' layout

    value_shape = key_shape

    def standard(self, m: int) -> tuple[Tensor, Tensor]:
        return self.key(m)[0].transpose(0, 1), self.value(m)[0].transpose(0, 1)  # (K, C, H)

    def load(self, m: int, key: Tensor, value: Tensor) -> None:
        self.key(m).copy_(key.transpose(0, 1).unsqueeze(0))  # (K, C, H) -> (1, C, K, H)
        self.value(m).copy_(value.transpose(0, 1).unsqueeze(0))

    def step_row(self, inner: nn.Module, m: int, q: Tensor, k: Tensor, v: Tensor,
                 start: Tensor) -> Tensor:
        keys, values = self.key(m), self.value(m)
        t = q.size(1)
        first = start[0].item()  # the kernels take the row's start as a number
        torch._check(first >= 0)
        torch._check(first + t <= self.capacity)
        torch.ops.llama.update_cache(k.transpose(0, 1).unsqueeze(0), keys, first)  # (1,T,K,H)
        torch.ops.llama.update_cache(v.transpose(0, 1).unsqueeze(0), values, first)
        ctx = torch.ops.llama.custom_sdpa(q.transpose(0, 1).unsqueeze(0), keys, values, first,
                                          None, 0.0, True, inner.scale)  # (1, T, N, H)
        return ctx[0].transpose(0, 1)  # (N, T, H)


ROW_KERNELS: dict[str, type[CacheRows]] = {"aten": AtenRows, "llm": LlmRows}
DEFAULT_KERNELS = "aten"


class RowsStep(nn.Module):
    """forward(x (M, T, d), past_lengths (M,)[, position_ids (M, T)]) -> y (M, T, d): the
    static-cache step on all M rows, row m's entries written at past_lengths[m] ... + T - 1."""

    def __init__(self, inner: nn.Module, cache: CacheRows):
        super().__init__()
        self.inner, self.cache = inner, cache

    def forward(self, x: Tensor, past_lengths: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        rows, t = x.size(0), x.size(1)  # rows: static, the cache's M
        slots = past_lengths.view(rows, 1) + torch.arange(t, device=x.device)  # (M, T)
        if position_ids is None:
            position_ids = slots
        q, k, v = self.inner._queries_keys_values(x, position_ids, slots)  # (M, N|K, T, H)
        ctx = [self.cache.step_row(self.inner, m, q[m], k[m], v[m], past_lengths[m:m + 1])
               for m in range(self.cache.rows)]  # (N, T, Hv) each
        return self.inner._output(x, torch.stack(ctx))  # (M, N, T, Hv) -> (M, T, d)


def llm_kernels_refusal(config: MHAConfig) -> Optional[str]:
    """Why ExecuTorch's LLM kernels cannot compute this layer (None: they can): custom_sdpa
    is plain causal attention with one scale, keys and values of one width, over a standard
    layer's cache."""
    if kind_of(config).name != "standard":
        return (f"--kernels llm: ExecuTorch's LLM kernels compute a standard layer's attention, "
                f"not {kind_of(config).summary}")
    lacks = [name for name, on in (
        ("sliding window", config.sliding_window), ("chunked attention",
                                                      config.attention_chunk),
        ("softcapping", config.softcap), ("attention sinks", config.sinks),
        ("ALiBi", config.alibi), ("non-causal attention", not config.causal),
        ("values of another width than keys", config.value_dim != config.head_dim)) if on]
    if lacks:
        return (f"--kernels llm: ExecuTorch's custom_sdpa has no {', '.join(lacks)}; "
                "the default --kernels aten computes this layer")
    return None
