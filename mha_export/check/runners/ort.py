"""ONNX Runtime runners (one per execution provider). Imports no torch, so that the bench
worker measures a session with this same set-up in a torch-free process."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import re
import tempfile
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import ml_dtypes
import numpy as np

from ...env import captured_fd
from ...graph.nodes import all_nodes
from ...lossy.projections import session_options
from ...lossy.projections.kernels import matmul_nbits_kinds, matmul_nbits_probe
from ...signature import Signature
from ...comparison.runner import Feeds, Runner, RunnerUnavailable
from .ort_kernels import describe_cpu, enable_debug_lines, model_ops, read_cuda_lines
from .ort_threads import DEFAULT as DEFAULT_THREAD_POOL, follow_process_pool, get_policy

ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@contextlib.contextmanager
def native_stderr() -> Iterator[dict]:
    """Capture what ONNX Runtime writes while loading providers: its native logger (file
    descriptor 2) and preload_dlls' Python prints."""
    out = {"text": ""}
    printed = io.StringIO()
    try:
        with captured_fd(2) as caught, contextlib.redirect_stdout(printed):
            yield out
    finally:
        out["text"] = printed.getvalue() + caught["text"]


COMPUTE_OPS = {"MatMul", "Gemm", "Softmax", "Attention", "MultiHeadAttention",
               "GroupQueryAttention", "MatMulNBits"}
_PLACED = re.compile(r"(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")


def node_placements(log: str) -> dict[str, list[str]]:
    """{provider: ["OpType (node name)", ...]} from ONNX Runtime's verbose 'Node placements' log
    (one block per graph and subgraph). 'All nodes placed on [X]' lists no names."""
    placed: dict[str, list[str]] = {}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = _PLACED.search(line)
        if not m:
            continue
        names = placed.setdefault(m.group(2), [])
        if m.group(1) == "All nodes":
            continue
        for follow in lines[i + 1: i + 1 + int(m.group(3))]:
            names.append(follow.split("]", 1)[-1].strip())
    return placed


# ONNX Runtime's line when a provider's own library does not load (then it falls back to the CPU)
_PROVIDER_NOT_LOADED = re.compile(r"Failed to load library \S*onnxruntime_providers_\w+\S* "
                                  r"with error: ([^\n]+)")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the terminal colours of ONNX Runtime's log lines


def _provider_not_loaded(log: str) -> str:
    """The loader's reason when the provider's library did not load, e.g. 'libcublasLt.so.13:
    cannot open shared object file: ...', else ''."""
    m = _PROVIDER_NOT_LOADED.search(log)
    return _COLOUR.sub("", m.group(1)).strip()[:200] if m else ""


def _load_failure(log: str) -> str:
    """The useful part of ORT's provider-load error line, e.g. 'libcublasLt.so.13: cannot open'
    (else preload_dlls' first 'Failed to load' line)."""
    if cause := _provider_not_loaded(log):
        return cause
    m = re.search(r"(Failed to load[^\n]+)", log)
    return _COLOUR.sub("", m.group(1)).strip()[:200] if m else ""


def _start_failure(provider: str, error: Exception, log: str) -> str:
    """Why a session on ``provider`` could not be made, in one line: the provider's library did
    not load where ONNX Runtime logged so (it then falls back to the CPU provider, whose error,
    e.g. no bfloat16 MatMul, is not the cause), else the session's own error."""
    if cause := _provider_not_loaded(log):
        return f"{provider} could not load: {cause}"
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return f"{provider} could not start: {lines[0][:300]}"


