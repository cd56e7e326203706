"""Export: the eager module (weights/source.py) -> an artifact folder, written through a staging
folder that replaces the destination in one rename (artifact.py), so that a failed or interrupted
export leaves nothing behind. Unless ``validate=False`` the parity check (check/) runs on the
staged folder before it is published. Each export declares its named inputs/outputs
(``signature.Signature``) in config.json; what differs per file format is an export target
(targets.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..artifact import CONFIG_FILE, REPORT_FILE, WEIGHTS_FILE, default_folder, staged_folder, \
    write_json_atomic
from ..config import MHAConfig
from ..env import utc_now, versions
from ..errors import UsageError
from ..kinds.registry import FORMS, refuse_unbuilt
from ..signature import (FLOAT, INT8, INT8_FLOAT32_ONLY, STATIC, Signature, make_signature,
                         signature_kind)
from ..weights.files import save_weights
from ..lossy.int8_cache.calibration import calibrate_cache
from ..lossy.int8_cache.codes import CACHE_DTYPES, VALUE_SCALE, KVCacheSpec
from ..lossy.projections.rtn import QuantSpec
from ..lossy.projections.source import SOURCE, SourceQuantSpec, kept_quantization
from ..weights.source import Source, load_source
from .base import ExportTarget
from .targets import TARGETS

ATTENTION_FORMS = tuple(FORMS)


@dataclass
class ExportResult:
    path: Path
    report: Optional[Any] = None  # mha_export.check.parity.CheckReport when validated

    @property
    def passed(self) -> bool:
        return self.report is None or self.report.passed


def export_artifact(target: str, config: Optional[MHAConfig] = None,
                    output: str | Path | None = None, *, weights: str | Path | None = None,
                    layer: Optional[int] = None, seed: int = 0, kv_cache: bool = False,
                    attention_mask: bool = False, static_cache: bool = False,
                    force: bool = False, validate: bool = True,
                    quantize: Optional[QuantSpec] = None, kv_cache_dtype: str = "float",
                    calibration: str | Path | None = None, value_scale: str = VALUE_SCALE,
                    check_options: Optional[dict] = None,
                    target_options: Optional[dict] = None, **config_fields) -> ExportResult:
    """Write DIR/<the target's model file> + config.json + weights.safetensors (+ parity.json).

    Pass an MHAConfig or its fields as keywords (heads=12, dim=768, ...), as on the CLI.
    ``kv_cache``: the decode-step model (x, attention_mask, past_key, past_value -> y,
    present_key, present_value); ``static_cache``: the decode-step model over an app-owned
    buffer written in place (x, past_key, past_value, past_lengths -> y, present_key,
    present_value); ``attention_mask``: the full-sequence model with a padding mask.
    ``quantize``: weight-only quantized projections (``QuantSpec``; the ONNX target only).
    ``kv_cache_dtype`` "int8" (with ``static_cache``): the buffers hold int8 codes, with static
    scales calibrated on ``calibration`` (hidden states [n, T, d_in], .npy / .safetensors) or on
    synthetic inputs; values scaled per ``value_scale`` ("channel" | "tensor")."""
    chosen = TARGETS[target]
    options = dict(target_options or {})
    if quantize is not None:
        if chosen.quantize_refusal:
            raise UsageError(chosen.quantize_refusal)
        options["quant"] = quantize
    kind = signature_kind(kv_cache, attention_mask, static_cache)
    int8_cache = _int8_cache_requested(chosen, kind, kv_cache_dtype, calibration,
                                       options.get("dtype", "float32"))
    source = load_source(config, weights, layer, seed, config_fields)
    if int8_cache:
        refuse_unbuilt(source.config, "int8-cache")
    if quantize is not None and quantize.quantizer == SOURCE:
        quantize = kept_blocks(source, quantize, options.get("dtype", "float32"))
        options["quant"] = quantize
    if int8_cache:
        options["kv_cache"] = _calibrated(source, quantize, calibration, value_scale, seed)
    sig = make_signature(source.config, kind, INT8 if int8_cache else FLOAT)
    prepared = chosen.prepare(source.module, source.config, sig, **options)
    meta = _describe(source, sig, target, prepared.export)
    dest = Path(output) if output is not None else default_folder(
        source.config, target, sig.kind,
        specs={"quantize": quantize, "int8-cache": options.get("kv_cache")})
    report = None
    with staged_folder(dest, force) as stage:
        save_weights(source.module, stage / WEIGHTS_FILE)
        prepared.write(stage / chosen.model_file)
        write_json_atomic(stage / CONFIG_FILE, meta)
        if validate:
            from ..check.parity import check_parity  # export -> check, never the other way round
            report = check_parity(stage, **(check_options or {}))
            report.artifact = str(dest)
            write_json_atomic(stage / REPORT_FILE, report.to_dict())
    return ExportResult(dest, report)


def _int8_cache_requested(target: ExportTarget, kind: str, cache_dtype: str,
                          calibration: str | Path | None, dtype: str) -> bool:
    """Whether an int8 cache was asked for: it needs the static cache, a float32 model and a
    target that writes it; a calibration file without it is a mistake, said before any work."""
    if cache_dtype not in CACHE_DTYPES:
        raise UsageError(f"unknown --kv-cache-dtype {cache_dtype!r}: choose one of "
                         f"{', '.join(CACHE_DTYPES)}")
    if cache_dtype != INT8:
        if calibration is not None:
            raise UsageError("--calibration needs --kv-cache-dtype int8")
        return False
    if target.int8_cache_refusal:
        raise UsageError(target.int8_cache_refusal)
    if kind != STATIC:
        raise UsageError("--kv-cache-dtype int8 needs --static-cache: the int8 buffers are "
                         "written in place; the growing --kv-cache model would re-quantize "
                         "(or copy) its whole cache every step")
    if dtype != "float32":
        raise UsageError(INT8_FLOAT32_ONLY.format(dtype=dtype))
    return True


def kept_blocks(source: Source, spec: SourceQuantSpec, dtype: str) -> SourceQuantSpec:
    """--quantize source: the GGUF layer's own blocks, for the projections of its own layout."""
    where = source.description
    if where.get("kind") != "gguf":
        raise UsageError("--quantize source keeps a GGUF file's own quantized blocks: it needs "
                         "--weights FILE.gguf")
    if source.config.layout != "split":
        raise UsageError("--quantize source keeps the checkpoint's own projections: export "
                         "them in its layout (split)")
    if dtype != "float32":
        raise UsageError("--quantize source is float32 only (the GGUF's scales as it stores "
                         "them, in float32 arithmetic)")
    kept = kept_quantization(where["path"], where["layer"], source.config, spec.accuracy_level)
    if not kept.projections:
        raise UsageError(f"--quantize source: {where['path']} stores layer {where['layer']}'s "
                         "projections as floats: nothing to keep (leave out --quantize)")
    return kept


