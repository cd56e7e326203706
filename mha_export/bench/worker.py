"""One benchmark measurement in its own process, so that peak RSS belongs to one variant.

Run as ``python -m mha_export.bench.worker '<json spec>'``: it imports only what its variant
needs (an ONNX Runtime variant never imports torch). Prints one JSON line:
{"median_ms", "reps", "peak_rss_mib", "base_rss_mib"} or {"error"}.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from typing import Callable


def rss_mib(field: str) -> float:
    """VmHWM (peak) or VmRSS (current) of this process, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def time_it(fn: Callable[[], object], min_reps: int, budget_s: float) -> tuple[list[float], int]:
    """Wall times (ms) after one warm-up: at least min_reps runs, more until budget_s."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget_s and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, len(times)


class HostClock:
    """Times N enqueued calls by the host's clock, one ``synchronize`` closing them."""

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize

    def start(self) -> None:
        self.synchronize()
        self.t0 = time.perf_counter()

    def stop(self) -> tuple[float, float]:
        """(seconds from start until the work was done, seconds the host took to enqueue it)."""
        enqueued = time.perf_counter() - self.t0
        self.synchronize()
        return time.perf_counter() - self.t0, enqueued


EVENTS = "CUDA events"  # a GPU row's clock when the calls ran on the bench's stream


class EventClock(HostClock):
    """Times N enqueued calls by two CUDA events recorded on the stream the calls run on (as
    apps and the anchors time a step): the device's own time between them. ONNX Runtime's
    sessions run on that stream only when given it (RunOptions.compute_stream)."""

    def __init__(self, stream):
        import torch
        self.stream = stream
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        super().__init__(stream.synchronize)

    def start(self) -> None:
        super().start()
        self.events[0].record(self.stream)

    def stop(self) -> tuple[float, float]:
        enqueued = time.perf_counter() - self.t0
        self.events[1].record(self.stream)
        self.events[1].synchronize()
        return self.events[0].elapsed_time(self.events[1]) / 1e3, enqueued


def back_to_back(fn: Callable[[], object], clock: HostClock, min_reps: int, budget_s: float,
                 batches: int = 5) -> tuple[list[float], int, list[float]]:
    """Per-step times (ms) as apps and anchors time a device's step: ``batches`` runs of N
    calls enqueued back to back (no sync per call), each timed by ``clock`` over N; N sized to
    the budget after a warm-up. A sync adds 10-20 us: amortized over N, not per step. Also per
    step: the host's time to enqueue a call (close to the step's: the GPU waited on the host)."""
    fn()
    clock.start()
    for _ in range(min_reps):
        fn()
    each = clock.stop()[0] / min_reps
    n = int(min(2000, max(min_reps, budget_s / batches / max(each, 1e-6))))
    times, enqueue = [], []
    for _ in range(batches):
        clock.start()
        for _ in range(n):
            fn()
        done, enqueued = clock.stop()
        times.append(done / n * 1e3)
        enqueue.append(enqueued / n * 1e3)
    return times, n * batches, enqueue


def spec_signature(spec: dict):
    """The signature of the spec's model (an int8 cache: "cache_dtype": "int8")."""
    from mha_export.config import MHAConfig
    from mha_export.signature import FLOAT, make_signature
    return make_signature(MHAConfig.from_dict(spec["config"]), spec.get("kind", "full"),
                          spec.get("cache_dtype", FLOAT))


def sample_feeds(spec: dict) -> dict:
    """The signature's named inputs at the spec's (batch, seq, past), as the parity sweep makes
    them (no padding); imports no torch, so an ONNX Runtime worker stays torch-free."""
    from mha_export.check.sweep import Case, make_feeds
    sig = spec_signature(spec)
    feeds = make_feeds(sig, Case(spec["batch"], spec["seq"], spec.get("past", 0)), seed=0)
    if sig.static_cache and spec.get("capacity"):  # the app's buffer at its full capacity
        import numpy as np
        for name in ("past_key", "past_value"):
            b, k, _, h = feeds[name].shape
            feeds[name] = np.zeros((b, k, spec["capacity"], h), feeds[name].dtype)
        feeds["past_lengths"] = np.full(spec["batch"], spec.get("past", 0), np.int64)
    return feeds


