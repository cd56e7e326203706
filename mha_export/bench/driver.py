"""`mha-export bench`: every variant side by side in one run, each measurement in its own process.

Variants: textbook eager (mask buffer + masked_fill + softmax), eager SDPA, TorchScript, ONNX
Runtime CPU for every graph form (and CUDA variants where a GPU and CUDA provider are present).
Per (variant, T): median latency, tokens/s, effective GFLOP/s, fraction of a GEMM ceiling
measured in the same run, speed-up over eager SDPA, peak RSS.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..config import MHAConfig
from ..env import gpu_l2_bytes, last_level_cache_bytes, machine_info
from ..errors import UsageError
from ..graph.builder import FLOAT_TYPES
from ..kinds.registry import FORMS, build_module, forms_for, kind_of, refuse_unbuilt
from ..lossy import registry as lossy
from ..signature import FLOAT, INT8
from ..lossy.int8_cache.codes import INT8_CACHE_TAG, KVCacheSpec
from ..lossy.projections.rtn import QuantSpec
from ..lossy.projections.records import quant_spec_from_record
from .plan import BenchPlan, timed_targets
from .report import BACK_TO_BACK, BASELINE, BenchReport, BenchRow
from .worker import on_cuda

WORKER = "mha_export.bench.worker"  # run with -m: the package, not its folder, on sys.path


def effective_flops(c: MHAConfig, seq: int, batch: int, past: int = 0) -> float:
    """The FLOPs a call really needs, as its attention kind counts them (kinds/), over the
    (query, key) pairs of the call: T^2/2 for a causal prefill (T*w - w^2/2 with a sliding
    window w; at most that with chunks of w), and T*P more over a cache of P. Standard
    attention: projections
    2*T*(d_in*(inner + 2*kv_inner) + inner*dim) + 4*inner per pair; for d_in = dim = inner = d
    and P = 0 that is 8*T*d^2 + 2*T^2*d."""
    w = c.sliding_window or c.attention_chunk
    pairs = (seq * seq / 2 if not w or w >= seq else seq * w - w * w / 2) if c.causal \
        else seq * seq
    return batch * kind_of(c).call_flops(c, seq, pairs, past)


def run_worker(spec: dict, timeout_s: float = 900) -> dict:
    try:
        out = subprocess.run([sys.executable, "-m", WORKER, json.dumps(spec)],
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if out.returncode < 0:
        return {"error": f"killed by signal {-out.returncode} (out of memory?)"}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = out.stderr.strip().splitlines()
        return {"error": tail[-1][:200] if tail else f"exit code {out.returncode}"}


def cuda_status() -> tuple[bool, str]:
    """(usable, reason): a GPU visible to torch. Each ORT CUDA worker still checks that its
    session really runs on CUDAExecutionProvider (else its row is an error)."""
    import torch
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch"
    return True, ""


def model_variants(config: MHAConfig, forms: Sequence[str], kind: str,
                   quantize: Sequence[QuantSpec] = (), int8_cache: Optional[KVCacheSpec] = None
                   ) -> dict[str, dict]:
    """The ONNX model of each variant, by key: every form, with each quantization (FORM-TAG,
    e.g. auto-int4), and with an int8 cache where the form builds one (FORM[-TAG]-kv8). Each
    value holds what to build it with (the lossy steps' ``specs``) and what its rows record
    (``quant``, ``cache_dtype``)."""
    from ..graph.forms import Feature
    caches = [None] + ([int8_cache] if int8_cache is not None else [])
    out = {}
    for form in forms:
        for quant in (None, *quantize):
            for cache in caches:
                if cache is not None and Feature.INT8_CACHE not in FORMS[form].supports:
                    continue
                key = form + (f"-{quant.tag}" if quant else "") + (f"-{INT8_CACHE_TAG}"
                                                                   if cache else "")
                specs = {name: spec for name, spec in (("quantize", quant),
                                                       ("int8-cache", cache)) if spec}
                out[key] = {"form": form, "specs": specs,
                            "record": {**({"quant": quant.to_dict()} if quant else {}),
                                       **({"cache_dtype": INT8} if cache else {})}}
    return out


def prepare_models(config: MHAConfig, variants: dict[str, dict], folder: Path, module,
                   kind: str = "full", dtype: str = "float32", runners: Sequence[str] = (),
                   batch: int = 1, points: Sequence[tuple[int, int]] = ((1, 0),),
                   capacity: int = 0) -> dict[str, tuple[Path, dict]]:
    """One model file per variant (``model_variants``), all from the same weights, of one
    signature kind, written by the export targets (targets/) as an export would write them,
    by model key -> (path, its rows' record); the TorchScript file, and the files of each
    other target one of ``runners`` runs (its record's ``programs``: the AOTInductor package,
    ExecuTorch's programs bounded by the run's ``batch``, ``points`` and ``capacity``)."""
    from ..signature import make_signature
    from ..targets.base import BenchRun
    from ..targets.registry import TARGETS
    out = {}
    for key, v in variants.items():
        sig = make_signature(config, kind, lossy.cache_dtype(v["specs"], FLOAT))
        out[key] = (folder / f"{key}.onnx", v["record"])
        TARGETS["onnx"].prepare(module, config, sig, attention=v["form"], dtype=dtype,
                                specs=v["specs"]).write(out[key][0])
    run = BenchRun(config, module, kind, make_signature(config, kind), variants, batch,
                   tuple(points), capacity, folder)
    for target in timed_targets(runners):  # a compile or a lowering: seconds to a minute each
        out.update(target.programs(target, run))
    return out


# how a GPU row is timed: N calls enqueued back to back, one device sync after them (worker.py's
# back_to_back), as apps step and as the anchors are timed
ON_GPU = {"back_to_back": True}

def variant_specs(config: MHAConfig, onnx_models: Sequence[str], models: dict[str, Path],
                  providers: Sequence[str], cuda_ok: bool, kind: str = "full",
                  extra: Sequence[str] = (), cpp: Optional[Path] = None,
                  dtype: str = "float32", cuda_graph: bool = False) -> list[dict]:
    """Eager baselines, TorchScript, every ONNX Runtime runner of the registry (one per provider
    asked for) on every ONNX model (``onnx_models``: keys of ``models``), the ``extra`` runners
    named (OpenVINO on every ONNX model, the AOTInductor package), and with ``cpp`` (a ``make
    cpp`` folder) the libtorch C++ programs on the TorchScript file and the AOTInductor
    package. CUDA runners time the call device-resident (its host copies timed apart);
    ``cuda_graph`` (static cache): each model also replayed as a CUDA graph; torch's CUDA
    rows run fp32 and ``dtype``; the torch CPU rows fp32 (torch's CPU fp16 is no deployment
    path)."""
    from ..check.runners import RUNNERS, ort_runner_names
    from ..targets.registry import TARGETS, target_of_file
    c = config.to_dict()
    textbook = (kind == "full" and config.rotary == "none" and not config.sliding_window
                and config.kv_heads == config.heads and config.inner == config.dim)
    specs = [{"variant": "textbook-eager", "config": c, "dtype": "float32"}] if textbook else []
    specs += [{"variant": BASELINE, "config": c, "dtype": "float32"},  # as CPU users run torch
              {"variant": "torchscript", "config": c, "model": str(models["torchscript"]),
               "dtype": "float32"}]
    for name in ort_runner_names(list(providers)):
        if RUNNERS[name].device == "cuda" and not cuda_ok:
            continue
        on_device = {"resident": True, "with_copies": True, **ON_GPU} \
            if RUNNERS[name].device == "cuda" else {}
        specs += [{"variant": "runner", "runner": name, "name": f"{name}-{form}", "config": c,
                   "model": str(models[form]), **on_device} for form in onnx_models]
        if "auto" in onnx_models:  # ORT's memory pattern over-reserves around the block loop
            specs.append({"variant": "runner", "runner": name, "name": f"{name}-auto-nomempattern",
                          "config": c, "model": str(models["auto"]), "mem_pattern": False,
                          **on_device})
    for name in extra:
        target = target_of_file(RUNNERS[name].model_file).name
        one = target != "onnx"  # its own files: the target's key, then its variants'
        targets = [k for k in models if k == target or k.startswith(f"{target}-")] if one \
            else onnx_models
        specs += [{"variant": "runner", "runner": name, "config": c, "model": str(models[t]),
                   "name": name + t[len(target):] if one else f"{name}-{t}"}
                  for t in targets]
    specs += [{"variant": "cpp", "name": f"cpp-{t.cpp_program}", "config": c,
               "program": str(cpp / t.cpp_program), "model": str(models[t.name])}
              for t in TARGETS.values()
              if cpp is not None and t.cpp_program and t.name in models]
    if "cuda" in providers and cuda_ok:
        graphs = cuda_graph and kind == "static-cache"
        if graphs:
            specs += [{"variant": "runner", "runner": "ort-cuda-graph", "resident": True,
                       "name": f"ort-cuda-graph-{form}", "config": c, "model": str(models[form]),
                       **ON_GPU} for form in onnx_models]
        dtypes = dict.fromkeys(("float32", dtype))
        specs += [{"variant": "sdpa-eager", "name": f"torch-cuda-sdpa-{dt}", "config": c,
                   "device": "cuda", "dtype": dt, **ON_GPU} for dt in dtypes]
        if graphs:  # torch's own step replayed as a CUDA graph: the anchor in the same run
            specs += [{"variant": "sdpa-eager", "name": f"torch-cuda-graph-{dt}", "config": c,
                       "device": "cuda", "dtype": dt, "cuda_graph": True, **ON_GPU}
                      for dt in dtypes]
    return [{"dtype": dtype, **spec, "kind": kind} for spec in specs]


def run_bench(config: MHAConfig, plan: Optional[BenchPlan] = None, *, weights_module=None,
              progress: Callable[[str], None] = lambda s: None, **fields) -> BenchReport:
    """Every variant at every (T, past) of ``plan`` (bench/plan.py; or its ``fields`` as
    keywords: ``run_bench(config, seq_lens=[1], past_lens=[1024], static_cache=True)``), on
    ``weights_module`` (default: the config's layer, seeded)."""
    from ..signature import make_signature
    p = replace(plan or BenchPlan(), **fields)
    _require_consistent(config, p)
    kind, points = p.kind, p.points
    forms = list(p.forms or forms_for(config, make_signature(config, kind)))
    cuda_ok, cuda_reason = cuda_status() if "cuda" in p.providers else (False, "not requested")
    ceiling = gemm_ceiling(p.threads, p.budget_s, progress)
    report = BenchReport(config.to_dict(), p.threads, ceiling, machine_info(), command=p.command)
    if "cuda" in p.providers and not cuda_ok:
        report.notes.append(f"CUDA variants not run: {cuda_reason}")
    with tempfile.TemporaryDirectory(prefix="mha-bench-") as tmp:
        module = weights_module or build_module(config, seed=p.seed)
        variants = model_variants(config, forms, kind, p.quantize,
                                  _int8_cache(module) if p.int8_cache else None)
        written = prepare_models(config, variants, Path(tmp), module, kind, p.dtype, p.runners,
                                 p.batch, points, p.capacity if p.static_cache else 0)
        models = {key: path for key, (path, _) in written.items()}
        onnx_models = [k for k in models if k in variants]
        specs = variant_specs(config, onnx_models, models, p.providers, cuda_ok, kind,
                              p.runners, p.cpp, p.dtype, p.cuda_graph)
        records = {str(path): record for path, record in written.values()}
        specs = [{**spec, **records.get(spec.get("model"), {})} for spec in specs]
        if p.static_cache:
            specs = _static_specs(specs, p.capacity)
        common = {"batch": p.batch, "threads": p.threads, "mem_limit_gib": p.mem_limit_gib,
                  "budget_s": p.budget_s}
        report.rows += _measure(config, specs, points, common, kind != "full", p.cold, progress)
    _machine_figures(report, ceiling, p.threads, p.budget_s, kind != "full", p.cold, progress)
    _speedups(report)
    return report


def _require_consistent(config: MHAConfig, p: BenchPlan) -> None:
    """The plan's combinations a run can measure, or a one-line refusal."""
    if p.cuda_graph and not p.static_cache:
        raise UsageError("--cuda-graph replays the static-cache step: add --static-cache")
    if p.cuda_graph and "cuda" not in p.providers:
        raise UsageError("--cuda-graph replays on CUDA: add cuda to --providers")
    if p.cold and not last_level_cache_bytes():
        raise UsageError("--cold: this machine does not say how large its CPU caches are "
                         "(/sys/devices/system/cpu/cpu0/cache)")
    if p.int8_cache and not p.static_cache:
        raise UsageError("an int8 cache is measured on the static cache: add --static-cache")
    if p.int8_cache:
        refuse_unbuilt(config, "int8-cache")


def _machine_figures(report: BenchReport, ceiling: Optional[float], threads: int,
                     budget_s: float, cached: bool, cold: bool,
                     progress: Callable[[str], None]) -> None:
    """The GEMM ceiling (the best rate seen, measured before and after the variants) and each
    row's fraction of it; the copy bandwidth of cached runs and the streaming read of cold
    ones."""
    report.gemm_ceiling_gflops = max(filter(None, [ceiling, gemm_ceiling(threads, budget_s,
                                                                         progress)]), default=None)
    if cached:
        report.copy_bandwidth_gbs = copy_bandwidth(budget_s, progress)
        if any(r.device == "cuda" for r in report.rows):
            report.device_copy_bandwidth_gbs = copy_bandwidth(budget_s, progress, "cuda")
    if cold:
        report.stream_bandwidth_gbs = stream_bandwidth(budget_s, progress)
    for r in report.rows:  # the ceiling is the CPU's: a GPU row has none here
        if r.gflops and report.gemm_ceiling_gflops and r.device == "cpu":
            r.ceiling_fraction = r.gflops / report.gemm_ceiling_gflops


def _int8_cache(module) -> KVCacheSpec:
    """Scales calibrated on synthetic inputs: a step's speed does not depend on their values."""
    from ..lossy.int8_cache.calibration import calibrate_cache
    return calibrate_cache(module.eval())


def _static_specs(specs: list[dict], capacity: int) -> list[dict]:
    """Static-cache runs: the baseline is eager torch's growing-cache step, as users run it,
    beside eager's own in-place step; every buffer of ``capacity`` entries."""
    eager = next(sp for sp in specs if sp["variant"] == BASELINE)
    specs = [{**eager, "kind": "kv-cache"}, {**eager, "name": "eager-static"},
             *(sp for sp in specs if sp is not eager)]
    return [{**spec, "capacity": capacity} for spec in specs]


def _measure(config: MHAConfig, specs: list[dict], points: list[tuple[int, int]], common: dict,
             cached: bool, cold: bool, progress: Callable[[str], None]) -> list[BenchRow]:
    """Every spec at every (T, past), each in its own worker process."""
    rows, total = [], len(specs) * len(points)
    for seq, past in points:
        for spec in specs:
            name = spec.get("name", spec["variant"])
            spec = {**spec, **common, "seq": seq, "past": past,
                    "min_reps": 5 if seq <= 2048 else 3}
            if cold:
                spec = _cold(spec, config)
            row = _row(name, config, spec, run_worker(spec), cached)
            rows.append(row)
            progress(f"[{len(rows)}/{total}] {name:24s} T={seq:<6d} P={past:<6d} " + (
                f"{row.median_ms:10.2f} ms  {row.peak_rss_mib:8.0f} MiB" if row.median_ms
                else f"ERROR: {row.error}"))
    return rows


def gemm_ceiling(threads: int, budget_s: float, progress: Callable[[str], None]
                 ) -> Optional[float]:
    """GFLOP/s of the fastest of several 4096^3 fp32 MatMuls through ONNX Runtime."""
    gemm = run_worker({"variant": "gemm", "n": 4096, "threads": threads, "min_reps": 5,
                       "budget_s": budget_s})
    rate = 2 * 4096**3 / (gemm["min_ms"] / 1e3) / 1e9 if "min_ms" in gemm else None
    progress(f"GEMM ceiling (ORT MatMul 4096^3 fp32, {threads} threads, best run): "
             + (f"{rate:.0f} GFLOP/s" if rate else gemm.get("error", "?")))
    return rate


def copy_bandwidth(budget_s: float, progress: Callable[[str], None],
                   device: str = "cpu") -> Optional[float]:
    """GB/s of the fastest copy (read + write) of 256 MiB (numpy) or, on the GPU, 1 GiB (a
    device-to-device torch copy): this run's memory ceiling."""
    mib = 256 if device == "cpu" else 1024
    copy = run_worker({"variant": "copy", "mib": mib, "min_reps": 5, "budget_s": budget_s,
                       "device": device})
    rate = 2 * mib * 2**20 / (copy["min_ms"] / 1e3) / 1e9 if "min_ms" in copy else None
    what = f"{mib} MiB " + ("numpy copy" if device == "cpu" else "GPU device-to-device copy")
    progress(f"copy bandwidth ({what}, read + write, best run): "
             + (f"{rate:.1f} GB/s" if rate else copy.get("error", "?")))
    return rate


def stream_bandwidth(budget_s: float, progress: Callable[[str], None]) -> Optional[float]:
    """GB/s of the fastest streaming read (numpy sum) of RING x the last-level cache: the
    size a cold row's ring steps through."""
    mib = max(64, -(-RING * last_level_cache_bytes() // 2**20))
    read = run_worker({"variant": "stream", "mib": mib, "min_reps": 5, "budget_s": budget_s})
    rate = mib * 2**20 / (read["min_ms"] / 1e3) / 1e9 if "min_ms" in read else None
    progress(f"streaming read ({mib} MiB numpy sum, one thread, best run): "
             + (f"{rate:.1f} GB/s" if rate else read.get("error", "?")))
    return rate


def step_bytes(c: MHAConfig, seq: int, batch: int, past: int,
               specs: Optional[dict] = None, dtype: str = "float32") -> float:
    """Bytes a cached step must read: the weights once (as the lossy steps' ``specs`` store
    them, else in ``dtype``), and the valid keys and values (in ``dtype``, or an int8 cache's
    codes; the kind's cache widths: an MLA layer's latents and rotated keys)."""
    specs, width = specs or {}, np.dtype(FLOAT_TYPES[dtype].numpy).itemsize
    heads, key_width, value_width = c.cache_shape
    return lossy.weight_bytes(c, specs, width) + lossy.cache_entry_bytes(specs, width) * (
        batch * heads * (key_width + value_width) * (past + seq))


def _row_specs(row: dict) -> dict:
    """A bench row's lossy steps, from what it records (``quant``, ``cache_dtype``)."""
    specs = {"quantize": quant_spec_from_record(row["quant"])} if row.get("quant") else {}
    return {**specs, **({"int8-cache": INT8} if row.get("cache_dtype") == INT8 else {})}


# A cold row's ring holds RING x the last-level cache in weights + valid cache (at least 2
# instances): stepping through it in turn, each call finds its bytes evicted.
RING = 3


def _cold(spec: dict, c: MHAConfig) -> dict:
    """The spec as a ring of instances larger than the last-level cache; a static buffer sized
    to the call (capacity = past + T: what is read is the same, the ring fits in memory)."""
    instance = step_bytes(c, spec["seq"], spec["batch"], spec["past"], _row_specs(spec),
                          spec.get("dtype", "float32"))
    cache = gpu_l2_bytes() if on_cuda(spec) else last_level_cache_bytes()
    count = -(-RING * cache // int(instance))
    out = {**spec, "ring": min(512, max(2, count))}
    if "capacity" in spec:
        out["capacity"] = spec["past"] + spec["seq"]
    return out


def _row(name: str, c: MHAConfig, spec: dict, result: dict, cached: bool = False) -> BenchRow:
    seq, batch, past = spec["seq"], spec["batch"], spec["past"]
    if "error" in result:
        return BenchRow(name, seq, batch, past, error=result["error"])
    s = result["median_ms"] / 1e3
    gflops = effective_flops(c, seq, batch, past) / s / 1e9
    model = Path(spec["model"]) if spec.get("model") else None
    read = step_bytes(c, seq, batch, past, _row_specs(spec), spec.get("dtype", "float32")) \
        if cached else None
    return BenchRow(name, seq, batch, past, result["median_ms"], result["reps"], batch * seq / s,
                    gflops, None, None, result["peak_rss_mib"], result.get("peak_device_mib"),
                    bandwidth_gbs=read / s / 1e9 if cached else None,
                    model_mib=model.stat().st_size / 2**20 if model and model.suffix == ".onnx"
                    else None, ring=spec.get("ring", 1),
                    timing=BACK_TO_BACK if spec.get("back_to_back") else "device-resident"
                    if spec.get("resident") or spec.get("device") == "cuda" else "",
                    copies_median_ms=result.get("copies_median_ms"),
                    device="cuda" if on_cuda(spec) else "cpu", kernels=result.get("kernels", ""),
                    enqueue_ms=result.get("enqueue_ms"), clock=result.get("clock", ""))


def _speedups(report: BenchReport) -> None:
    base = {(r.seq, r.past): r.median_ms for r in report.rows
            if r.variant == BASELINE and r.median_ms}
    for r in report.rows:
        if r.median_ms and (r.seq, r.past) in base:
            r.speedup_vs_sdpa = base[r.seq, r.past] / r.median_ms
