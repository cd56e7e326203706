"""OpenVINO runners: model.onnx compiled by OpenVINO's CPU plugin. Imports no torch.

OpenVINO picks its own arithmetic: on a CPU with bfloat16 support (AVX512_BF16, AMX) the CPU
plugin runs fp32 models in bf16 unless asked for f32. ``openvino-cpu`` asks for f32
(``INFERENCE_PRECISION_HINT``); ``openvino-cpu-default`` leaves the plugin its default. Either
way the precision reported is the one OpenVINO says it used, read back from the compiled model
(its ``INFERENCE_PRECISION_HINT`` and the precision of the compute nodes of its runtime graph),
and the tolerance follows it (``tolerance_dtype``): a bf16 run is never an fp32 result.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np

from ...signature import Signature
from .base import Feeds, Runner, RunnerUnavailable

INSTALL = "pip install 'mha-export[openvino]'"
# OpenVINO's element type names -> the names the check reports, lowest precision first.
PRECISIONS = {"bf16": "bf16", "f16": "fp16", "f32": "fp32"}
TOLERANCE_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # fp32: the model's own dtype
COMPUTE_LAYERS = {"FullyConnected", "MatMul", "ScaledDotProductAttention", "Softmax",
                  "SoftMax", "Eltwise", "MHA"}


def openvino_missing() -> Optional[str]:
    """Why OpenVINO cannot run here (not importable), or None."""
    try:
        import openvino  # noqa: F401
    except ImportError as e:
        if getattr(e, "name", None) == "openvino":
            return f"openvino is not installed: {INSTALL}"
        return f"openvino cannot be imported ({str(e).splitlines()[0][:200]}): {INSTALL}"
    return None


class OpenVinoRunner(Runner):
    """model.onnx on OpenVINO's CPU plugin, fed and read by the signature's names.

    ``hint``: the INFERENCE_PRECISION_HINT to ask for ("f32"), or None for the plugin's
    default. A model the plugin cannot read or compile raises RunnerUnavailable (one line)."""

    def __init__(self, signature: Signature, path: str | Path, name: str = "openvino-cpu",
                 hint: Optional[str] = "f32", threads: Optional[int] = None):
        super().__init__(signature)
        import openvino as ov
        self.name = name
        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        version = ov.get_version().split("-")[0]
        try:
            self.compiled = core.compile_model(str(path), "CPU", config)
        except Exception as e:
            raise RunnerUnavailable(f"OpenVINO {version} cannot compile "
                                    f"{Path(path).name}: {message(e)}") from None
        self.precision = executed_precision(self.compiled)
        self.device = (f"cpu (OpenVINO {version} CPU plugin, {self.precision}, "
                       f"{core.get_property('CPU', 'FULL_DEVICE_NAME')})")
        self.tolerance_dtype = TOLERANCE_DTYPES.get(self.precision)
        self.dtypes = {n: self.compiled.input(n).get_element_type().to_dtype()
                       for n in signature.input_names}
        self.request = self.compiled.create_infer_request()

    def prepare(self, feeds: Feeds) -> Feeds:
        return {n: np.ascontiguousarray(feeds[n].astype(self.dtypes[n]))
                for n in self.signature.input_names}

    def run_prepared(self, prepared: Feeds) -> list[np.ndarray]:
        try:
            self.request.infer(prepared)
        except RuntimeError as e:  # a case the plugin cannot run fails its rows, with the cause
            raise RuntimeError(message(e)) from None
        return [self.request.get_tensor(self.compiled.output(n)).data.copy()
                for n in self.signature.output_names]

    def run(self, feeds: Feeds) -> Feeds:
        outs = self.run_prepared(self.prepare(feeds))
        return {n: o.astype(np.float32) for n, o in zip(self.signature.output_names, outs)}


# OpenVINO's errors are a stack of "Exception from src/...:N:" lines; the cause comes last.
_WHERE = re.compile(r"^(Exception from |Check '|FrontEnd API failed|Summary:|-- |While validating)")


def message(e: Exception) -> str:
    """The line of an OpenVINO error that says what went wrong (its last non-location line)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    causes = [line for line in lines if not _WHERE.match(line)]
    return ((causes or lines or [type(e).__name__])[-1])[:300]


def executed_precision(compiled) -> str:
    """The lowest precision OpenVINO says it computes in: the compiled model's
    INFERENCE_PRECISION_HINT (the plugin resolves it: bf16 asked on a CPU without bf16 reads f32)
    and the runtime precision of the compute nodes of its runtime graph (top level)."""
    names = {compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in COMPUTE_LAYERS:
            names.add(info["runtimePrecision"].astype(str))
    for name, reported in PRECISIONS.items():
        if name in names:
            return reported
    return "/".join(sorted(names))  # an arithmetic the check has no name for: shown as is