def torch_variant(spec: dict) -> Callable[[], object]:
    import torch
    from mha_export.config import MHAConfig
    from mha_export.layer.entry import entry_module
    from mha_export.kinds.registry import build_module
    from mha_export.signature import make_signature
    from mha_export.bench.baselines import MultiHeadAttention
    from mha_export.graph.builder import FLOAT_TYPES
    torch.set_num_threads(spec["threads"])
    c = MHAConfig.from_dict(spec["config"])
    device = spec.get("device", "cpu")
    dtype = FLOAT_TYPES[spec.get("dtype", "float32")].torch
    t = spec["seq"]
    sig = make_signature(c, spec.get("kind", "full"))
    if spec["variant"] == "textbook-eager":  # mask buffer sized to the context (here T)
        module = MultiHeadAttention(c.d_in, c.dim, t, 0.0, c.heads, c.qkv_bias).eval()
    elif spec["variant"] == "torchscript":
        module = torch.jit.load(spec["model"], map_location=device)
    else:  # eager: the signature's entry point (a cached step: forward_step over torch.cat)
        module = entry_module(build_module(c, seed=0), sig.kind, sig.input_names,
                              sig.output_names)
    module = module.to(device, dtype)
    feeds = sample_feeds(spec)
    args = [torch.from_numpy(feeds[n]).to(device) for n in sig.input_names]
    args = [a.to(dtype) if a.is_floating_point() else a for a in args]

    if spec.get("cuda_graph"):
        return _torch_graph(module, args)

    def run() -> object:
        with torch.inference_mode():
            y = module(*args)
        if device == "cuda" and not spec.get("back_to_back"):
            torch.cuda.synchronize()
        return y

    return run


def _torch_graph(module, args: list) -> Callable[[], object]:
    """torch's own step captured as one CUDA graph (warmed on a side stream, as torch's docs
    capture) and replayed: what an app replaying torch's step runs; a static cache's step
    writes the same slot at every replay."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            module(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        module(*args)
    return graph.replay


def runner_variant(spec: dict) -> Callable[[], object]:
    """A registered runner under test (ONNX Runtime: torch is never imported) on the spec's
    inputs, converted once; its session set-up is the check's own."""
    from pathlib import Path

    from mha_export.check.runners import RUNNERS, RunOptions
    sig = spec_signature(spec)
    options = RunOptions(threads=spec["threads"], mem_pattern=spec.get("mem_pattern", True),
                         thread_pool=spec.get("thread_pool", "idle"),
                         compute_stream=spec.get("compute_stream"))
    runner = RUNNERS[spec["runner"]].open(sig, Path(spec["model"]), options)
    if spec.get("resident"):  # the buffers on the device, nothing read back (an app's call)
        step = runner.resident_step(sample_feeds(spec), not spec.get("back_to_back"))
    else:
        prepared = runner.prepare(sample_feeds(spec))
        step = lambda: runner.run_prepared(prepared)  # noqa: E731

    def call() -> object:
        return step()
    call.kernels = runner.kernels  # which kernels ran: asked after the timing
    return call


