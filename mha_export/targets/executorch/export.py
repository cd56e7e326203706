"""The ExecuTorch target: model.pte for ExecuTorch's runtime (phones, embedded Linux, its C++
``Module`` and Python's ``executorch.runtime``). The signature's entry point is captured by
``torch.export`` with batch and seq dynamic up to stated bounds (ExecuTorch plans its memory
for them), lowered by ``to_edge_transform_and_lower`` to XNNPACK (default) or left on the
portable kernels, and serialized.

The static cache lives inside the program as mutable buffers written in place
(cache.py: forward, get_cache, set_cache, reset_cache); a standard layer's step
runs M static rows, each row's buffers read where they lie, by ATen ops or by ExecuTorch's LLM
kernels (``kernels``; rows.py). Refused in one line: the growing cache (buffers
have fixed shapes), a KV-shared layer's cached calls, DeepSeek Sparse Attention (its kind's
``needs``: a stable sort ExecuTorch has no operator for).
"""
from __future__ import annotations

import copy
import warnings
from collections import Counter
from typing import Any, Optional

import torch
from torch import nn
from torch.export import Dim

from ...config import MHAConfig
from .install import executorch_missing, load_llm_kernels
from .torchao import in_program
from ...errors import UsageError
from ...kinds.registry import convert, kind_of
from ...layer.entry import entry_module
from ...signature import CACHE_NAMES, INDEX_K, Signature
from .cache import Method, backend_config, cache_methods, cache_record
from ..base import Prepared, refuse_lacking
from . import MODEL_FILE
from .limits import BACKENDS, LACKS
from .rows import DEFAULT_KERNELS, ROW_KERNELS, llm_kernels_refusal

MAX_BATCH = 4  # the batch axis's default bound: ExecuTorch plans every buffer for the largest
STATIC_ROWS = 1  # a static-cache program's rows (its static batch): one stream, as an app
EXAMPLE = {"batch": 2, "seq": 3, INDEX_K: 2}  # neither 0 nor 1: no axis specialised to them
DELEGATE = "executorch_call_delegate"


def prepare(module: nn.Module, config: MHAConfig, sig: Signature, backend: str = "xnnpack",
            max_batch: Optional[int] = None, specs: Optional[dict] = None,
            kernels: str = DEFAULT_KERNELS, max_seq: Optional[int] = None) -> Prepared:
    """``max_batch``: the batch axis's bound (seq's: config.max_seq_len); a static cache's: the
    program's rows, M static (a standard layer's; default 1), each holding max_batch rows of
    max_seq_len entries inside the program. ``kernels``: a standard layer's static-cache step
    on ATen ops ("aten") or on ExecuTorch's LLM kernels ("llm"). ``max_seq``: seq's bound
    when below the cache's (the bench's steps: ExecuTorch plans memory for the longest call)."""
    max_batch = max_batch if max_batch is not None else default_max_batch(sig)
    check(config, sig, backend, max_batch, specs, kernels)
    if why := executorch_missing():
        raise UsageError(why)
    module, records = in_program(without_empty_buffers(in_split_layout(module)), specs or {},
                                 config)
    bounds = program_bounds(config, sig, max_batch, max_seq)
    example = {**EXAMPLE, "seq": kind_of(config).example_seq(config)}
    export: dict[str, Any] = {"file": MODEL_FILE, "method": "torch.export + ExecuTorch",
                              "backend": backend, "bounds": bounds,
                              "program_layout": module.config.layout, **records}
    if sig.static_cache:
        rows = by_rows(config, sig)
        if rows and kernels == "llm":
            load_llm_kernels()
        methods = cache_methods(
            module, sig, max_batch, config.max_seq_len,
            *_step_example(sig, bounds, example, {"past_key", "past_value"}, rows),
            kernels=kernels if rows else None)
        export["cache"] = cache_record(sig, max_batch, config.max_seq_len,
                                             kernels if rows else "")
    else:
        entry = entry_module(module, sig.kind, sig.input_names, sig.output_names)
        methods = {"forward": Method(entry, *_step_example(sig, bounds, example, set()))}
    program = _lowered(methods, bounds, backend, io_names(sig))
    export.update(placement=placement(program.exported_program("forward")),
                  executorch=_version())
    buffer = _serialized(program, sig.static_cache, "rows" in bounds)
    return Prepared(export, lambda path: path.write_bytes(buffer))


