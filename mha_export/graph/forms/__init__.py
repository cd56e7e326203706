"""The graph forms of standard multi-head / grouped-query attention (see ``base.GraphForm``);
kinds/registry.py collects them with every other attention kind's into the one registry that
the exporter, the CLI choices, the checker's sweep and the docs' generated table read.

Adding a form: one new module here that defines its core and its ``GraphForm``, plus one entry
in ``STANDARD_FORMS`` below (the default, ``auto``, first).
"""
from __future__ import annotations

from ...errors import UsageError
from . import attention_op, auto, blocked, contrib, contrib_packed, decomposed
from .base import (ALL_FEATURES, AttentionIO, AttentionOut, Feature, GraphForm, Memory,
                   required_features)

STANDARD_FORMS = (auto.FORM, decomposed.FORM, attention_op.FORM, blocked.BLOCKED,
                  blocked.BLOCKED_PLAIN, contrib.CONTRIB_MHA, contrib.CONTRIB_GQA,
                  contrib_packed.CONTRIB_GQA_PACKED)
DEFAULT = auto.FORM.name
# Highest opset ONNX Runtime 1.31 loads (27+ is refused).
MAX_OPSET = 26

__all__ = ["STANDARD_FORMS", "DEFAULT", "MAX_OPSET", "ALL_FEATURES", "Feature", "Memory",
           "AttentionIO", "AttentionOut", "GraphForm", "resolve_opset", "required_features"]


def resolve_opset(form: GraphForm, opset: int | None) -> int:
    """The exact opset to write: the form's lowest by default; one it cannot be written in is an
    error, never substituted."""
    if opset is None:
        return form.min_opset
    if not form.min_opset <= opset <= MAX_OPSET:
        raise UsageError(f"opset {opset} cannot be produced for attention form {form.name!r} "
                         f"(supported: {form.min_opset}-{MAX_OPSET})")
    return opset