class OrtRunner(Runner):
    """An ONNX Runtime session on one execution provider ('cpu' or 'cuda'), fed by name."""

    WATCHED_RUNS = 4  # CUDA calls whose kernel debug lines are read (a replay prints none)

    def __init__(self, signature: Signature, path: str | Path, provider: str = "cpu",
                 threads: Optional[int] = None, tf32: bool = True, mem_pattern: bool = True,
                 fp32_compute: bool = False, thread_pool: str = DEFAULT_THREAD_POOL,
                 cuda_graph: bool = False):
        """``fp32_compute``: the file's quantized projections run at accuracy level 1 (a copy
        in memory): its weights checked exactly, apart from level 4's int8 arithmetic;
        ``cuda_graph``: a static-cache step captured as a CUDA graph per shape and replayed
        (``GraphReplays``)."""
        super().__init__(signature)
        self.name = f"ort-{provider}" + ("-fp32-compute" if fp32_compute else "") + (
            "-graph" if cuda_graph else "")
        self.fp32_compute = fp32_compute
        if cuda_graph and (why := cuda_graph_refusal(signature, provider)):
            raise RunnerUnavailable(why)
        model = _at_fp32_compute(path) if fp32_compute else path
        self.session = _session(model, provider, threads, tf32, mem_pattern, thread_pool)
        self.graphs = GraphReplays(lambda dims, graph: _session(
            model, provider, threads, tf32, mem_pattern, thread_pool, graph, dims),
            self.session, signature) if cuda_graph else None
        self.provider, self.providers = provider, self.session.get_providers()
        self.ops = model_ops(_proto(model))
        # CUDA: the first runs' native stdout, where the kernels print which one ran
        self.kernel_log, self._watched_runs = "", self.WATCHED_RUNS
        self.run_options = _quiet_runs()
        self.device = f"{provider} ({self.providers[0]})"
        declared = {i.name: i for i in self.session.get_inputs()}
        missing = [n for n in signature.input_names if n not in declared]
        if missing:
            raise ValueError(f"the model has no input named {missing[0]!r} "
                             f"(it declares {', '.join(declared)})")
        self.dtypes = {n: _NUMPY.get(declared[n].type, np.float32) for n in declared}
        half = next((_HALF[t] for t in map(np.dtype, self.dtypes.values()) if t in _HALF), None)
        self.precision = half or (
            "fp32, TF32 matmuls allowed" if provider == "cuda" and tf32 else "fp32")
        # bfloat16 crosses ONNX Runtime's Python API only as OrtValues: bound, never run()
        self.bound = any(np.dtype(t) in _BITS for t in self.dtypes.values())
        if provider != "cpu":
            self.warning = _cpu_compute_nodes(self.session.load_log)
        if self.session.quantized is not None:
            self._describe_quantized(self.session.quantized)
        if self.session.float8_folded:
            folded = "float8 weights dequantized once at load (no FP8 matmul on CPU)"
            self.precision += f"; {folded}"
            self.device = f"{self.device[:-1]}; {folded})"

    def _describe_quantized(self, ran: "QuantizedKernels") -> None:
        """What ran for the quantized projections, read off the session's optimized graph: the
        MatMulNBits kernels and the arithmetic they really used (int8 activations only where
        this CPU's kernel has that path: probed, not assumed). An unfused dequantize + MatMul
        is correct but slow: a warning, never silent."""
        self.precision += f"; projections: {ran.describe()}"
        self.device = f"{self.device[:-1]}; {ran.describe()})"
        if ran.int8_activations:
            self.tolerance_dtype = INT8_ACTIVATION_DTYPE
        if ran.slow and not self.warning and not self.fp32_compute:  # the copy is slow by design
            self.warning = "; ".join(ran.slow)

    def prepare(self, feeds: Feeds):
        """The inputs in the model's dtypes, made once per case (the bench times run_prepared);
        a static cache: an IO binding whose present_* are bound to past_*'s own memory."""
        inputs = {n: np.ascontiguousarray(feeds[n].astype(self.dtypes[n]))
                  for n in self.signature.input_names}  # copies: the caller's feeds stay as given
        if self.graphs is not None:  # a new shape's first runs (before capture) print
            return self._watched(lambda: self.graphs.call(inputs))
        if not (self.signature.static_cache or self.bound):
            return inputs
        return InPlaceCall(self.session, self.signature, inputs, self.provider,
                           self.run_options, in_place=self.signature.static_cache)

    def run_prepared(self, prepared) -> list[np.ndarray]:
        if isinstance(prepared, InPlaceCall):
            return self._watched(prepared.run)
        return self._watched(lambda: self.session.run(self.signature.output_names, prepared,
                                                      self.run_options))

    def _watched(self, call: Callable):
        """``call()``; on CUDA with its native stdout kept apart (the kernels' debug lines,
        ort_kernels.py, printed at every run that is not a replay), read for the first
        ``WATCHED_RUNS`` calls. The bench's timed calls (``resident_step``'s) are not watched:
        its worker sends them to /dev/null."""
        if self.provider != "cuda":
            return call()
        with captured_fd(1) as printed:
            out = call()
        if self._watched_runs > 0:
            self._watched_runs -= 1
            self.kernel_log += printed["text"]
        return out

    def kernels(self) -> str:
        """Which kernels ran the attention and MatMulNBits: CUDA's debug lines, or what the CPU
        provider's kernels are."""
        if self.provider == "cuda":
            return read_cuda_lines(self.kernel_log, self.ops).describe()
        return describe_cpu(self.ops)

    def resident_step(self, feeds: Feeds, synchronize: bool = True) -> Callable[[], None]:
        """A call as an app with its buffers on the device makes it (the bench times it):
        inputs bound once where the session runs, outputs left there, nothing read back; a
        static cache written in place (a CUDA graph replayed with ``cuda_graph``);
        ``synchronize=False``: enqueued, not waited for (the caller syncs after N steps)."""
        prepared = self.prepare(feeds)
        if not isinstance(prepared, InPlaceCall):
            prepared = InPlaceCall(self.session, self.signature, prepared, self.provider,
                                   self.run_options, in_place=False)
        self._watched(prepared.step)  # warm, and its kernels named
        return prepared.step if synchronize else prepared.queue

    def ran_note(self) -> str:
        return self.graphs.describe() if self.graphs is not None else ""

    def ran_failure(self) -> str:
        if self.graphs is None or not self.graphs.calls or self.graphs.captured():
            return ""
        return "no shape was replayed as a CUDA graph (ONNX Runtime captured none)"

    def bind_cache(self, buffers: Feeds) -> Optional["BoundCache"]:
        """On CPU (base.Runner.bind_cache): the buffers bound once; a call binds x and its
        positions and a fresh y (0.30 vs 0.38 ms a one-token SmolLM2 layer call through
        ``run``, whose every call copies its inputs and makes a new binding;
        benchmarks/layer_call.py)."""
        if not self.signature.static_cache or self.provider != "cpu":
            return None
        return BoundCache(self.session, buffers, self.dtypes, self.run_options)

    def run(self, feeds: Feeds) -> Feeds:
        outs = self.run_prepared(self.prepare(feeds))
        return {n: widened(o) for n, o in zip(self.signature.output_names, outs)}


