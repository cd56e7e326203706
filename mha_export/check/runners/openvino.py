"""OpenVINO runners: model.onnx compiled by OpenVINO's CPU plugin. Imports no torch.

OpenVINO picks its own arithmetic: on a CPU with bfloat16 support (AVX512_BF16, AMX) the CPU
plugin runs fp32 models in bf16 unless asked for f32. ``openvino-cpu`` asks for f32
(``INFERENCE_PRECISION_HINT``); ``openvino-cpu-default`` leaves the plugin its default. Either
way the precision reported is the one OpenVINO says it used, read back from the compiled model
(its ``INFERENCE_PRECISION_HINT`` and the precision of the compute nodes of its runtime graph),
and the tolerance follows it (``tolerance_dtype``): a bf16 run is never an fp32 result.

Weight-compressed MatMuls (a file with quantized projections: MatMulNBits) are the plugin's other
silent precision change: on CPUs with int8 dot products (AVX-512 VNNI, AMX) it quantizes their
activations to int8 per group of ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` (32 by default), even when
f32 was asked for; on AVX2-only CPUs it computes them in f32. Which one ran is probed on this CPU
(one such matmul compiled with the runner's settings and with dynamic quantization off: do they
differ?), reported on the "ran on" line and followed by the tolerance (int8 activations, as ONNX
Runtime's accuracy level 4). ``openvino-cpu-fp32-compute`` turns it off
(``DYNAMIC_QUANTIZATION_GROUP_SIZE`` 0): the file's weights checked at fp32's tolerance.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from dataclasses import dataclass
from typing import Optional

import ml_dtypes
import numpy as np

from ...graph.nodes import all_nodes
from ...lossy.projections.kernels import matmul_nbits_kinds, matmul_nbits_probe
from ...signature import Signature
from ...comparison.runner import Feeds, Runner, RunnerUnavailable
from ...comparison.comparator import INT8_ACTIVATION_DTYPE

INSTALL = "pip install 'mha-export[openvino]'"
# OpenVINO's element type names -> the names the check reports, lowest precision first.
PRECISIONS = {"bf16": "bf16", "f16": "fp16", "f32": "fp32"}
TOLERANCE_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # fp32: the model's own dtype
COMPUTE_LAYERS = {"FullyConnected", "MatMul", "ScaledDotProductAttention", "Softmax",
                  "SoftMax", "Eltwise", "MHA"}
DYNAMIC_QUANTIZATION = "DYNAMIC_QUANTIZATION_GROUP_SIZE"
# element types whose Tensor.data numpy mislabels (bf16's says float16 but holds bfloat16's bits):
# OpenVINO's name -> the numpy type really held
BITS_OF = {"bf16": ml_dtypes.bfloat16}


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
                 hint: Optional[str] = "f32", threads: Optional[int] = None,
                 dynamic_quantization: bool = True):
        """``dynamic_quantization``: False compiles with DYNAMIC_QUANTIZATION_GROUP_SIZE 0 (the
        compressed-weight MatMuls compute in the hinted float precision)."""
        super().__init__(signature)
        import openvino as ov
        self.name = name
        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
        if not dynamic_quantization:
            config[DYNAMIC_QUANTIZATION] = "0"
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        version = ov.get_version().split("-")[0]
        try:
            self.compiled = core.compile_model(str(path), "CPU", config)
        except Exception as e:
            raise RunnerUnavailable(f"OpenVINO {version} cannot compile "
                                    f"{Path(path).name}: {message(e)}") from None
        self.precision = executed_precision(self.compiled)
        self.compressed = compressed_matmuls(self.compiled, path, config)
        self.tolerance_dtype = TOLERANCE_DTYPES.get(self.precision)
        if self.compressed is not None:
            self.precision += f"; projections: {self.compressed.describe()}"
            if self.compressed.int8_activations:
                self.tolerance_dtype = "+".join(filter(None, (self.tolerance_dtype,
                                                              INT8_ACTIVATION_DTYPE)))
        self.device = (f"cpu (OpenVINO {version} CPU plugin, {self.precision}, "
                       f"{core.get_property('CPU', 'FULL_DEVICE_NAME')})")
        self.types = {n: self.compiled.input(n).get_element_type()
                      for n in signature.input_names}
        self.dtypes = {n: BITS_OF.get(t.get_type_name(), None) or t.to_dtype()
                       for n, t in self.types.items()}
        self.request = self.compiled.create_infer_request()

    def prepare(self, feeds: Feeds) -> dict:
        """numpy arrays in the model's dtypes; bf16 as Tensors over their bits."""
        import openvino as ov
        arrays = {n: np.ascontiguousarray(feeds[n].astype(self.dtypes[n]))
                  for n in self.signature.input_names}
        return {n: ov.Tensor(a.view(np.uint16), a.shape, self.types[n])
                if self.types[n].get_type_name() in BITS_OF else a for n, a in arrays.items()}

    def run_prepared(self, prepared: dict) -> list[np.ndarray]:
        try:
            self.request.infer(prepared)
        except RuntimeError as e:  # a case the plugin cannot run fails its rows, with the cause
            raise RuntimeError(message(e)) from None
        return [_array(self.request.get_tensor(self.compiled.output(n)))
                for n in self.signature.output_names]

    def run(self, feeds: Feeds) -> Feeds:
        outs = self.run_prepared(self.prepare(feeds))
        return {n: o.astype(np.float32) for n, o in zip(self.signature.output_names, outs)}


