"""The GPU speed questions in one bounded call (a lent NVIDIA H200, docs/performance.md#cuda):

  A  environment and the device's copy bandwidth (the bytes floor's reference);
  B  the static-cache decode step (T = 1) of a Llama-3-8B-shaped layer, fp16 (bf16 where the
     export takes it): ONNX Runtime CUDA with every buffer bound on the device (the cache bound
     as past and present: written in place), with and without CUDA-graph capture, each graph
     form that builds a static cache; the project's eager module on CUDA, plain and replayed
     from a torch.cuda.CUDAGraph; int4 projections (MatMulNBits); each against the bytes floor
     (weights + the valid cache prefix / measured bandwidth);
  C  prefill (no cache), fp16, 12 heads x 768 and the 8B shape, every form vs the eager module
     (torch SDPA), plus fp32 at 12 x 768;
  D  parity of what was timed, on the device: each output (and the written cache slot) against
     the eager module in float32 on the same inputs, at the project's tolerance for the dtype;
     a CUDA graph is replayed on fresh inputs three times, and once on stale ones (a control
     that must fail).

Run on the GPU machine (benchmarks/gpu/run-speed.sh wraps it):
    PYTHONPATH=$PWD python3 benchmarks/gpu/speed.py --out DIR
Here, on the CPU (every code path, tiny shapes, the CPU provider; graph rows say "needs CUDA"):
    PYTHONPATH=$PWD python benchmarks/gpu/speed.py --device cpu --smoke --out DIR

Writes DIR/gpu-speed.json (env + rows; rewritten after every row), DIR/gpu-speed.txt (the
printed lines) and DIR/gpu-speed.md (ratios). Every section has a time budget and the whole run
one (--budget): what is left when it is spent is recorded as skipped, never run late. Each
measurement is guarded: its error is its row's ``error``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before onnxruntime: its CUDA libraries)
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto  # noqa: E402

from mha_export.comparison.comparator import (BFLOAT16, FLOAT16, FP32, FP32_TF32,  # noqa: E402
                                         INT8_ACTIVATIONS, Tolerance, compare, loosest)
from mha_export.check.runners.ort import native_stderr, _file_settings  # noqa: E402
from mha_export.config import MHAConfig  # noqa: E402
from mha_export.export.pipeline import export_onnx  # noqa: E402
from mha_export.kinds.registry import FORMS, default_form, forms_for, kind_of  # noqa: E402
from mha_export.lossy.projections.reference import reference_module  # noqa: E402
from mha_export.lossy.projections.rtn import QuantSpec  # noqa: E402
from mha_export.presets import PRESETS  # noqa: E402
from mha_export.signature import STATIC, make_signature  # noqa: E402
from mha_export.weights.source import load_source  # noqa: E402

JSON, TXT, MD = "gpu-speed.json", "gpu-speed.txt", "gpu-speed.md"
PROBE_ROWS = "probe-rows.json"
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ORT_TYPES = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16,
             "tensor(bfloat16)": torch.bfloat16, "tensor(int64)": torch.int64,
             "tensor(int8)": torch.int8}
# IOBinding.bind_input/bind_output take an ONNX element type as an int (numpy has no bfloat16)
ELEM = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16,
        torch.bfloat16: TensorProto.BFLOAT16, torch.int64: TensorProto.INT64,
        torch.int8: TensorProto.INT8}
TOLERANCE = {"float32": FP32, "float16": FLOAT16, "bfloat16": BFLOAT16}
NEEDS_CUDA = "needs CUDA (not run: --device cpu)"


# ----------------------------------------------------------------------------- the plan
class Plan:
    """Shapes, lengths, iterations and per-section budgets (seconds) of a run."""

    def __init__(self, smoke: bool, budget: float):
        self.smoke = smoke
        if smoke:
            self.shapes = {
                "llama": ("tiny-gqa (llama3-8b stand-in)",
                          dict(dim=64, heads=4, kv_heads=2, head_dim=16, rotary="half",
                               rope_theta=500000.0, qkv_bias=False, out_bias=False,
                               max_seq_len=16)),
                "small": ("tiny-mha (12x768 stand-in)", dict(dim=32, heads=4, max_seq_len=16))}
            self.pasts, self.capacity = [8, 16], 32
            self.prefill = {"small": [8, 16], "llama": [8, 16]}
            self.fp32_prefill_T = 16
            self.decode = dict(warmup=1, iters=2, max_s=0.5)
            self.prefill_it = dict(warmup=1, iters=2, max_s=0.5)
            self.copy_bytes = 16 << 20
            self.budgets = dict(A=20, B=60, C=40, G=30, probe=40)
        else:
            llama = dict(PRESETS["llama3-8b"])
            self.shapes = {"llama": ("llama3-8b", llama),
                           "small": ("12x768", dict(dim=768, heads=12))}
            self.pasts = [1024, 8192]
            # past 8192 + this token must fit: capacity max_seq_len + 64 (a multiple of 64)
            self.capacity = llama["max_seq_len"] + 64
            self.prefill = {"small": [512, 4096, 16384], "llama": [512, 4096, 16384]}
            self.fp32_prefill_T = 4096
            self.decode = dict(warmup=10, iters=200, max_s=0.6)
            self.prefill_it = dict(warmup=3, iters=30, max_s=1.0, batch=10)
            self.copy_bytes = 1 << 30
            self.budgets = dict(A=20, B=110, C=110, G=60, probe=75)
        self.total = budget


class Ctx:
    def __init__(self, args, plan: Plan):
        self.args, self.plan = args, plan
        self.cuda = args.device == "cuda"
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.ort_device = "cuda" if self.cuda else "cpu"
        self.out = Path(args.out)
        self.models = Path(args.models) if args.models else Path(
            os.environ.get("TMPDIR", "/tmp")) / f"mha-speed-models-{os.getpid()}"
        self.end = T_START + plan.total
        self.bandwidth: Optional[float] = None  # bytes / s
        self.exports: dict[tuple, Any] = {}
        self.modules: dict[tuple, Any] = {}

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def deadline(self, seconds: float) -> float:
        return min(time.perf_counter() + seconds, self.end)

    @staticmethod
    def left(deadline: float) -> float:
        return deadline - time.perf_counter()


# ----------------------------------------------------------------------------- the report
class Report:
    FIELDS = ("section", "form", "dtype", "shape", "T", "past", "mode", "median_ms", "iters",
              "floor_ms", "floor_fraction", "parity", "error")

    def __init__(self, out: Path, env: dict):
        self.out, self.env, self.rows, self.lines = out, env, [], []
        out.mkdir(parents=True, exist_ok=True)

    def line(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)
        self.flush()

    def add(self, row: dict) -> dict:
        row = {**{k: None for k in self.FIELDS}, **row}
        row["elapsed_s"] = round(time.perf_counter() - T_START, 1)
        self.rows.append(row)
        self.line(describe(row))
        return row

    def flush(self) -> None:
        doc = {"env": self.env, "rows": self.rows}
        tmp = self.out / (JSON + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, self.out / JSON)
        (self.out / TXT).write_text("\n".join(self.lines) + "\n")

    def markdown(self) -> None:
        try:
            (self.out / MD).write_text(summary_markdown(self.env, self.rows))
        except Exception as e:  # the summary never costs the results
            (self.out / MD).write_text(f"summary failed: {type(e).__name__}: {e}\n")


def describe(r: dict) -> str:
    where = " ".join(str(x) for x in (
        r["section"], r["shape"], r["dtype"], f"T={r['T']}" if r["T"] is not None else None,
        f"past={r['past']}" if r["past"] is not None else None, r["form"], r["mode"])
        if x is not None)
    if r["error"]:
        return f"{where}: {'SKIPPED' if r.get('skipped') else 'ERROR'} {r['error'][:300]}"
    text = f"{where}:"
    if r["median_ms"] is not None:
        text += f" {r['median_ms']:.4g} ms (n={r['iters']}"
        if r.get("batched_ms") is not None:
            text += f", back-to-back {r['batched_ms']:.4g}"
        text += ")"
    if r["floor_ms"] is not None and r["floor_fraction"] is not None:
        text += f" floor {r['floor_ms']:.4g} ms = {r['floor_fraction']:.0%}"
    p = r["parity"]
    if p:
        text += (f" parity max|d| {p['max_abs']:.2e} rel {p['max_rel']:.2e} "
                 f"{'PASS' if p['pass'] else 'FAIL'}")
        if p.get("stale_control"):
            s = p["stale_control"]
            text += f"; stale control {'fails (ok)' if s['control_ok'] else 'PASSED (bad)'}"
    for key in ("bandwidth_GBps", "note"):
        if r.get(key) is not None:
            text += f" {key}={r[key]}"
    return text


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()[:4000]


def guard(report: Report, meta: dict, fn: Callable[[], dict]) -> dict:
    """One measurement: its row, or the row with the error that stopped it."""
    try:
        return report.add({**meta, **fn()})
    except Exception as e:
        row = {**meta, "error": err(e)}
        if os.environ.get("SPEED_TRACEBACK"):
            row["traceback"] = traceback.format_exc()[-3000:]
        return report.add(row)


def skipped(report: Report, meta: dict, why: str) -> None:
    report.add({**meta, "error": why, "skipped": True})


# ----------------------------------------------------------------------------- timing
def timeit(call: Callable, sync: Callable, warmup: int, iters: int, max_s: float,
           batch: int = 50) -> dict:
    """Median of per-call times (each call then a device synchronize), after warm-up; also the
    mean of back-to-back calls with one synchronize (launches overlapping)."""
    for _ in range(warmup):
        call()
    sync()
    times: list[float] = []
    stop = time.perf_counter() + max_s
    while len(times) < iters and (len(times) < 2 or time.perf_counter() < stop):
        t = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t)
    k = max(1, min(len(times), batch))
    t = time.perf_counter()
    for _ in range(k):
        call()
    sync()
    batched = (time.perf_counter() - t) / k
    return {"median_ms": statistics.median(times) * 1e3, "iters": len(times),
            "min_ms": min(times) * 1e3, "batched_ms": batched * 1e3}


# ----------------------------------------------------------------------------- parity
def parity(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> dict:
    """The comparator's rule (|a - e| <= atol + scaled * max|e| + rtol * |e|, every element
    finite), on the device in float64: max_rel is max|d| / max|e| (comparator's ``rel``)."""
    a, e = actual.detach().to(torch.float64), expected.detach().to(torch.float64)
    if a.shape != e.shape:
        return {"max_abs": float("nan"), "max_rel": float("nan"), "pass": False,
                "reason": f"shape {list(a.shape)} != {list(e.shape)}"}
    if not bool(torch.isfinite(a).all()):
        return {"max_abs": float("nan"), "max_rel": float("nan"), "pass": False,
                "reason": "non-finite output"}
    d = (a - e).abs()
    scale = float(e.abs().max()) if e.numel() else 0.0
    allowed = tol.atol + tol.scaled * scale + tol.rtol * e.abs()
    max_abs = float(d.max()) if d.numel() else 0.0
    return {"max_abs": max_abs, "max_rel": max_abs / max(scale, 1e-30),
            "pass": bool((d <= allowed).all()), "tol": str(tol)}


def parity_numpy_agrees(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> bool:
    """Smoke check that ``parity`` decides as mha_export.comparison.comparator.compare does."""
    mine = parity(actual, expected, tol)
    theirs = compare(actual.detach().float().cpu().numpy(),
                     expected.detach().double().cpu().numpy(), tol)
    return mine["pass"] == theirs.passed and abs(mine["max_abs"] - theirs.max_abs) <= 1e-12 + \
        1e-9 * abs(theirs.max_abs)


def merged(parts: dict[str, dict]) -> dict:
    return {"max_abs": max(p["max_abs"] for p in parts.values()),
            "max_rel": max(p["max_rel"] for p in parts.values()),
            "pass": all(p["pass"] for p in parts.values()), "parts": parts}


# ----------------------------------------------------------------------------- the layer
def config_of(ctx: Ctx, key: str) -> MHAConfig:
    return MHAConfig(**ctx.plan.shapes[key][1])


def shape_name(ctx: Ctx, key: str) -> str:
    return ctx.plan.shapes[key][0]


def eager(ctx: Ctx, key: str, dtype: str = "float32", quant: Optional[QuantSpec] = None,
          quant_dtype: str = "float16"):
    """The project's eager module (seed 0, as export_onnx builds it) on the device in dtype;
    rotary frequencies kept float32 (the exported graph computes the angles in float32).
    ``quant``: the function an int4 file holds (its dequantized weights, scales in
    ``quant_dtype``)."""
    k = (key, dtype, quant, quant_dtype)
    if k in ctx.modules:
        return ctx.modules[k]
    if dtype != "float32":
        m32 = eager(ctx, key, "float32", quant, quant_dtype)
        m = copy.deepcopy(m32).to(TORCH_DTYPES[dtype])
        for name in ("inv_freq", "long_inv_freq"):
            setattr(m, name, getattr(m32, name).clone())
    else:
        m = load_source(config_of(ctx, key), seed=0).module
        if quant is not None:
            m = reference_module(m, quant, quant_dtype)
        m = m.to(ctx.dev)
    m.eval().requires_grad_(False)
    ctx.modules[k] = m
    return m


def exported(ctx: Ctx, key: str, kind: str, form: str, dtype: str,
             quant: Optional[QuantSpec] = None) -> Path:
    """model.onnx of this shape / signature / form / dtype (exported once; a refusal is kept
    and raised again)."""
    k = (key, kind, form, dtype, quant)
    if k not in ctx.exports:
        name = f"{key}-{kind}-{form}-{dtype}" + (f"-{quant.tag}" if quant else "")
        t = time.perf_counter()
        try:
            extra = {"quantize": quant} if quant else {}
            res = export_onnx(config_of(ctx, key), ctx.models / name, attention=form,
                              dtype=dtype, static_cache=kind == STATIC, validate=False,
                              force=True, **extra)
            ctx.exports[k] = (res.path / "model.onnx", round(time.perf_counter() - t, 1))
        except Exception as e:
            ctx.exports[k] = e
    got = ctx.exports[k]
    if isinstance(got, Exception):
        raise RuntimeError(f"export refused/failed: {err(got)}")
    return got[0]


def form_list(ctx: Ctx, key: str, kind: str) -> tuple[list[str], dict[str, str]]:
    """(forms that build this layer and signature, default first; {form: why not})."""
    cfg = config_of(ctx, key)
    sig = make_signature(cfg, kind)
    ok = forms_for(cfg, sig)
    first = default_form(cfg, sig).name
    ok = [first] + [f for f in ok if f != first]
    refused = {n: f.problem(cfg, sig) for n, f in FORMS.items() if n not in ok}
    return ok, refused


# ----------------------------------------------------------------------------- ONNX Runtime
class SessionFailed(RuntimeError):
    pass


def session(ctx: Ctx, path: Path, graph: bool = False, tf32: bool = False):
    """An InferenceSession on the CUDA provider (the CPU provider with --device cpu);
    ``graph``: CUDA-graph capture enabled. Without a graph its first run is profiled (then
    profiling ends): the profile names each node's provider (``placements``). A verbose
    session log would say it at load too, but it also logs during every run, into the timings."""
    opts = ort.SessionOptions()
    _, entries = _file_settings(path)  # what the file asks of the app (session_options.py)
    for key, value in entries.items():
        opts.add_session_config_entry(key, value)
    opts.log_severity_level = 3
    if not graph:
        ctx.models.mkdir(parents=True, exist_ok=True)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(ctx.models / "ort-profile")
    if ctx.cuda:
        providers = [("CUDAExecutionProvider", {
            "enable_cuda_graph": "1" if graph else "0", "use_tf32": "1" if tf32 else "0",
            # no power-of-two growth: a T = 16384 prefill's scores would double the arena
            "arena_extend_strategy": "kSameAsRequested"})]
    else:
        providers = ["CPUExecutionProvider"]
    failure = None
    with native_stderr() as log:
        try:
            sess = ort.InferenceSession(str(path), opts, providers=providers)
        except Exception as e:
            failure = e
    if failure is not None:
        raise SessionFailed(f"{err(failure)}") from None
    want = "CUDAExecutionProvider" if ctx.cuda else "CPUExecutionProvider"
    if sess.get_providers()[0] != want:
        raise SessionFailed(f"{want} did not load (ONNX Runtime fell back to "
                            f"{sess.get_providers()[0]})")
    sess.load_log = log["text"][-2000:]
    sess.profiling, sess.placed = not graph, None
    return sess


def placements(sess) -> Optional[dict]:
    """{provider: ["OpType (node)", ...]} of the nodes the profiled first run executed (ends
    the profiling; None for a session that was not profiled or has not run)."""
    if sess.placed is None and sess.profiling:
        sess.profiling = False
        path = sess.end_profiling()
        try:
            events = json.loads(Path(path).read_text())
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)
        placed: dict = {}
        for e in events:
            a = e.get("args", {})
            if e.get("cat") == "Node" and "provider" in a and e["name"].endswith("_kernel_time"):
                node = f"{a.get('op_name')} ({e['name'][:-len('_kernel_time')]})"
                names = placed.setdefault(a["provider"], [])
                if node not in names:
                    names.append(node)
        sess.placed = placed
    return sess.placed


def placement_info(sess) -> dict:
    """Where ONNX Runtime put the nodes: providers, and the nodes on the CPU provider (from the
    profiled first run)."""
    placed = placements(sess)
    if placed is None:
        return {"providers": None}
    cpu = placed.get("CPUExecutionProvider", [])
    memcpy = [n for nodes in placed.values() for n in nodes if n.startswith("Memcpy")]
    return {"providers": sorted(placed), "cpu_nodes": len(cpu), "cpu_node_list": cpu[:40],
            "memcpy_nodes": memcpy[:10]}


def run_options(graph_id: Optional[int] = None):
    ro = ort.RunOptions()
    ro.log_severity_level = 3  # the session loads verbosely: runs log warnings only
    if graph_id is not None:
        ro.add_run_config_entry("gpu_graph_id", str(graph_id))
    return ro


def bind(binding, name: str, t: torch.Tensor, output: bool, device: str) -> None:
    """Bind a torch tensor's own memory (its data_ptr) as an input or output."""
    args = (name, device, 0, ELEM[t.dtype], list(t.shape), t.data_ptr())
    (binding.bind_output if output else binding.bind_input)(*args)


class OrtCall:
    """One session call with every input and output bound to device buffers (torch tensors,
    bound by data_ptr); a static cache's present_* bound to past_*'s buffers (in place).
    ``refresh`` copies new values INTO the same buffers (what a CUDA graph replays)."""

    CACHE = {"present_key": "past_key", "present_value": "past_value"}

    def __init__(self, ctx: Ctx, sess, feeds: dict, graph_id: Optional[int] = None):
        self.ctx, self.sess = ctx, sess
        types = {i.name: ORT_TYPES[i.type] for i in sess.get_inputs()}
        self.bufs = {n: feeds[n].to(ctx.dev, types[n]).clone() for n in types}  # own memory
        y_spec = next(o for o in sess.get_outputs() if o.name == "y")
        x = self.bufs["x"]
        self.y = torch.empty(x.shape[0], x.shape[1], y_spec.shape[-1], dtype=ORT_TYPES[
            y_spec.type], device=ctx.dev)
        self.binding = sess.io_binding()
        for n, t in self.bufs.items():
            bind(self.binding, n, t, False, ctx.ort_device)
        for o in sess.get_outputs():
            t = self.y if o.name == "y" else self.bufs[self.CACHE[o.name]]
            bind(self.binding, o.name, t, True, ctx.ort_device)
        self.ro = run_options(graph_id)

    def refresh(self, feeds: dict) -> None:
        for n, t in self.bufs.items():
            t.copy_(feeds[n])
        self.ctx.sync()

    def __call__(self) -> None:
        self.sess.run_with_iobinding(self.binding, self.ro)

    def in_place(self) -> bool:
        outs = dict(zip([o.name for o in self.sess.get_outputs()], self.binding.get_outputs()))
        return all(outs[p].data_ptr() == self.bufs[c].data_ptr() for p, c in self.CACHE.items()
                   if p in outs) and outs["y"].data_ptr() == self.y.data_ptr()


# ----------------------------------------------------------------------------- section A
def section_a(ctx: Ctx, report: Report) -> None:
    deadline = ctx.deadline(ctx.plan.budgets["A"])
    meta = dict(section="A", mode="copy", dtype="uint8")

    def bandwidth() -> dict:
        n = ctx.plan.copy_bytes
        a = torch.empty(n, dtype=torch.uint8, device=ctx.dev).random_(0, 255)
        b = torch.empty_like(a)
        t = timeit(lambda: b.copy_(a), ctx.sync, 3, 20, min(3.0, max(0.5, ctx.left(deadline))))
        ctx.bandwidth = 2 * n / (t["median_ms"] / 1e3)
        del a, b
        return {**t, "shape": f"{n >> 20} MiB", "bandwidth_GBps": round(ctx.bandwidth / 1e9, 1),
                "note": "device-to-device torch copy, bytes read + written / median time"}
    guard(report, meta, bandwidth)


def environment(ctx: Ctx) -> dict:
    env: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "argv": sys.argv, "device": ctx.args.device, "smoke": ctx.plan.smoke,
                           "python": platform.python_version(), "host": platform.node(),
                           "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                           "onnxruntime": ort.__version__, "onnxruntime_file": ort.__file__,
                           "providers": ort.get_available_providers(),
                           "numpy": np.__version__, "budget_s": ctx.plan.total,
                           "plan": {"shapes": ctx.plan.shapes, "pasts": ctx.plan.pasts,
                                    "capacity": ctx.plan.capacity, "prefill": ctx.plan.prefill,
                                    "decode": ctx.plan.decode, "prefill_iters": ctx.plan.prefill_it,
                                    "budgets": ctx.plan.budgets}}
    with contextlib.suppress(Exception):
        import onnx
        env["onnx"] = onnx.__version__
    for f in (ROOT / "COMMIT",):
        if f.exists():
            env["commit"] = f.read_text().strip()
    if "commit" not in env:
        with contextlib.suppress(Exception):
            env["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short",
                                            "HEAD"], capture_output=True, text=True,
                                           timeout=10).stdout.strip()
    if ctx.cuda:
        with contextlib.suppress(Exception):
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpu_memory_GiB"] = round(torch.cuda.get_device_properties(0).total_memory
                                          / 2**30, 1)
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                 "clocks.max.mem", "--format=csv,noheader"], capture_output=True, text=True,
                timeout=20).stdout.strip()
        except Exception as e:
            env["nvidia_smi"] = err(e)
    with contextlib.suppress(Exception):
        from torch.nn.attention import SDPBackend
        names = {int(getattr(SDPBackend, n)): n for n in SDPBackend.__members__}
        env["sdpa_priority"] = [names.get(i, i) for i in torch._C._get_sdp_priority_order()]
    return env