def _calibrated(source: Source, quantize: Optional[QuantSpec], calibration, value_scale: str,
                seed: int) -> KVCacheSpec:
    """Scales calibrated on the function the file will hold (dequantized projections)."""
    module = source.module
    if quantize is not None:
        from ..lossy.projections.reference import reference_module
        module = reference_module(module, quantize)
    return calibrate_cache(module.eval(), calibration, value_scale, seed,
                           layer=source.description.get("layer"))


def _describe(source: Source, sig: Signature, target: str, export: dict) -> dict:
    return {"format": target, "config": source.config.to_dict(), "export": export,
            "io": sig.to_dict(), "weights": {"file": WEIGHTS_FILE, "source": source.description},
            "seq_len_policy": ("any T >= 1 is supported: the causal mask is built from the runtime "
                               "length; max_seq_len is the context length checked by default"),
            "versions": versions(), "created": utc_now()}


def export_onnx(config: Optional[MHAConfig] = None, output: str | Path | None = None, *,
                attention: Optional[str] = None, opset: Optional[int] = None,
                dtype: str = "float32", **options) -> ExportResult:
    """Write DIR/model.onnx with one graph form's attention core (default: ``auto``, or a
    memory-linear form that can build the layer) at an exact opset (the form's lowest by
    default); ``options`` as ``export_artifact``'s (``quantize=QuantSpec(bits=4)``: the
    projections as int4 MatMulNBits)."""
    return export_artifact("onnx", config, output, target_options=dict(
        attention=attention, opset=opset, dtype=dtype), **options)


def export_torchscript(config: Optional[MHAConfig] = None, output: str | Path | None = None,
                       **options) -> ExportResult:
    """Write DIR/model.pt (torch.jit.script: loads with torch.jit.load and libtorch); its
    forward takes the signature's inputs positionally, in the declared order."""
    return export_artifact("torchscript", config, output, **options)


def export_aoti(config: Optional[MHAConfig] = None, output: str | Path | None = None, *,
                device: str = "cpu", **options) -> ExportResult:
    """Write DIR/model.pt2: the torch.export'ed entry point compiled by AOTInductor (loads
    with torch._inductor.aoti_load_package and in C++); batch, seq and cache lengths dynamic."""
    return export_artifact("aoti", config, output, target_options=dict(device=device), **options)
