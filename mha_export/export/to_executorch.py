"""The ExecuTorch target: model.pte for ExecuTorch's runtime (phones, embedded Linux, its C++
``Module`` and Python's ``executorch.runtime``). The signature's entry point is captured by
``torch.export`` with batch and seq dynamic up to stated bounds (ExecuTorch plans its memory
for them), lowered by ``to_edge_transform_and_lower`` to XNNPACK (default) or left on the
portable kernels, and serialized.

Not built yet: the static cache held inside the program as mutable buffers (ExecuTorch's way
for a decode step), the growing cache, torchao's quantized projections; each is refused in one
line.
"""
from __future__ import annotations

import copy
from collections import Counter
from typing import Any, Optional

import torch
from torch import nn
from torch.export import Dim

from ..config import MHAConfig
from ..env import executorch_missing
from ..errors import UsageError
from ..layer.entry import entry_module
from ..signature import Signature
from .base import Prepared, require_no_lossy_steps

MODEL_FILE = "model.pte"
BACKENDS = ("xnnpack", "portable")
MAX_BATCH = 4  # the batch axis's default bound: ExecuTorch plans every buffer for the largest
EXAMPLE = {"batch": 2, "seq": 3}  # neither 0 nor 1: no axis specialised to them
DELEGATE = "executorch_call_delegate"


def prepare(module: nn.Module, config: MHAConfig, sig: Signature, backend: str = "xnnpack",
            max_batch: int = MAX_BATCH, specs: Optional[dict] = None) -> Prepared:
    """``max_batch``: the batch axis's bound (seq's: config.max_seq_len)."""
    require_no_lossy_steps(specs, MODEL_FILE)
    _require_buildable(sig, backend, max_batch)
    entry = entry_module(without_empty_buffers(module), sig.kind, sig.input_names,
                         sig.output_names)
    bounds = {"batch": max_batch, "seq": config.max_seq_len}
    program = _lowered(entry, sig, bounds, backend)
    export = {"file": MODEL_FILE, "method": "torch.export + ExecuTorch", "backend": backend,
              "bounds": bounds, "placement": placement(program.exported_program()),
              "executorch": _version()}
    buffer = program.to_executorch().buffer
    return Prepared(export, lambda path: path.write_bytes(buffer))


def _require_buildable(sig: Signature, backend: str, max_batch: int) -> None:
    if why := executorch_missing():
        raise UsageError(why)
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise UsageError(f"--max-batch must be a positive integer, got {max_batch!r}")
    if sig.follows_past:
        raise UsageError("--kv-cache / --static-cache: the ExecuTorch program's cache (held "
                         "inside it as mutable buffers) is not built yet; export the "
                         "full-sequence or --attention-mask call")


def without_empty_buffers(module: nn.Module) -> nn.Module:
    """A copy without the 0-element placeholder buffers (inv_freq, sinks, k_scale, ... of the
    options a layer does not use): ExecuTorch's runtime refuses to load a program holding a
    0-byte constant ("getTensorDataPtr() failed: 0x23"). The forward never reads them."""
    module = copy.deepcopy(module)
    for sub in module.modules():
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None and buffer.numel() == 0:
                del sub._buffers[name]
                object.__setattr__(sub, name, None)
    return module


def _lowered(entry: nn.Module, sig: Signature, bounds: dict, backend: str) -> Any:
    """torch.export with batch in [1, bounds.batch] and seq in [1, bounds.seq], then ExecuTorch's
    edge dialect, delegated to XNNPACK where it can (``portable``: nothing delegated)."""
    from executorch.exir import to_edge_transform_and_lower
    dims = {"batch": Dim("batch", min=1, max=bounds["batch"]),
            "seq": Dim("seq", min=1, max=bounds["seq"])}
    args = tuple(_example(t) for t in sig.inputs)
    dynamic = {t.name: {i: dims[d] for i, d in t.dynamic_axes.items()} for t in sig.inputs}
    with torch.no_grad():
        program = torch.export.export(entry, args, dynamic_shapes=dynamic)
        return to_edge_transform_and_lower(program, partitioner=_partitioners(backend))


def _partitioners(backend: str) -> list:
    """XNNPACK's partitioner, its unsqueeze rule made to refuse what its serializer refuses
    (executorch 1.5.1: an unsqueeze of an output with two dynamic axes, such as rotary's
    positions [batch, seq] -> [batch, seq, 1], is taken and then fails to lower); that node
    stays on the portable kernels."""
    if backend == "portable":
        return []
    from executorch.backends.xnnpack.partition import config as xnn
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from torch.fx.experimental.symbolic_shapes import free_symbols

    class OneDynamicAxisUnsqueeze(xnn.UnsqueezeCopyConfig):
        def check_constraints(self, node, ep) -> bool:
            dynamic = sum(bool(free_symbols(d)) for d in node.meta["val"].shape)
            return dynamic <= 1 and super().check_constraints(node, ep)

    configs = [OneDynamicAxisUnsqueeze if c is xnn.UnsqueezeCopyConfig else c
               for c in xnn.ALL_PARTITIONER_CONFIGS]
    return [XnnpackPartitioner(configs=configs)]


def _example(t) -> torch.Tensor:
    shape = [EXAMPLE[d] if isinstance(d, str) else d for d in t.shape]
    if t.name == "attention_mask":
        return torch.ones(shape, dtype=torch.int64)
    if t.name == "position_ids":
        return torch.arange(shape[1]).expand(shape).contiguous()
    return torch.randn(shape)


def placement(program: Any) -> dict:
    """Where the program's work runs: the delegated subgraphs by backend, and the operators
    left to the portable kernels (by name, counted)."""
    delegated: Counter = Counter()
    portable: Counter = Counter()
    lowered = {n.name: m.backend_id for n, m in _lowered_modules(program)}
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        if DELEGATE in str(node.target):
            delegated[lowered.get(node.args[0].name, "?")] += 1
        elif not str(node.target).startswith("<built-in"):  # getitem: not a kernel
            portable[_op_name(node.target)] += 1
    return {"delegated": dict(delegated), "portable": dict(sorted(portable.items()))}


def _lowered_modules(program: Any) -> list:
    gm = program.graph_module
    return [(n, getattr(gm, n.target)) for n in gm.graph.nodes
            if n.op == "get_attr" and hasattr(getattr(gm, n.target), "backend_id")]


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", str(target))  # "aten.add.Tensor" (edge: its ops)
    return name.split("::")[-1]


def _version() -> str:
    from importlib.metadata import version
    return version("executorch")
