"""Quantized Hugging Face checkpoints: one record per format (its quantization_config's
quant_method), each decoding a module's tensors into the codes, scales and zero points it
stores (base.py) — the function the checkpoint holds, and what ``--quantize source`` keeps."""
from __future__ import annotations

from ...errors import UsageError
from . import awq, compressed, fp8, gptq
from .base import FLOAT8, INT_GROUPS, Decoded, Float8Blocks, IntGroups, QuantFormat

FORMATS: dict[str, QuantFormat] = {f.method: f for f in (gptq.FORMAT, awq.FORMAT,
                                                         compressed.FORMAT, fp8.FORMAT)}


def checkpoint_format(qcfg: object, where: str) -> QuantFormat | None:
    """The format of a config.json's quantization_config (None: not quantized); an unknown
    method or a variant without an exact form is one line."""
    if not qcfg:
        return None
    method = qcfg.get("quant_method") if isinstance(qcfg, dict) else None
    fmt = FORMATS.get(method)
    if fmt is None:
        raise UsageError(f"{where}: quantization_config quant_method {method!r} is not read "
                         f"({', '.join(FORMATS)} are)")
    try:
        fmt.check(qcfg)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return fmt


__all__ = ["FLOAT8", "FORMATS", "INT_GROUPS", "Decoded", "Float8Blocks", "IntGroups", "QuantFormat",
           "checkpoint_format"]
