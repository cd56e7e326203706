"""The static cache held inside an ExecuTorch program (ExecuTorch's way for a decode step, as
its llama example does): the key and value buffers are the program's mutable buffers, written
in place, so a step moves no cache tensor across the API. The program's methods:

    forward(x, past_lengths[, position_ids]) -> y   the static-cache step
    get_cache() -> (key_cache, value_cache)         the whole buffers, (M, K, C, H)
    set_cache(key, value) -> ()                     the buffers replaced (a saved session)
    reset_cache() -> ()                             every entry 0

M = the rows (--max-batch), K = cache heads, C = the capacity (max_seq_len), H = width.
The methods share the buffers (MemoryPlanningPass(share_mutable_buffers=True)). A step attends
over all C entries, those past each row's length masked (no size depends on past_lengths'
values): they must be finite, and ExecuTorch leaves a mutable buffer's first contents
unspecified, so an app calls reset_cache (or set_cache) once after loading.

A standard layer's program (executorch_rows.py): M static rows, a buffer pair per row in the
kernel set's layout, read where it lies. Another kind's (Multi-head Latent Attention, whose
cache holds its latent): ``Step`` over (M, K, C, H) buffers, batch dynamic in [1, M], which
ExecuTorch copies on the write and on each slice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ...signature import Signature
from .rows import ROW_KERNELS, CacheRows, RowsStep

METHODS = ("forward", "get_cache", "set_cache", "reset_cache")
BUFFERS = ("key_cache", "value_cache")


@dataclass(frozen=True)
class Method:
    """One method of the program: the module torch.export captures, its example arguments
    and each argument's dynamic axes ({position: axis name})."""

    module: nn.Module
    args: tuple
    dynamic: tuple


class CacheHolder(nn.Module):
    """Holds the buffers under the names every method shares (the same tensors)."""

    def __init__(self, key_cache: Tensor, value_cache: Tensor):
        super().__init__()
        self.register_buffer("key_cache", key_cache)
        self.register_buffer("value_cache", value_cache)


