"""How far each runner's output is from the float64 reference on a real checkpoint's layers, as a
fraction of the output's scale (max|d| / max|y|): the measurement the fp32 tolerance is set from.

    .venv/bin/python benchmarks/real_layers.py --weights FILE.gguf|FOLDER [--layers all|0,5,...]
        [--inputs captured.safetensors] [--kinds full,kv_cache,static_cache]
        [--quantize int4:4,int8:1,...] [--out FILE.json]

Each layer is exported (ONNX, default form) per call kind and checked with an atol/rtol too loose
to fail, so every row is measured; the JSON keeps, per layer, kind, runner, output and inputs
(random or real), the worst max|d| vs fp64, max|y| and their ratio. With --quantize (bits:level
specs, block 32 symmetric), each spec is exported too, and its quantization cost (the dequantized
vs the unquantized layer, fp64) on random and on real inputs is kept beside the kernel's rows.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from mha_export import check_parity, export_onnx
from mha_export.env import machine_info
from mha_export.lossy.projections.rtn import QuantSpec

KINDS = {"full": {}, "attention_mask": {"attention_mask": True}, "kv_cache": {"kv_cache": True},
         "static_cache": {"static_cache": True}}


def measure(weights: str, layer: int, kind: str, inputs: str | None, folder: Path,
            spec: QuantSpec | None = None, sweep: dict | None = None) -> list[dict]:
    name = spec.label() if spec else "float"
    art = export_onnx(weights=weights, layer=layer, output=folder / f"l{layer}-{kind}",
                      validate=False, force=True, quantize=spec, **KINDS[kind]).path
    report = check_parity(art, atol=1e3, rtol=1e3, inputs=inputs, **(sweep or {}))
    costs = [{"layer": layer, "kind": kind, "quantize": name, "runner": "quantization cost",
              "output": q.output, "inputs": inputs_, "rel": q.deviation.rel,
              "max_abs": q.deviation.max_abs, "cosine": q.deviation.cosine, "max_y": 0.0}
             for inputs_, found in (("random", report.quantization),
                                    ("real", report.real_quantization)) for q in found]
    worst: dict[tuple, dict] = {}
    for r in report.results:
        ref = r.vs_reference
        key = (r.runner, r.output, r.inputs)
        scale = ref.max_abs / ref.rel if ref.rel > 0 else 0.0
        row = worst.setdefault(key, {"layer": layer, "kind": kind, "quantize": name,
                                     "runner": r.runner,
                                     "output": r.output, "inputs": r.inputs, "rel": 0.0,
                                     "max_abs": 0.0, "max_y": 0.0})
        row["rel"], row["max_abs"] = max(row["rel"], ref.rel), max(row["max_abs"], ref.max_abs)
        row["max_y"] = max(row["max_y"], scale)
    return list(worst.values()) + costs


def _print(r: dict) -> None:
    print(f"layer {r['layer']:2d} {r['kind']:14s} {r['quantize']:40s} {r['runner']:22s} "
          f"{r['output']:13s} {r['inputs']:6s} max|d| {r['max_abs']:.2e}  rel {r['rel']:.2e}"
          + (f"  cosine {r['cosine']:.6f}" if "cosine" in r else ""), file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--layers", default="all")
    ap.add_argument("--count", type=int, default=30, help="layers in the checkpoint (for all)")
    ap.add_argument("--inputs", default=None)
    ap.add_argument("--kinds", default="full")
    ap.add_argument("--quantize", default="", help="bits:level,... (e.g. int4:4,int8:1)")
    ap.add_argument("--seq-lens", default=None, help="the check's T values [default: its sweep]")
    ap.add_argument("--past-lens", default=None, help="cache lengths [default: its sweep]")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    layers = range(args.count) if args.layers == "all" else map(int, args.layers.split(","))
    specs = [None] + [QuantSpec(bits=int(b.removeprefix("int")), accuracy_level=int(lvl))
                      for b, lvl in (q.split(":") for q in args.quantize.split(",") if q)]
    if args.quantize:
        specs = specs[1:]
    sweep = {name: [int(v) for v in value.split(",")] for name, value in (
        ("seq_lens", args.seq_lens), ("past_lens", args.past_lens)) if value}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layer in layers:
            for kind in args.kinds.split(","):
                for spec in specs:
                    found = measure(args.weights, layer, kind, args.inputs, Path(tmp), spec,
                                    sweep)
                    rows += found
                    for r in found:
                        _print(r)
    out = {"machine": machine_info(), "weights": args.weights, "inputs": args.inputs,
           "sweep": sweep or "default", "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
