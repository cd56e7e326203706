"""ONNX Runtime runners (one per execution provider) and the sessions they open. Imports no
torch, so that the bench worker measures a session with this same set-up in a torch-free
process. Its parts, by concern: ort_values.py (arrays and half precision across the API),
ort_calls.py (IO bindings: a static cache written in place, device-resident calls),
ort_graphs.py (CUDA graphs), ort_quantized.py (the quantized projections' kernels probed),
ort_logs.py (what ONNX Runtime's native logs say), ort_kernels.py (which kernels ran),
ort_threads.py (how sessions share the cores)."""
from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

from ...env import captured_fd
from ...lossy.projections import session_options
from ...signature import Signature
from ...comparison.runner import Feeds, Runner, RunnerUnavailable
from ...comparison.comparator import INT8_ACTIVATION_DTYPE
from .ort_calls import BoundCache, InPlaceCall, quiet_runs
from .ort_graphs import GraphReplays, cuda_graph_refusal
from .ort_kernels import describe_cpu, enable_debug_lines, model_ops, read_cuda_lines
from .ort_logs import cpu_compute_nodes, load_failure, native_stderr, node_placements, \
    start_failure
from .ort_quantized import DEQUANTIZE_PATH, QuantizedKernels, at_fp32_compute, quantized_kernels
from .ort_threads import DEFAULT as DEFAULT_THREAD_POOL, get_policy
from .ort_values import BITS, HALF_PRECISION, NUMPY_DTYPES, ORT_PROVIDERS, widened

# what the tests and the bench reach through this module: ONNX Runtime's runner and its parts
__all__ = ["OrtRunner", "BoundCache", "InPlaceCall", "GraphReplays", "QuantizedKernels",
           "DEQUANTIZE_PATH", "INT8_ACTIVATION_DTYPE", "ORT_PROVIDERS", "cuda_graph_refusal",
           "cuda_provider_missing", "cuda_session_refusal", "native_stderr", "node_placements",
           "cpu_compute_nodes", "widened"]


class OrtRunner(Runner):
    """An ONNX Runtime session on one execution provider ('cpu' or 'cuda'), fed by name."""

    WATCHED_RUNS = 4  # CUDA calls whose kernel debug lines are read (a replay prints none)

    def __init__(self, signature: Signature, path: str | Path, provider: str = "cpu",
                 threads: Optional[int] = None, tf32: bool = True, mem_pattern: bool = True,
                 fp32_compute: bool = False, thread_pool: str = DEFAULT_THREAD_POOL,
                 cuda_graph: bool = False, compute_stream: Optional[int] = None):
        """``fp32_compute``: the file's quantized projections run at accuracy level 1 (a copy
        in memory): its weights checked exactly, apart from level 4's int8 arithmetic;
        ``cuda_graph``: a static-cache step captured as a CUDA graph per shape and replayed
        (``GraphReplays``); ``compute_stream``: RunOptions.compute_stream."""
        super().__init__(signature)
        self.name = f"ort-{provider}" + ("-fp32-compute" if fp32_compute else "") + (
            "-graph" if cuda_graph else "")
        self.fp32_compute = fp32_compute
        if cuda_graph and (why := cuda_graph_refusal(signature, provider)):
            raise RunnerUnavailable(why)
        model = at_fp32_compute(path) if fp32_compute else path
        cuda = CudaSettings(tf32, compute_stream=compute_stream)
        self.session = _session(model, provider, threads, cuda, mem_pattern, thread_pool)
        self.graphs = GraphReplays(lambda dims, graph: _session(
            model, provider, threads, cuda._replace(graph=graph), mem_pattern, thread_pool,
            dims), self.session, signature) if cuda_graph else None
        self.provider, self.providers = provider, self.session.get_providers()
        self.ops = model_ops(_proto(model))
        # CUDA: the first runs' native stdout, where the kernels print which one ran
        self.kernel_log, self._watched_runs = "", self.WATCHED_RUNS
        self.run_options = quiet_runs()
        self.device = f"{provider} ({self.providers[0]})"
        declared = {i.name: i for i in self.session.get_inputs()}
        missing = [n for n in signature.input_names if n not in declared]
        if missing:
            raise ValueError(f"the model has no input named {missing[0]!r} "
                             f"(it declares {', '.join(declared)})")
        self.dtypes = {n: NUMPY_DTYPES.get(declared[n].type, np.float32) for n in declared}
        half = next((HALF_PRECISION[t] for t in map(np.dtype, self.dtypes.values())
                     if t in HALF_PRECISION), None)
        self.precision = half or (
            "fp32, TF32 matmuls allowed" if provider == "cuda" and tf32 else "fp32")
        # bfloat16 crosses ONNX Runtime's Python API only as OrtValues: bound, never run()
        self.bound = any(np.dtype(t) in BITS for t in self.dtypes.values())
        if provider != "cpu":
            self.warning = cpu_compute_nodes(self.session.load_log)
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
        _session(model.SerializeToString(), "cuda", None, CudaSettings())
    except RunnerUnavailable as e:
        return str(e)
    return None


class CudaSettings(NamedTuple):
    """What a CUDA session is opened with (ignored on the CPU)."""

    tf32: bool = True  # TF32 matmuls for float32 models
    graph: bool = False  # capture and replay as a CUDA graph (enable_cuda_graph)
    compute_stream: Optional[int] = None  # RunOptions.compute_stream

    def provider_options(self) -> dict[str, str]:
        """The CUDA provider's options, as ONNX Runtime's Python API takes them (strings; a
        stream as its address, onnxruntime PR #19229; with a graph: captured and replayed on
        that stream, the bundled CUDA provider's behaviour, PR #29221)."""
        options = {"use_tf32": "1" if self.tf32 else "0",
                   "enable_cuda_graph": "1" if self.graph else "0"}
        if self.compute_stream is not None:
            options["user_compute_stream"] = str(self.compute_stream)
        return options


def _session(path: str | Path | bytes, provider: str, threads: Optional[int],
             cuda: CudaSettings = CudaSettings(), mem_pattern: bool = True,
             thread_pool: str = DEFAULT_THREAD_POOL, fixed: Optional[dict[str, int]] = None):
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
        providers = [(wanted, cuda.provider_options())]
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
        raise RunnerUnavailable(start_failure(wanted, failure, log["text"]))
    used = session.get_providers()
    if used[0] != wanted:
        cause = load_failure(log["text"]) or "provider library or GPU not available"
        raise RunnerUnavailable(f"{wanted} did not load ({cause}); ONNX Runtime fell back "
                                f"to {used[0]}, which is not reported as a {provider} result")
    session.load_log = log["text"]
    session.float8_folded = session_options.folds_float8(entries)
    session.quantized = None
    if scratch:
        with scratch:
            session.quantized = quantized_kernels(opts.optimized_model_filepath, provider)
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