# ----------------------------------------------------------------------------- section B
def step_feeds(ctx: Ctx, cfg: MHAConfig, past: int, seed: int) -> dict:
    """float32 inputs of one static-cache step on the device: x, a cache of capacity
    plan.capacity whose first ``past`` entries are valid (the rest zeros)."""
    sig = make_signature(cfg, STATIC)
    gen = torch.Generator(device=ctx.dev).manual_seed(seed)
    shape = sig.cache_buffer("past_key", 1, ctx.plan.capacity)
    vshape = sig.cache_buffer("past_value", 1, ctx.plan.capacity)
    feeds = {"x": torch.randn(1, 1, cfg.d_in, generator=gen, device=ctx.dev)}
    for name, s in (("past_key", shape), ("past_value", vshape)):
        buf = torch.zeros(s, device=ctx.dev)
        buf[:, :, :past] = torch.randn(s[0], s[1], past, s[3], generator=gen, device=ctx.dev)
        feeds[name] = buf
    feeds["past_lengths"] = torch.tensor([past], dtype=torch.int64, device=ctx.dev)
    if cfg.rotary != "none":
        feeds["position_ids"] = torch.tensor([[past]], dtype=torch.int64, device=ctx.dev)
    return feeds


def eager_step(m, feeds: dict, dtype: torch.dtype) -> tuple:
    """The eager module's static step on copies of feeds (cast to dtype): (y, key slot, value
    slot) of the one written position."""
    f = {n: (t.to(dtype) if t.is_floating_point() else t).clone() for n, t in feeds.items()}
    with torch.no_grad():
        y, k, v = m.forward_static(f["x"], f["past_key"], f["past_value"], f["past_lengths"],
                                   f.get("position_ids"))
    p = int(feeds["past_lengths"][0])
    return y, k[:, :, p], v[:, :, p]


