"""The ExecuTorch target: model.pte for ExecuTorch's runtime, lowered to XNNPACK (or its
portable kernels), batch and seq dynamic up to stated bounds, the static cache inside the
program. An extra (install.py); int4 projections as torchao's 8da4w (torchao.py); run by
``executorch.runtime`` (runner.py); a bench run's programs (bench.py). The record is read
torch-free (limits.py; export.py loads at the first export)."""
from __future__ import annotations

import re

from ...comparison.comparator import native_tolerance
from ...comparison.runner import Runner, RunnerKind, RunOptions
from ...env import native_stderr_without
from ...signature import Signature
from ..base import ExportTarget, TargetOption, lazy
from .install import executorch_missing
from .limits import BACKENDS, LACKS

MODEL_FILE = "model.pte"
_EXPORT = f"{__name__}.export"

OPTIONS = (
    TargetOption("backend", default="xnnpack", choices=BACKENDS, show_default=True,
                 help="Where the program's work runs: delegated to XNNPACK, or ExecuTorch's "
                      "portable kernels."),
    TargetOption("max_batch", type=int,
                 help="The batch axis's bound (seq's: --max-seq-len): ExecuTorch plans its "
                      "memory for the largest call [default: 4]. With --static-cache: the "
                      "step's rows, a static batch (each row's cache read where it lies) "
                      "[default: 1]."),
    TargetOption("kernels", default="aten", choices=("aten", "llm"), show_default=True,
                 help="The --static-cache step's attention: ATen ops (XNNPACK's matrix "
                      "products; any app's runtime runs them), or ExecuTorch's LLM kernels "
                      "(update_cache, custom_sdpa: faster; an app links executorch's "
                      "custom_ops library, see docs/executorch.md).", in_eval=True),
)

SUMMARY = """Export to ExecuTorch: model.pte for its runtime (Android, iOS, embedded Linux: the C++
Module; Python's executorch.runtime), lowered to XNNPACK; batch and seq dynamic up to
stated bounds. Needs the executorch extra (docs/executorch.md).

\b
Examples:
  mha-export executorch --heads 12 --dim 768     # -> models/split-h12-d768-executorch/
  mha-export executorch --heads 12 --dim 768 --attention-mask --max-batch 8
  mha-export executorch --heads 12 --dim 768 --backend portable
  mha-export executorch --heads 12 --dim 768 --static-cache   # the cache inside
  mha-export executorch --heads 12 --dim 768 --static-cache --kernels llm
  mha-export executorch --heads 12 --dim 768 --static-cache --quantize int4
"""

# ExecuTorch's runtime logs to the process's stderr, from C++, when its thread pool starts or
# is resized (executorch 1.5.1): info lines, not the check's
RUNTIME_INFO = (re.compile(r"\[cpuinfo_utils\.cpp:\d+\] (Reading file|Failed to open midr "
                           r"file|CPU info and manual query)"),
                re.compile(r"\[threadpool\.cpp:\d+\] Resetting threadpool to"))


def _open(sig: Signature, path, options: RunOptions) -> Runner:
    from .runner import ExecuTorchRunner
    with native_stderr_without(RUNTIME_INFO):
        return ExecuTorchRunner(sig, path, options.threads)


TARGET = ExportTarget(
    "executorch", MODEL_FILE, lazy(_EXPORT, "prepare"), lazy(_EXPORT, "check"),
    ("torch.export and ExecuTorch's lowering", "writing model.pte"),
    lazy(_EXPORT, "program_bounds"), executorch_missing,
    # measured: a SmolLM2 layer's worker peaked at 1,257 MiB against 648 MiB estimated without
    # it (AMD Zen 4, 2026-11-28)
    worker_bytes=640 * 2**20, folder_tag=lazy(_EXPORT, "folder_tag"), title="ExecuTorch",
    summary=SUMMARY, options=OPTIONS, lacks=LACKS,
    builds={"quantize": lazy(f"{__name__}.torchao", "refusal")},
    runners=(RunnerKind("executorch-cpu", MODEL_FILE, "cpu",
                        "ExecuTorch (executorch.runtime)", _open, native_tolerance,
                        unavailable=executorch_missing),),
    programs=lazy(f"{__name__}.bench", "programs"))
