"""Which MatMulNBits kernel a runtime really runs (torch-free: the ONNX Runtime and OpenVINO
runners read it): the distinct MatMulNBits forms of a model, and a one-node probe of a form
that a runner compiles on this CPU to find out (int8 activations or fp32 compute), never
assumed."""
from __future__ import annotations

import numpy as np
import onnx

from ...graph.nodes import CONTRIB, all_nodes

ZERO_POINTS = ("default", "uint8", "float")  # MatMulNBits' zero points: absent, packed, float


def matmul_nbits_probe(bits: int, block_size: int, accuracy_level: int = 1,
                       zero_points: str = "default") -> tuple[onnx.ModelProto, np.ndarray]:
    """One MatMulNBits (K = 4 blocks, N = 16) over fixed random codes (and zero points of the
    given kind), and a fixed input A [3, K]: what the runners compile to find out which kernel
    path a runtime really takes for it on this CPU (int8 activations or fp32 compute), never
    assumed."""
    from onnx import TensorProto, helper, numpy_helper
    k, n = 4 * block_size, 16
    rng = np.random.default_rng(0)
    packed = rng.integers(0, 256, (n, 4, block_size * bits // 8),
                          dtype=np.uint8)
    scales = rng.uniform(0.01, 0.02, n * 4).astype(np.float32)
    constants = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "scales")]
    if zero_points == "float":
        constants.append(numpy_helper.from_array(
            rng.uniform(0, 2 ** bits - 1, n * 4).astype(np.float32), "zero_points"))
    elif zero_points == "uint8":
        constants.append(numpy_helper.from_array(
            rng.integers(0, 256, n * -(-4 * bits // 8), dtype=np.uint8), "zero_points"))
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"] + (
        ["zero_points"] if zero_points != "default" else []), ["Y"], domain=CONTRIB, K=k,
        N=n, bits=bits, block_size=block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "probe", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, n])], constants)
    # ir_version 10: ONNX Runtime 1.31 refuses the installed onnx's newer default
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(CONTRIB, 1)])
    return model, rng.standard_normal((3, k)).astype(np.float32)


def matmul_nbits_kinds(model: onnx.ModelProto) -> list[tuple[int, int, int, str]]:
    """The distinct (bits, block_size, accuracy_level, zero points: ZERO_POINTS) of a model's
    MatMulNBits nodes."""
    floats = {t.name for t in model.graph.initializer
              if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
    kinds = set()
    for node in all_nodes(model.graph.node):
        if node.op_type != "MatMulNBits":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        zp = node.input[3] if len(node.input) > 3 and node.input[3] else ""
        kind = "default" if not zp else "float" if zp in floats else "uint8"
        kinds.add((a["bits"], a["block_size"], a.get("accuracy_level", 0), kind))
    return sorted(kinds)
