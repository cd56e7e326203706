"""The registry of attention kinds, and what is asked of a config's kind through it: its eager
module, its forms (every kind's, one registry of graph forms), its refusals.

Adding a kind: a package here (its settings as a config section in config.SECTIONS, its eager
layer, graph layer and forms, and a ``kind.py`` record) plus one entry in ``_KINDS`` below.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import MHAConfig
from ..errors import UsageError
from ..graph.forms import DEFAULT, GraphForm
from ..signature import Signature, make_signature
from . import standard
from .base import AttentionKind
from .dsv4 import kind as dsv4
from .kv_shared import kind as kv_shared
from .mla import kind as mla
from .qsa import kind as qsa

_KINDS = (standard.KIND, mla.KIND, kv_shared.KIND, qsa.KIND, dsv4.KIND)
KINDS: dict[str, AttentionKind] = {k.name: k for k in _KINDS}
FORMS: dict[str, GraphForm] = {f.name: f for k in _KINDS for f in k.forms}
# layout -> the tensor name that identifies it in a weights file (the first that matches wins)
ANCHORS: dict[str, str] = {layout: a for k in reversed(_KINDS) for layout, a in k.anchors.items()}
# Renamed in 0.2, refused since 0.3 with the new name in the error.
RENAMED = {"fused": "attention-op"}


def kind_of(config: MHAConfig) -> AttentionKind:
    return KINDS[config.kind]


def build_module(config: MHAConfig, seed: Optional[int] = None) -> nn.Module:
    """A module of config's kind and layout in eval mode; with a seed, deterministic random
    weights (norm weights and biases, sinks too: their initial values — ones, zeros — would
    hide bugs)."""
    layout_class = kind_of(config).layouts[config.layout]
    if seed is None:
        return layout_class(config).eval()
    torch.manual_seed(seed)
    module = layout_class(config).eval()
    with torch.no_grad():
        for name, t in module.named_parameters():
            if name.endswith(("norm.weight", "norm.bias")) or name == "sinks":
                t.normal_(mean=float(t.mean()), std=0.5)
    return module


def convert(module: nn.Module, layout: str) -> nn.Module:
    """The same function in another weight layout of its kind (where shapes allow)."""
    kind = kind_of(module.config)
    if layout not in kind.layouts:
        raise UsageError(f"layout {module.config.layout!r} ({kind.summary}) cannot be converted "
                         f"to {layout!r}: its kind's layouts are {', '.join(kind.layouts)}")
    target = build_module(module.config.replace(layout=layout))
    target.load_weights(module.to_weights())
    return target.train(module.training)


def get_form(name: str) -> GraphForm:
    if name in RENAMED:
        raise UsageError(f"attention form {name!r} is called {RENAMED[name]!r} since 0.2")
    if name not in FORMS:
        raise UsageError(f"unknown attention form {name!r}: choose one of {', '.join(FORMS)}")
    return FORMS[name]


def forms_for(config: MHAConfig, sig: Signature | None = None) -> list[str]:
    """The names of the forms that can build this config (and signature: default full)."""
    sig = sig or make_signature(config)
    return [name for name, form in FORMS.items() if not form.problem(config, sig)]


def default_form(config: MHAConfig, sig: Signature) -> GraphForm:
    """The kind's first form (``auto``; ``latent`` for Multi-head Latent Attention); where it
    cannot build the layer (sinks) the kind's first memory-linear form that can, then any that
    can (build_model then names the forms that can when none does)."""
    own = kind_of(config).forms
    candidates = [own[0]] + sorted(own, key=lambda f: f.memory.linear_from != 0)
    return next((f for f in candidates if not f.problem(config, sig)), FORMS[DEFAULT])


def opset_summary() -> str:
    """Each form's lowest opset: '17 for decomposed, blocked-plain, ...; 23 for auto, ...'."""
    by_opset: dict[int, list[str]] = {}
    for form in FORMS.values():
        by_opset.setdefault(form.min_opset, []).append(form.name)
    return "; ".join(f"{opset} for {', '.join(names)}" for opset, names in sorted(by_opset.items()))


def refuse_unbuilt(config: MHAConfig, *steps: str) -> None:
    """The lossy steps asked for that the config's kind does not build: a one-line refusal."""
    for step in steps:
        kind_of(config).refuse(step)
