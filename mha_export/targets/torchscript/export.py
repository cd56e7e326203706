"""The TorchScript target: model.pt, the signature's entry point compiled by torch.jit.script
(loads with torch.jit.load and libtorch's torch::jit::load; the declared input/output names
travel inside it as the attributes input_names / output_names)."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from ...config import MHAConfig
from ...layer.entry import entry_module
from ...layer.layouts import AttentionBase
from ...signature import Signature
from ..base import Prepared, require_no_lossy_steps
from . import MODEL_FILE, SUCCESSOR, SUCCESSOR_FORMAT



def prepare(module: AttentionBase, config: MHAConfig, sig: Signature,
            specs: Optional[dict] = None) -> Prepared:
    """``specs``: lossy steps (none: each step refuses this target when asked for)."""
    check(config, sig, specs)

    def write(path) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            entry = entry_module(module, sig.kind, sig.input_names, sig.output_names)
            torch.jit.script(entry).save(str(path))
        surface(caught)

    return Prepared({"file": MODEL_FILE, "method": "torch.jit.script",
                     "deprecation": DEPRECATION}, write)


def check(config: MHAConfig, sig: Signature, specs: Optional[dict] = None) -> None:
    require_no_lossy_steps(specs, MODEL_FILE)


DEPRECATION = (f"torch 2.13 deprecates torch.jit.script and torch.jit.load; {SUCCESSOR} "
               f"({SUCCESSOR_FORMAT}) writes the successor")


def surface(caught: list) -> None:
    """torch.jit.script warns once per scripted function: each distinct warning is passed on
    once (never hidden), deprecations with where to go instead."""
    for category, message in dict.fromkeys((w.category, str(w.message)) for w in caught):
        if issubclass(category, DeprecationWarning) and "torch.jit" in message:
            message += f" ({SUCCESSOR.strip('`')} writes its successor: {SUCCESSOR_FORMAT})"
        warnings.warn(message, category, stacklevel=3)