def default_max_batch(sig: Signature) -> int:
    """--max-batch's default: a static-cache program's rows (1), else the batch bound (4)."""
    return STATIC_ROWS if sig.static_cache else MAX_BATCH


def by_rows(config: MHAConfig, sig: Signature) -> bool:
    """Whether the program's step runs a static batch of rows, each row's cache its own
    buffers (executorch_rows.py): a standard layer's static cache."""
    return sig.static_cache and kind_of(config).name == "standard"


def program_bounds(config: MHAConfig, sig: Signature, max_batch: Optional[int] = None,
                   max_seq: Optional[int] = None, **options: Any) -> dict[str, int]:
    """The program's axis bounds (config.json's export.bounds): batch, seq and, with the cache
    inside, past + seq (ExecuTorch plans its memory for the largest call); rows: a static
    batch, exactly that many."""
    max_batch = max_batch if max_batch is not None else default_max_batch(sig)
    bounds = {"batch": max_batch, "seq": min(max_seq or config.max_seq_len, config.max_seq_len)}
    if sig.static_cache:
        bounds["cache"] = config.max_seq_len
    if sig.reads_topk:  # a shared-top-k layer's selection: min(index_topk, keys) a query
        bounds[INDEX_K] = min(config.reach, config.max_seq_len)
    if by_rows(config, sig):
        bounds["rows"] = max_batch
    return bounds


def folder_tag(config: MHAConfig, sig: Signature, backend: str = "xnnpack",
               max_batch: Optional[int] = None, kernels: str = DEFAULT_KERNELS) -> str:
    """The default folder's marks of the options away from their defaults: "-portable" (the
    backend), "-b8" (--max-batch: the batch bound, or a static cache's rows), "-llm" (the
    kernels)."""
    marks = (backend if backend != BACKENDS[0] else "",
             f"b{max_batch}" if max_batch not in (None, default_max_batch(sig)) else "",
             kernels if kernels != DEFAULT_KERNELS else "")
    return "".join(f"-{mark}" for mark in marks if mark)


def check(config: MHAConfig, sig: Signature, backend: str = "xnnpack",
          max_batch: Optional[int] = None, specs: Optional[dict] = None,
          kernels: str = DEFAULT_KERNELS) -> None:
    """What prepare refuses of the request, without ExecuTorch's libraries (the pipeline asks
    whether they are installed after this and the other request checks)."""
    refuse_lacking(kind_of(config).needs(config), "ExecuTorch", LACKS)
    max_batch = max_batch if max_batch is not None else default_max_batch(sig)
    if kernels not in ROW_KERNELS:
        raise UsageError(f"unknown --kernels {kernels!r}: choose one of "
                         f"{', '.join(ROW_KERNELS)}")
    if kernels != DEFAULT_KERNELS:
        if not sig.static_cache:
            raise UsageError(f"--kernels {kernels}: ExecuTorch's LLM kernels compute the "
                             "--static-cache step (export --static-cache)")
        if why := llm_kernels_refusal(config):
            raise UsageError(why)
    if specs and backend == "portable":
        raise UsageError(f"--backend portable cannot hold {', '.join(specs)}: torchao's "
                         "rounding ops have no ExecuTorch portable kernels (XNNPACK "
                         "runs them)")
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise UsageError(f"--max-batch must be a positive integer, got {max_batch!r}")
    if sig.follows_past and not sig.static_cache:
        raise UsageError(REFUSED_CALLS["shared" if sig.shared_kv else "growing"])


REFUSED_CALLS = {
    "growing": "--kv-cache: a growing cache cannot live inside an ExecuTorch program (its "
               "buffers have fixed shapes); export --static-cache, whose buffers the program "
               "holds and writes in place",
    "shared": "a KV-shared layer's cached call reads its source layer's cache, which lives "
              "inside the source layer's own program: export the full-sequence or "
              "--attention-mask call",
}


def in_split_layout(module: nn.Module) -> nn.Module:
    """The same function with q, k and v projected apart, where the layer's kind has that
    layout: torch.export (2.13) silently fixes the batch axis to the example's size when the
    heads are split out of a fused projection's slices (seen on the fused layout)."""
    if module.config.layout == "split" or "split" not in kind_of(module.config).layouts:
        return module
    return convert(module, "split").eval()


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


