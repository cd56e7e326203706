"""Export: the eager module (weights/source.py) -> an artifact folder, written through a staging
folder that replaces the destination in one rename (artifact.py), so that a failed or interrupted
export leaves nothing behind. Unless ``validate=False`` the parity check (check/) runs on the
staged folder before it is published. Each export declares its named inputs/outputs
(``signature.Signature``) in config.json; what differs per file format is an export target
(targets/).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..address import Address
from ..artifact import (CONFIG_FILE, REPORT_FILE, WEIGHTS_FILE, check_destination,
                        default_folder, staged_folder, write_json_atomic)
from ..check.sweep import require_runnable
from ..config import MHAConfig
from ..env import utc_now, versions
from ..errors import UsageError, stage
from ..kinds.registry import FORMS, kind_of
from ..lossy import registry as lossy
from ..signature import FLOAT, Signature, make_signature, signature_kind
from ..weights.files import save_weights
from ..weights.source import Source, load_source
from ..targets.base import ExportTarget, refuse_lacking
from ..targets.registry import TARGETS

ATTENTION_FORMS = tuple(FORMS)


@dataclass
class ExportResult:
    """The folder written and its export-time check (``passed``: no check, or it passed)."""

    path: Path
    report: Optional[Any] = None  # mha_export.check.parity.CheckReport when validated

    @property
    def passed(self) -> bool:
        return self.report is None or self.report.passed


def export_artifact(target: str, config: Optional[MHAConfig] = None,
                    output: str | Path | None = None, *, weights: str | Path | None = None,
                    layer: Optional[Address] = None, seed: int = 0, kv_cache: bool = False,
                    attention_mask: bool = False, static_cache: bool = False,
                    force: bool = False, validate: bool = True,
                    check_options: Optional[dict] = None,
                    target_options: Optional[dict] = None, **fields) -> ExportResult:
    """Write DIR/<the target's model file> + config.json + weights.safetensors (+ parity.json).

    Pass an MHAConfig or its fields as keywords (heads=12, dim=768, ...), as on the CLI.
    ``kv_cache``: the decode-step model (x, attention_mask, past_key, past_value -> y,
    present_key, present_value); ``static_cache``: the decode-step model over an app-owned
    buffer written in place (x, past_key, past_value, past_lengths -> y, present_key,
    present_value); ``attention_mask``: the full-sequence model with a padding mask.
    The lossy steps' keywords (lossy/): ``quantize``: weight-only quantized projections
    (``QuantSpec``; the ONNX target only); ``kv_cache_dtype`` "int8" (with ``static_cache``):
    the buffers hold int8 codes, with static scales calibrated on ``calibration`` (hidden
    states [n, T, d_in], .npy / .safetensors) or on synthetic inputs; values scaled per
    ``value_scale`` ("channel" | "tensor")."""
    asked = checked_request(target, config, weights=weights, layer=layer, seed=seed,
                            kv_cache=kv_cache, attention_mask=attention_mask,
                            static_cache=static_cache, target_options=target_options,
                            check_options=(check_options or {}) if validate else None, **fields)
    chosen, source, options = asked.target, asked.source, asked.options
    specs = lossy.prepared(source, asked.steps, seed, asked.dtype)
    sig = make_signature(source.config, asked.kind, lossy.cache_dtype(specs, FLOAT))
    dest = Path(output) if output is not None else default_folder(
        source.config, target, asked.kind, specs=specs,  # the call's (sig.kind: the layer's)
        tag=chosen.folder_tag(source.config, sig, **options))
    check_destination(dest, force)
    require_installed(chosen)  # last: its libraries' import alone can take seconds
    what = f"{target} export of {source.config.slug()}" + (
        f", layer {layer}" if layer is not None else "")
    with stage(f"{what}: {chosen.stages[0]}"):
        prepared = chosen.prepare(source.module, source.config, sig, specs=specs, **options)
    meta = _describe(source, sig, target, prepared.export)
    report = None
    with staged_folder(dest, force) as folder:
        save_weights(source.module, folder / WEIGHTS_FILE)
        with stage(f"{what}: {chosen.stages[1]}"):
            prepared.write(folder / chosen.model_file)
        write_json_atomic(folder / CONFIG_FILE, meta)
        if validate:
            from ..check.parity import check_parity  # export -> check, never the other way round
            report = check_parity(folder, **{"sweep": "quick", **(check_options or {})})
            report.artifact = str(dest)
            write_json_atomic(folder / REPORT_FILE, report.to_dict())
    return ExportResult(dest, report)


@dataclass(frozen=True)
class Request:
    """An export asked for, checked: nothing of it is built yet."""

    target: ExportTarget
    kind: str  # the call: signature.signature_kind's
    steps: dict[str, Any]  # the lossy steps asked for, by name (lossy.requested's)
    source: Source  # the layer: its eager module and config
    options: dict[str, Any]  # the target's own (ONNX: attention, opset, dtype)

    @property
    def dtype(self) -> str:
        return self.options.get("dtype", "float32")


def checked_request(target: str, config: Optional[MHAConfig] = None, *,
                    weights: str | Path | None = None, layer: Optional[Address] = None,
                    seed: int = 0, kv_cache: bool = False, attention_mask: bool = False,
                    static_cache: bool = False, target_options: Optional[dict] = None,
                    check_options: Optional[dict] = None, **fields) -> Request:
    """What ``export_artifact`` with these keywords refuses, refused before any work: the lossy
    steps' options for this target, call kind and layer, config fields the checkpoint
    contradicts, the target's own options (an opset the form cannot be written in, ...), the
    check's lengths (``check_options``) that the call or the file's bounds cannot take. The
    layer's source is loaded; nothing is built, and the target's libraries are not asked for
    (``require_installed``)."""
    chosen, options = TARGETS[target], dict(target_options or {})
    kind = signature_kind(kv_cache, attention_mask, static_cache)
    steps = lossy.requested(fields, chosen, kind, options.get("dtype", "float32"))
    source = load_source(config, weights, layer, seed, fields)
    lossy.refuse_unbuilt(source.config, steps)
    layer_kind, c = kind_of(source.config), source.config
    refuse_lacking({**layer_kind.needs(c), **layer_kind.call_needs(c, kind)}, chosen.title,
                   chosen.lacks)
    sig = make_signature(source.config, kind, lossy.cache_dtype(steps, FLOAT))
    chosen.check(source.config, sig, specs=steps, **options)
    if check_options is not None:
        require_runnable(sig, chosen.bounds(source.config, sig, **options),
                         *(check_options.get(k) for k in ("seq_lens", "batch_sizes",
                                                          "past_lens")))
    return Request(chosen, kind, steps, source, options)


def require_installed(target: ExportTarget) -> None:
    """The target's libraries, where they are an extra: one line naming the install."""
    if why := target.missing():
        raise UsageError(why)


