"""Runners that call a torch module: the eager layer (the float32 baseline and the float64
reference) and a TorchScript file."""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from ..layer.entry import entry_module
from ..layer.layouts import AttentionBase
from ..signature import Signature
from .runner import Feeds, Runner, require_in_place


class TorchRunner(Runner):
    """A torch module called positionally in the signature's input order."""

    def __init__(self, signature: Signature, module: torch.nn.Module, dtype: torch.dtype):
        super().__init__(signature)
        self.module, self.dtype = module, dtype

    def run(self, feeds: Feeds) -> Feeds:
        """Inputs are copied (a static-cache call writes its buffers in place); a static-cache
        call's present_* must be the very tensors passed as past_* (written in place)."""
        args = [torch.from_numpy(feeds[t.name].copy()) for t in self.signature.inputs]
        args = [a.to(self.dtype) if a.is_floating_point() else a for a in args]
        with torch.inference_mode():
            out = self.module(*args)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)  # (list: an own cache's)
        require_in_place(self.signature, args, list(out))
        return {name: o.numpy() for name, o in zip(self.signature.output_names, out)}


class EagerRunner(TorchRunner):
    """The eager PyTorch module, in float32 (the parity baseline) or float64 (the reference)."""

    def __init__(self, signature: Signature, module: AttentionBase,
                 dtype: torch.dtype = torch.float32):
        self.name = "eager-fp64" if dtype == torch.float64 else "eager-fp32"
        self.device = "cpu (torch)"
        self.precision = "fp64" if dtype == torch.float64 else "fp32"
        self.source = copy.deepcopy(module).to(dtype).eval()
        entry = entry_module(self.source, signature.kind, signature.input_names,
                             signature.output_names)
        super().__init__(signature, entry, dtype)


class TorchScriptRunner(TorchRunner):
    """model.pt through torch.jit.load, on the CPU."""

    def __init__(self, signature: Signature, path: str | Path):
        self.name = "torchscript"
        self.device = "cpu (torch.jit)"
        super().__init__(signature, torch.jit.load(str(path), map_location="cpu").eval(),
                         torch.float32)
