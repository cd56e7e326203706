"""The registry of export targets: one ``ExportTarget`` record per file format an export writes.

Adding a target (say torch.export + AOTInductor): one module here whose ``prepare`` builds the
model in memory and returns how to write it (its ``check``: what prepare refuses, before anything
is built), one record in ``_TARGETS``, and a runner for its file in ``check/runners`` (the check
finds runners by the file they run). The pipeline (staging,
config.json, source weights, the lossy steps, the parity check at export) is shared; a lossy
step the target cannot write is refused by the step (lossy/*/step.py's ``refusals``).
"""
from __future__ import annotations

from ..env import executorch_missing
from . import to_aoti, to_executorch, to_onnx, to_torchscript
from .base import ExportTarget


_TARGETS = (
    ExportTarget("onnx", to_onnx.MODEL_FILE, to_onnx.prepare, to_onnx.check,
                 ("building the ONNX graph", "writing model.onnx"),
                 folder_tag=to_onnx.folder_tag),
    ExportTarget("torchscript", to_torchscript.MODEL_FILE, to_torchscript.prepare,
                 to_torchscript.check, ("torch.jit.script", "saving model.pt")),
    ExportTarget("aoti", to_aoti.MODEL_FILE, to_aoti.prepare, to_aoti.check,
                 ("torch.export", "AOTInductor's compile of model.pt2"),
                 folder_tag=to_aoti.folder_tag),
    ExportTarget("executorch", to_executorch.MODEL_FILE, to_executorch.prepare,
                 to_executorch.check,
                 ("torch.export and ExecuTorch's lowering", "writing model.pte"),
                 to_executorch.program_bounds, executorch_missing,
                 # measured: a SmolLM2 layer's worker peaked at 1,257 MiB against 648 MiB
                 # estimated without it (AMD Zen 4, 2026-11-28)
                 worker_bytes=640 * 2**20, folder_tag=to_executorch.folder_tag),
)
TARGETS: dict[str, ExportTarget] = {t.name: t for t in _TARGETS}
