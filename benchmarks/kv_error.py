"""What an int8 KV cache costs, per layer and value scale layout (keys: always per channel):

- ``check``: each layout exported (--static-cache --kv-cache-dtype int8) and checked with a
  short sweep; the JSON keeps the check's own int8-cache cost (the int8-cache layer vs the
  float-cache layer, fp64, over its generate and ragged scenarios), its clip rates, and the worst
  kernel error of ort-cpu's y (judged over its own codes).
- ``long``: the eager layer with the int8 cache vs with a float cache on one sequence of past P
  (1024, 4096) + 16 tokens, y over those last 16 tokens (the decode steps that read a long
  cache), and the clip rate of the P + 16 written keys and values.

    .venv/bin/python benchmarks/kv_error.py [--out benchmarks/results/kv-error.json]

Scales are calibrated on synthetic inputs (the export's default) and the inputs are
standard-normal, like the calibration's: a real model's hidden states have outlier channels, and
its clip rate and error can differ (calibrate with --calibration FILE). Random weights, as
quant_error.py's layers.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from mha_export import MHAConfig, export_onnx
from mha_export.env import machine_info
from mha_export.kinds.registry import build_module
from mha_export.lossy.int8_cache.calibration import SYNTHETIC, calibrate_cache
from mha_export.lossy.int8_cache.codes import GRANULARITIES, KVCacheSpec
from quant_error import LAYERS

SWEEP = dict(seq_lens=(1, 7, 64), batch_sizes=(1, 3), past_lens=(0, 5, 63))
PASTS, STEPS = (1024, 4096), 16


def checked(config: MHAConfig, value: str, folder: Path) -> dict:
    report = export_onnx(config, folder, static_cache=True, kv_cache_dtype="int8",
                         value_scale=value, force=True, check_options=SWEEP).report
    kernel = [r for r in report.results if r.runner == "ort-cpu" and r.output == "y"]
    kv = report.kv_cache
    return {"passed": report.passed, "cost_y": kv.deviation.to_dict(),
            "clip_rates": kv.clip_rates, "kernel_rel_y": max(r.vs_reference.rel for r in kernel)}


def long_sequence(config: MHAConfig, spec: KVCacheSpec, past: int) -> dict:
    """y of the last STEPS tokens of one past + STEPS sequence, int8 vs float cache (fp32)."""
    module = build_module(config, seed=0).eval()
    x = torch.from_numpy(np.random.default_rng([past, 3]).standard_normal(
        (1, past + STEPS, config.d_in)).astype(np.float32))
    with torch.inference_mode():
        want = module(x)[:, past:].double().numpy()
        k, v = module.keys_values(x, torch.arange(past + STEPS).view(1, -1))
        module.use_int8_cache(torch.from_numpy(spec.key.scale), torch.from_numpy(spec.value.scale))
        got = module(x)[:, past:].double().numpy()
    err = float(np.abs(got - want).max())
    cosine = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    return {"past": past, "max_abs": err, "rel": err / float(np.abs(want).max()),
            "cosine": cosine, "clip_key": spec.key.clipped(k.numpy()),
            "clip_value": spec.value.clipped(v.numpy())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/kv-error.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in LAYERS.items():
            for value in GRANULARITIES:
                spec = calibrate_cache(build_module(config, seed=0).eval(), value=value)
                row = {"layer": name, "value_scale": value,
                       **checked(config, value, Path(tmp) / "a"),
                       "long": [long_sequence(config, spec, p) for p in PASTS]}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    Path(args.out).write_text(json.dumps({
        "machine": machine_info(), "calibration": SYNTHETIC, "sweep": SWEEP,
        "layers": {k: v.to_dict() for k, v in LAYERS.items()}, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
