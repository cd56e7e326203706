"""The ExecuTorch runner: model.pte loaded by ``executorch.runtime`` (the pip wheel's runtime,
the one an app links) and called with the signature's inputs in order. Its row says where the
program's work ran: the delegated subgraphs by backend (XNNPACK) and the operators left to the
portable kernels, as the export recorded them."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...signature import Signature
from .base import Feeds, Runner


class ExecuTorchRunner(Runner):
    def __init__(self, signature: Signature, path: str | Path):
        super().__init__(signature)
        from executorch.runtime import Runtime
        self.name = "executorch-cpu"
        self.method = Runtime.get().load_program(str(path)).load_method("forward")
        self.bounds, where = _recorded(Path(path).parent)
        self.device = f"cpu (ExecuTorch: {where})"

    def prepare(self, feeds: Feeds) -> list[torch.Tensor]:
        return [torch.from_numpy(feeds[n].copy()) for n in self.signature.input_names]

    def run_prepared(self, args: list[torch.Tensor]) -> list:
        batch, seq = args[0].shape[0], args[0].shape[1]
        if batch > self.bounds.get("batch", batch) or seq > self.bounds.get("seq", seq):
            raise RuntimeError(f"the program's bounds are batch <= {self.bounds['batch']}, "
                               f"seq <= {self.bounds['seq']}; got batch {batch}, seq {seq}")
        return list(self.method.execute(args))

    def run(self, feeds: Feeds) -> Feeds:
        out = self.run_prepared(self.prepare(feeds))
        return {n: o.numpy() for n, o in zip(self.signature.output_names, out)}


def _recorded(folder: Path) -> tuple[dict, str]:
    """The program's bounds and placement from the artifact's config.json."""
    try:
        export = json.loads((folder / "config.json").read_text()).get("export", {})
    except (OSError, ValueError):
        export = {}
    placed = export.get("placement", {})
    parts = [f"{backend} ({n} delegated subgraph{'s' if n != 1 else ''})"
             for backend, n in placed.get("delegated", {}).items()]
    portable = placed.get("portable", {})
    if portable:
        parts.append("portable kernels: " + ", ".join(f"{op} x{n}" for op, n in portable.items()))
    return export.get("bounds", {}), "; ".join(parts) or "placement not recorded"
