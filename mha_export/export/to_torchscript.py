"""The TorchScript target: model.pt, the signature's entry point compiled by torch.jit.script
(loads with torch.jit.load and libtorch's torch::jit::load; the declared input/output names
travel inside it as the attributes input_names / output_names)."""
from __future__ import annotations

import warnings

import torch

from ..config import MHAConfig
from ..layer.entry import entry_module
from ..layer.layouts import AttentionBase
from ..signature import Signature
from .base import Prepared

MODEL_FILE = "model.pt"


def prepare(module: AttentionBase, config: MHAConfig, sig: Signature) -> Prepared:

    def write(path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            entry = entry_module(module, sig.kind, sig.input_names, sig.output_names)
            torch.jit.script(entry).save(str(path))

    return Prepared({"file": MODEL_FILE, "method": "torch.jit.script"}, write)
