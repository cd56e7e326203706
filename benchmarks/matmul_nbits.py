"""One projection alone: ONNX Runtime's fp32 MatMul against MatMulNBits (int4/int8, block 32,
accuracy levels 1 and 4) for one token, x (1, K) @ W (K, N), hot (one weight matrix in a loop).
Explains where a quantized decode step's time goes on this CPU.

    .venv/bin/python benchmarks/matmul_nbits.py [--sizes 768,2048,4096] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mha_export.env import cpu_name
from mha_export.lossy.projections.rtn import QuantSpec, quantize


def session(k: int, n: int, w: np.ndarray, spec: QuantSpec | None, threads: int):
    if spec is None:
        node = helper.make_node("MatMul", ["A", "W"], ["Y"])
        inits = [numpy_helper.from_array(w.T.copy(), "W")]
    else:
        q = quantize(w, spec)
        inits = [numpy_helper.from_array(q.packed(), "B"),
                 numpy_helper.from_array(q.scales.reshape(-1), "scales")]
        node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft",
                                K=k, N=n, bits=spec.bits, block_size=spec.block_size,
                                accuracy_level=spec.accuracy_level)
    graph = helper.make_graph([node], "p", [helper.make_tensor_value_info("A", TensorProto.FLOAT,
                                                                          [1, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])], inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def median_us(s, x, reps: int = 400) -> float:
    for _ in range(20):
        s.run(None, {"A": x})
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        s.run(None, {"A": x})
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="768,2048,4096")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    variants = {"fp32 MatMul": None, "int4 level 4": QuantSpec(4), "int4 level 1":
                QuantSpec(4, accuracy_level=1), "int8 level 4": QuantSpec(8)}
    print(f"{cpu_name()}, {args.threads} threads, onnxruntime {ort.__version__}; median us "
          "of one session.run (x: 1 token)")
    for size in map(int, args.sizes.split(",")):
        w = (np.random.default_rng(0).standard_normal((size, size)) * 0.02).astype(np.float32)
        x = np.random.default_rng(1).standard_normal((1, size)).astype(np.float32)
        row = {name: median_us(session(size, size, w, spec, args.threads), x)
               for name, spec in variants.items()}
        print(f"K = N = {size}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