def step_parity(y, kslot, vslot, ref: tuple, tol: Tolerance) -> dict:
    return merged({"y": parity(y, ref[0], tol), "key_slot": parity(kslot, ref[1], tol),
                   "value_slot": parity(vslot, ref[2], tol)})


def slots(bufs: dict, past: int) -> tuple:
    return bufs["past_key"][:, :, past], bufs["past_value"][:, :, past]


def decode_floor(ctx: Ctx, cfg: MHAConfig, past: int, dtype: str,
                 quant: Optional[QuantSpec] = None) -> dict:
    """Bytes a step must read (the projections' weights as stored + the valid k and v prefix,
    past + 1 entries) / the measured copy bandwidth."""
    size = torch.tensor([], dtype=TORCH_DTYPES[dtype]).element_size()
    proj = kind_of(cfg).projections(cfg)
    weights = sum(quant.stored_bytes(n, k) if quant else n * k * size
                  for n, k in proj.values())
    sig = make_signature(cfg, STATIC)
    _, kh, _, kw = sig.cache_buffer("past_key", 1, 1)
    _, vh, _, vw = sig.cache_buffer("past_value", 1, 1)
    cache = (kh * kw + vh * vw) * (past + 1) * size
    out = {"floor_bytes": weights + cache, "weight_bytes": weights, "cache_bytes": cache}
    if ctx.bandwidth:
        out["floor_ms"] = (weights + cache) / ctx.bandwidth * 1e3
    return out