class InPlaceCall:
    """One call through an IO binding, every input an OrtValue (bfloat16 can cross the Python
    API no other way). ``in_place`` (a static cache): past_key/past_value live in OrtValues that
    are also bound as present_key/present_value, so the model writes the app's buffer itself.
    After the run the outputs must BE those buffers (same memory): a copy is an error. Off the
    CPU every input and output is a device buffer, as an app keeps them there (the copies to
    and from the host are the check's, outside the run)."""

    CACHE = {"present_key": "past_key", "present_value": "past_value"}

    def __init__(self, session, signature: Signature, inputs: Feeds, device: str = "cpu",
                 run_options=None, in_place: bool = True):
        self.session, self.signature, self.inputs, self.device = session, signature, inputs, device
        self.run_options = run_options
        self.cache = self.CACHE if in_place else {}
        self.values = {n: ortvalue(a, device) for n, a in inputs.items()}  # CPU: a's memory
        self.buffers = {n: self.values[n] for n in self.cache.values()}
        self.binding = session.io_binding()
        for name, value in self.values.items():  # self.inputs keeps each array alive
            self.binding.bind_ortvalue_input(name, value)
        for name in signature.output_names:
            if name in self.cache:
                self.binding.bind_ortvalue_output(name, self.buffers[self.cache[name]])
            elif device == "cpu" or not self.cache:  # allocated where the session runs
                self.binding.bind_output(name, device)
            else:  # the static step's y: a fixed device buffer (a replayed graph writes it)
                self.values[name] = device_buffer(_static_y_shape(session, name, inputs),
                                                  _output_dtype(session, name), device)
                self.binding.bind_ortvalue_output(name, self.values[name])

    def refresh(self, inputs: Feeds) -> "InPlaceCall":
        """New inputs copied into the same bound buffers (their addresses unchanged; on CPU
        the arrays those buffers share)."""
        for name, array in inputs.items():
            if self.device == "cpu":
                np.copyto(self.inputs[name], array)
            else:
                self.values[name].update_inplace(bits_of(array))
        return self

    def step(self) -> None:
        """The call alone: outputs stay in their bound buffers."""
        self.session.run_with_iobinding(self.binding, self.run_options)

    def queue(self) -> None:
        """The call enqueued where the session runs and not waited for (RunOptions
        ``disable_synchronize_execution_providers``, onnxruntime PR #28686: a replayed graph
        too), as an app steps: N calls back to back, one sync by the caller."""
        self.session.run_with_iobinding(self.binding, _unsynchronized_runs())

    def run(self) -> list[np.ndarray]:
        self.step()
        outs = dict(zip(self.signature.output_names, self.binding.get_outputs()))
        for name, past in self.cache.items():
            if outs[name].data_ptr() != self.buffers[past].data_ptr():
                raise RuntimeError(f"{name} is a copy: the model did not write the bound "
                                   f"{past} buffer in place")
        return [host_array(outs[n]) if n not in self.cache else self._cache(self.cache[n])
                for n in self.signature.output_names]

    def _cache(self, past: str) -> np.ndarray:
        """The buffer after the call: the input array itself on CPU (the OrtValue shares its
        memory), a copy back from the device elsewhere."""
        return self.inputs[past] if self.device == "cpu" else host_array(self.buffers[past])