class Step(CacheHolder):
    def __init__(self, inner: nn.Module, key_cache: Tensor, value_cache: Tensor):
        super().__init__(key_cache, value_cache)
        self.inner = inner
        # attention over all C entries, those past each row's length masked: no size depends
        # on past_lengths' values, so XNNPACK takes the attention's matmuls
        inner.whole_buffer = True

    def forward(self, x: Tensor, past_lengths: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        # rows [0, B) of the (M, K, C, H) buffers written and read. ExecuTorch 1.5.1 copies
        # a buffer on the write (index_put, then copy_ back): its reinplace pass makes an
        # index_put_ that its runtime refuses for a (rows, slots) index ("in-place index_put
        # only supports 1-dimensional index tensors")
        y, _, _ = self.inner.forward_static(x, self.key_cache, self.value_cache, past_lengths,
                                            position_ids)
        return y


class TopKStep(Step):
    """A GLM-5 shared-top-k layer's step: its source layer's selection an input."""

    def forward(self, x: Tensor, past_lengths: Tensor, topk_indices: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        y, _, _ = self.inner.forward_static(x, self.key_cache, self.value_cache, past_lengths,
                                            position_ids, topk_indices)
        return y


class Read(CacheHolder):
    def forward(self) -> tuple[Tensor, Tensor]:
        # a self-copy makes the buffers this method's mutable ones, so that it shares the
        # step's (a method that only reads a buffer gets its own constant copy)
        self.key_cache.copy_(self.key_cache)
        self.value_cache.copy_(self.value_cache)
        return self.key_cache.clone(), self.value_cache.clone()


class Write(CacheHolder):
    # its arguments named apart from the buffers (ExecuTorch 1.5.1's passes mix up a user
    # input named as a buffer: "expand a dimension of length M -> B")
    def forward(self, key: Tensor, value: Tensor) -> None:
        self.key_cache[:key.size(0)].copy_(key)  # (B, K, C, H) into (M, K, C, H)
        self.value_cache[:value.size(0)].copy_(value)


class Reset(CacheHolder):
    def forward(self) -> None:
        self.key_cache.zero_()
        self.value_cache.zero_()


class ReadRows(nn.Module):
    def __init__(self, cache: CacheRows):
        super().__init__()
        self.cache = cache

    def forward(self) -> tuple[Tensor, Tensor]:
        for t in self.cache.buffers_of():  # a self-copy: the buffers become this method's
            t.copy_(t)  # mutable ones, shared with the step's (else: a constant copy)
        rows = [self.cache.standard(m) for m in range(self.cache.rows)]
        return (torch.stack([k for k, _ in rows]),  # (M, K, C, H)
                torch.stack([v for _, v in rows]))


class WriteRows(nn.Module):
    def __init__(self, cache: CacheRows):
        super().__init__()
        self.cache = cache

    def forward(self, key: Tensor, value: Tensor) -> None:  # (M, K, C, H) each
        for m in range(self.cache.rows):
            self.cache.load(m, key[m], value[m])


class ResetRows(nn.Module):
    def __init__(self, cache: CacheRows):
        super().__init__()
        self.cache = cache

    def forward(self) -> None:
        for t in self.cache.buffers_of():
            t.zero_()


def cache_methods(inner: nn.Module, sig: Signature, max_batch: int, capacity: int,
                  step_args: tuple, step_dynamic: tuple, kernels: Optional[str] = None
                  ) -> dict[str, Method]:
    """The program's methods over the cache of ``max_batch`` rows of ``capacity`` entries in
    the layer's dtype; ``step_args``/``step_dynamic``: forward's example and axes, in its
    argument order. ``kernels`` (ROW_KERNELS: a standard layer's): M static rows, a buffer
    pair each; None: ``Step`` over one buffer pair, batch dynamic."""
    dtype = next(inner.parameters()).dtype
    if kernels is None:
        return _batch_methods(inner, sig, max_batch, capacity, step_args, step_dynamic, dtype)
    heads, width = sig.cache_buffer("past_key", 1, 1)[1::2]
    value_width = sig.cache_buffer("past_value", 1, 1)[3]
    cache = ROW_KERNELS[kernels](max_batch, heads, capacity, width, value_width, dtype)
    key, value = (torch.zeros(sig.cache_buffer(n, max_batch, capacity), dtype=dtype)
                  for n in ("past_key", "past_value"))
    return {"forward": Method(RowsStep(inner, cache).eval(), step_args, step_dynamic),
            "get_cache": Method(ReadRows(cache), (), ()),
            "set_cache": Method(WriteRows(cache), (key, value), ()),
            "reset_cache": Method(ResetRows(cache), (), ())}


def _batch_methods(inner: nn.Module, sig: Signature, max_batch: int, capacity: int,
                   step_args: tuple, step_dynamic: tuple, dtype: torch.dtype
                   ) -> dict[str, Method]:
    """``Step`` and its methods over (max_batch, K, capacity, H) buffers, batch dynamic."""
    key, value = (torch.zeros(sig.cache_buffer(n, max_batch, capacity), dtype=dtype)
                  for n in ("past_key", "past_value"))
    example = (key[:2].clone(), value[:2].clone())
    step = TopKStep if sig.reads_topk else Step
    return {"forward": Method(step(inner, key, value).eval(), step_args, step_dynamic),
            "get_cache": Method(Read(key, value), (), ()),
            "set_cache": Method(Write(key, value), example, ({0: "batch"}, {0: "batch"})),
            "reset_cache": Method(Reset(key, value), (), ())}


def backend_config(reinplace: bool = False) -> Any:
    """The buffers planned once and shared by every method, their names kept in the program;
    ``reinplace``: a write into a buffer is index_put_ in place (a row's buffers: one index
    over their slot axis; ExecuTorch's runtime refuses it for ``Step``'s (rows, slots))."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False,
                                                share_mutable_buffers=True),
        emit_mutable_buffer_names=True,
        run_reinplace_pass=reinplace)


def cache_record(sig: Signature, max_batch: int, capacity: int, kernels: str = "") -> dict:
    """config.json's export.cache: where the cache lives, the methods that reach it and, a
    standard layer's, the kernel set of its step (executorch_rows.py)."""
    rows = {"rows": max_batch, "kernels": kernels, "layout": "a buffer pair per row"} \
        if kernels else {}
    return {"inside": True, "methods": list(METHODS), **rows,
            "key_cache": list(sig.cache_buffer("past_key", max_batch, capacity)),
            "value_cache": list(sig.cache_buffer("past_value", max_batch, capacity)),
            "initial": "unspecified: call reset_cache or set_cache after loading"}