def with_floor(row: dict, floor: dict) -> dict:
    row = {**floor, **row}
    if row.get("floor_ms") and row.get("median_ms"):
        row["floor_fraction"] = row["floor_ms"] / row["median_ms"]
    return row


def with_refresh(timed: dict, refreshed: dict) -> dict:
    """A call without a graph: its parity on the timed inputs, and the same three fresh inputs
    copied into its buffers and the stale control as a graph gets (the buffers are read at
    every call)."""
    return {**timed, "pass": timed["pass"] and refreshed["pass"],
            "max_abs": max(timed["max_abs"], refreshed["max_abs"]),
            "max_rel": max(timed["max_rel"], refreshed["max_rel"]),
            "replays": refreshed["replays"], "stale_control": refreshed["stale_control"]}


def export_seconds(ctx: Ctx, *key) -> Optional[float]:
    got = ctx.exports.get(tuple(key))
    return got[1] if isinstance(got, tuple) else None


def graph_parity(ctx: Ctx, refresh: Callable[[dict], None], replay: Callable[[], None],
                 outputs: Callable[[], tuple], reference: Callable[[dict], tuple],
                 fresh: Callable[[int], dict], tol: Tolerance) -> dict:
    """Three replays, each on fresh inputs copied into the captured buffers, against eager on
    those inputs; then the control: new inputs NOT copied in, one replay, compared with eager
    on the new inputs — it must fail (a graph that ignored its inputs would pass the first)."""
    replays = []
    for i in range(3):
        feeds = fresh(1000 + i)
        refresh(feeds)
        replay()
        ctx.sync()
        replays.append(step_parity(*outputs(), reference(feeds), tol))
    stale = fresh(2000)
    replay()
    ctx.sync()
    control = step_parity(*outputs(), reference(stale), tol)
    out = {"max_abs": max(r["max_abs"] for r in replays),
           "max_rel": max(r["max_rel"] for r in replays),
           "pass": all(r["pass"] for r in replays), "replays": replays,
           "stale_control": {"max_abs": control["max_abs"], "max_rel": control["max_rel"],
                             "pass": control["pass"], "control_ok": not control["pass"]}}
    return out


@contextlib.contextmanager
def fixed_valid_end(end: int) -> Iterator[None]:
    """The eager step reads max(past_lengths) on the host (layer/base.py valid_end: .item()),
    which a CUDA graph cannot capture; an app capturing one graph per cache length fixes it."""
    import mha_export.layer.base as layer_base
    saved = layer_base.valid_end
    layer_base.valid_end = lambda past_lengths, t, capacity: end
    try:
        yield
    finally:
        layer_base.valid_end = saved