def _static_y_shape(session, name: str, inputs: Feeds) -> list[int]:
    """A static step's y for these inputs: (B, T) of x and the declared width, (B, T, D)."""
    b, t = inputs["x"].shape[:2]
    return [b, t, *_declared(session, name).shape[2:]]


def _output_dtype(session, name: str) -> np.dtype:
    return np.dtype(_NUMPY[_declared(session, name).type])


def _declared(session, name: str):
    """The session's declared output of that name."""
    return next(o for o in session.get_outputs() if o.name == name)


def cuda_graph_refusal(signature: Signature, provider: str) -> Optional[str]:
    """Why a session cannot replay this file as a CUDA graph, or None."""
    if provider != "cuda":
        return "a CUDA graph needs the CUDA provider"
    if not signature.static_cache:
        return ("a CUDA graph replays fixed shapes and addresses: only the static-cache step "
                "(--static-cache) has them")
    return None


class GraphReplays:
    """A static-cache step replayed as CUDA graphs, as an app steps one: per input shape a
    session whose symbolic dimensions are fixed at that shape (so ONNX Runtime folds every
    shape computation away and no node is left on the CPU) and whose buffers are bound once
    on the device; a call copies its fresh inputs into them and replays. ONNX Runtime captures
    on a shape's first runs and replays from then on, so a graph that read a stale or host-side
    value would give the case's wrong answer, which the check catches."""

    CAPTURE_RUNS = 3  # ONNX Runtime runs a shape twice before it captures (1.31)

    def __init__(self, open_session: Callable[[dict[str, int], bool], object], declared,
                 signature: Signature, device: str = "cuda"):
        """``open_session(dims, graph)``: a session with those symbolic dimensions fixed (and
        graph capture on, or off for a shape ONNX Runtime will not capture);
        ``declared``: a session of the same model, whose inputs name the dimensions."""
        self.open_session, self.signature, self.device = open_session, signature, device
        self.dims = {i.name: i.shape for i in declared.get_inputs()}
        self.calls: dict[tuple, InPlaceCall] = {}
        self.uncaptured: dict[str, str] = {}  # shape -> why ONNX Runtime would not capture it

    def call(self, inputs: Feeds) -> InPlaceCall:
        """The shape's bound call with these inputs in its buffers; a new shape is captured
        first (its runs repeat the same writes into the cache: idempotent), so the call the
        caller makes is a replay."""
        shape = tuple((n, a.shape) for n, a in sorted(inputs.items()))
        if shape in self.calls:
            return self.calls[shape].refresh(inputs)
        dims = fixed_dims(self.dims, inputs)
        try:
            session = self.open_session(dims, True)
        except RunnerUnavailable as e:  # run as an app runs it: this shape without a graph
            if _CAPTURE_REFUSED not in str(e):
                raise
            self.uncaptured[_shape_label(dims)] = str(e).split(_CAPTURE_REFUSED, 1)[1].strip()
            session = self.open_session(dims, False)
        made = self.calls[shape] = InPlaceCall(session, self.signature, inputs, self.device,
                                               _quiet_runs())
        for _ in range(self.CAPTURE_RUNS):
            made.step()
        return made

    def captured(self) -> list[str]:
        """The shapes replayed as CUDA graphs."""
        shapes = [_shape_label(fixed_dims(self.dims, {n: np.empty(s) for n, s in shape}))
                  for shape in self.calls]
        return [s for s in shapes if s not in self.uncaptured]

    def describe(self) -> str:
        """Which shapes were replayed as CUDA graphs and which ran without one, and why."""
        captured = self.captured()
        why = sorted(set(self.uncaptured.values()))
        return (f"replayed as CUDA graphs: {', '.join(captured) or 'none'}" + (
            f"; without a graph (ONNX Runtime would not capture them: {'; '.join(why)}): "
            f"{', '.join(self.uncaptured)}" if self.uncaptured else ""))