def _array(tensor) -> np.ndarray:
    """A copy of an output Tensor's data, of the numpy type it really holds."""
    held = BITS_OF.get(tensor.get_element_type().get_type_name())
    return tensor.data.copy() if held is None else tensor.data.view(held).copy()


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


@dataclass(frozen=True)
class CompressedMatMuls:
    """The weight-compressed MatMuls of a compiled model and what the plugin really does with
    their activations on this CPU (probed: ``activations_quantized``)."""

    count: int  # MatMulNBits nodes of the file (If branches included)
    weights: tuple  # their code widths, e.g. ("u4",)
    group_size: int  # DYNAMIC_QUANTIZATION_GROUP_SIZE read back from the compiled model
    int8_activations: bool

    def describe(self) -> str:
        what = (f"activations quantized to int8 per group of {self.group_size} (OpenVINO's "
                f"dynamic quantization)" if self.int8_activations else
                "float activations" + ("" if self.group_size else " (dynamic quantization off)"))
        plural = "s" if self.count != 1 else ""
        return (f"{self.count} MatMulNBits as compressed-weight MatMul{plural} "
                f"({'/'.join(self.weights)}): {what}")


def compressed_matmuls(compiled, path: str | Path, config: dict) -> Optional[CompressedMatMuls]:
    """None for a model without quantized projections. Counted in the file (MatMulNBits,
    inside If branches too: the runtime model lists only its top level); the group size read
    back from the compiled model; whether activations were quantized, probed on this CPU."""
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    count = sum(n.op_type == "MatMulNBits" for n in all_nodes(model.graph.node))
    if not count:
        return None
    kinds = matmul_nbits_kinds(model)
    group = int(str(compiled.get_property(DYNAMIC_QUANTIZATION)))
    hint = str(config.get("INFERENCE_PRECISION_HINT", ""))
    quantized = group > 0 and any(activations_quantized(bits, block, hint, group)
                                  for bits, block, *_ in kinds)
    weights = tuple(sorted({f"u{bits}" for bits, *_ in kinds}))
    return CompressedMatMuls(count, weights, group, quantized)


@functools.lru_cache(maxsize=None)
def activations_quantized(bits: int, block_size: int, hint: str, group: int) -> bool:
    """Whether the CPU plugin quantizes the activations of an int``bits`` MatMulNBits with
    ``block_size`` here: the probe matmul compiled with these settings and with dynamic
    quantization off, run on the same input: any difference is the int8 rounding."""
    import openvino as ov
    model, a = matmul_nbits_probe(bits, block_size)
    core = ov.Core()
    base = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
    outs = []
    for extra in ({DYNAMIC_QUANTIZATION: str(group)}, {DYNAMIC_QUANTIZATION: "0"}):
        compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                      {**base, **extra})
        outs.append(compiled({"A": a})[compiled.output(0)].copy())
    return not np.array_equal(*outs)
