"""Walking an ONNX graph's nodes, subgraphs included (torch-free: the runners read it too)."""
from __future__ import annotations

from typing import Iterable, Iterator

import onnx

CONTRIB = "com.microsoft"  # ONNX Runtime's contrib operators' domain


def all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Nodes and the nodes of their subgraphs (Loop bodies, If branches), recursively."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g.node)