def checked_export(target: str, check_options: Optional[dict] = None, **options) -> Request:
    """``export_to(target, **options)``'s request, checked (``checked_request``, and the
    target's libraries installed): a fan-out's preflight, so that what every layer's export
    would refuse is one error before any work."""
    asked = checked_request(target, target_options=TARGETS[target].own(options),
                            check_options=check_options, **options)
    require_installed(asked.target)
    return asked


def _describe(source: Source, sig: Signature, target: str, export: dict) -> dict:
    return {"format": target, "config": source.config.to_dict(), "export": export,
            "io": sig.to_dict(), "weights": {"file": WEIGHTS_FILE, "source": source.description},
            "seq_len_policy": ("any T >= 1 is supported: the causal mask is built from the runtime "
                               "length; max_seq_len is the context length checked by default"),
            "versions": versions(), "created": utc_now()}


def export_to(target: str, config: Optional[MHAConfig] = None,
              output: str | Path | None = None, **options) -> ExportResult:
    """Write DIR/<the target's model file> (targets/registry.py's TARGETS: "onnx",
    "torchscript", "aoti", "executorch"): ``export_artifact`` with the target's own options
    (its record's ``options``) passed as keywords beside the others:

    - onnx: ``attention`` (the graph form; default ``auto``, or a memory-linear form that can
      build the layer), ``opset`` (exact; the form's lowest by default), ``dtype`` ("float32",
      "float16", "bfloat16"); ``quantize=QuantSpec(bits=4)``: the projections as int4
      MatMulNBits;
    - torchscript: none (model.pt, torch.jit.script; its forward takes the signature's inputs
      positionally, in the declared order);
    - aoti: ``device`` ("cpu", "cuda"): model.pt2 compiled by AOTInductor, batch, seq and
      cache lengths dynamic;
    - executorch: ``backend`` ("xnnpack", "portable"), ``max_batch`` (the batch bound,
      default 4; a static cache's rows, default 1), ``kernels`` ("aten", "llm": a static
      cache's step on ExecuTorch's LLM kernels): model.pte, seq in [1, max_seq_len]."""
    if target not in TARGETS:
        raise UsageError(f"unknown export target {target!r}: choose one of {', '.join(TARGETS)}")
    own = TARGETS[target].own(options)
    return export_artifact(target, config, output, target_options=own or None, **options)