# the words of ONNX Runtime's refusal to capture a session (1.31), before its reason
_CAPTURE_REFUSED = "This session cannot use the graph capture feature as requested by the user"


def _shape_label(dims: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items() if k != "max_cache")


def fixed_dims(declared: dict[str, list], inputs: Feeds) -> dict[str, int]:
    """{symbolic dimension name: its size in ``inputs``} (e.g. batch, seq, max_cache)."""
    return {d: inputs[name].shape[i] for name, dims in declared.items() if name in inputs
            for i, d in enumerate(dims) if isinstance(d, str)}


def ortvalue(a: np.ndarray, device: str = "cpu"):
    """``a`` as an OrtValue (on CPU: sharing its memory); bfloat16 as its bits, typed."""
    import onnxruntime as ort
    if a.dtype not in _BITS:
        return ort.OrtValue.ortvalue_from_numpy(a, device, 0)
    if device == "cpu":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits_of(a), _BITS[a.dtype][1])
    value = device_buffer(list(a.shape), a.dtype, device)
    value.update_inplace(bits_of(a))
    return value


def device_buffer(shape: list[int], dtype: np.dtype, device: str):
    """An uninitialised OrtValue on ``device``; bfloat16 by its ONNX element type."""
    import onnxruntime as ort
    kind = _BITS[dtype][1] if dtype in _BITS else dtype.type
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), kind, device, 0)


def bits_of(a: np.ndarray) -> np.ndarray:
    """What ONNX Runtime's Python API takes for ``a``: a bfloat16 array as its uint16 bits."""
    return a.view(_BITS[a.dtype][0]) if a.dtype in _BITS else a


def host_array(value) -> np.ndarray:
    """An OrtValue's contents as a numpy array (a copy); bfloat16 (its ``numpy()`` says "No
    corresponding Numpy type") read from its bytes on CPU, widened to float32 on the device
    by a Cast there (exact)."""
    dtype = np.dtype(_NUMPY.get(value.data_type(), np.float32))
    if dtype not in _BITS:
        return value.numpy()
    if value.device_name().lower() != "cpu":
        return _widened_on_device(value)
    raw = (ctypes.c_char * value.tensor_size_in_bytes()).from_address(value.data_ptr())
    return np.frombuffer(raw, _BITS[dtype][0]).reshape(value.shape()).view(dtype).copy()


