"""Quantized projections in the ONNX graph (the step's graph hook, graph/builder.py's
``projections``): x (.., K) @ W^T with W (N, K) in its quantizer's MatMulNBits form(s)
(rtn.py: round to nearest here; source.py: a checkpoint's own blocks) — ONNX Runtime's
com.microsoft.MatMulNBits reading the packed codes, one scale (and zero point) per block;
default zero points (2^(bits-1)) are left out. Several forms (a weight split in two) are summed.
A kept act-order weight reads x through a Gather of its input order (one per distinct order:
q, k and v share theirs). A float8 weight is ONNX's DequantizeLinear (opset 21: float8 codes,
a scale per block of inputs) and a MatMul.

Shape legend: B = batch, T = this call, K = input features, N = output features.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ...graph.builder import GraphBuilder
from ...graph.nodes import CONTRIB
from ...graph.ops import Ops
from .kept import BLOCKS, FLOAT8

FLOAT8_OPSET = 21  # DequantizeLinear with block_size
OPSETS = {BLOCKS: 1, FLOAT8: FLOAT8_OPSET}  # the opset each kind of kept weight needs


@dataclass(frozen=True)
class MatMulNBitsProjections:
    """The projections of ``spec`` (QuantSpec, SourceQuantSpec: its ``forms`` and accuracy
    level) as MatMulNBits; a projection it has no form for stays a float MatMul (None)."""

    spec: Any
    # (builder, input value, order bytes) -> the Gather of x in that order, shared by projections
    _orders: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def min_opset(self) -> int:
        """The opset the forms need (float8 DequantizeLinear: 21)."""
        kept = getattr(self.spec, "blocks", {}).values()
        return max((OPSETS[b.kind] for b in kept), default=1)

    def __call__(self, g: GraphBuilder, x: str, name: str,
                 weight: torch.Tensor) -> Optional[str]:
        forms = self.spec.forms(name, weight.detach().to(torch.float32).numpy())
        if not forms:
            return None
        parts = [self._write(g, x, name + (f"_part{i}" if i else ""), q)
                 for i, q in enumerate(forms)]
        y = parts[0]
        for part in parts[1:]:
            y = Ops(g).Add(y, part, name=f"{name}_sum")  # (.., N)
        return y

    def packed(self, g: GraphBuilder, x: str, name: str,
               weights: list[tuple[str, torch.Tensor]]) -> tuple[Optional[str], str]:
        """The projections ``weights`` (name, (N_i, K)) as one node of their weights stacked
        along the outputs: one MatMulNBits of their blocks' rows concatenated (a block spans
        inputs of one row, so rows move whole), or one float MatMul where none is quantized;
        (None, why) where they are not one node's (a mix of float and quantized, weights in
        two parts, or block layouts that differ)."""
        forms = [self.spec.forms(n, w.detach().to(torch.float32).numpy()) for n, w in weights]
        names = ", ".join(n for n, _ in weights)
        if not any(forms):
            w = torch.cat([w for _, w in weights])  # (sum N_i, K)
            return Ops(g).MatMul(x, g.const(f"{name}.weight", w.t()),
                                 name=f"{name}_matmul"), ""  # (.., sum N_i)
        if not all(len(f) == 1 for f in forms):
            return None, f"{names}: not each one quantized weight of one part"
        blocks = [f[0] for f in forms]
        why = _rows_differ(blocks)
        if why:
            return None, f"{names}: {why}"
        stacked = dataclasses.replace(blocks[0], **{
            a: np.concatenate([getattr(b, a) for b in blocks]) for a in _ROW_ARRAYS})
        return self._write(g, x, name, stacked), ""  # (.., sum N_i)

    def _write(self, g: GraphBuilder, x: str, name: str, q) -> str:
        """One node of a weight, by its kind (kept.py; round to nearest's are blocks)."""
        write = {BLOCKS: self._blocks, FLOAT8: self._dequantize_linear}[q.kind]
        return write(g, x, name, q)

    def _blocks(self, g: GraphBuilder, x: str, name: str, q) -> str:
        """MatMulNBits, x read in the weight's input order where it has one (act-order)."""
        if getattr(q, "input_order", None) is not None:
            x = self._in_order(g, x, q.input_order)
        return self._matmul_nbits(g, x, name, q)

    def _in_order(self, g: GraphBuilder, x: str, order: np.ndarray) -> str:
        """x (.., K) with its inputs in ``order``: one Gather per distinct order and input."""
        key = (id(g), x, order.tobytes())  # a branch's builder gathers its own x
        if key not in self._orders:  # the builder kept with its Gather: its id stays its own
            index = g.shared_const("input_order", order.astype(np.int64))
            self._orders[key] = (g, Ops(g).Gather(x, index, axis=-1, name="act_order"))
        return self._orders[key][1]  # (.., K)

    def _dequantize_linear(self, g: GraphBuilder, x: str, name: str, q: Any) -> str:
        """W^T (K, N) = DequantizeLinear(codes^T, scales (ceil(K / cols), N), axis 0, block
        cols): the float8 codes kept, each row's scales (block rows expanded) per block of
        inputs; the same single rounding as the format's definition."""
        op = Ops(g)
        codes_t = g.float8_const(f"{name}.weight_f8_t", np.ascontiguousarray(q.codes.T))
        scales_t = g.const(f"{name}.weight_scales_t", np.ascontiguousarray(q.row_scales().T),
                           float_dtype=False)
        w_t = op.DequantizeLinear(codes_t, scales_t, axis=0, block_size=q.block_size,
                                  name=f"{name}_dequantize")  # (K, N) float32
        return op.MatMul(x, w_t, name=f"{name}_matmul")  # (.., N)

    def _matmul_nbits(self, g: GraphBuilder, x: str, name: str, q) -> str:
        if getattr(q, "float_zero_points", False):
            return self._affine_blocks(g, x, name, q)
        inputs = [x, g.const(f"{name}.weight_q{q.bits}", q.packed(), float_dtype=False),
                  g.const(f"{name}.weight_scales", q.scales.reshape(-1))]  # (N * blocks,)
        if q.needs_zero_points:
            zero_points = q.packed_zero_points()
            inputs.append(g.const(f"{name}.weight_zero_points", zero_points,
                                  float_dtype=zero_points.dtype != np.uint8))
        return Ops(g).MatMulNBits(*inputs, name=f"{name}_matmul", domain=CONTRIB, K=q.k, N=q.n,
                                  bits=q.bits, block_size=q.block_size,
                                  accuracy_level=self.spec.accuracy_level)  # (.., N)

    def _affine_blocks(self, g: GraphBuilder, x: str, name: str, q) -> str:
        """Blocks with float zero points, (code - zp) * scale = code * scale + m (m = -zp *
        scale: a GGUF block's min), as the packed integer kernel with zero points 0 plus each
        block's sum of x times its m — exact, where ONNX Runtime 1.31 would dequantize float
        zero points' weights at every call:

            x (B, T, K) -> MatMulNBits(codes, scales, zero points 0)        (B, T, N)
            x -> (B, T, n_blocks, block) -> ReduceSum -> @ m^T (n_blocks, N) (B, T, N)"""
        op = Ops(g)
        n_blocks, block = q.scales.shape[1], q.block_size
        zero = dataclasses.replace(q, zero_points=np.zeros(q.scales.shape, np.uint8))
        codes = self._matmul_nbits(g, x, name, zero)  # (B, T, N)
        shape = g.ints(f"{name}.blocks_shape", [0, 0, n_blocks, block])
        blocks = op.Reshape(x, shape, name=f"{name}_blocks")  # (B, T, n_blocks, block)
        sums = op.ReduceSum(blocks, g.ints(f"{name}.last_axis", [-1]), keepdims=0,
                            name=f"{name}_block_sums")  # (B, T, n_blocks)
        mins = -(q.zero_points.astype(np.float64) * q.scales)  # (N, n_blocks)
        offset = op.MatMul(sums, g.const(f"{name}.weight_mins_t", mins.T),
                           name=f"{name}_mins")  # (B, T, N)
        return op.Add(codes, offset, name=f"{name}_affine")


_ROW_ARRAYS = ("codes", "scales", "zero_points")  # (N, n_blocks, ...): one row per output


def _rows_differ(blocks: list) -> Optional[str]:
    """Why the blocks of several weights cannot be stacked by rows into one MatMulNBits (their
    kind, record, bits, block size, inputs, zero points' type or input order differ), or
    None. (Integer zero points of some rows only: the stacked weight writes them all.)"""
    if any(b.kind != BLOCKS for b in blocks):
        return "float8 weights (DequantizeLinear), not blocks"
    for label, value in (("records", lambda b: type(b).__name__), ("bits", lambda b: b.bits),
                         ("block sizes", lambda b: b.block_size), ("inputs", lambda b: b.k),
                         ("zero points", lambda b: b.zero_points.dtype.name)):
        if len({value(b) for b in blocks}) > 1:
            return f"their {label} differ ({', '.join(str(value(b)) for b in blocks)})"
    orders = [getattr(b, "input_order", None) for b in blocks]
    if any(o is not None for o in orders) and not all(
            o is not None and np.array_equal(o, orders[0]) for o in orders):
        return "their input orders (act-order) differ"
    return None
