"""Graph code that reads like the math: ``op = Ops(g)``, then ``op.MatMul(q, k_t)`` adds a MatMul
node to the builder g and returns its output's name.

    op.Softmax(scores, axis=-1)                     attributes as keywords
    q_nope, q_rot = op.Split(q, sizes, axis=3, n_out=2)      several outputs: a list of names
    op.GroupQueryAttention(q, k, v, domain=CONTRIB, num_heads=4)     an operator of a domain
    op.ScatterND(buffer, index, k, name="key_write")    a node name that tests or tools look up

Nodes are named after their op type (``matmul``, ``matmul_1``, ...: unique through the builder's
``name``, so a subgraph builder's prefix still applies). ``op.named("q_norm")`` adds to the same
builder with every node named ``q_norm_<name>`` (``q_norm_mul``; ``q_norm_square`` for
name="square"): each call of a helper keeps its nodes recognisable. Initializers stay the
builder's (``g.const``, ``g.ints``): their names are the model's interface.

Shape legend of the comments beside graph code: B = batch, T = this call's length, P = past
length, S = P + T keys, C = a static cache's capacity, N = query heads, K = key/value heads,
H = head size, D = N * H.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol


class Builder(Protocol):
    """What Ops needs of a builder: graph/builder.py's GraphBuilder.op (named here, not
    imported: builder.py's own helpers use Ops)."""

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None,
           domain: str = "", **attrs: Any) -> str | list[str]: ...


class Ops:
    """``op.<OpType>(*inputs, n_out=1, name=None, domain="", **attributes)``: one node of
    ``g``; returns its output's name (a list of ``n_out`` names when n_out > 1)."""

    def __init__(self, g: Builder, stem: str = "") -> None:
        self.g = g
        self.stem = stem

    def named(self, stem: str) -> Ops:
        """The same builder; every node named ``<stem>_<name>`` (a default name or given)."""
        return Ops(self.g, f"{self.stem}_{stem}" if self.stem else stem)

    def __getattr__(self, op_type: str) -> Callable[..., str | list[str]]:
        if not op_type[:1].isupper():  # op types only: a typo of g or stem stays an error
            raise AttributeError(op_type)

        def node(*inputs: str, n_out: int = 1, name: str | None = None, domain: str = "",
                 **attrs: Any) -> str | list[str]:
            base = name or op_type.lower()
            return self.g.op(op_type, list(inputs), n_out=n_out, domain=domain,
                             name=f"{self.stem}_{base}" if self.stem else base, **attrs)

        node.__name__ = op_type
        return node
