"""Walking an ONNX graph's nodes, subgraphs included (torch-free: the runners read it too)."""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import onnx

CONTRIB = "com.microsoft"  # ONNX Runtime's contrib operators' domain


def all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Nodes and the nodes of their subgraphs (Loop bodies, If branches), recursively."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g.node)


def matmul_nbits_probe(bits: int, block_size: int, accuracy_level: int = 1
                       ) -> tuple[onnx.ModelProto, np.ndarray]:
    """One MatMulNBits (K = 4 blocks, N = 16) over fixed random codes, and a fixed input A
    [3, K]: what the runners compile to find out which kernel path a runtime really takes for
    (bits, block) on this CPU (int8 activations or fp32 compute), never assumed."""
    from onnx import TensorProto, helper, numpy_helper
    k, n = 4 * block_size, 16
    rng = np.random.default_rng(0)
    packed = rng.integers(0, 256, (n, 4, block_size * bits // 8), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.02, n * 4).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain=CONTRIB, K=k,
                            N=n, bits=bits, block_size=block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "probe", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, n])],
        [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "scales")])
    # ir_version 10: ONNX Runtime 1.31 refuses the installed onnx's newer default
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(CONTRIB, 1)])
    return model, rng.standard_normal((3, k)).astype(np.float32)


def matmul_nbits_kinds(model: onnx.ModelProto) -> list[tuple[int, int, int]]:
    """The distinct (bits, block_size, accuracy_level) of a model's MatMulNBits nodes."""
    return sorted({(a["bits"], a["block_size"], a.get("accuracy_level", 0)) for a in (
        {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        for node in all_nodes(model.graph.node) if node.op_type == "MatMulNBits")})
