"""An int8 static KV cache as a lossy step (lossy/base.py): the buffers hold int8 codes,
quantized on write with static scales and dequantized on read (codes.py)."""
from __future__ import annotations

from typing import Any

from ...signature import INT8
from ..base import LossyStep
from .codes import INT8_CACHE_TAG, KVCacheSpec


class Int8Cache(LossyStep):
    name = "int8-cache"
    record_key = "kv_cache"
    target_option = "kv_cache"
    signature_dtype = INT8

    def from_record(self, record: dict) -> Any:
        return KVCacheSpec.from_dict(record)

    def validate(self, export: dict, config: Any, signature: Any) -> None:
        """The record must fit the layer and agree with the declared buffers."""
        spec = self.spec(export)
        if (spec is not None) != (signature.cache_dtype == INT8):
            raise ValueError("export.kv_cache and the declared cache dtype disagree")
        if spec is not None and not all(s.fits(config.kv_heads, config.head_dim)
                                        for s in (spec.key, spec.value)):
            raise ValueError("the int8 cache's scales do not fit kv_heads x head_dim")

    def reference(self, module: Any, spec: KVCacheSpec, export: dict) -> Any:
        """The layer quantizing on write and dequantizing on read with the recorded scales."""
        import torch
        return module.use_int8_cache(torch.from_numpy(spec.key.scale),
                                     torch.from_numpy(spec.value.scale))

    def tag(self, spec: Any) -> str:
        return INT8_CACHE_TAG


STEP = Int8Cache()