class TorchStep:
    """The eager module's static step over device buffers (the cache written in place)."""

    def __init__(self, ctx: Ctx, m, feeds: dict, dtype: torch.dtype):
        self.ctx, self.m, self.dtype = ctx, m, dtype
        self.bufs = {n: (t.to(dtype) if t.is_floating_point() else t).clone()
                     for n, t in feeds.items()}
        self.y = None

    def refresh(self, feeds: dict) -> None:
        for n, t in self.bufs.items():
            t.copy_(feeds[n])
        self.ctx.sync()

    def __call__(self):
        b = self.bufs
        with torch.no_grad():
            self.y = self.m.forward_static(b["x"], b["past_key"], b["past_value"],
                                           b["past_lengths"], b.get("position_ids"))[0]
        return self.y

    def capture(self, past: int) -> Callable[[], None]:
        """A torch.cuda.CUDAGraph of one step (valid_end fixed at past + 1); returns replay."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with fixed_valid_end(past + 1):
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self()
        self.graph = graph
        return graph.replay


class Decode:
    """What sections B and G share: the 8B-shaped layer's forms, inputs per past length and
    the float32 eager step's outputs on them (the parity reference)."""

    def __init__(self, ctx: Ctx):
        self.key = "llama"
        self.cfg, self.shape = config_of(ctx, self.key), shape_name(ctx, self.key)
        self.forms, self.refused = form_list(ctx, self.key, STATIC)
        self.m32 = eager(ctx, self.key)
        self.feeds = {p: step_feeds(ctx, self.cfg, p, seed=p) for p in ctx.plan.pasts}
        self.refs = {p: eager_step(self.m32, self.feeds[p], torch.float32)
                     for p in ctx.plan.pasts}
        self.sessions: dict = {}  # (model path, graph) -> session or the error it raised
        self.placed: dict = {}  # model path -> the no-graph session's placement_info
        self.raw_placed: dict = {}  # model path -> its {provider: nodes}
        self._bf16: Optional[tuple] = None

    def bf16_refusal(self, ctx: Ctx) -> Optional[str]:
        """Why the export refuses bfloat16 (tried once: the same refusal for every form)."""
        if self._bf16 is None:
            try:
                exported(ctx, self.key, STATIC, self.forms[0], "bfloat16")
                self._bf16 = (None,)
            except Exception as e:
                self._bf16 = (err(e),)
        return self._bf16[0]

    def fresh(self, ctx: Ctx, past: int) -> Callable[[int], dict]:
        return lambda seed: step_feeds(ctx, self.cfg, past, seed=seed)

    def reference(self, m) -> Callable[[dict], tuple]:
        return lambda f: eager_step(m, f, torch.float32)

    def session(self, ctx: Ctx, path: Path, graph: bool):
        k = (path, graph)
        if k not in self.sessions:
            try:
                self.sessions[k] = session(ctx, path, graph=graph)
            except Exception as e:
                self.sessions[k] = e
        got = self.sessions[k]
        if isinstance(got, Exception):
            extra = ""
            if graph and path in self.placed:
                extra = (f" [the no-graph session's CPU nodes: "
                         f"{self.placed[path].get('cpu_node_list')}]")
            raise RuntimeError(err(got) + extra)
        return got

    def close(self) -> None:
        self.sessions.clear()
        gc.collect()


def decode_state(ctx: Ctx) -> Decode:
    if getattr(ctx, "decode_state", None) is None:
        ctx.decode_state = Decode(ctx)
    return ctx.decode_state


def torch_decode_rows(ctx: Ctx, report: Report, st: Decode, dtype: str, past: int,
                      deadline: float) -> None:
    """The project's eager module (dtype, on the device) doing the step, plain and replayed
    from a torch.cuda.CUDAGraph."""
    tdt, tol, it = TORCH_DTYPES[dtype], TOLERANCE[dtype], ctx.plan.decode
    meta = dict(section="B", shape=st.shape, dtype=dtype, T=1, past=past, form="eager")
    floor = decode_floor(ctx, st.cfg, past, dtype)
    if ctx.left(deadline) <= 0:
        for mode in ("torch", "torch-cuda-graph"):
            skipped(report, {**meta, "mode": mode}, "skipped: section B's budget spent")
        return
    reference, fresh = st.reference(st.m32), st.fresh(ctx, past)

    def plain() -> dict:
        step = TorchStep(ctx, eager(ctx, st.key, dtype), st.feeds[past], tdt)
        t = timeit(step, ctx.sync, **it)
        y = step()
        ctx.sync()
        row = {**t, "parity": with_refresh(
            step_parity(y, *slots(step.bufs, past), st.refs[past], tol),
            graph_parity(ctx, step.refresh, step, lambda: (step.y, *slots(step.bufs, past)),
                         reference, fresh, tol))}
        if ctx.cuda:
            row["sdpa_backends"] = sdpa_backends(step, ctx)
        return with_floor(row, floor)
    guard(report, {**meta, "mode": "torch"}, plain)

    if not ctx.cuda:
        return skipped(report, {**meta, "mode": "torch-cuda-graph"}, NEEDS_CUDA)

    def graphed() -> dict:
        step = TorchStep(ctx, eager(ctx, st.key, dtype), st.feeds[past], tdt)
        replay = step.capture(past)
        t = timeit(replay, ctx.sync, **it)
        p = graph_parity(ctx, step.refresh, replay, lambda: (step.y, *slots(step.bufs, past)),
                         reference, fresh, tol)
        return with_floor({**t, "parity": p, "note": "valid_end fixed at past+1 for the "
                           "capture (the eager step's .item()); one graph per past"}, floor)
    guard(report, {**meta, "mode": "torch-cuda-graph"}, graphed)


def ort_decode_row(ctx: Ctx, report: Report, st: Decode, dtype: str, past: int, form: str,
                   graph: bool, deadline: float, quant: Optional[QuantSpec] = None) -> None:
    """ONNX Runtime's step with every buffer bound on the device, the cache in place; with
    ``graph`` the session captures a CUDA graph (gpu_graph_id per past) and replays it."""
    mode = "ort-cuda-graph" if graph else "ort"
    it = ctx.plan.decode
    meta = dict(section="B", shape=st.shape, dtype=dtype + (f"+{quant.tag}" if quant else ""),
                T=1, past=past, form=form, mode=mode)
    if ctx.left(deadline) <= 0:
        return skipped(report, meta, f"skipped: section {'G' if graph else 'B'}'s budget spent")
    if graph and not ctx.cuda and not os.environ.get("SPEED_CPU_GRAPH_STANDIN"):
        return skipped(report, meta, NEEDS_CUDA)  # (the stand-in runs this path on the CPU)
    floor = decode_floor(ctx, st.cfg, past, dtype, quant)
    if quant is None:
        tol, ref_fn = TOLERANCE[dtype], st.reference(st.m32)
    else:  # the function the int4 file holds: its dequantized weights (scales in dtype)
        tol = loosest([TOLERANCE[dtype], INT8_ACTIVATIONS])
        ref_fn = st.reference(eager(ctx, st.key, "float32", quant, dtype))

    def run() -> dict:
        path = exported(ctx, st.key, STATIC, form, dtype, quant)
        sess = st.session(ctx, path, graph)
        call = OrtCall(ctx, sess, st.feeds[past],
                       graph_id=ctx.plan.pasts.index(past) + 1 if graph else None)
        call()  # (a session's first run is profiled: where its nodes ran)
        ctx.sync()
        placed = placement_info(sess) if not graph else {
            **st.placed.get(path, {}), "placement_from": "the same model's no-graph session"}
        if not graph:
            st.placed[path], st.raw_placed[path] = placed, placements(sess)
        t = timeit(call, ctx.sync, max(it["warmup"], 5) if graph else it["warmup"],
                   it["iters"], it["max_s"])
        ref = ref_fn(st.feeds[past])
        call.refresh(st.feeds[past])  # the timed inputs again (a graph reads its buffers)
        call()
        ctx.sync()
        timed = step_parity(call.y, *slots(call.bufs, past), ref, tol)
        y0 = call.y.clone()
        refreshed = graph_parity(ctx, call.refresh, call,
                                 lambda: (call.y, *slots(call.bufs, past)), ref_fn,
                                 st.fresh(ctx, past), tol)
        row = {**t, "parity": refreshed if graph else with_refresh(timed, refreshed),
               "in_place": call.in_place(),
               "export_s": export_seconds(ctx, st.key, STATIC, form, dtype, quant), **placed}
        if graph:
            row["parity"]["timed_inputs"] = timed
        if quant is not None:
            row["matmulnbits_on"] = matmulnbits_placement(st.raw_placed.get(path))
        if ctx.plan.smoke:
            row["parity_rule_matches_comparator"] = parity_numpy_agrees(y0, ref[0], tol)
        return with_floor(row, floor)
    guard(report, meta, run)


