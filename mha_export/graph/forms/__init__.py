"""The registry of ONNX graph forms: one record per form (see ``base.GraphForm``).

Adding a form: one new module here that defines its core and its ``GraphForm``, plus one entry
in ``_FORMS`` below. Nothing else changes: the exporter, the CLI choices, the checker's sweep
(switch lengths), the opset checks and the docs' generated table all read this registry.
"""
from __future__ import annotations

from ...config import MHAConfig
from ...errors import UsageError
from ...signature import Signature, make_signature
from . import attention_op, auto, blocked, contrib, decomposed, latent
from .base import (ALL_FEATURES, AttentionIO, AttentionOut, Feature, GraphForm, Memory,
                   required_features)

_FORMS = (auto.FORM, decomposed.FORM, attention_op.FORM, blocked.BLOCKED, blocked.BLOCKED_PLAIN,
          contrib.CONTRIB_MHA, contrib.CONTRIB_GQA, latent.LATENT_AUTO, latent.LATENT_ABSORBED,
          latent.LATENT_EXPANDED)
FORMS: dict[str, GraphForm] = {f.name: f for f in _FORMS}
# Renamed in 0.2, refused since 0.3 with the new name in the error.
RENAMED = {"fused": "attention-op"}
DEFAULT = "auto"
LATENT_DEFAULT = latent.LATENT_AUTO.name  # Multi-head Latent Attention's
# Highest opset ONNX Runtime 1.31 loads (27+ is refused).
MAX_OPSET = 26

__all__ = ["FORMS", "DEFAULT", "MAX_OPSET", "ALL_FEATURES", "Feature", "Memory", "AttentionIO",
           "AttentionOut", "GraphForm", "get_form", "resolve_opset", "required_features",
           "opset_summary", "default_form", "forms_for"]


def forms_for(config: MHAConfig, sig: Signature | None = None) -> list[str]:
    """The names of the forms that can build this config (and signature: default full)."""
    sig = sig or make_signature(config)
    return [name for name, form in FORMS.items() if not form.problem(config, sig)]


def get_form(name: str) -> GraphForm:
    if name in RENAMED:
        raise UsageError(f"attention form {name!r} is called {RENAMED[name]!r} since 0.2")
    if name not in FORMS:
        raise UsageError(f"unknown attention form {name!r}: choose one of {', '.join(FORMS)}")
    return FORMS[name]


def resolve_opset(form: GraphForm, opset: int | None) -> int:
    """The exact opset to write: the form's lowest by default; one it cannot be written in is an
    error, never substituted."""
    if opset is None:
        return form.min_opset
    if not form.min_opset <= opset <= MAX_OPSET:
        raise UsageError(f"opset {opset} cannot be produced for attention form {form.name!r} "
                         f"(supported: {form.min_opset}-{MAX_OPSET})")
    return opset


def opset_summary() -> str:
    """Each form's lowest opset: '17 for decomposed, blocked-plain, ...; 23 for auto, ...'."""
    by_opset: dict[int, list[str]] = {}
    for form in FORMS.values():
        by_opset.setdefault(form.min_opset, []).append(form.name)
    return "; ".join(f"{opset} for {', '.join(names)}" for opset, names in sorted(by_opset.items()))


def default_form(config: MHAConfig, sig: Signature) -> GraphForm:
    """``auto`` (``latent`` for Multi-head Latent Attention); where it cannot build the layer
    (sinks) the first memory-linear form that can, then any that can (build_model then names
    the forms that can when none does)."""
    candidates = [FORMS[DEFAULT], FORMS[LATENT_DEFAULT]] + sorted(FORMS.values(),
                                           key=lambda f: f.memory.linear_from != 0)
    return next((f for f in candidates if not f.problem(config, sig)), FORMS[DEFAULT])
