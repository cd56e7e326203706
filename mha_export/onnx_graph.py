"""Build the ONNX graph of causal MHA directly from layout-neutral weights.

Every graph form shares the projections:

    x (B, T, d_in) -> MatMul qkv.weight (+ qkv.bias) -> (B, T, 3*inner) -> Split -> q, k, v
    ... attention core (one per form) ... -> ctx (B, T, inner) -> MatMul out.weight (+ out.bias) -> y

and differs only in the attention core:

- ``decomposed``: standard ops (MatMul, Where, Softmax), opset 17+. The causal mask is built from
  the runtime length with Range/Greater: nothing of size max_seq_len is stored.
- ``fused``: one standard ``Attention`` node (opset 23+, ``is_causal=1``), 3-D q/k/v.

The input ``x`` and output ``y`` have symbolic dims ``batch`` and ``seq``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from .config import MHAConfig
from .errors import UsageError
from .model import AttentionWeights

INPUT, OUTPUT = "x", "y"
DYNAMIC_AXES = {INPUT: {0: "batch", 1: "seq"}, OUTPUT: {0: "batch", 1: "seq"}}
# Highest opset ONNX Runtime 1.31 loads (27+ is refused); lowest each form can be written in.
MAX_OPSET = 26
CONTRIB = "com.microsoft"
ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; names are unique and readable."""

    dtype: str = "float32"
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    _count: dict = field(default_factory=dict)

    def name(self, base: str) -> str:
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def const(self, name: str, value: np.ndarray | torch.Tensor, float_dtype: bool = True) -> str:
        if isinstance(value, torch.Tensor):
            value = value.detach().to(torch.float64).numpy()
        arr = np.asarray(value)
        if float_dtype:
            arr = arr.astype(np.float16 if self.dtype == "float16" else np.float32)
        name = self.name(name)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, name: str, values: list[int] | int) -> str:
        return self.const(name, np.array(values, dtype=np.int64), float_dtype=False)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None,
           domain: str = "", **attrs) -> str | list[str]:
        base = self.name(name or op_type.lower())
        outs = [base] if n_out == 1 else [f"{base}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def linear(self, x: str, name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> str:
        """x @ weight.T + bias (nn.Linear semantics)."""
        y = self.op("MatMul", [x, self.const(f"{name}.weight", weight.t())], name=f"{name}_matmul")
        if bias is not None:
            y = self.op("Add", [y, self.const(f"{name}.bias", bias)], name=f"{name}_add")
        return y


def finite_lowest(dtype: str) -> float:
    """Mask fill that stays finite in the dtype (no -inf, so no NaN from -inf - -inf)."""
    return float(np.finfo(np.float16 if dtype == "float16" else np.float32).min)


# --- attention cores: (B, T, 3*inner) q|k|v -> (B, T, inner) ---------------------------------

def decomposed_core(g: GraphBuilder, q: str, k: str, v: str, c: MHAConfig) -> str:
    heads4 = g.ints("heads_shape", [0, 0, c.heads, c.head_dim])
    q = g.op("Reshape", [q, heads4], name="q_heads")  # (B, T, nh, hs)
    k = g.op("Reshape", [k, heads4], name="k_heads")
    v = g.op("Reshape", [v, heads4], name="v_heads")
    q = g.op("Transpose", [q], perm=[0, 2, 1, 3], name="q_bhtd")  # (B, nh, T, hs)
    k = g.op("Transpose", [k], perm=[0, 2, 3, 1], name="k_bhdt")  # (B, nh, hs, T)
    v = g.op("Transpose", [v], perm=[0, 2, 1, 3], name="v_bhtd")  # (B, nh, T, hs)
    q = g.op("Mul", [q, g.const("attn.scale", np.array(1.0 / math.sqrt(c.head_dim)))],
             name="q_scaled")  # scale the queries, not the (T, T) scores
    scores = g.op("MatMul", [q, k], name="scores")  # (B, nh, T, T)
    if c.causal:
        scores = g.op("Where", [causal_mask(g, q), g.const("mask_fill", np.array(
            finite_lowest(g.dtype))), scores], name="masked_scores")
    probs = g.op("Softmax", [scores], axis=-1, name="probs")
    ctx = g.op("MatMul", [probs, v], name="context")  # (B, nh, T, hs)
    ctx = g.op("Transpose", [ctx], perm=[0, 2, 1, 3], name="context_bthd")  # (B, T, nh, hs)
    return g.op("Reshape", [ctx, g.ints("merged_shape", [0, 0, c.inner])],
                name="context_merged")  # (B, T, inner)


def causal_mask(g: GraphBuilder, q: str) -> str:
    """(T, T) bool, True above the diagonal (masked), from the runtime length of q (B, nh, T, hs)."""
    t = g.op("Shape", [q], start=2, end=3, name="seq_len")  # (1,)
    t = g.op("Squeeze", [t, g.ints("axis0", [0])], name="seq_len_scalar")  # ()
    pos = g.op("Range", [g.ints("zero", 0), t, g.ints("one", 1)], name="positions")  # (T,)
    rows = g.op("Unsqueeze", [pos, g.ints("axis1", [1])], name="query_pos")  # (T, 1)
    cols = g.op("Unsqueeze", [pos, g.ints("axis0_", [0])], name="key_pos")  # (1, T)
    return g.op("Greater", [cols, rows], name="causal_mask")  # (T, T)


def fused_core(g: GraphBuilder, q: str, k: str, v: str, c: MHAConfig) -> str:
    """One standard Attention node (opset 23) on 3-D inputs (B, T, nh*hs)."""
    return g.op("Attention", [q, k, v], name="attention", is_causal=int(c.causal),
                q_num_heads=c.heads, kv_num_heads=c.heads, scale=1.0 / math.sqrt(c.head_dim))


def contrib_mha_core(g: GraphBuilder, q: str, k: str, v: str, c: MHAConfig) -> str:
    """ONNX Runtime's com.microsoft.MultiHeadAttention (unidirectional = causal), 3-D inputs."""
    return g.op("MultiHeadAttention", [q, k, v], name="attention", domain=CONTRIB,
                num_heads=c.heads, unidirectional=int(c.causal), scale=1.0 / math.sqrt(c.head_dim))


def contrib_gqa_core(g: GraphBuilder, q: str, k: str, v: str, c: MHAConfig) -> str:
    """ONNX Runtime's com.microsoft.GroupQueryAttention (always causal) with kv heads = heads;
    its seqlens_k (B,) = T-1 and total_sequence_length = T come from the runtime shape."""
    t = g.op("Cast", [g.op("Shape", [q], start=1, end=2, name="seq_len")], to=TensorProto.INT32,
             name="seq_len_i32")  # (1,)
    total = g.op("Squeeze", [t, g.ints("axis0", [0])], name="total_len")  # ()
    last = g.op("Sub", [t, g.const("one_i32", np.array([1], np.int32), float_dtype=False)],
                name="last_pos")  # (1,)
    seqlens = g.op("Expand", [last, g.op("Shape", [q], start=0, end=1, name="batch")],
                   name="seqlens_k")  # (B,)
    return g.op("GroupQueryAttention", [q, k, v, "", "", seqlens, total], name="attention",
                domain=CONTRIB, num_heads=c.heads, kv_num_heads=c.heads,
                scale=1.0 / math.sqrt(c.head_dim))


CONTRIB_FORMS = ("contrib-mha", "contrib-gqa")  # ONNX Runtime only (not standard ONNX)


# --- the registry of graph forms -------------------------------------------------------------
# The blocked cores live in their own module, which builds on GraphBuilder and fused_core above.
from .onnx_blocked import AUTO_THRESHOLD, BLOCK, auto_core, blocked_core  # noqa: E402

Core = Callable[[GraphBuilder, str, str, str, MHAConfig], str]
CORES: dict[str, Core] = {
    "auto": auto_core,  # If on T: fused node below AUTO_THRESHOLD, blocked loop above
    "decomposed": decomposed_core,
    "fused": fused_core,
    "blocked": blocked_core,  # Attention node per query block (opset 23)
    "blocked-plain": functools.partial(blocked_core, use_attention_op=False),  # opset 17
    "contrib-mha": contrib_mha_core,
    "contrib-gqa": contrib_gqa_core,
}
MIN_OPSET = {"auto": 23, "decomposed": 17, "fused": 23, "blocked": 23, "blocked-plain": 17,
             "contrib-mha": 17, "contrib-gqa": 17}
# Lengths where a form switches code path: the parity sweep covers both sides of each.
_BLOCK_EDGES = [BLOCK, BLOCK + 1, 2 * BLOCK + 1]
SWITCH_SEQ_LENS = {"auto": [AUTO_THRESHOLD - 1, AUTO_THRESHOLD] + [AUTO_THRESHOLD + e for e in _BLOCK_EDGES],
                   "blocked": _BLOCK_EDGES, "blocked-plain": _BLOCK_EDGES}


def build_model(config: MHAConfig, w: AttentionWeights, form: str, opset: int,
                dtype: str = "float32", metadata: dict[str, str] | None = None) -> onnx.ModelProto:
    g = GraphBuilder(dtype=dtype)
    c = config
    if form == "contrib-gqa" and not c.causal:
        raise UsageError("attention form 'contrib-gqa' is always causal: use another form")
    if form == "contrib-gqa" and c.head_dim % 8:
        raise UsageError(f"attention form 'contrib-gqa' needs head_dim % 8 == 0 (ONNX Runtime's "
                         f"kernel), got {c.head_dim}")
    qkv = g.linear(INPUT, "qkv", torch.cat([w.wq, w.wk, w.wv]),
                   None if w.bq is None else torch.cat([w.bq, w.bk, w.bv]))  # (B, T, 3*inner)
    q, k, v = g.op("Split", [qkv, g.ints("qkv_split", [c.inner] * 3)], n_out=3, axis=2,
                   name="qkv_split")  # 3 x (B, T, inner)
    ctx = CORES[form](g, q, k, v, c)  # (B, T, inner)
    y = ctx if w.wo is None else g.linear(ctx, "out", w.wo, w.bo)
    g.nodes.append(helper.make_node("Identity", [y], [OUTPUT], name="output"))

    elem = ONNX_DTYPES[dtype]
    graph = helper.make_graph(
        g.nodes, f"mha_{form}",
        [helper.make_tensor_value_info(INPUT, elem, ["batch", "seq", c.d_in])],
        [helper.make_tensor_value_info(OUTPUT, elem, ["batch", "seq", c.dim])],
        initializer=g.initializers)
    opsets = [helper.make_opsetid("", opset)]
    ir_version = helper.find_min_ir_version_for(opsets)
    if form in CONTRIB_FORMS:
        opsets.append(helper.make_opsetid(CONTRIB, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="mha-export",
                              ir_version=ir_version)
    helper.set_model_props(model, metadata or {})
    return model