def section_b(ctx: Ctx, report: Report) -> None:
    """The decode step without ONNX Runtime's CUDA graphs (section G has them): fp16 first
    (the main question), then int4 projections, then bf16."""
    deadline = ctx.deadline(ctx.plan.budgets["B"])
    st = decode_state(ctx)
    for name, why in st.refused.items():
        report.add(dict(section="B", shape=st.shape, form=name, mode="ort", T=1,
                        error=f"form refuses: {why}", skipped=True))
    for past in ctx.plan.pasts:
        torch_decode_rows(ctx, report, st, "float16", past, deadline)
        for form in st.forms:
            ort_decode_row(ctx, report, st, "float16", past, form, False, deadline)
    for past in ctx.plan.pasts:
        ort_decode_row(ctx, report, st, "float16", past, st.forms[0], False, deadline,
                       QuantSpec(bits=4))
    for past in ctx.plan.pasts:
        torch_decode_rows(ctx, report, st, "bfloat16", past, deadline)
        if st.bf16_refusal(ctx):
            report.add(dict(section="B", shape=st.shape, dtype="bfloat16", T=1, past=past,
                            form="all", mode="ort", error=st.bf16_refusal(ctx)))
        else:
            for form in st.forms:
                ort_decode_row(ctx, report, st, "bfloat16", past, form, False, deadline)
    st.close()


def section_g(ctx: Ctx, report: Report) -> None:
    """ONNX Runtime's CUDA-graph capture of the decode step (rows of section B, mode
    ort-cuda-graph): after the sections whose numbers a failed capture must not cost."""
    deadline = ctx.deadline(ctx.plan.budgets["G"])
    st = decode_state(ctx)
    dtypes = ["float16"] + ([] if st.bf16_refusal(ctx) else ["bfloat16"])
    for dtype in dtypes:
        for past in ctx.plan.pasts:
            for form in st.forms:
                ort_decode_row(ctx, report, st, dtype, past, form, True, deadline)
    for past in ctx.plan.pasts:
        ort_decode_row(ctx, report, st, "float16", past, st.forms[0], True, deadline,
                       QuantSpec(bits=4))
    st.close()


def matmulnbits_placement(placed: Optional[dict]) -> Any:
    """The providers the profiled run executed MatMulNBits nodes on (an empty list: none ran,
    e.g. fused away or dequantized into MatMul)."""
    if placed is None:
        return None
    return [p for p, nodes in placed.items() if any(n.startswith("MatMulNBits") for n in nodes)]


