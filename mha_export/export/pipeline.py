"""Export: config + weights -> an artifact folder holding model.onnx or model.pt.

Export and validation are separate: ``export_onnx`` / ``export_torchscript`` write the folder
and, unless ``validate=False``, run :func:`mha_export.parity.check_parity` on it before it is
published. Each export declares its named inputs/outputs (``signature.Signature``) in config.json.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import onnx
import torch

from ..graph import forms
from ..artifact import (CONFIG_FILE, MODEL_FILES, REPORT_FILE, WEIGHTS_FILE, default_folder,
                       staged_folder, write_json_atomic)
from ..config import MHAConfig
from ..env import utc_now, versions
from ..errors import UsageError
from ..layer.entry import entry_module
from ..weights.huggingface import hf_config_path, merge_fields, read_layer
from ..layer.layouts import AttentionBase, build_module, convert
from ..graph.model import build_model
from ..signature import Signature, make_signature, signature_kind
from ..weights.files import detect_file_layout, load_module, load_strict, save_weights

PROTOBUF_LIMIT = 2**31 - 2**26  # 2 GiB less a margin for the graph itself
ATTENTION_FORMS = tuple(forms.FORMS)


@dataclass
class ExportResult:
    path: Path
    report: Optional[Any] = None  # mha_export.parity.CheckReport when the export was validated

    @property
    def passed(self) -> bool:
        return self.report is None or self.report.passed


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


def _describe(config: MHAConfig, sig: Signature, fmt: str, export: dict, source: dict) -> dict:
    return {"format": fmt, "config": config.to_dict(), "export": export, "io": sig.to_dict(),
            "weights": {"file": WEIGHTS_FILE, "source": source},
            "seq_len_policy": ("any T >= 1 is supported: the causal mask is built from the runtime "
                               "length; max_seq_len is the context length checked by default"),
            "versions": versions(), "created": utc_now()}


def _publish(config: MHAConfig, fmt: str, output: str | Path | None, force: bool,
             module: AttentionBase, meta: dict, write_model: Callable[[Path], None],
             validate: bool, check_options: Optional[dict]) -> ExportResult:
    dest = Path(output) if output is not None else default_folder(config, fmt, meta["io"]["kind"])
    report = None
    with staged_folder(dest, force) as stage:
        save_weights(module, stage / WEIGHTS_FILE)
        write_model(stage / MODEL_FILES[fmt])
        write_json_atomic(stage / CONFIG_FILE, meta)
        if validate:
            from ..check.parity import check_parity  # export -> parity, never the other way round
            report = check_parity(stage, **(check_options or {}))
            report.artifact = str(dest)
            write_json_atomic(stage / REPORT_FILE, report.to_dict())
    return ExportResult(dest, report)


def _validate_flag(validate: bool, fields: dict) -> bool:
    """``check=`` is the old spelling of ``validate=`` (accepted until 0.3)."""
    if "check" in fields:
        warnings.warn("export_*(check=...) is now validate=...", DeprecationWarning, 3)
        return bool(fields.pop("check"))
    return validate


def _prepare(config, weights, layer, seed, kv_cache, attention_mask, fields):
    if config is None and weights is not None and hf_config_path(weights):
        config, module, source = checkpoint_module(weights, layer, fields)
    else:
        config = resolve_config(config, weights, layer, fields)
        module, source = source_module(config, weights, layer, seed)
    sig = make_signature(config, signature_kind(kv_cache, attention_mask))
    return config, sig, module, source


def checkpoint_module(path: str | Path, layer: Optional[int], fields: dict
                      ) -> tuple[MHAConfig, AttentionBase, dict]:
    """One layer of a Hugging Face checkpoint: its config from config.json (given fields must
    agree), its weights in the checkpoint's layout, converted to the layout asked for."""
    found, state, source = read_layer(path, layer)
    config = MHAConfig(**merge_fields(found, fields))
    module = build_module(config.replace(layout=found["layout"]))
    load_strict(module, state, f"layer {layer}: ")
    return config, (module if config.layout == found["layout"] else
                    convert(module, config.layout)), source


def export_onnx(config: Optional[MHAConfig] = None, output: str | Path | None = None, *,
                weights: str | Path | None = None, layer: Optional[int] = None, seed: int = 0,
                attention: str = forms.DEFAULT, opset: Optional[int] = None,
                dtype: str = "float32", kv_cache: bool = False, attention_mask: bool = False,
                force: bool = False, validate: bool = True,
                check_options: Optional[dict] = None, **config_fields) -> ExportResult:
    """Write DIR/model.onnx (+ config.json, weights.safetensors, parity.json).

    Pass an MHAConfig or its fields as keywords (heads=12, dim=768, ...), as on the CLI.
    ``kv_cache``: the decode-step model (x, attention_mask, past_key, past_value -> y,
    present_key, present_value); ``attention_mask``: the full-sequence model with a padding mask."""
    validate = _validate_flag(validate, config_fields)
    config, sig, module, source = _prepare(config, weights, layer, seed, kv_cache,
                                           attention_mask, config_fields)
    form = forms.get_form(attention)
    opset = forms.resolve_opset(form, opset)
    export = {"file": MODEL_FILES["onnx"], "opset": opset, "attention": form.name, "dtype": dtype}
    props = {"mha_export.config": json.dumps(config.to_dict()),
             "mha_export.export": json.dumps(export),
             "mha_export.io": json.dumps(sig.to_dict())}
    model = build_model(config, module.to_weights(), form, opset, dtype, sig, props)
    external = sum(len(t.raw_data) for t in model.graph.initializer) > PROTOBUF_LIMIT
    meta = _describe(config, sig, "onnx", {**export, "external_data": external}, source)

    def write_model(path: Path) -> None:
        if external:  # beyond protobuf's 2 GB: weights in model.onnx.data beside it
            onnx.save_model(model, str(path), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=path.name + ".data")
            onnx.checker.check_model(str(path), full_check=True)
        else:
            onnx.checker.check_model(model, full_check=True)
            onnx.save_model(model, str(path))

    return _publish(config, "onnx", output, force, module, meta, write_model, validate,
                    check_options)


def export_torchscript(config: Optional[MHAConfig] = None, output: str | Path | None = None, *,
                       weights: str | Path | None = None, layer: Optional[int] = None,
                       seed: int = 0, kv_cache: bool = False, attention_mask: bool = False,
                       force: bool = False, validate: bool = True,
                       check_options: Optional[dict] = None, **config_fields) -> ExportResult:
    """Write DIR/model.pt (torch.jit.script: loads with torch.jit.load and libtorch); its
    forward takes the signature's inputs positionally, in the declared order."""
    validate = _validate_flag(validate, config_fields)
    config, sig, module, source = _prepare(config, weights, layer, seed, kv_cache,
                                           attention_mask, config_fields)
    meta = _describe(config, sig, "torchscript", {"file": MODEL_FILES["torchscript"],
                                                  "method": "torch.jit.script"}, source)

    def write_model(path: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            entry = entry_module(module, sig.kind, sig.input_names, sig.output_names)
            torch.jit.script(entry).save(str(path))

    return _publish(config, "torchscript", output, force, module, meta, write_model, validate,
                    check_options)
