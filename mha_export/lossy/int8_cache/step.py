"""An int8 static KV cache as a lossy step (lossy/base.py): the buffers hold int8 codes,
quantized on write with static scales and dequantized on read (codes.py). Its hooks: the CLI's
--kv-cache-dtype options, the export's request (a static float32 cache) and scales (calibrated
on the function the file will hold), the signature's int8 buffers, the graph's scales, the
record in config.json, the function the file holds."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import click

from ...errors import UsageError
from ...signature import INT8, INT8_FLOAT32_ONLY, STATIC
from ..base import LossyStep
from .calibration import calibrate_cache
from .codes import CACHE_DTYPES, GRANULARITIES, INT8_CACHE_TAG, VALUE_SCALE, KVCacheSpec

@dataclass(frozen=True)
class Request:
    """An int8 cache as asked for: where its scales come from."""

    calibration: Optional[str | Path]  # hidden states [n, T, d_in]; None: synthetic inputs
    value_scale: str  # "channel" | "tensor"


class Int8Cache(LossyStep):
    name = "int8-cache"
    label = "int8 cache"
    record_key = "kv_cache"
    signature_dtype = INT8
    # The eager module holds the int8 cache's function (layer/base.py), but no torch program
    # target is proven to write the codes in place and read them dequantized at speed:
    # refused, not guessed.
    unbuilt = ("--kv-cache-dtype int8 is ONNX-only (ONNX Runtime's GroupQueryAttention and "
               "standard ops); {title} exports the float cache: use `mha-export onnx "
               "--static-cache --kv-cache-dtype int8`")

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
        """The layer quantizing on write and dequantizing on read with the recorded scales (a
        copy: the module given stays a float-cache layer)."""
        import copy

        import torch
        return copy.deepcopy(module).use_int8_cache(torch.from_numpy(spec.key.scale),
                                     torch.from_numpy(spec.value.scale))

    def tag(self, spec: Any) -> str:
        return INT8_CACHE_TAG

    def options(self) -> list[Callable]:
        return [
            click.option("--kv-cache-dtype", type=click.Choice(CACHE_DTYPES), default="float",
                         show_default=True,
                         help="With --static-cache: int8 = the buffers hold int8 codes, "
                              "quantized on write with static scales (round half to even, "
                              "clipped) and dequantized on read (ONNX only; docs/kv-cache.md)."),
            click.option("--calibration", type=click.Path(dir_okay=False), default=None,
                         help="int8 cache: hidden states [n, T, d_in] (.npy or .safetensors) "
                              "to calibrate the scales on [default: synthetic random inputs, "
                              "and the check's report says so]."),
            click.option("--value-scale", type=click.Choice(tuple(GRANULARITIES)),
                         default=VALUE_SCALE, show_default=True,
                         help="int8 cache: one scale per value channel, or one for all values "
                              "(keys: always per channel)."),
        ]

    def from_cli(self, kw: dict) -> dict:
        if "value_scale" in kw and kw.get("kv_cache_dtype") != INT8:
            raise UsageError("--value-scale needs --kv-cache-dtype int8")
        return kw

    def request(self, kw: dict, target: Any, kind: str, dtype: str) -> Optional[Request]:
        """It needs the static cache, a float32 model and a target that writes it; a
        calibration file without it is a mistake, said before any work."""
        cache_dtype = kw.pop("kv_cache_dtype", "float")
        wanted = Request(kw.pop("calibration", None), kw.pop("value_scale", VALUE_SCALE))
        if cache_dtype not in CACHE_DTYPES:
            raise UsageError(f"unknown --kv-cache-dtype {cache_dtype!r}: choose one of "
                             f"{', '.join(CACHE_DTYPES)}")
        if cache_dtype != INT8:
            if wanted.calibration is not None:
                raise UsageError("--calibration needs --kv-cache-dtype int8")
            return None
        target.refuse_lossy(self.name, wanted, self.unbuilt)
        if kind != STATIC:
            raise UsageError("--kv-cache-dtype int8 needs --static-cache: the int8 buffers are "
                             "written in place; the growing --kv-cache model would re-quantize "
                             "(or copy) its whole cache every step")
        if dtype != "float32":
            raise UsageError(INT8_FLOAT32_ONLY.format(dtype=dtype))
        return wanted

    def prepare(self, source: Any, wanted: Request, held: Any, seed: int,
                dtype: str) -> KVCacheSpec:
        """Scales calibrated on the function the file will hold (``held``: the steps before it
        applied, e.g. dequantized projections)."""
        return calibrate_cache(held.eval(), wanted.calibration, wanted.value_scale, seed,
                               layer=source.description.get("layer"))

    def graph_args(self, spec: KVCacheSpec) -> dict:
        return {"kv_cache": spec}

    def record(self, spec: KVCacheSpec, config: Any) -> dict:
        return spec.to_dict()

    def api_keys(self) -> tuple[str, ...]:
        return ("kv_cache_dtype", "calibration", "value_scale")

    def files(self, options: dict) -> dict[str, Any]:
        return {"calibration": options.get("calibration")}

    def asked(self, options: dict) -> bool:
        return options.get("kv_cache_dtype") == INT8

    def cache_entry_bytes(self) -> int:
        return 1


STEP = Int8Cache()