def sdpa_backends(call: Callable, ctx: Ctx) -> dict:
    """Which SDPA backends can run this call alone (torch picks the first of its priority order
    that can: env.sdpa_priority)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with warnings.catch_warnings(record=True) as caught, sdpa_kernel([backend]):
                warnings.simplefilter("always")
                call()
                ctx.sync()
            out[name] = "ok"
        except Exception as e:
            why = "; ".join(str(w.message).splitlines()[0] for w in caught[:2])
            out[name] = (why or str(e).splitlines()[0])[:200]
    return out


# ----------------------------------------------------------------------------- section C
def section_c(ctx: Ctx, report: Report) -> None:
    deadline = ctx.deadline(ctx.plan.budgets["C"])
    it = ctx.plan.prefill_it
    for key in ("small", "llama"):
        cfg, shape = config_of(ctx, key), shape_name(ctx, key)
        forms, refused = form_list(ctx, key, "full")
        for name, why in refused.items():
            report.add(dict(section="C", shape=shape, form=name, mode="ort",
                            error=f"form refuses: {why}", skipped=True))
        m32 = eager(ctx, key)
        Ts = ctx.plan.prefill[key]
        xs: dict[int, dict] = {}
        refs: dict[int, torch.Tensor] = {}

        def inputs(T: int) -> dict:
            if T not in xs:
                gen = torch.Generator(device=ctx.dev).manual_seed(T)
                f = {"x": torch.randn(1, T, cfg.d_in, generator=gen, device=ctx.dev)}
                if cfg.rotary != "none":
                    f["position_ids"] = torch.arange(T, device=ctx.dev).view(1, T)
                xs[T] = f
                with torch.no_grad():
                    refs[T] = m32(f["x"])
            return xs[T]

        def torch_row(T: int, dtype: str, tf32: bool = False) -> None:
            meta = dict(section="C", shape=shape, dtype=dtype + ("+tf32" if tf32 else ""), T=T,
                        form="eager", mode="torch")
            if ctx.left(deadline) <= 0:
                return skipped(report, meta, "skipped: section C's budget spent")

            def run() -> dict:
                f = inputs(T)
                m = eager(ctx, key, dtype)
                x = f["x"].to(TORCH_DTYPES[dtype])
                torch.backends.cuda.matmul.allow_tf32 = tf32
                try:
                    def call():
                        with torch.no_grad():
                            return m(x)
                    t = timeit(call, ctx.sync, **it)
                    y = call()
                    ctx.sync()
                    tol = FP32_TF32 if tf32 else TOLERANCE[dtype]
                    row = {**t, "parity": parity(y, refs[T], tol)}
                    if ctx.cuda:
                        row["sdpa_backends"] = sdpa_backends(call, ctx)
                    return row
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = False
            guard(report, meta, run)

        def ort_row(sess_cache: dict, T: int, form: str, dtype: str, tf32: bool = False) -> None:
            meta = dict(section="C", shape=shape, dtype=dtype + ("+tf32" if tf32 else ""), T=T,
                        form=form, mode="ort")
            if ctx.left(deadline) <= 0:
                return skipped(report, meta, "skipped: section C's budget spent")

            def run() -> dict:
                f = inputs(T)
                if "sess" not in sess_cache:
                    sess_cache["sess"] = session(ctx, exported(ctx, key, "full", form, dtype),
                                                 tf32=tf32)
                sess = sess_cache["sess"]
                call = OrtCall(ctx, sess, f)
                call()  # (a session's first run is profiled: where its nodes ran)
                ctx.sync()
                placed = placement_info(sess)
                t = timeit(call, ctx.sync, **it)
                call()
                ctx.sync()
                tol = FP32_TF32 if tf32 else TOLERANCE[dtype]
                row = {**t, "parity": parity(call.y, refs[T], tol), **placed}
                del call
                return row
            guard(report, meta, run)

        def free() -> None:
            gc.collect()
            if ctx.cuda:
                torch.cuda.empty_cache()

        # the shorter lengths first for every form, the longest last (the first cut when the
        # budget runs short); a form's session is closed after its longest run (its arena
        # holds that run's scores)
        sessions: dict = {f: {} for f in forms}
        for T in Ts[:-1]:
            torch_row(T, "float16")
        for form in forms:
            for T in Ts[:-1]:
                ort_row(sessions[form], T, form, "float16")
        if key == "small":  # fp32: the default form (TF32 off and on) vs torch (off and on)
            T = ctx.plan.fp32_prefill_T
            for tf32 in (False, True):
                torch_row(T, "float32", tf32)
                ort_row({}, T, forms[0], "float32", tf32)
                free()
        torch_row(Ts[-1], "float16")
        for form in forms:
            ort_row(sessions[form], Ts[-1], form, "float16")
            sessions[form].clear()
            free()
        xs.clear()
        refs.clear()
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- the probe
def probe_main(args) -> None:
    """In a child process (a failed capture or a slow compile costs only it): the eager step
    captured as the module is (its .item() must refuse), then torch.compile(mode=
    "reduce-overhead") of the step with valid_end fixed. Rows go to DIR/probe-rows.json, one
    at a time."""
    plan = Plan(args.smoke, args.budget)
    ctx = Ctx(args, plan)
    out = Path(args.out) / PROBE_ROWS
    rows: list = []

    def add(row: dict) -> None:
        rows.append(row)
        out.write_text(json.dumps(rows, default=str))
        print(describe({**{k: None for k in Report.FIELDS}, **row}), flush=True)

    key = "llama"
    cfg, shape = config_of(ctx, key), shape_name(ctx, key)
    past = plan.pasts[0]
    feeds = step_feeds(ctx, cfg, past, seed=past)
    m32 = eager(ctx, key)
    ref = eager_step(m32, feeds, torch.float32)
    tol = FLOAT16
    meta = dict(section="B", shape=shape, dtype="float16", T=1, past=past, form="eager")
    m = eager(ctx, key, "float16")
    if args.bandwidth:
        ctx.bandwidth = args.bandwidth
    floor = decode_floor(ctx, cfg, past, "float16")

    step = TorchStep(ctx, m, feeds, torch.float16)
    try:
        step()
        ctx.sync()
        if not ctx.cuda:
            raise NotImplementedError(NEEDS_CUDA)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        t = timeit(graph.replay, ctx.sync, **plan.decode)
        add({**meta, **with_floor(t, floor), "mode": "torch-cuda-graph-as-is",
             "note": "captured without fixing valid_end (unexpected)"})
    except NotImplementedError as e:
        add({**meta, "mode": "torch-cuda-graph-as-is", "error": str(e), "skipped": True})
    except Exception as e:
        add({**meta, "mode": "torch-cuda-graph-as-is", "error": err(e),
             "note": "the eager step captured as it is: valid_end's .item() reads the device"})
    with contextlib.suppress(Exception):
        ctx.sync()

    for p in plan.pasts:
        if not ctx.cuda and not os.environ.get("SPEED_PROBE_COMPILE"):
            add({**meta, "past": p, "mode": "torch-compile-reduce-overhead",
                 "error": NEEDS_CUDA + "; SPEED_PROBE_COMPILE=1 compiles on the CPU",
                 "skipped": True})
            continue
        feeds = step_feeds(ctx, cfg, p, seed=p)
        ref = eager_step(m32, feeds, torch.float32)
        floor = decode_floor(ctx, cfg, p, "float16")
        meta = {**meta, "past": p}
        try:
            torch._dynamo.reset()
            step = TorchStep(ctx, m, feeds, torch.float16)
            b = step.bufs

            def fn(x, pk, pv, pl, pos):
                return m.forward_static(x, pk, pv, pl, pos)[0]
            compiled = torch.compile(fn, mode="reduce-overhead")
            t0 = time.perf_counter()
            with fixed_valid_end(p + 1), torch.no_grad():
                args_ = (b["x"], b["past_key"], b["past_value"], b["past_lengths"],
                         b.get("position_ids"))
                for _ in range(3):
                    compiled(*args_)
                ctx.sync()
                compile_s = time.perf_counter() - t0
                t = timeit(lambda: compiled(*args_), ctx.sync, **plan.decode)
                y = compiled(*args_).clone()
                ctx.sync()
            skips = {}
            with contextlib.suppress(Exception):
                from torch._dynamo.utils import counters
                skips = dict(counters.get("inductor", {}))
                skips = {k: v for k, v in skips.items() if "cudagraph" in k}
            add({**meta, **with_floor(t, floor), "mode": "torch-compile-reduce-overhead",
                 "compile_s": round(compile_s, 1), "inductor_cudagraph_counters": skips,
                 "parity": step_parity(y, *slots(b, p), ref, tol),
                 "note": "valid_end fixed at past+1; parity on the timed inputs"})
        except Exception as e:
            add({**meta, "mode": "torch-compile-reduce-overhead", "error": err(e)})


def run_probe(ctx: Ctx, report: Report) -> None:
    meta = dict(section="B", shape=shape_name(ctx, "llama"), dtype="float16", T=1,
                form="eager")
    limit = min(ctx.plan.budgets["probe"], ctx.left(ctx.end) - 5)
    if limit < (10 if ctx.plan.smoke else 30):
        for mode in ("torch-cuda-graph-as-is", "torch-compile-reduce-overhead"):
            skipped(report, {**meta, "mode": mode},
                    f"skipped: {max(limit, 0):.0f} s left of the run's budget")
        return
    path = ctx.out / PROBE_ROWS
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", "--out", str(ctx.out),
           "--device", ctx.args.device, "--budget", str(ctx.plan.total)] + (
               ["--smoke"] if ctx.plan.smoke else [])
    if ctx.bandwidth:
        cmd += ["--bandwidth", str(ctx.bandwidth)]
    note = None
    with open(ctx.out / "probe.log", "w") as log:
        # its own process group: on timeout it goes with inductor's compile workers
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(ROOT), os.environ.get("PYTHONPATH", "")])})
        try:
            if proc.wait(timeout=limit):
                note = f"probe exited {proc.returncode} (see probe.log)"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            note = f"probe killed at its {limit:.0f} s limit (see probe.log)"
    rows = []
    with contextlib.suppress(Exception):
        rows = json.loads(path.read_text())
    for row in rows:
        report.add(row)
    if note:
        report.add({**meta, "mode": "torch-compile-reduce-overhead"
                    if len(rows) < 1 + len(ctx.plan.pasts) else "probe", "error": note})


# ----------------------------------------------------------------------------- summary
def summary_markdown(env: dict, rows: list) -> str:
    def ms(r):
        if r is None:
            return "-"
        if r.get("median_ms") is None:
            return "n/a" if r.get("skipped") else "error"
        return f"{r['median_ms']:.3g}"

    def ok(r):
        p = r and r.get("parity")
        return "" if not p else (" ✓" if p["pass"] else " ✗")

    lines = [f"# GPU speed ({env.get('gpu', env.get('device'))}, commit {env.get('commit')})",
             "", f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), onnxruntime "
             f"{env.get('onnxruntime')}; driver: {env.get('nvidia_smi', '-')}", ""]
    bw = next((r for r in rows if r["section"] == "A" and r.get("bandwidth_GBps")), None)
    if bw:
        lines += [f"Copy bandwidth {bw['bandwidth_GBps']} GB/s (the bytes floor's reference).",
                  ""]
    by = {(r["section"], r["shape"], r["dtype"], r["T"], r["past"], r["form"], r["mode"]): r
          for r in rows}
    # B: decode
    b_rows = [r for r in rows if r["section"] == "B"]
    if b_rows:
        lines += ["## Static-cache decode step (T = 1), median ms (✓/✗ parity)", "",
                  "| dtype | past | form | ORT | ORT + CUDA graph | graph speedup | eager "
                  "torch | torch + CUDA graph | ORT speedup vs torch | ORT graph speedup vs "
                  "torch graph | floor ms | best ORT % of floor |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        keys = sorted({(r["dtype"], r["past"], r["shape"]) for r in b_rows
                       if r["past"] is not None}, key=lambda k: (k[0], k[1]))
        for dtype, past, shape in keys:
            base = dtype.split("+")[0]
            tp = by.get(("B", shape, base, 1, past, "eager", "torch"))
            tg = by.get(("B", shape, base, 1, past, "eager", "torch-cuda-graph"))
            forms = [r["form"] for r in b_rows if r["dtype"] == dtype and r["past"] == past
                     and r["mode"] == "ort"]
            for form in forms:
                o = by.get(("B", shape, dtype, 1, past, form, "ort"))
                g = by.get(("B", shape, dtype, 1, past, form, "ort-cuda-graph"))
                best = min([x["median_ms"] for x in (o, g) if x and x.get("median_ms")],
                           default=None)
                floor = (o or {}).get("floor_ms")
                lines.append("| " + " | ".join([
                    dtype, str(past), form, ms(o) + ok(o), ms(g) + ok(g), ratio(o, g),
                    ms(tp) + ok(tp), ms(tg) + ok(tg), ratio(tp, o), ratio(tg, g),
                    f"{floor:.3g}" if floor else "-",
                    f"{floor / best:.0%}" if floor and best else "-"]) + " |")
        lines += ["", "speedups: the slower's ms / the faster's (graph speedup = ORT ms / ORT "
                  "graph ms; vs torch = torch ms / ORT ms: > 1 means ORT is faster); int4 rows "
                  "beside fp16 torch; n/a = not run (needs CUDA, or the budget).", ""]
        errs = [r for r in b_rows if r.get("error") and not r.get("skipped")]
        if errs:
            lines += ["Errors (section B):", ""] + [
                f"- {r['dtype']} past={r['past']} {r['form']} {r['mode']}: "
                f"{r['error'][:300]}" for r in errs] + [""]
        probe = [r for r in b_rows if r["mode"] in ("torch-compile-reduce-overhead",
                                                    "torch-cuda-graph-as-is")]
        for r in probe:
            lines.append(f"- {r['mode']} past={r['past']}: "
                         + (r["error"][:200] if r.get("error") else f"{ms(r)} ms{ok(r)}"))
        lines.append("")
    c_rows = [r for r in rows if r["section"] == "C"]
    if c_rows:
        lines += ["## Prefill (no cache), median ms (✓/✗ parity); ratio = torch / ORT", "",
                  "| shape | dtype | T | form | ORT | torch (eager, SDPA) | ORT speedup (torch ms "
                  "/ ORT ms) |",
                  "|---|---|---|---|---|---|---|"]
        for r in c_rows:
            if r["mode"] != "ort" or r["T"] is None:
                continue
            t = by.get(("C", r["shape"], r["dtype"], r["T"], None, "eager", "torch"))
            lines.append(f"| {r['shape']} | {r['dtype']} | {r['T']} | {r['form']} | "
                         f"{ms(r)}{ok(r)} | {ms(t)}{ok(t)} | {ratio(t, r)} |")
        lines.append("")
    fails = [r for r in rows if r.get("parity") and not r["parity"]["pass"]]
    lines.append(f"Parity failures: {len(fails)}" + "".join(
        f"\n- {r['section']} {r['dtype']} T={r['T']} past={r['past']} {r['form']} {r['mode']}: "
        f"max|d| {r['parity']['max_abs']:.2e}" for r in fails))
    return "\n".join(lines) + "\n"


def ratio(a: Optional[dict], b: Optional[dict]) -> str:
    """a's time / b's time: b's speedup over a."""
    if not a or not b or not a.get("median_ms") or not b.get("median_ms"):
        return "-"
    return f"{a['median_ms'] / b['median_ms']:.2f}×"


