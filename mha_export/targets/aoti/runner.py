"""The AOTInductor runner: model.pt2 loaded with ``torch._inductor.aoti_load_package`` and called
with the signature's inputs in order, on the device it was compiled for."""
from __future__ import annotations

from pathlib import Path

import torch

from ...signature import Signature
from ...comparison.runner import Feeds, Runner, RunnerUnavailable, require_in_place


class AotiRunner(Runner):
    def __init__(self, signature: Signature, path: str | Path, device: str = "cpu"):
        super().__init__(signature)
        if device == "cuda" and not torch.cuda.is_available():
            raise RunnerUnavailable("no CUDA device visible to torch")
        self.name, self.device_name = f"aoti-{device}", device
        self.device = f"{device} (AOTInductor, torch {torch.__version__})"
        self.package = torch._inductor.aoti_load_package(str(path))
        shapes = self.package.get_metadata().get("mha_export.input_shapes")
        if shapes is None:
            raise ValueError("not an mha-export AOTInductor package (its metadata holds no "
                             "mha_export.input_shapes)")
        self.shapes = [s.split(",") if s else [] for s in shapes.split(";")]

    def prepare(self, feeds: Feeds) -> list[torch.Tensor]:
        """The inputs as tensors on the package's device, made once (the bench times
        run_prepared)."""
        return [torch.from_numpy(feeds[n].copy()).to(self.device_name)
                for n in self.signature.input_names]

    def run_prepared(self, args: list[torch.Tensor]):
        for name, arg, dims in zip(self.signature.input_names, args, self.shapes):
            if len(dims) != arg.dim() or any(d != "?" and int(d) != n
                                             for d, n in zip(dims, arg.shape)):
                raise RuntimeError(f"the package was compiled for {name} [{', '.join(dims)}] "
                                   f"('?' dynamic), got {list(arg.shape)}")
        with torch.inference_mode():
            out = self.package(*args)
        return out if isinstance(out, (tuple, list)) else (out,)

    def run(self, feeds: Feeds) -> Feeds:
        """A static-cache call's present_* must come back as the past_* buffers it was given."""
        args = self.prepare(feeds)
        out = self.run_prepared(args)
        require_in_place(self.signature, args, list(out))
        return {n: o.cpu().numpy() for n, o in zip(self.signature.output_names, out)}
