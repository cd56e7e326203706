"""The AOTInductor target: model.pt2, the signature's entry point captured by ``torch.export``
(batch, seq and the cache lengths dynamic, 0 and 1 included) and compiled ahead of time by
AOTInductor into a package that Python (``torch._inductor.aoti_load_package``) and C++
(``torch::inductor::AOTIModelPackageLoader``) load without the Python model code: TorchScript's
successor (torch 2.13 deprecates ``torch.jit``). The compile takes tens of seconds."""
from __future__ import annotations

from typing import Optional

from pathlib import Path

import torch
from torch.export import Dim

from ...config import MHAConfig
from ...errors import UsageError
from ...layer.entry import entry_module
from ...layer.layouts import AttentionBase
from ...signature import INDEX_K, Signature
from ..base import Prepared, require_no_lossy_steps
from . import DEVICES, MODEL_FILE

# Example sizes for the capture: none of them is 0 or 1, so no axis is specialised to them.
EXAMPLE = {"batch": 2, "seq": 3, "past_seq": 5, "max_cache": 16}
# A static cache's example rows: different valid lengths, both writes inside the buffer.
EXAMPLE_PAST_LENGTHS = (2, 5)


def prepare(module: AttentionBase, config: MHAConfig, sig: Signature,
            device: str = "cpu", specs: Optional[dict] = None) -> Prepared:
    """``specs``: lossy steps (none: each step refuses this target when asked for)."""
    check(config, sig, device, specs)
    entry = entry_module(module, sig.kind, sig.input_names, sig.output_names).to(device)
    program = _export(entry, sig, device)
    axes = {t.name: {str(i): d for i, d in t.dynamic_axes.items()} for t in sig.inputs}
    export = {"file": MODEL_FILE, "method": "torch.export + AOTInductor", "device": device,
              "dynamic_axes": axes, "axis_range": "0 .. unbounded (batch >= 1, seq >= 1)",
              "torch": torch.__version__}

    return Prepared(export, lambda path: compile_package(program, path, sig, device))


def folder_tag(config: MHAConfig, sig: Signature, device: str = "cpu") -> str:
    """A CUDA package's mark in its default folder's name ("-cuda": it runs on no CPU)."""
    return "" if device == DEVICES[0] else f"-{device}"


def check(config: MHAConfig, sig: Signature, device: str = "cpu",
          specs: Optional[dict] = None) -> None:
    require_no_lossy_steps(specs, MODEL_FILE)
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device here (an AOTInductor CUDA "
                         "package is compiled on a machine with the GPU)")


def compile_package(program, path: Path, sig: Signature, device: str) -> None:
    """AOTInductor's package of ``program``, its metadata naming the declared inputs/outputs and
    the input shapes the program really accepts (read by the runners before every call: a
    package run at a shape it was not compiled for reads out of bounds, it does not raise)."""
    metadata = {"mha_export.input_names": ",".join(sig.input_names),
                "mha_export.output_names": ",".join(sig.output_names),
                "mha_export.device": device,
                "mha_export.input_shapes": input_shapes(program)}
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(path), inductor_configs={"aot_inductor.metadata": metadata})


def input_shapes(program) -> str:
    """'d0,d1,...;d0,...' per user input in order: an int where the axis is fixed, '?' where it
    is dynamic."""
    shapes = []
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder" and node.name in program.graph_signature.user_inputs:
            shapes.append(",".join(str(d) if isinstance(d, int) else "?"
                                   for d in node.meta["val"].shape))
    return ";".join(shapes)


def _export(entry: torch.nn.Module, sig: Signature, device: str, dynamic_axes: bool = True):
    """torch.export with every symbolic axis dynamic; backed_size_oblivious keeps 0 and 1 (an
    empty cache, a single token, batch 1) inside the range instead of specialising them.
    ``dynamic_axes=False`` fixes every axis at the example's size (a planted fault)."""
    import torch.fx.experimental._config as fx_config
    args = tuple(_example(t, sig, device) for t in sig.inputs)
    dynamic = tuple({i: Dim.DYNAMIC for i in t.dynamic_axes} if dynamic_axes else None
                    for t in sig.inputs)  # by position (an own cache's entry: s0, s1, ...)
    with fx_config.patch(backed_size_oblivious=True), torch.no_grad():
        return torch.export.export(entry, args, dynamic_shapes=dynamic)


def _example(t, sig: Signature, device: str) -> torch.Tensor:
    sizes = {**EXAMPLE, "past_seq + seq": EXAMPLE["past_seq"] + EXAMPLE["seq"], INDEX_K: 2,
             **(sig.axis_sizes(EXAMPLE["past_seq"]) if sig.axis_sizes else {})}  # an own cache's
    shape = [sizes[d] if isinstance(d, str) else d for d in t.shape]
    if t.name == "attention_mask":
        return torch.ones(shape, dtype=torch.int64, device=device)
    if t.name == "past_lengths":
        return torch.tensor(EXAMPLE_PAST_LENGTHS, device=device)
    if t.name == "topk_indices":  # a shared-top-k layer's selection: key positions
        return torch.arange(shape[2], device=device).expand(shape).contiguous()
    if t.name == "position_ids":
        past = (torch.tensor(EXAMPLE_PAST_LENGTHS, device=device).view(-1, 1)
                if sig.static_cache else EXAMPLE["past_seq"] if sig.has_cache else 0)
        return (past + torch.arange(shape[1], device=device)).expand(shape).contiguous()
    return torch.randn(shape, device=device)
