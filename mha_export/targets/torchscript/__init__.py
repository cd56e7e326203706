"""The TorchScript target: model.pt (torch.jit.script), deprecated by torch 2.13 (its command
says so first); no lossy step; run by torch.jit and the C++ app mha_torch. The record is read
torch-free (export.py loads at the first export)."""
from __future__ import annotations

from ...comparison.comparator import FP32
from ...comparison.runner import Runner, RunnerKind, RunOptions
from ...signature import Signature
from ..base import ExportTarget, lazy

MODEL_FILE = "model.pt"
SUCCESSOR = "`mha-export aoti`"  # the command writing what torch 2.13 points to instead
SUCCESSOR_FORMAT = "torch.export + AOTInductor"
_EXPORT = f"{__name__}.export"

SUMMARY = """Export to TorchScript: model.pt (torch.jit.script), loadable by torch.jit.load and
libtorch's torch::jit::load. torch 2.13 deprecates torch.jit ("Please switch to
torch.compile or torch.export"): {successor} writes its successor.

\b
Examples:
  mha-export torchscript --heads 12 --dim 768
  mha-export torchscript --layout fused --weights attn.pt -o out/ts --force
""".format(successor=SUCCESSOR)


def _open(sig: Signature, path, options: RunOptions) -> Runner:
    from ...comparison.torch_runners import TorchScriptRunner
    return TorchScriptRunner(sig, path)


TARGET = ExportTarget(
    "torchscript", MODEL_FILE, lazy(_EXPORT, "prepare"), lazy(_EXPORT, "check"),
    ("torch.jit.script", "saving model.pt"), title="TorchScript", summary=SUMMARY,
    notice=f"torch 2.13 deprecates torch.jit (TorchScript); {SUCCESSOR} writes its "
           f"successor ({SUCCESSOR_FORMAT})",
    cpp_program="mha_torch",
    runners=(RunnerKind("torchscript", MODEL_FILE, "cpu", "torch.jit", _open,
                        lambda dtype, options: FP32),))
