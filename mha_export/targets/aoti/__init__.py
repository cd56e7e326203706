"""The AOTInductor target: model.pt2 (torch.export + AOTInductor), for the CPU or a CUDA device;
no lossy step; run by torch (aoti-cpu, aoti-cuda) and the C++ app mha_aoti. The record is read
torch-free (export.py loads at the first export)."""
from __future__ import annotations

from typing import Optional

from ...comparison.comparator import FP32, FP32_TF32
from ...comparison.runner import Runner, RunnerKind, RunOptions
from ...signature import Signature
from ..base import ExportTarget, TargetOption, lazy

MODEL_FILE = "model.pt2"
DEVICES = ("cpu", "cuda")
_EXPORT = f"{__name__}.export"

SUMMARY = """Export with torch.export + AOTInductor: model.pt2, loadable by
torch._inductor.aoti_load_package and C++'s torch::inductor::AOTIModelPackageLoader;
batch, seq and cache lengths dynamic (0 and 1 included). Compiling takes tens of seconds.

\b
Examples:
  mha-export aoti --heads 12 --dim 768            # -> models/split-h12-d768-aoti/
  mha-export aoti --heads 12 --dim 768 --kv-cache
  mha-export aoti --heads 12 --dim 768 --static-cache   # the app's buffers written in place
"""


def _open(device: str):
    def open_(sig: Signature, path, options: RunOptions) -> Runner:
        from .runner import AotiRunner
        return AotiRunner(sig, path, device)
    return open_


def _no_torch_cuda() -> Optional[str]:
    import torch
    return None if torch.cuda.is_available() else "no CUDA device visible to torch"


# what a layer may need (its kind's ``needs``/``call_needs``) that AOTInductor does not
# compile right (measured)
LACKS = {"windows closed from a carried buffer": "torch.export (2.13) guards that count at the "
                                                "example's and AOTInductor's compile then fails "
                                                "(the keys' and the mask's sizes disagree)"}

RUNNERS = (
    RunnerKind("aoti-cpu", MODEL_FILE, "cpu", "AOTInductor (torch)", _open("cpu"),
               lambda dtype, options: FP32),
    RunnerKind("aoti-cuda", MODEL_FILE, "cuda", "AOTInductor (torch, CUDA)",
               _open("cuda"), lambda dtype, options: FP32_TF32 if options.tf32 else FP32,
               unavailable=_no_torch_cuda),
)

TARGET = ExportTarget(
    "aoti", MODEL_FILE, lazy(_EXPORT, "prepare"), lazy(_EXPORT, "check"),
    ("torch.export", "AOTInductor's compile of model.pt2"), folder_tag=lazy(_EXPORT, "folder_tag"),
    title="AOTInductor", summary=SUMMARY,
    options=(TargetOption("device", default="cpu", choices=DEVICES, show_default=True,
                          help="Device the package is compiled for (cuda: only where torch "
                               "sees a GPU)."),),
    runners=RUNNERS, cpp_program="mha_aoti", lacks=LACKS)
