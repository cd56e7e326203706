"""The registry of runners under test: one ``RunnerKind`` record per runner (see ``base``).

Adding a runner (another runtime, say): one module here with its ``Runner`` subclass (it imports
its runtime), and one record in ``_KINDS`` below whose ``open`` imports that module lazily. A
runner of another runtime than the one the file was made for (OpenVINO on model.onnx) is
``by_default=False``: it runs when named (``--runners openvino-cpu``), so an export's own check
never fails on another runtime's bugs, unless no default runner can run the file here (a bf16
file on a CPU): then the first that can runs in their place (plan.py), and says so. The
check's selection (``--runners``), its SKIPPED lines, the CUDA requirement, the default
tolerances and the bench read these records; nothing else changes. The runners of a file
other than model.onnx are its target's (targets/: the record's ``runners``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...errors import UsageError
from ...signature import Signature
from ...comparison.comparator import (FP32, FP32_TF32, HALF_TOLERANCES, INT8_ACTIVATION_DTYPE,
                                      INT8_ACTIVATIONS, Tolerance, loosest, native_tolerance)
from ...comparison.runner import Feeds, Runner, RunnerKind, RunnerUnavailable, RunOptions
from ...targets.registry import TARGETS

__all__ = ["RUNNERS", "Feeds", "Runner", "RunnerKind", "RunnerUnavailable", "RunOptions",
           "get_runner", "on_device", "ort_runner_names"]


def _open_ort(provider: str, fp32_compute: bool = False, cuda_graph: bool = False):
    def open_(sig: Signature, path: Path, options: RunOptions) -> Runner:
        from .ort import OrtRunner
        return OrtRunner(sig, path, provider, options.threads, options.tf32,
                         options.mem_pattern, fp32_compute, options.thread_pool, cuda_graph,
                         options.compute_stream)
    return open_


def _int8_activation_export(export: dict) -> bool:
    """Quantized projections at accuracy level 4 (int8 activations): their kernel's own
    rounding (~1e-2) would hide a wrong weight, so the file's weights are also run at fp32
    compute and checked at fp32's tolerance."""
    return export.get("quantize", {}).get("accuracy_level") == 4


def _quantized_export(export: dict) -> bool:
    """Quantized projections at any accuracy level: OpenVINO ignores the level and quantizes
    their activations wherever the CPU has int8 dot products, so the file's weights are also run
    with its dynamic quantization off, at fp32's tolerance."""
    return "quantize" in export


def _cuda_missing() -> Optional[str]:
    from .ort import cuda_provider_missing
    return cuda_provider_missing()


def _ort_cuda_tolerance(dtype: str, options: RunOptions) -> Tolerance:
    """TF32 keeps a 10-bit mantissa in fp32 matmuls: --no-tf32 checks CUDA with FP32."""
    if dtype in HALF_TOLERANCES:
        return HALF_TOLERANCES[dtype]
    return FP32_TF32 if options.tf32 else FP32


def _open_openvino(name: str, hint: Optional[str], dynamic_quantization: bool = True):
    def open_(sig: Signature, path: Path, options: RunOptions) -> Runner:
        from .openvino import OpenVinoRunner
        return OpenVinoRunner(sig, path, name, hint, options.threads, dynamic_quantization)
    return open_


def _openvino_missing() -> Optional[str]:
    from .openvino import openvino_missing
    return openvino_missing()


def _openvino_tolerance(dtype: str, options: RunOptions) -> Tolerance:
    """``dtype``: the runner's ``tolerance_dtype`` (bfloat16 when OpenVINO really ran bf16,
    float16 for fp16 arithmetic, "+int8-activations" when it quantized the activations of
    compressed-weight MatMuls), else the model's: the loosest of what ran."""
    known = {**HALF_TOLERANCES, INT8_ACTIVATION_DTYPE: INT8_ACTIVATIONS}
    return loosest([known.get(part, FP32) for part in dtype.split("+")])


