"""Export: config + weights -> an artifact folder holding model.onnx or model.pt.

Export and validation are separate: ``export_onnx`` / ``export_torchscript`` write the folder
and, unless ``check=False``, call :func:`mha_export.parity.check` on it before it is published.
"""
from __future__ import annotations

import datetime
import json
import platform
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import onnx
import torch

from . import onnx_graph
from .artifact import (CONFIG_FILE, MODEL_FILES, REPORT_FILE, WEIGHTS_FILE, default_folder,
                       staged_folder, write_json_atomic)
from .config import MHAConfig
from .errors import UsageError
from .model import AttentionBase, build_module
from .weights import detect_file_layout, load_module, save_weights

PROTOBUF_LIMIT = 2**31 - 2**26  # 2 GiB less a margin for the graph itself
ATTENTION_FORMS = tuple(onnx_graph.CORES)
DTYPES = tuple(onnx_graph.ONNX_DTYPES)


@dataclass
class ExportResult:
    path: Path
    report: Optional[Any] = None  # mha_export.parity.CheckReport when the export ran the check

    @property
    def passed(self) -> bool:
        return self.report is None or self.report.passed


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("mha-export", "torch", "onnx", "onnxruntime-gpu", "onnxruntime", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def source_module(config: MHAConfig, weights: str | Path | None = None,
                  layer: Optional[int] = None, seed: int = 0) -> tuple[AttentionBase, dict]:
    """The eager module to export and a description of where its weights came from."""
    if weights is None:
        if layer is not None:
            raise UsageError("--layer needs --weights")
        return build_module(config, seed=seed), {"kind": "random", "seed": seed}
    return load_module(config, weights, layer), {"kind": "file", "file": str(weights),
                                                  "layer": layer}


def resolve_config(config: Optional[MHAConfig], weights: str | Path | None,
                   layer: Optional[int], fields: dict) -> MHAConfig:
    """The config given, or one built from CLI-style fields. Without a layout, the weights
    file's layout is kept (split for random weights)."""
    if config is not None:
        if fields:
            raise UsageError("pass either a config or config fields, not both")
        return config
    if fields.get("layout") is None:
        fields = {**fields, "layout": detect_file_layout(weights, layer) if weights else "split"}
    return MHAConfig(**fields)


def resolve_opset(form: str, opset: Optional[int]) -> int:
    if form not in onnx_graph.CORES:
        raise UsageError(f"unknown attention form {form!r}: choose one of {', '.join(ATTENTION_FORMS)}")
    if opset is None:
        return onnx_graph.MIN_OPSET[form]  # default: the form's lowest
    lo, hi = onnx_graph.MIN_OPSET[form], onnx_graph.MAX_OPSET
    if not lo <= opset <= hi:
        raise UsageError(f"opset {opset} cannot be produced for attention form {form!r} "
                         f"(supported: {lo}-{hi})")
    return opset


def _describe(config: MHAConfig, fmt: str, export: dict, source: dict) -> dict:
    io = {"inputs": [{"name": onnx_graph.INPUT, "shape": ["batch", "seq", config.d_in]}],
          "outputs": [{"name": onnx_graph.OUTPUT, "shape": ["batch", "seq", config.dim]}],
          "dynamic_axes": onnx_graph.DYNAMIC_AXES}
    return {"format": fmt, "config": config.to_dict(), "export": export, "io": io,
            "weights": {"file": WEIGHTS_FILE, "source": source},
            "seq_len_policy": ("any T >= 1 is supported: the causal mask is built from the runtime "
                               "length; max_seq_len is the context length checked by default"),
            "versions": versions(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _publish(config: MHAConfig, fmt: str, output: str | Path | None, force: bool,
             module: AttentionBase, meta: dict, write_model, check: bool,
             check_options: Optional[dict]) -> ExportResult:
    dest = Path(output) if output is not None else default_folder(config, fmt)
    report = None
    with staged_folder(dest, force) as stage:
        save_weights(module, stage / WEIGHTS_FILE)
        write_model(stage / MODEL_FILES[fmt])
        write_json_atomic(stage / CONFIG_FILE, meta)
        if check:
            from .parity import check as run_check
            report = run_check(stage, **(check_options or {}))
            report.artifact = str(dest)
            write_json_atomic(stage / REPORT_FILE, report.to_dict())
    return ExportResult(dest, report)


def export_onnx(config: Optional[MHAConfig] = None, output: str | Path | None = None, *,
                weights: str | Path | None = None, layer: Optional[int] = None, seed: int = 0,
                attention: str = "auto", opset: Optional[int] = None,
                dtype: str = "float32", force: bool = False, check: bool = True,
                check_options: Optional[dict] = None, **config_fields) -> ExportResult:
    """Write DIR/model.onnx (+ config.json, weights.safetensors, parity.json).

    Pass an MHAConfig or its fields as keywords (heads=12, dim=768, ...), as on the CLI."""
    config = resolve_config(config, weights, layer, config_fields)
    opset = resolve_opset(attention, opset)
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    module, source = source_module(config, weights, layer, seed)
    export = {"file": MODEL_FILES["onnx"], "opset": opset, "attention": attention, "dtype": dtype}
    props = {"mha_export.config": json.dumps(config.to_dict()),
             "mha_export.export": json.dumps(export),
             "mha_export.dynamic_axes": json.dumps(onnx_graph.DYNAMIC_AXES)}
    model = onnx_graph.build_model(config, module.to_weights(), attention, opset, dtype, props)
    external = sum(len(t.raw_data) for t in model.graph.initializer) > PROTOBUF_LIMIT
    meta = _describe(config, "onnx", {**export, "external_data": external}, source)

    def write_model(path: Path) -> None:
        if external:  # beyond protobuf's 2 GB: weights in model.onnx.data beside it
            onnx.save_model(model, str(path), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=path.name + ".data")
            onnx.checker.check_model(str(path), full_check=True)
        else:
            onnx.checker.check_model(model, full_check=True)
            onnx.save_model(model, str(path))

    return _publish(config, "onnx", output, force, module, meta, write_model, check,
                    check_options)


def export_torchscript(config: Optional[MHAConfig] = None, output: str | Path | None = None, *,
                       weights: str | Path | None = None, layer: Optional[int] = None,
                       seed: int = 0, force: bool = False, check: bool = True,
                       check_options: Optional[dict] = None, **config_fields) -> ExportResult:
    """Write DIR/model.pt (torch.jit.script: loads with torch.jit.load and libtorch)."""
    config = resolve_config(config, weights, layer, config_fields)
    module, source = source_module(config, weights, layer, seed)
    meta = _describe(config, "torchscript", {"file": MODEL_FILES["torchscript"],
                                             "method": "torch.jit.script"}, source)

    def write_model(path: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.jit.script(module).save(str(path))

    return _publish(config, "torchscript", output, force, module, meta, write_model, check,
                    check_options)
