"""What quantizing the projections costs, per bits x block size, measured by `check` itself: each
spec is exported (--static-cache, the decode model) and checked; the JSON keeps each check's
quantization cost (the dequantized vs the unquantized layer, fp64, worst over the sweep) and the
worst kernel error of ort-cpu (level 4: int8 activations) against the dequantized weights.

    .venv/bin/python benchmarks/quant_error.py [--out benchmarks/results/quant-error.json]

Layers (random weights, as nn.Linear initialises them: trained weights have outlier channels, and
their error can differ): the 12 x 768 default layer, and a Qwen3-0.6B-shaped layer (hidden 1024,
16 heads, 8 kv heads, head_dim 128, q/k RMSNorm per head, rotary).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from mha_export import MHAConfig, export_onnx
from mha_export.env import machine_info
from mha_export.lossy.projections.rtn import BITS, BLOCK_SIZES, QuantSpec

LAYERS = {
    "12 x 768": MHAConfig(dim=768, heads=12, max_seq_len=64),
    "Qwen3-0.6B-shaped": MHAConfig(dim=1024, heads=16, kv_heads=8, head_dim=128, rotary="half",
                                   rope_theta=1e6, qk_norm="head", out_bias=False,
                                   max_seq_len=64),
}
SWEEP = dict(seq_lens=(1, 7, 64), batch_sizes=(1, 3), past_lens=(0, 5, 63))


def measure(config: MHAConfig, spec: QuantSpec, folder: Path) -> dict:
    report = export_onnx(config, folder, quantize=spec, static_cache=True, force=True,
                         check_options=SWEEP).report
    kernel = [r for r in report.results if r.runner == "ort-cpu" and r.output == "y"]
    cost = {q.output: q.deviation.to_dict() for q in report.quantization}
    return {**spec.to_dict(), "passed": report.passed, "cost": cost,
            "kernel_rel_y": max(r.vs_reference.rel for r in kernel)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/quant-error.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in LAYERS.items():
            for bits in BITS:
                for block in BLOCK_SIZES:
                    row = {"layer": name, **measure(config, QuantSpec(bits, block),
                                                    Path(tmp) / "a")}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    Path(args.out).write_text(json.dumps({
        "machine": machine_info(), "sweep": SWEEP,
        "layers": {k: v.to_dict() for k, v in LAYERS.items()}, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
