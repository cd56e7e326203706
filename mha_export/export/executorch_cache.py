"""The static cache held inside an ExecuTorch program (ExecuTorch's way for a decode step, as
its llama example does): the key and value buffers are the program's mutable buffers, written
in place, so a step moves no cache tensor across the API. The program's methods:

    forward(x, past_lengths[, position_ids]) -> y      the static-cache step on rows [0, B)
    read_cache()  -> (key_cache, value_cache)          the whole buffers, (M, K, C, H)
    write_cache(key, value) -> ()                      rows [0, B) replaced (a saved session)
    reset_cache() -> ()                                every entry 0

M = the batch bound (--max-batch), K = cache heads, C = the capacity (max_seq_len), H = width.
The methods share the buffers (MemoryPlanningPass(share_mutable_buffers=True)); ExecuTorch
leaves a mutable buffer's first contents unspecified, so an app calls reset_cache (or
write_cache) once after loading: a ragged batch's step reads entries past a short row's
length (masked, but a NaN there would still reach y).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..signature import Signature

METHODS = ("forward", "read_cache", "write_cache", "reset_cache")
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

    def forward(self, x: Tensor, past_lengths: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        b = x.size(0)  # rows [0, B) of the buffers: (B, K, C, H) views, written in place
        y, _, _ = self.inner.forward_static(x, self.key_cache[:b], self.value_cache[:b],
                                            past_lengths, position_ids)
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


def cache_methods(inner: nn.Module, sig: Signature, max_batch: int, capacity: int,
                  step_args: tuple, step_dynamic: tuple) -> dict[str, Method]:
    """The program's methods over buffers (max_batch, K, capacity, H) in the layer's dtype;
    ``step_args``/``step_dynamic``: forward's example and axes, in its argument order."""
    dtype = next(inner.parameters()).dtype
    key, value = (torch.zeros(sig.cache_buffer(n, max_batch, capacity), dtype=dtype)
                  for n in ("past_key", "past_value"))
    example = (key[:2].clone(), value[:2].clone())
    return {"forward": Method(Step(inner, key, value).eval(), step_args, step_dynamic),
            "read_cache": Method(Read(key, value), (), ()),
            "write_cache": Method(Write(key, value), example, ({0: "batch"}, {0: "batch"})),
            "reset_cache": Method(Reset(key, value), (), ())}


def backend_config() -> Any:
    """The buffers planned once and shared by every method, their names kept in the program."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False,
                                                share_mutable_buffers=True),
        emit_mutable_buffer_names=True)


def cache_record(sig: Signature, max_batch: int, capacity: int) -> dict:
    """config.json's export.cache: where the cache lives and the methods that reach it."""
    return {"inside": True, "methods": list(METHODS),
            "key_cache": list(sig.cache_buffer("past_key", max_batch, capacity)),
            "value_cache": list(sig.cache_buffer("past_value", max_batch, capacity)),
            "initial": "unspecified: call reset_cache or write_cache after loading"}
