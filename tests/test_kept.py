"""Kept weights' protocol (lossy/projections/kept.py): every class that keeps a checkpoint's own
quantized weight implements it, and the graph, the record and the report go by its fields
(its kind), never by the class or the type's name."""
import dataclasses

import numpy as np
import pytest
import torch

from mha_export.graph.builder import GraphBuilder
from mha_export.lossy.projections.checkpoint_blocks import kept_form
from mha_export.lossy.projections.gguf_blocks import SourceBlocks
from mha_export.lossy.projections.graph import FLOAT8_OPSET, MatMulNBitsProjections
from mha_export.lossy.projections.kept import (BLOCKS, FLOAT8, KINDS, KeptWeight, record,
                                               record_kind)
from mha_export.lossy.projections.source import SourceQuantSpec
from mha_export.weights.quantized import Float8Blocks, IntGroups

N, K = 6, 64
RNG = np.random.default_rng(0)


def q5_blocks() -> SourceBlocks:
    """A GGUF-style affine 5-bit weight (Q5_K: 8 bits, float zero points): kept as two parts."""
    return SourceBlocks("Q5_K", 8, 32, K, RNG.integers(0, 32, (N, 2, 32), dtype=np.uint8),
                        RNG.uniform(0.01, 0.1, (N, 2)).astype(np.float32),
                        RNG.uniform(0, 31, (N, 2)).astype(np.float32))


def int_groups() -> IntGroups:
    return IntGroups("GPTQ", 4, 32, RNG.integers(0, 16, (N, K), dtype=np.uint8),
                     RNG.integers(0, 16, (N, 2), dtype=np.uint8),
                     RNG.uniform(0.01, 0.1, (N, 2)).astype(np.float32), np.arange(K) // 32)


def float8() -> Float8Blocks:
    codes = torch.randn(N, K, generator=torch.Generator().manual_seed(0))
    return Float8Blocks("FP8 blocks", codes.to(torch.float8_e4m3fn).view(torch.uint8).numpy(),
                        RNG.uniform(0.5, 2, (2, 1)).astype(np.float32), (4, K))


KEPT = {"gguf blocks": q5_blocks, "int groups": lambda: kept_form(int_groups()),
        "float8 blocks": lambda: kept_form(float8())}


@pytest.mark.parametrize("make", KEPT.values(), ids=KEPT.keys())
def test_every_kept_weight_implements_the_protocol(make):
    w = make()
    assert isinstance(w, KeptWeight) and w.kind in KINDS
    parts = w.parts()
    assert all(p.kind == w.kind for p in parts)
    np.testing.assert_allclose(sum(p.dequantized() for p in parts), w.dequantized(),
                               rtol=1e-5, atol=1e-5 * np.abs(w.dequantized()).max())
    assert w.stored_bytes() == sum(p.stored_bytes() for p in parts) > 0
    rows = w.take_rows(np.array([3, 1]))
    assert rows.kind == w.kind and rows.bits == w.bits
    np.testing.assert_array_equal(rows.dequantized(), w.dequantized()[[3, 1]])
    assert record(w) == {"type": w.type_name, "kind": w.kind, "bits": w.bits,
                         "block_size": w.block_size, "bytes": w.stored_bytes()}


def test_kept_forms_by_the_decoded_kind():
    groups = int_groups()
    kept = kept_form(groups)
    assert (kept.kind, kept.type_name, kept.bits) == (BLOCKS, "GPTQ-int4-g32", 4)
    np.testing.assert_array_equal(kept.dequantized(), groups.dequantized())
    f8 = float8()
    assert kept_form(f8) is f8 and (f8.kind, f8.type_name) == (FLOAT8, f"FP8-e4m3-4x{K}")
    assert len(q5_blocks().parts()) == 2 and len(kept.parts()) == 1


@dataclasses.dataclass(frozen=True)
class Disguised:
    """A float8 weight under another class and type name: what the record says decides."""

    inner: Float8Blocks
    kind = FLOAT8
    type_name = "MY-OWN-F8"

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def parts(self):
        return (self,)


def _written(w) -> tuple[list[str], int]:
    spec = SourceQuantSpec(projections={"q_proj": record(w)}, blocks={"q_proj": w})
    g, projections = GraphBuilder(), MatMulNBitsProjections(spec)
    projections(g, "x", "q_proj", torch.zeros(0))
    return [n.op_type for n in g.nodes], projections.min_opset


def test_the_graph_dispatches_by_the_record():
    assert _written(Disguised(float8())) == (["DequantizeLinear", "MatMul"], FLOAT8_OPSET)
    assert _written(kept_form(int_groups())) == (["MatMulNBits"], 1)
    ops = _written(q5_blocks())[0]  # two parts, each with its mins' term, summed
    assert ops.count("MatMulNBits") == 2 and "DequantizeLinear" not in ops


def test_records_of_0_5_are_read_and_the_report_goes_by_the_kind():
    """A 0.5 record names only its type; a newer one its kind, whatever its type is called."""
    old_f8 = {"type": "FP8-e4m3-128x128", "bits": 8, "block_size": 128, "bytes": 10}
    old_q4 = {"type": "Q4_K", "bits": 4, "block_size": 32, "bytes": 10}
    assert (record_kind(old_f8), record_kind(old_q4)) == (FLOAT8, BLOCKS)
    assert record_kind({**old_q4, "type": "FP8-looking", "kind": BLOCKS}) == BLOCKS
    note = "float8 weights are dequantized at run time"
    for projections, said in (({"q_proj": old_f8}, True), ({"q_proj": old_q4}, False),
                              ({"q_proj": record(Disguised(float8()))}, True)):
        spec = SourceQuantSpec.from_dict({"accuracy_level": 1, "projections": projections})
        assert (note in spec.label()) == said
