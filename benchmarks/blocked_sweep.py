"""Scratch sweep: blocked ONNX attention vs torch SDPA eager vs the single fused Attention node.

    .venv/bin/python benchmarks/blocked_sweep.py [--seqs 128,512,2048,8192,16384] [--variants ...]

Config dim 768, 12 heads, batch 1, fp32, 2 threads. Each (variant, T) runs in its own subprocess,
one at a time, so peak RSS (VmHWM) is that variant's alone; ORT workers import only onnxruntime and
numpy (the models are built and saved by the parent). Prints median ms, speedup vs SDPA, peak RSS.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM, HEADS, THREADS = 768, 12, 2
# variant -> (form builder kwargs, opset); "sdpa" is torch eager.
VARIANTS = {
    "fused": (None, 23),
    **{f"att{b}": (dict(block=b, use_attention_op=True), 23) for b in (64, 128, 256, 512)},
    **{f"plain{b}": (dict(block=b, use_attention_op=False), 17) for b in (128, 256)},
    "auto": ("auto", 23),
}
DEFAULT = ["sdpa", "fused", "att128", "att256", "att512", "plain256", "auto"]
FUSED_MAX_T = 2048  # the fused node holds (heads, T, T) scores: 14 GiB at 16384


def reps_for(t: int) -> int:
    return 30 if t <= 512 else 8 if t <= 2048 else 3 if t <= 8192 else 2


def peak_rss_mib() -> tuple[float, float]:
    """(VmHWM, VmRSS) in MiB of this process."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return vals["VmHWM"], vals["VmRSS"]


def _cpu_idle(window: float = 0.2) -> float:
    """Idle fraction of all CPUs over ``window`` seconds (this process sleeps meanwhile)."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    i0, t0 = read()
    time.sleep(window)
    i1, t1 = read()
    return (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(max_wait: float = 30.0, idle: float = 0.9) -> bool:
    """The machine is shared: wait (up to max_wait s) until other processes leave the CPUs idle."""
    end = time.monotonic() + max_wait
    while time.monotonic() < end:
        if _cpu_idle() >= idle:
            return True
    return False


def time_fn(fn, reps: int) -> list[float]:
    fn()  # warm-up (allocations, ORT's first-run planning)
    out = []
    for _ in range(reps):
        wait_quiet()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def worker(variant: str, t: int, model_path: str | None) -> None:
    import numpy as np

    reps = reps_for(t)
    x = np.random.default_rng(0).standard_normal((1, t, DIM), dtype=np.float32)
    if variant == "sdpa":
        import torch

        sys.path.insert(0, ROOT)
        from mha_export.config import MHAConfig
        from mha_export.kinds.registry import build_module

        torch.set_num_threads(THREADS)
        m = build_module(MHAConfig(dim=DIM, heads=HEADS), seed=0)
        xt = torch.from_numpy(x)
        base = peak_rss_mib()[1]

        def run():
            with torch.inference_mode():
                m(xt)
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        base = peak_rss_mib()[1]

        def run():
            sess.run(None, {"x": x})
    times = time_fn(run, reps)
    hwm, _ = peak_rss_mib()
    print(json.dumps(dict(variant=variant, T=t, median_ms=float(np.median(times)),
                          min_ms=min(times), reps=reps, peak_mib=hwm, base_mib=base)))


def build_models(variants: list[str], folder: str) -> dict[str, str]:
    sys.path.insert(0, ROOT)
    import dataclasses

    from mha_export.config import MHAConfig
    from mha_export.graph.model import build_model
    from mha_export.kinds.registry import FORMS, build_module

    c = MHAConfig(dim=DIM, heads=HEADS)
    w = build_module(c, seed=0).to_weights()
    paths = {}
    for v in variants:
        if v == "sdpa":
            continue
        kwargs, opset = VARIANTS[v]
        if kwargs in (None, "auto"):
            form = FORMS["attention-op" if kwargs is None else "auto"]
        else:  # the blocked form with another block size / body
            base = FORMS["blocked"]
            form = dataclasses.replace(base, core=functools.partial(base.core, **kwargs),
                                       min_opset=opset)
        paths[v] = os.path.join(folder, f"{v}.onnx")
        with open(paths[v], "wb") as f:
            f.write(build_model(c, w, form, opset).SerializeToString())
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="128,512,2048,8192,16384")
    ap.add_argument("--variants", default=",".join(DEFAULT),
                    help=f"comma list of sdpa, {', '.join(VARIANTS)}")
    ap.add_argument("--worker", nargs=3, metavar=("VARIANT", "T", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if args.worker:
        v, t, path = args.worker
        worker(v, int(t), None if path == "-" else path)
        return
    seqs = [int(s) for s in args.seqs.split(",")]
    variants = args.variants.split(",")
    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        paths = build_models(variants, folder)
        for t in seqs:
            for v in variants:
                if v == "fused" and t > FUSED_MAX_T:
                    continue
                cmd = [sys.executable, __file__, "--worker", v, str(t), paths.get(v, "-")]
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print(f"{v} T={t}: timeout", flush=True)
                    continue
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                if p.returncode or not lines:
                    print(f"{v} T={t}: failed rc={p.returncode}\n{p.stderr[-2000:]}", flush=True)
                    continue
                r = json.loads(lines[-1])
                results[(v, t)] = r
                sd = results.get(("sdpa", t))
                ratio = f"{sd['median_ms'] / r['median_ms']:.2f}x" if sd else "-"
                print(f"T={t:6d} {v:9s} median {r['median_ms']:9.2f} ms  min {r['min_ms']:9.2f}  "
                      f"vs sdpa {ratio:>6s}  peak {r['peak_mib']:7.0f} MiB "
                      f"(base {r['base_mib']:.0f})",
                      flush=True)
    print("\n| T | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for t in seqs:
        cells = []
        sd = results.get(("sdpa", t))
        for v in variants:
            r = results.get((v, t))
            if r is None:
                cells.append("-")
                continue
            ratio = ("" if v == "sdpa" or sd is None
                     else f" ({sd['median_ms'] / r['median_ms']:.2f}x)")
            cells.append(f"{r['median_ms']:.1f}{ratio}, {r['peak_mib'] / 1024:.2f} GiB")
        print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