def gemm_variant(spec: dict) -> Callable[[], object]:
    """A large fp32 MatMul through ONNX Runtime: the machine's GEMM ceiling for this run."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    n = spec["n"]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    opsets = [helper.make_opsetid("", 17)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = spec["threads"]
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((n, n)).astype(np.float32) for k in "ab"}
    return lambda: session.run(None, feeds)


def stream_variant(spec: dict) -> Callable[[], object]:
    """A streaming read (sum) of an array of the spec's size: what reading cold bytes costs."""
    import numpy as np
    src = np.ones(spec["mib"] * 2**20 // 4, np.float32)
    return lambda: np.add.reduce(src)


def ring(make: Callable[[dict], Callable[[], object]], spec: dict) -> Callable[[], object]:
    """``spec["ring"]`` independent instances of the variant (own weights, buffers, inputs),
    stepped in turn: their total exceeds the last-level cache, so each call reads its weights
    and cache from memory, as a layer of a real model does (the others evicted them)."""
    import itertools
    made = [make(spec) for _ in range(spec.get("ring", 1))]
    for fn in made[1:] * 2:  # warmed like the first (time_it warms that one): TorchScript's
        fn()  # profiling executor optimizes on its second call
    instances = itertools.cycle(made)

    def step() -> object:
        return next(instances)()
    step.made = made
    return step


def copy_variant(spec: dict) -> Callable[[], object]:
    """A plain memory copy: this machine's (or the GPU's) bandwidth ceiling for a cached step."""
    if spec.get("device") == "cuda":
        import torch
        src = torch.ones(spec["mib"] * 2**20 // 4, device="cuda")
        dst = torch.empty_like(src)

        def copy() -> None:
            dst.copy_(src)
            torch.cuda.synchronize()
        return copy
    import numpy as np
    src = np.ones(spec["mib"] * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def cpp_measure(spec: dict) -> dict:
    """A C++ program (cpp/: mha_aoti, mha_torch) on the spec's inputs written as one CASE_DIR:
    its ``--repeat`` times the model call alone, no Python per call. A first short run sizes the
    repeat count to the budget; peak RSS is the program's own."""
    import re
    import resource
    import subprocess
    import tempfile
    from pathlib import Path

    import numpy as np
    with tempfile.TemporaryDirectory(prefix="mha-bench-cpp-") as case:
        for name, array in sample_feeds(spec).items():
            np.save(Path(case) / f"{name}.npy", array)

        def timed(repeat: int) -> tuple[float, float]:
            out = subprocess.run([spec["program"], spec["model"], case, "--repeat", str(repeat),
                                  "--threads", str(spec["threads"])],
                                 capture_output=True, text=True, timeout=900)
            found = re.search(r"(\d+) calls, median ([\d.]+) ms, min ([\d.]+) ms", out.stdout)
            if out.returncode or not found:
                tail = (out.stderr or out.stdout).strip().splitlines()
                raise RuntimeError(tail[-1] if tail else f"exit code {out.returncode}")
            return float(found.group(2)), float(found.group(3))

        first, _ = timed(spec.get("min_reps", 5))
        reps = int(min(200, max(spec.get("min_reps", 5), spec.get("budget_s", 2.0) * 1e3 / first)))
        median, fastest = timed(reps)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB -> MiB
    return {"median_ms": median, "min_ms": fastest, "reps": reps, "peak_rss_mib": peak,
            "base_rss_mib": float("nan")}


def measure(spec: dict) -> dict:
    kind = spec["variant"]
    if kind == "cpp":
        return cpp_measure(spec)
    make = {"gemm": gemm_variant, "runner": runner_variant, "copy": copy_variant,
            "stream": stream_variant}.get(kind, torch_variant)
    base = rss_mib("VmRSS")
    if spec.get("back_to_back"):
        fn, result = _on_own_stream(make, spec)
    else:
        fn = ring(make, spec)
        times, reps = time_it(fn, spec.get("min_reps", 5), spec.get("budget_s", 2.0))
        result = {"median_ms": statistics.median(times), "min_ms": min(times), "reps": reps}
    result.update(peak_rss_mib=rss_mib("VmHWM"), base_rss_mib=base)
    if kernels := getattr(fn.made[0], "kernels", None):
        result["kernels"] = kernels()
    if spec.get("resident") and spec.get("with_copies"):  # the same call fed from the host
        copies, _ = time_it(ring(make, {**spec, "resident": False}), spec.get("min_reps", 5),
                            spec.get("budget_s", 2.0))
        result["copies_median_ms"] = statistics.median(copies)
    if spec.get("device") == "cuda":  # torch's own count; ORT CUDA's arena is not visible here
        import torch
        result["peak_device_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def _on_own_stream(make: Callable[[dict], Callable[[], object]], spec: dict):
    """A GPU row: the variant made and stepped on a stream of the bench's own (ONNX Runtime's
    sessions given it as their compute stream, torch's calls and graph replays made on it),
    timed back to back by CUDA events on that stream. A variant that cannot be opened on it is
    timed by the host's clock around a device sync instead, and its row says why. Returns (the
    variant, its timing)."""
    import torch
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        try:
            fn = ring(make, {**spec, "compute_stream": stream.cuda_stream})
            clock, named = EventClock(stream), EVENTS
        except Exception as e:  # noqa: BLE001  (a refusal of the stream: its words in the row)
            fn, clock = ring(make, spec), HostClock(torch.cuda.synchronize)
            named = f"host clock ({str(e).strip().splitlines()[0][:160]})"
        times, reps, enqueue = back_to_back(fn, clock, spec.get("min_reps", 5),
                                            spec.get("budget_s", 2.0))
    return fn, {"median_ms": statistics.median(times), "min_ms": min(times), "reps": reps,
                "enqueue_ms": statistics.median(enqueue), "clock": named}


def limit_memory(gib: float | None) -> None:
    """Cap the address space so an oversized variant fails with an allocation error in its own
    row instead of waking the kernel's OOM killer."""
    if gib:
        import resource
        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def on_cuda(spec: dict) -> bool:
    """A variant that runs on the GPU: CUDA reserves far more address space than it uses (an
    address-space cap makes ONNX Runtime's CUDA provider fail at cudaSetDevice, 'out of
    memory', and fall back to the CPU; seen on an H100, 2026-11-25), so no cap applies."""
    if spec.get("device") == "cuda":
        return True
    if spec.get("variant") == "runner":
        from mha_export.check.runners import RUNNERS
        return RUNNERS[spec["runner"]].device == "cuda"
    return False


@contextlib.contextmanager
def quiet_native_stdout():
    """File descriptor 1 sent to /dev/null meanwhile (this process's one JSON line is printed
    after): the kernel debug lines a CUDA session prints at every run that is not a replay."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if not on_cuda(spec):
        limit_memory(spec.get("mem_limit_gib"))
    elif spec.get("variant") == "runner":  # torch first: it loads the CUDA libraries that
        import torch  # noqa: F401  onnxruntime-gpu links (docs/gpu.md)
    try:
        with quiet_native_stdout():  # ONNX Runtime's CUDA kernel debug lines (ort_kernels.py)
            result = measure(spec)
    except MemoryError:
        result = {"error": "out of memory"}
    except Exception as e:  # reported in the variant's row, never a crash of the whole run
        text = str(e).strip() or type(e).__name__
        oom = any(w in text.lower() for w in ("alloc", "bfc_arena", "out of memory"))
        result = {"error": f"out of memory ({text.splitlines()[0][:80]})" if oom
                  else text.splitlines()[0][:200]}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