@functools.lru_cache(maxsize=None)
def _bf16_widener(provider: str):
    """A one-Cast session (bfloat16 -> float32) on ``provider``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT)], "widen",
        [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, None)],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 19)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    return ort.InferenceSession(model.SerializeToString(), providers=[provider])


def _widened_on_device(value) -> np.ndarray:
    session = _bf16_widener(ORT_PROVIDERS["cuda"])
    binding = session.io_binding()
    binding.bind_ortvalue_input("a", value)
    binding.bind_output("b", "cpu")
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def widened(a: np.ndarray) -> np.ndarray:
    """A half-precision output as float32 (as every runner gives its outputs), else as is."""
    return a.astype(np.float32) if a.dtype in _HALF else a


class BoundCache:
    """A static-cache CPU session as an app keeps it: past_key/past_value bound once to the
    caller's arrays (of the model's cache dtype), also as present_key/present_value (the model
    writes them in place); each call binds its other inputs and a new y array, runs, and
    returns y (float32, as ``run`` gives it)."""

    def __init__(self, session, buffers: Feeds, dtypes: dict, run_options=None):
        self.session, self.dtypes, self.run_options = session, dtypes, run_options
        self.binding = session.io_binding()
        y = _declared(session, "y")
        self.width, self.y_dtype = y.shape[-1], _NUMPY.get(y.type, np.float32)  # (B, T, D)
        for present, past in InPlaceCall.CACHE.items():
            buffer = buffers[past]
            if buffer.dtype != dtypes[past] or not buffer.flags.c_contiguous:
                raise ValueError(f"{past}: a C-contiguous {np.dtype(dtypes[past]).name} array "
                                 f"is bound in place, got {buffer.dtype}")
            value = ortvalue(buffer)  # shares the array's memory
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)

    def __call__(self, feeds: Feeds) -> np.ndarray:
        arrays = {n: np.ascontiguousarray(v, self.dtypes[n]) for n, v in feeds.items()}
        for name, value in arrays.items():  # alive until the run: an OrtValue shares them
            self.binding.bind_ortvalue_input(name, ortvalue(value))
        b, t = feeds["x"].shape[:2]
        y = np.empty((b, t, self.width), self.y_dtype)  # (B, T, D)
        self.binding.bind_ortvalue_output("y", ortvalue(y))
        self.session.run_with_iobinding(self.binding, self.run_options)
        return widened(y)  # as run() gives it


# tolerance_dtype of a session whose MatMulNBits really quantized their activations (level 4)
INT8_ACTIVATION_DTYPE = "int8-activations"


@dataclass(frozen=True)
class QuantizedKernels:
    """The weight-only quantized matmuls of a session's optimized graph, and the path ONNX
    Runtime's CPU kernel really takes for them on this machine (``kernel_path``)."""

    kernels: int  # MatMulNBits nodes
    paths: tuple  # (bits, accuracy level, zero points, path) of each distinct kind of node
    unfused: int  # DequantizeLinear nodes left in the optimized graph

    @property
    def int8_activations(self) -> bool:
        return any(path == INT8_PATH for *_, path in self.paths)

    @property
    def slow(self) -> list[str]:
        """Why some projections run slowly (dequantized to float at every call)."""
        why = [f"int{b} MatMulNBits at accuracy level {lvl}" + (
               f" with {zp} zero points" if zp != "default" else "") + ": ONNX Runtime "
               "dequantizes the weights to fp32 at every call (" + (
                   "no packed kernel takes float zero points" if zp == "float" else
                   "no such fast kernel on this CPU; accuracy level 4 has one") + ")"
               for b, lvl, zp, path in self.paths if path == DEQUANTIZE_PATH]
        if self.unfused:
            why.append(f"{self.unfused} DequantizeLinear nodes were not fused into MatMulNBits: "
                       "their weights are dequantized to float at every call")
        return why

    def describe(self) -> str:
        kinds = ", ".join(f"int{b} level {lvl}{'' if zp == 'default' else f', {zp} zero points'}"
                          f": {path}" for b, lvl, zp, path in self.paths)
        return f"{self.kernels} MatMulNBits nodes ({kinds})"


INT8_PATH, FP32_PATH, DEQUANTIZE_PATH = ("int8-activation compute", "fp32 compute",
                                         "dequantized to fp32 every call")
_FALLBACK_LOG = "Falling back to using unpacked compute mode"


def _at_fp32_compute(path: str | Path) -> bytes:
    """The model with every MatMulNBits at accuracy level 1 (fp32 compute), serialized."""
    import onnx
    model = onnx.load(str(path))
    for node in all_nodes(model.graph.node):
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = 1
    return model.SerializeToString()


def _quantized_kernels(optimized_path: str, provider: str) -> QuantizedKernels:
    import onnx
    model = onnx.load(optimized_path, load_external_data=False)
    nodes = list(all_nodes(model.graph.node))
    kinds = matmul_nbits_kinds(model)
    paths = tuple(dict.fromkeys(
        (bits, level, zp, kernel_path(bits, block, level, zp) if provider == "cpu"
         else f"{provider} kernel, not probed")
        for bits, block, level, zp in kinds))
    return QuantizedKernels(sum(n.op_type == "MatMulNBits" for n in nodes), paths,
                            sum(n.op_type == "DequantizeLinear" for n in nodes))


@functools.lru_cache(maxsize=None)
def kernel_path(bits: int, block_size: int, accuracy_level: int,
                zero_points: str = "default") -> str:
    """The path ONNX Runtime's CPU MatMulNBits really takes here, probed on one small matmul,
    not assumed: a kernel without a packed path for this (bits, block, level) logs that it
    falls back to dequantizing B (8 bits at fp32 compute, in 1.31); level 4 quantizes the
    activations only where MLAS has an int8 kernel for this CPU, else it computes in fp32
    silently (outputs identical to level 1's; so does it for float zero points)."""
    out, logs = {}, {}
    for level in sorted({1, accuracy_level}):
        out[level], logs[level] = _probe(bits, block_size, level, zero_points)
    if _FALLBACK_LOG in logs[accuracy_level]:
        return DEQUANTIZE_PATH
    if accuracy_level == 4 and not np.array_equal(out[1], out[4]):
        return INT8_PATH
    return FP32_PATH


