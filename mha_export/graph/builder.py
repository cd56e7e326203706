"""ONNX graph building blocks shared by every graph form: the builder, runtime shapes, the heads
split/merge, and the one attention-mask builder.

Shape legend: B = batch, T = this call's length, P = past length, S = P + T keys,
N = query heads, K = key/value heads, H = head size, D = N * H.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import ml_dtypes
import numpy as np
import torch
from onnx import GraphProto, TensorProto, helper, numpy_helper

from .nodes import CONTRIB  # noqa: F401  (re-exported: the forms import it from here)
from .ops import Ops



@dataclass(frozen=True)
class FloatType:
    """A model dtype (``--dtype``): how the graph stores and declares its floats."""

    onnx: int  # TensorProto element type of the graph's float I/O and initializers
    numpy: type  # its numpy scalar type (bfloat16: ml_dtypes', numpy has none)
    torch: torch.dtype
    tag: str = ""  # a default folder's mark of a file in it ("bf16"; float32: none)


# every dtype an ONNX export can be built in: what varies with --dtype lives here
FLOAT_TYPES = {"float32": FloatType(TensorProto.FLOAT, np.float32, torch.float32),
               "float16": FloatType(TensorProto.FLOAT16, np.float16, torch.float16, "fp16"),
               "bfloat16": FloatType(TensorProto.BFLOAT16, ml_dtypes.bfloat16, torch.bfloat16,
                                     "bf16")}
ONNX_DTYPES = {name: t.onnx for name, t in FLOAT_TYPES.items()}
NUMPY_DTYPES = {name: t.numpy for name, t in FLOAT_TYPES.items()}


class ProjectionWriter(Protocol):
    """How a lossy step writes the projections (lossy/projections/graph.py: MatMulNBits):
    x @ weight.T into builder g under ``name``, or None where the weight stays a float
    MatMul."""

    def __call__(self, g: "GraphBuilder", x: str, name: str,
                 weight: torch.Tensor) -> str | None: ...

    def packed(self, g: "GraphBuilder", x: str, name: str,
               weights: list[tuple[str, torch.Tensor]]) -> tuple[str | None, str]:
        """x @ [W_1; W_2; ...].T, the weights (N_i, K) of the named projections concatenated
        along their outputs, as one node under ``name``; (None, why) where they cannot be
        one node (their block layouts differ)."""
        ...


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; names are unique and readable (a subgraph's builder
    carries a prefix, so none of its names shadows the outer scope)."""

    dtype: str = "float32"
    prefix: str = ""
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    _count: dict = field(default_factory=dict)
    # a branch that shares the outer graph's constants: its const() returns the outer graph's
    # initializer of the same name and content (weights stored once for every branch)
    outer: "GraphBuilder | None" = None
    _shared: dict = field(default_factory=dict)
    # the projections as a lossy step writes them (weight-only quantized: MatMulNBits); None:
    # float MatMuls
    projections: ProjectionWriter | None = None

    def name(self, base: str) -> str:
        base = self.prefix + base
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def sub(self, prefix: str, share_constants: bool = False) -> "GraphBuilder":
        return GraphBuilder(dtype=self.dtype, prefix=self.prefix + prefix,
                            outer=self if share_constants else None,
                            projections=self.projections)

    @property
    def elem(self) -> int:
        return ONNX_DTYPES[self.dtype]

    def const(self, name: str, value: np.ndarray | torch.Tensor | float,
              float_dtype: bool = True) -> str:
        if isinstance(value, torch.Tensor):
            value = value.detach().to(torch.float64).numpy()
        arr = np.asarray(value)
        if float_dtype:
            arr = arr.astype(NUMPY_DTYPES[self.dtype])
        if self.outer is not None:
            return self.outer.shared_const(name, arr)
        name = self.name(name)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def shared_const(self, name: str, arr: np.ndarray) -> str:
        """One initializer per (name, content), however many branches ask for it."""
        key = (name, arr.dtype.str, arr.shape, hashlib.sha1(arr.tobytes()).hexdigest())
        if key not in self._shared:
            self._shared[key] = self.const(name, arr, float_dtype=False)
        return self._shared[key]

    def float8_const(self, name: str, codes: np.ndarray) -> str:
        """e4m3fn bytes (uint8, numpy has no float8) as one FLOAT8E4M3FN initializer, shared
        by content like ``shared_const``."""
        if self.outer is not None:
            return self.outer.float8_const(name, codes)
        key = ("float8", name, codes.shape, hashlib.sha1(codes.tobytes()).hexdigest())
        if key not in self._shared:
            self._shared[key] = self.name(name)
            self.initializers.append(helper.make_tensor(
                self._shared[key], TensorProto.FLOAT8E4M3FN, codes.shape,
                np.ascontiguousarray(codes, np.uint8).tobytes(), raw=True))
        return self._shared[key]

    def ints(self, name: str, values: list[int] | int) -> str:
        return self.const(name, np.array(values, dtype=np.int64), float_dtype=False)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None,
           domain: str = "", **attrs) -> str | list[str]:
        base = self.name(name or op_type.lower())
        outs = [base] if n_out == 1 else [f"{base}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain,
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def linear(self, x: str, name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> str:
        """x @ weight.T + bias (nn.Linear semantics); the weight as ``projections`` writes it
        where set (the bias stays in the model dtype)."""
        y = self.projections(self, x, name, weight) if self.projections else None
        if y is None:
            y = self.op("MatMul", [x, self.const(f"{name}.weight", weight.t())],
                        name=f"{name}_matmul")
        if bias is not None:
            y = self.op("Add", [y, self.const(f"{name}.bias", bias)], name=f"{name}_add")
        return y

    def subgraph(self, name: str, inputs: list, outputs: list) -> GraphProto:
        return helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.initializers)


def finite_lowest(dtype: str) -> float:
    """Mask fill that stays finite in the dtype (no -inf, so no NaN from -inf - -inf)."""
    return float(ml_dtypes.finfo(NUMPY_DTYPES[dtype]).min)  # numpy's finfo knows no bfloat16


def scale_queries(g: GraphBuilder, q: str, scale: float) -> str:
    """q * scale: the (.., T, H) queries are scaled, never the (.., T, S) scores."""
    return Ops(g).Mul(q, g.const("attn.scale", np.array(scale)), name="q_scaled")


# --- runtime shapes ---------------------------------------------------------------------------

def dim(g: GraphBuilder, x: str, axis: int, name: str) -> str:
    """int64 scalar (): x.shape[axis] at runtime (the node ``name``)."""
    op = Ops(g)
    d = op.Shape(x, start=axis, end=axis + 1, name=f"{name}_1d")  # (1,)
    return op.Squeeze(d, g.ints("axes0", [0]), name=name)  # ()


def as_1d(g: GraphBuilder, s: str, name: str) -> str:
    return Ops(g).Unsqueeze(s, g.ints("axes0", [0]), name=name)  # () -> (1,)


def ceil_div(g: GraphBuilder, a: str, b: str, name: str) -> str:
    """int64 scalars: ceil(a / b) for a, b > 0 (the node ``name``)."""
    op = Ops(g).named(name)
    num = op.Sub(op.Add(a, b), g.ints("one", 1))  # a + b - 1
    return Ops(g).Div(num, b, name=name)  # integer Div truncates; operands are positive


# --- heads --------------------------------------------------------------------------------------

def split_heads(g: GraphBuilder, x: str, heads: int, head_dim: int, name: str,
                keys_last: bool = False) -> str:
    """(B, T, heads*H) -> (B, heads, T, H), or (B, heads, H, T) with keys_last (for q @ k^T)."""
    op = Ops(g).named(name)
    x = op.Reshape(x, g.ints("heads_shape", [0, 0, heads, head_dim]))  # (B, T, heads, H)
    perm = [0, 2, 3, 1] if keys_last else [0, 2, 1, 3]
    return op.Transpose(x, perm=perm)  # (B, heads, T, H) | (B, heads, H, T)


def repeat_kv(g: GraphBuilder, x: str, groups: int, name: str) -> str:
    """(B, K, S, H) -> (B, K*groups, S, H): kv head j serves query heads j*groups ... (the
    mapping of Hugging Face's repeat_kv and ONNX's Attention op); x itself when groups == 1."""
    if groups == 1:
        return x
    op = Ops(g).named(name)
    x = op.Unsqueeze(x, g.ints("axes2", [2]))  # (B, K, 1, S, H)
    x = op.Expand(x, g.ints("group_shape", [1, 1, groups, 1, 1]))  # (B, K, G, S, H)
    shape = op.Concat(op.Shape(x, start=0, end=1), g.ints("minus_one", [-1]),
                      op.Shape(x, start=3, end=5), axis=0)  # [B, -1, S, H]
    return op.Reshape(x, shape)  # (B, N, S, H)


def merge_heads(g: GraphBuilder, x: str, width: int, name: str = "context") -> str:
    """(B, N, T, H) -> (B, T, N*H)."""
    op = Ops(g).named(name)
    x = op.Transpose(x, perm=[0, 2, 1, 3])  # (B, T, N, H)
    return op.Reshape(x, g.ints("merged_shape", [0, 0, width]))  # (B, T, N*H)


# --- the attention mask: one builder for every form -------------------------------------------

def masked_positions(g: GraphBuilder, t_q: str, t_k: str, start: str | None = None,
                     name: str = "causal", window: int = 0, chunk: int = 0,
                     first: str | None = None) -> str:
    """(t_q, t_k) bool, True where query i may NOT see key j (j > i + offset): bottom-right
    alignment, query i sits at key position (t_k - t_q) + i, or at ``start`` + i when given
    (a block of queries inside a longer sequence). All int64 scalars, from the runtime shapes.
    ``chunk``: keys before the query's chunk too (``chunk_behind``; (B, 1, t_q, t_k) when
    ``first`` is given). Nodes named ``<name>_*`` (``<name>_offset`` and ``window_behind``: a
    test's faults edit them)."""
    op = Ops(g).named(name)
    offset = start if start is not None else op.Sub(t_k, t_q, name="offset")  # ()
    zero, one = g.ints("zero", 0), g.ints("one", 1)
    q_pos = op.Add(op.Range(zero, t_q, one), offset)  # (t_q,)
    k_pos = op.Range(zero, t_k, one)  # (t_k,)
    rows = op.Unsqueeze(q_pos, g.ints("axes1", [1]))  # (t_q, 1)
    future = op.Greater(k_pos, rows)  # (t_q, t_k)
    if chunk > 0:
        return Ops(g).Or(future, chunk_behind(g, rows, k_pos, chunk, first))  # (B|., ., t_q, t_k)
    if window <= 0:
        return future
    win = Ops(g).named("window")
    oldest = win.Sub(rows, g.ints("window", window - 1))  # (t_q, 1)
    behind = win.Less(k_pos, oldest, name="behind")  # (t_q, t_k): i - j >= window
    return win.Or(future, behind)  # (t_q, t_k)


def row_masked_positions(g: GraphBuilder, starts: str, t_q: str, t_k: str,
                         window: int = 0, chunk: int = 0) -> str:
    """(B, 1, t_q, t_k) bool, True where row b's query i may NOT see key j: it sits at key
    position starts[b] + i (a static cache's own length per row). Nodes named ``row_*``
    (``row_query_start`` and ``row_window_behind``: a test's faults edit them)."""
    op = Ops(g).named("row")
    steps = op.Range(g.ints("zero", 0), t_q, g.ints("one", 1))  # (Tq,)
    rows = op.Unsqueeze(starts, g.ints("axes1", [1]), name="query_start")  # (B, 1)
    q_pos = op.Unsqueeze(op.Add(rows, steps), g.ints("axes13", [1, 3]))  # (B, 1, Tq, 1)
    k_pos = op.Range(g.ints("zero", 0), t_k, g.ints("one", 1))  # (Tk,)
    future = op.Greater(k_pos, q_pos)  # (B, 1, Tq, Tk)
    if chunk > 0:  # a static cache's rows start at slot 0
        return op.Or(future, chunk_behind(g, q_pos, k_pos, chunk))  # (B, 1, Tq, Tk)
    if window <= 0:
        return future
    oldest = op.Sub(q_pos, g.ints("window", window - 1))  # (B, 1, Tq, 1)
    behind = op.Less(k_pos, oldest, name="window_behind")  # (B, 1, Tq, Tk)
    return op.Or(future, behind)  # (B, 1, Tq, Tk)


def alibi_bias(g: GraphBuilder, slopes: str, t_q: str, t_k: str, start: str | None = None
               ) -> str:
    """(B|1, N, t_q, t_k) float: slopes (1, N, 1, 1) * (j - i), query i at key position
    (t_k - t_q) + i, or start + i (start: () or (B,)). Nodes named ``alibi_*``."""
    op = Ops(g).named("alibi")
    offset = start if start is not None else op.Sub(t_k, t_q, name="offset")  # () | (B,)
    steps = op.Range(g.ints("zero", 0), t_q, g.ints("one", 1))  # (Tq,)
    rows = op.Reshape(offset, g.ints("alibi_rows", [-1, 1, 1, 1]))  # (B|1, 1, 1, 1)
    q_pos = op.Add(rows, op.Reshape(steps, g.ints("alibi_cols", [1, 1, -1, 1])))  # (B|1,1,Tq,1)
    k_pos = op.Range(g.ints("zero", 0), t_k, g.ints("one", 1))  # (Tk,)
    distance = op.Cast(op.Sub(k_pos, q_pos), to=g.elem)  # (B|1, 1, Tq, Tk)
    return op.Mul(slopes, distance, name="bias")  # (B|1, N, Tq, Tk)


def chunk_behind(g: GraphBuilder, q_pos: str, k_pos: str, chunk: int,
                 first: str | None = None) -> str:
    """True at keys k_pos (Tk,) before the chunk of queries q_pos (.., Tq, 1) (Llama 4): a
    chunk starts at q - ((q - first[b]) mod chunk), first (B,) the slot of each row's first
    token (0 when None). Nodes named ``chunk_*`` (``chunk_behind``: a test's fault)."""
    op = Ops(g).named("chunk")
    offset = q_pos
    if first is not None:
        offset = op.Sub(q_pos, op.Reshape(first, g.ints("first_shape", [-1, 1, 1, 1])))
    inside = op.Mod(offset, g.ints("chunk", chunk), name="inside")  # (B|., ., Tq, 1)
    return op.Less(k_pos, op.Sub(q_pos, inside), name="behind")  # (B|., ., Tq, Tk)


def first_tokens(g: GraphBuilder, attention_mask: str) -> str:
    """(B,) the slot of each row's first token: the left padding before it (transformers'
    chunked mask counts chunks from there)."""
    op = Ops(g).named("first_token")
    seen = op.CumSum(attention_mask, g.ints("axis_last", -1))  # (B, S)
    before = op.Cast(op.Equal(seen, g.ints("zero", 0)), to=TensorProto.INT64)  # (B, S)
    return op.ReduceSum(before, g.ints("axes_last_1d", [-1]), keepdims=0)  # (B,)


def additive(g: GraphBuilder, masked: str, name: str) -> str:
    """bool 'masked' -> additive float: lowest finite value where masked, 0 elsewhere."""
    return Ops(g).Where(masked, g.const("mask_fill", finite_lowest(g.dtype)),
                        g.const("mask_zero", 0.0), name=name)


def padding_masked(g: GraphBuilder, attention_mask: str, name: str = "padding") -> str:
    """(B, S) int64 attention_mask (1 = token) -> (B, 1, 1, S) bool, True at padding keys
    (``<name>_keys``: a test's fault edits it)."""
    op = Ops(g).named(name)
    pad = op.Equal(attention_mask, g.ints("pad_value", 0), name="keys")  # (B, S)
    return op.Unsqueeze(pad, g.ints("axes12", [1, 2]))  # (B, 1, 1, S)


def score_mask(g: GraphBuilder, causal: bool, t_q: str, t_k: str,
                  attention_mask: str | None, start: str | None = None,
                  window: int = 0, chunk: int = 0) -> str | None:
    """bool (t_q, t_k) or (B, 1, t_q, t_k), True where a score is masked: causal (bottom-right,
    or from ``start``), outside the window or chunk, and/or padding keys; None when nothing is
    masked. Chunks count from each row's first token in ``attention_mask`` (its slots 0 .. t_k
    must be the keys' own)."""
    if attention_mask is None:
        return masked_positions(g, t_q, t_k, start, window=window,
                                chunk=chunk) if causal else None
    pad = padding_masked(g, attention_mask)  # (B, 1, 1, t_k)
    op = Ops(g).named("masked")
    if not causal:  # ORT's Attention wants the query axis spelled out: (B, 1, t_q, t_k)
        rows = op.Concat(g.ints("ones2", [1, 1]), as_1d(g, t_q, "rows_1d"),
                         g.ints("one_1d", [1]), axis=0)  # (4,) [1, 1, t_q, 1]
        return op.Expand(pad, rows)  # (B, 1, t_q, t_k)
    first = first_tokens(g, attention_mask) if chunk else None  # (B,)
    return op.Or(masked_positions(g, t_q, t_k, start, window=window, chunk=chunk, first=first),
                 pad)  # (B, 1, t_q, t_k)