_KINDS = (
    RunnerKind("ort-cpu", "model.onnx", "cpu", "ONNX Runtime (CPUExecutionProvider)",
               _open_ort("cpu"), native_tolerance, ort_provider="cpu"),
    RunnerKind("ort-cpu-fp32-compute", "model.onnx", "cpu",
               "ONNX Runtime (CPUExecutionProvider), quantized projections at fp32 compute: "
               "the file's weights checked exactly", _open_ort("cpu", fp32_compute=True),
               native_tolerance, by_default=False, also_with="ort-cpu",
               also_for=_int8_activation_export,
               also_for_doc="files with int8-activation quantized projections"),
    RunnerKind("ort-cuda", "model.onnx", "cuda", "ONNX Runtime (CUDAExecutionProvider)",
               _open_ort("cuda"), _ort_cuda_tolerance, unavailable=_cuda_missing,
               ort_provider="cuda"),
    RunnerKind("ort-cuda-graph", "model.onnx", "cuda",
               "ONNX Runtime (CUDAExecutionProvider), the static-cache step captured as a CUDA "
               "graph per shape and replayed with each case's fresh inputs",
               _open_ort("cuda", cuda_graph=True), _ort_cuda_tolerance, unavailable=_cuda_missing,
               by_default=False),
    RunnerKind("openvino-cpu", "model.onnx", "cpu", "OpenVINO (CPU plugin)",
               _open_openvino("openvino-cpu", "f32"), _openvino_tolerance,
               unavailable=_openvino_missing, by_default=False),
    RunnerKind("openvino-cpu-fp32-compute", "model.onnx", "cpu",
               "OpenVINO (CPU plugin, f32, dynamic quantization of compressed-weight MatMuls "
               "off): the file's quantized weights checked exactly",
               _open_openvino("openvino-cpu-fp32-compute", "f32", dynamic_quantization=False),
               _openvino_tolerance, unavailable=_openvino_missing, by_default=False,
               also_with="openvino-cpu", also_for=_quantized_export,
               also_for_doc="files with quantized projections"),
    RunnerKind("openvino-cpu-default", "model.onnx", "cpu",
               "OpenVINO (CPU plugin, its default precision: bf16 where the CPU has it)",
               _open_openvino("openvino-cpu-default", None), _openvino_tolerance,
               unavailable=_openvino_missing, by_default=False),
)
# the runners of the ONNX file, then those of each other target's (its record's)
_KINDS += tuple(k for t in TARGETS.values() for k in t.runners)
RUNNERS: dict[str, RunnerKind] = {k.name: k for k in _KINDS}


def get_runner(name: str) -> RunnerKind:
    if name not in RUNNERS:
        raise UsageError(f"unknown runner {name!r}: choose from {', '.join(RUNNERS)}")
    return RUNNERS[name]


def on_device(name: str, device: str) -> str:
    """The runner of ``name``'s file and runtime on ``device`` (ort-cpu on cuda: ort-cuda,
    through the registry's ``ort_provider``), refused in one line where there is none or it
    cannot run here (no CUDA session starts: its reason)."""
    if RUNNERS[name].device == device:
        return name
    twin = next((k.name for k in _KINDS if k.ort_provider == device
                 and k.model_file == RUNNERS[name].model_file), None)
    if twin is None or RUNNERS[name].ort_provider is None:
        raise UsageError(f"--device {device}: --runner {name} has no {device} counterpart "
                         "(--runner ort-cpu has: ort-cuda)")
    if device == "cuda":
        from .ort import cuda_session_refusal
        if why := cuda_session_refusal():
            raise UsageError(f"--device cuda: {why}")
    return twin


def ort_runner_names(providers: list[str]) -> list[str]:
    """The ``--providers cpu,cuda`` shorthand as runner names (ort-cpu, ort-cuda)."""
    by_provider = {k.ort_provider: k.name for k in _KINDS if k.ort_provider}
    unknown = [p for p in providers if p not in by_provider]
    if unknown or not providers:
        raise UsageError(f"unknown provider {(unknown or [''])[0]!r}: choose from "
                         f"{', '.join(by_provider)}")
    return [by_provider[p] for p in providers]