def _step_example(sig: Signature, bounds: dict, example: dict, inside: set[str],
                  static_batch: bool = False) -> tuple[tuple, tuple]:
    """forward's example arguments (each axis ``example``'s size within its bound) and
    dynamic axes: the signature's inputs but those the program holds inside;
    ``static_batch``: batch is bounds' batch, no axis."""
    inputs = [t for t in sig.inputs if t.name not in inside]
    sizes = {d: min(example[d], bounds[d]) for d in example if d in bounds}
    if static_batch:
        sizes["batch"] = bounds["batch"]
    dynamic = tuple({i: d for i, d in t.dynamic_axes.items()
                     if not (static_batch and d == "batch")} for t in inputs)
    return tuple(_example(t, sizes) for t in inputs), dynamic


def io_names(sig: Signature) -> dict[str, str]:
    """The program's own record of forward's names (constant methods a C++ app reads with
    ``Module::execute("input_names")``): its inputs and outputs, comma-separated; a cache
    inside: the signature's cache inputs and outputs its other methods stand for."""
    held = CACHE_NAMES if sig.static_cache else ()
    return {"input_names": ",".join(n for n in sig.input_names if n not in held),
            "output_names": ",".join(n for n in sig.output_names if n not in held)}


def _lowered(methods: dict[str, Method], bounds: dict, backend: str,
             names: dict[str, str]) -> Any:
    """Each method torch.export'ed with batch in [1, bounds.batch] and seq in [1, bounds.seq]
    (an axis bounded by 1 is no axis: size 1), then ExecuTorch's edge dialect; forward
    delegated to XNNPACK where it can (``portable``: nothing delegated), the cache's plain
    copies left to ExecuTorch's kernels."""
    from executorch.exir import to_edge_transform_and_lower
    dims = {d: Dim(d, min=1, max=bounds[d]) for d in EXAMPLE if bounds.get(d, 1) > 1}
    with torch.no_grad():
        programs = {name: torch.export.export(
            m.module, m.args, dynamic_shapes=tuple(
                {i: dims[d] for i, d in axes.items() if d in dims} for axes in m.dynamic)
            or None)
            for name, m in methods.items()}
        for name, program in programs.items():
            _require_dynamic(name, program, methods[name].dynamic, dims)
        return to_edge_transform_and_lower(
            programs, partitioner={name: _partitioners(backend) if name == "forward" else []
                                   for name in programs}, constant_methods=names)


def _require_dynamic(name: str, program: Any, dynamic: tuple, dims: dict) -> None:
    """Every axis asked dynamic is dynamic in the captured program: torch.export can fix one
    to its example's size without a word, and a program taking one batch size is no export
    of the signature."""
    from torch.fx.experimental.symbolic_shapes import free_symbols
    inputs = [n for n in program.graph.nodes if n.op == "placeholder"][-len(dynamic):]
    for node, axes in zip(inputs, dynamic) if dynamic else ():
        fixed = [d for i, d in axes.items() if d in dims
                 and not free_symbols(node.meta["val"].shape[i])]
        if fixed:
            raise RuntimeError(f"torch.export fixed the {', '.join(fixed)} axis of {name}'s "
                               f"input {node.name} to its example's size")


def _serialized(program: Any, cache_inside: bool, by_rows: bool = False) -> bytes:
    """The .pte bytes; a cache inside: its buffers planned once and shared by the methods
    (``by_rows``: each row's write re-inplaced). ExecuTorch warns that a mutated buffer's
    first contents are not kept: by design here (export.cache.initial says so; reset_cache
    sets them)."""
    if not cache_inside:
        return program.to_executorch().buffer
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Mutation on a buffer in the model")
        return program.to_executorch(backend_config(by_rows)).buffer


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


def _example(t, sizes: dict) -> torch.Tensor:
    shape = [sizes[d] if isinstance(d, str) else d for d in t.shape]
    if t.name == "attention_mask":
        return torch.ones(shape, dtype=torch.int64)
    if t.name == "past_lengths":  # ragged rows, their writes inside any buffer
        return torch.arange(shape[0]) * 2
    if t.name == "position_ids":
        return torch.arange(shape[1]).expand(shape).contiguous()
    if t.name == "topk_indices":  # a shared-top-k layer's selection: key positions
        return torch.arange(shape[2]).expand(shape).contiguous()
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