# ----------------------------------------------------------------------------- main
def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results folder")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 2 iterations")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run (default 350; smoke 110)")
    ap.add_argument("--sections", default="ABCG",
                    help="which sections, in this order (default ABCG: G = ORT CUDA graphs)")
    ap.add_argument("--models", default=None, help="where the exports go (default a temp dir)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bandwidth", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.budget is None:
        args.budget = 110.0 if args.smoke else 350.0
    if args.probe:
        probe_main(args)
        return 0
    plan = Plan(args.smoke, args.budget)
    ctx = Ctx(args, plan)
    torch.manual_seed(0)
    if ctx.cuda and not torch.cuda.is_available():
        print("no CUDA device visible to torch: use --device cpu", file=sys.stderr)
    env = {}
    try:
        env = environment(ctx)
    except Exception as e:
        env = {"error": err(e)}
    report = Report(ctx.out, env)
    report.line(f"env: {env.get('gpu', args.device)}; torch {env.get('torch')} "
                f"onnxruntime {env.get('onnxruntime')} providers {env.get('providers')}; "
                f"{env.get('nvidia_smi', '')}")
    sections = {"A": section_a, "B": section_b, "C": section_c, "G": section_g}
    for name in args.sections:
        if name not in sections:
            continue
        t = time.perf_counter()
        if time.perf_counter() > ctx.end:
            report.add(dict(section=name, error="skipped: the run's budget is spent",
                            skipped=True))
            continue
        try:
            sections[name](ctx, report)
        except Exception as e:  # a section's own set-up failed: the others still run
            report.add(dict(section=name, error=f"section failed: {err(e)}",
                            traceback=traceback.format_exc()[-3000:]))
        report.line(f"section {name} took {time.perf_counter() - t:.1f} s "
                    f"(run at {time.perf_counter() - T_START:.1f} s of {plan.total:.0f})")
        report.markdown()
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()
    if "B" in args.sections:  # the optional torch probes: last, with what is left
        try:
            run_probe(ctx, report)
        except Exception as e:
            report.add(dict(section="B", mode="probe", error=f"probe failed: {err(e)}"))
        report.markdown()
    if not args.models:  # the exports were this run's own
        import shutil
        shutil.rmtree(ctx.models, ignore_errors=True)
    report.env["finished_s"] = round(time.perf_counter() - T_START, 1)
    report.flush()
    report.markdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