def _probe(bits: int, block_size: int, level: int, zero_points: str
           ) -> tuple[np.ndarray, str]:
    """The probe matmul's output and the kernel's verbose log of one run."""
    import onnxruntime as ort
    model, a = matmul_nbits_probe(bits, block_size, level, zero_points)
    opts = follow_process_pool(ort.SessionOptions())
    opts.log_severity_level = 0
    with native_stderr() as log:
        session = ort.InferenceSession(model.SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        y = session.run(None, {"A": a})[0]
    return y, log["text"]


_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
          "tensor(bfloat16)": ml_dtypes.bfloat16, "tensor(int64)": np.int64,
          "tensor(int8)": np.int8}
_HALF = {np.dtype(np.float16): "fp16", np.dtype(ml_dtypes.bfloat16): "bf16"}  # -> precision
# dtypes ONNX Runtime's Python API (1.31) cannot take from numpy: (their bits, ONNX element type)
_BITS = {np.dtype(ml_dtypes.bfloat16): (np.uint16, 16)}  # TensorProto.BFLOAT16


def _cpu_compute_nodes(load_log: str) -> str:
    """Nodes that do the arithmetic but were placed on the CPU provider: a CUDA session that runs
    its MatMuls on the CPU is not a clean CUDA result (reported; fatal with --require-cuda)."""
    nodes = [n for n in node_placements(load_log).get(ORT_PROVIDERS["cpu"], [])
             if n.split(" ", 1)[0] in COMPUTE_OPS]
    if not nodes:
        return ""
    why = sorted({_NO_CUDA_KERNEL[op] for op in (n.split(" ", 1)[0] for n in nodes)
                  if op in _NO_CUDA_KERNEL})
    return (f"{len(nodes)} compute nodes ran on the CPU provider, not CUDA: "
            + ", ".join(nodes[:5]) + "".join(f" ({w})" for w in why))


# why ONNX Runtime's CUDA provider leaves an op to the CPU (its kernel registrations, 1.31)
_NO_CUDA_KERNEL = {"GroupQueryAttention": "its CUDA kernel takes float16 and bfloat16 only: "
                                          "export with --dtype float16 for CUDA"}


def cuda_provider_missing() -> Optional[str]:
    """Why this onnxruntime build cannot run CUDA at all (cheap: no session), or None."""
    import onnxruntime as ort
    if ORT_PROVIDERS["cuda"] not in ort.get_available_providers():
        return "this onnxruntime build has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


@functools.lru_cache(maxsize=None)
def cuda_session_refusal() -> Optional[str]:
    """Why no CUDA session runs here, or None: the build has no CUDA provider, or a one-node
    session on it did not start (its libraries or the GPU missing: ONNX Runtime's own reason)."""
    if missing := cuda_provider_missing():
        return missing
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "probe",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    try:
        _session(model.SerializeToString(), "cuda", None, True)
    except RunnerUnavailable as e:
        return str(e)
    return None


def _quiet_runs():
    """RunOptions that log warnings only: a CUDA session loads verbosely (its node placements
    are read from that log) and would otherwise log every kernel of every run."""
    import onnxruntime as ort
    options = ort.RunOptions()
    options.log_severity_level = 3
    return options


@functools.lru_cache(maxsize=None)
def _unsynchronized_runs():
    """Quiet RunOptions whose run returns without waiting for the device."""
    options = _quiet_runs()
    options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    return options


