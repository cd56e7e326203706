"""The ONNX target: model.onnx written directly from the weights with one graph form's core
(graph/), at an exact opset, checked by onnx.checker before it is published."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import onnx
from onnx import helper

from ...config import MHAConfig
from ...graph.builder import FLOAT_TYPES
from ...graph.forms import GraphForm, resolve_opset
from ...graph.model import build_model, check_buildable
from ...errors import UsageError
from ...kinds.registry import FORMS, default_form, get_form, kind_of
from ...layer.layouts import AttentionBase
from ...lossy import registry as lossy
from ...lossy.projections import session_options
from ...signature import Signature
from ..base import Prepared

from . import MODEL_FILE
PROTOBUF_LIMIT = 2**31 - 2**26  # 2 GiB less a margin for the graph itself


def prepare(module: AttentionBase, config: MHAConfig, sig: Signature,
            attention: Optional[str] = None, opset: Optional[int] = None,
            dtype: str = "float32", specs: Optional[dict] = None) -> Prepared:
    """``specs``: the lossy steps' (lossy/registry.py), built into the graph and recorded."""
    specs = specs or {}
    form = check(config, sig, attention, opset, dtype)
    model = build_model(config, module.to_weights(), form, opset, dtype, sig,
                        **lossy.graph_args(specs))
    opset = model.opset_import[0].version  # the form's lowest when none was asked for
    export = {"file": MODEL_FILE, "opset": opset, "attention": form.name, "dtype": dtype,
              **lossy.records(specs, config)}
    needs = session_options.needed(model)  # what an app must set to run it as checked
    helper.set_model_props(model, {"mha_export.config": json.dumps(config.to_dict()),
                                   "mha_export.export": json.dumps(export),
                                   "mha_export.io": json.dumps(sig.to_dict()),
                                   **({session_options.KEY: json.dumps(needs)} if needs else {})})
    external = sum(len(t.raw_data) for t in model.graph.initializer) > PROTOBUF_LIMIT
    return Prepared({**export, "external_data": external},
                    lambda path: _write(model, path, external))


def check(config: MHAConfig, sig: Signature, attention: Optional[str] = None,
          opset: Optional[int] = None, dtype: str = "float32",
          specs: Optional[dict] = None) -> GraphForm:
    """The form the graph is built with; one that cannot build the layer, an unknown dtype or
    an opset the form cannot be written in refused before anything is built."""
    kind = kind_of(config)
    if not kind.forms:
        raise UsageError(f"{kind.summary} is not built as an ONNX graph yet (no graph form "
                         "builds it): `mha-export torchscript` holds its eager layer")
    form = get_form(attention) if attention else default_form(config, sig)
    if not attention and form.kind != config.kind:  # the default, none of the kind's own forms
        form = kind.forms[0]  # building it: its first form says why (one asked for says its own)
    check_buildable(config, form, sig, dtype, FORMS.values())  # naming every kind's forms
    resolve_opset(form, opset)
    return form


def folder_tag(config: MHAConfig, sig: Signature, dtype: str = "float32", **built: Any) -> str:
    """A half-precision file's mark in its default folder's name ("-fp16", "-bf16");
    ``built``: the options that choose only how the same function is written (form, opset)."""
    tag = FLOAT_TYPES[dtype].tag
    return f"-{tag}" if tag else ""


def _write(model: onnx.ModelProto, path: Path, external: bool) -> None:
    if external:  # beyond protobuf's 2 GB: weights in model.onnx.data beside it
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=path.name + ".data")
        onnx.checker.check_model(str(path), full_check=True)
    else:
        onnx.checker.check_model(model, full_check=True)
        onnx.save_model(model, str(path))