def _session(path: str | Path | bytes, provider: str, threads: Optional[int], tf32: bool,
             mem_pattern: bool = True, thread_pool: str = DEFAULT_THREAD_POOL,
             cuda_graph: bool = False, fixed: Optional[dict[str, int]] = None):
    """An InferenceSession that really runs on ``provider`` (else RunnerUnavailable); its load
    log is kept as ``session.load_log`` (CUDA: verbose, with the node placements)."""
    import onnxruntime as ort
    wanted = ORT_PROVIDERS[provider]
    opts = ort.SessionOptions()
    get_policy(thread_pool).apply(opts, threads)
    opts.enable_mem_pattern = mem_pattern
    for name, size in (fixed or {}).items():  # shapes known: their computations fold away
        opts.add_free_dimension_override_by_name(name, size)
    quantized, entries = _file_settings(path)
    for key, value in entries.items():  # what the file asks for (session_options.py): float8
        opts.add_session_config_entry(key, value)  # weights folded at load
    scratch = tempfile.TemporaryDirectory(prefix="mha-ort-") if quantized else None
    if scratch:  # what ONNX Runtime made of the quantized projections: its optimized graph
        opts.optimized_model_filepath = os.path.join(scratch.name, "optimized.onnx")
    providers: list = [wanted]
    if provider == "cuda":
        if missing := cuda_provider_missing():
            raise RunnerUnavailable(missing)
        enable_debug_lines()  # read when the session makes its kernels
        for name, value in session_options.environment(entries).items():
            os.environ.setdefault(name, value)  # fpA_intB, for builds reading only this
        providers = [(wanted, {"use_tf32": "1" if tf32 else "0",
                               "enable_cuda_graph": "1" if cuda_graph else "0"})]
    failure: Optional[Exception] = None
    with native_stderr() as log:
        if provider == "cuda" and hasattr(ort, "preload_dlls"):
            with contextlib.suppress(Exception):
                ort.preload_dlls()
        opts.log_severity_level = 3 if provider == "cpu" else 0
        try:
            model = path if isinstance(path, bytes) else str(path)
            session = ort.InferenceSession(model, opts, providers=providers)
        except Exception as e:
            if provider == "cpu":  # a model the CPU provider cannot load is a broken model,
                if why := _no_cpu_kernel(path, e):  # unless it has no kernel for its dtype
                    raise RunnerUnavailable(why) from None
                raise
            failure = e
    if failure is not None:  # the load log is complete only once its capture has ended
        raise RunnerUnavailable(_start_failure(wanted, failure, log["text"]))
    used = session.get_providers()
    if used[0] != wanted:
        cause = _load_failure(log["text"]) or "provider library or GPU not available"
        raise RunnerUnavailable(f"{wanted} did not load ({cause}); ONNX Runtime fell back "
                                f"to {used[0]}, which is not reported as a {provider} result")
    session.load_log = log["text"]
    session.float8_folded = session_options.folds_float8(entries)
    session.quantized = None
    if scratch:
        with scratch:
            session.quantized = _quantized_kernels(opts.optimized_model_filepath, provider)
    return session


def _proto(model: str | Path | bytes):
    """The model's ModelProto, without its external data."""
    import onnx
    return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(
        str(model), load_external_data=False)


_MISSING_KERNEL = re.compile(r"NOT_IMPLEMENTED : Could not find an implementation for "
                             r"(\w+)\((\d+)\) node with name '([^']*)'")


def _no_cpu_kernel(model: str | Path | bytes, error: Exception) -> Optional[str]:
    """Why the CPU provider cannot load a model of a dtype it has no kernels for (one line), or
    None: any other load failure is a broken model."""
    missing = _MISSING_KERNEL.search(str(error))
    inputs = _proto(model).graph.input if missing else ()
    dtype = next((_NO_CPU_KERNELS[i.type.tensor_type.elem_type] for i in inputs
                  if i.type.tensor_type.elem_type in _NO_CPU_KERNELS), None)
    if dtype is None:
        return None
    op, version, node = missing.groups()
    return (f"{ORT_PROVIDERS['cpu']} has no {dtype} kernel for {op}({version}) (node {node!r}): "
            f"{_NO_CPU_KERNELS_WHY}")


# the model dtypes ONNX Runtime's CPU provider registers for few ops (1.31): by ONNX element type
_NO_CPU_KERNELS = {16: "bfloat16"}  # TensorProto.BFLOAT16
_NO_CPU_KERNELS_WHY = ("it registers bfloat16 for few ops (not MatMul, Add, Softmax): check "
                       "with --runners ort-cuda or openvino-cpu")


def _file_settings(model: str | Path | bytes) -> tuple[bool, dict[str, str]]:
    """(an mha-export model with quantized projections — its recorded export settings —,
    the session config entries the file asks for: session_options.py)."""
    import json
    proto = _proto(model)
    props = {p.key: p.value for p in proto.metadata_props}
    return ("quantize" in json.loads(props.get("mha_export.export", "{}")),
            session_options.declared(proto))
