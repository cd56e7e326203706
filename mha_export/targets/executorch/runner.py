"""The ExecuTorch runner: model.pte loaded by ``executorch.runtime`` (the pip wheel's runtime,
the one an app links) and its forward called with the signature's inputs in order. Its row says
where the program's work ran: the delegated subgraphs by backend (XNNPACK) and the operators
left to ExecuTorch's own CPU kernels (the wheel's runtime links its optimized kernels, the
portable ones beneath), as the export recorded them.

The program states its own bounds (its inputs' largest shapes) and, with get_cache among its
methods, holds its static cache inside (export/executorch_cache.py): forward moves no cache. The
runner writes the call's past_key/past_value into the program (set_cache) only when they are
not what it read back after its previous call, so a prefill and its steps run on the program's
own buffers; present_* are the buffers read back (get_cache), cut to the call's rows and
capacity."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ...signature import Signature
from ...comparison.runner import Feeds, Runner

CACHE_INPUTS = ("past_key", "past_value")


class ExecuTorchRunner(Runner):
    def __init__(self, signature: Signature, path: str | Path, threads: Optional[int] = None):
        super().__init__(signature)
        from executorch.runtime import Runtime
        self.name = "executorch-cpu"
        export = _recorded(Path(path).parent)
        llm = uses_llm_kernels(Path(path))
        if llm:  # registered into the runtime before the program loads
            from .install import load_llm_kernels
            load_llm_kernels()
        if threads:  # XNNPACK's and the kernels' pool (the process's: one program at a time)
            from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
            _unsafe_reset_threadpool(threads)
        program = Runtime.get().load_program(str(path))
        self.method = program.load_method("forward")
        x = self.method.metadata.input_tensor_meta(0).sizes()  # (B, T, d) at their bounds
        self.bounds = {"batch": x[0], "seq": x[1]}
        self.rows = export.get("bounds", {}).get("rows")  # a static batch: exactly these
        self.cache = CacheInside(program) if "get_cache" in program.method_names else None
        inside = "; the cache inside the program (steps move none)" if self.cache else ""
        if self.rows:
            inside += (f"; {self.rows} static row{'s' if self.rows != 1 else ''}, "
                       f"{'ExecuTorch LLM kernels' if llm else 'ATen ops'}")
        # a lossy step's kernels computing in other arithmetic (int8 activations): its tolerance
        self.tolerance_dtype = next((v["arithmetic"] for v in export.values()
                                     if isinstance(v, dict) and "arithmetic" in v), None)
        arithmetic = f"; {self.tolerance_dtype}" if self.tolerance_dtype else ""
        self.device = f"cpu (ExecuTorch: {_placement(export)}{inside}{arithmetic})"
        self.forward_inputs = [n for n in signature.input_names
                               if not (self.cache and n in CACHE_INPUTS)]

    def prepare(self, feeds: Feeds) -> list[torch.Tensor]:
        if self.cache:
            self.cache.load(feeds)
        return [torch.from_numpy(feeds[n].copy()) for n in self.forward_inputs]

    def run_prepared(self, args: list[torch.Tensor]) -> list:
        batch, seq = args[0].shape[0], args[0].shape[1]
        if batch > self.bounds.get("batch", batch) or seq > self.bounds.get("seq", seq):
            raise RuntimeError(f"the program's bounds are batch <= {self.bounds['batch']}, "
                               f"seq <= {self.bounds['seq']}; got batch {batch}, seq {seq}")
        if self.rows and batch != self.rows:
            raise RuntimeError(f"the program runs exactly {self.rows} rows a call (a static "
                               f"batch); got batch {batch}")
        return list(self.method.execute(args))

    def bind_cache(self, buffers: Feeds) -> Optional[Callable[[Feeds], np.ndarray]]:
        """An app's steps: the program's cache set once from ``buffers``, then each call
        forward alone (the buffers given are not written: the program holds the cache)."""
        if not self.cache:
            return None
        self.cache.set(buffers)
        return lambda feeds: self.run_prepared(
            [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.forward_inputs]
        )[0].numpy()

    def run(self, feeds: Feeds) -> Feeds:
        out = self.run_prepared(self.prepare(feeds))
        if self.cache:
            return {"y": out[0].numpy(), **self.cache.read(feeds)}
        return {n: o.numpy() for n, o in zip(self.signature.output_names, out)}


class CacheInside:
    """The program's own key/value buffers (M, K, C, H), reached by its cache methods."""

    def __init__(self, program: Any):
        self.write = program.load_method("set_cache")
        self.read_back = program.load_method("get_cache")
        self.capacity = self.read_back.metadata.output_tensor_meta(0).sizes()[2]
        self.last: Optional[Feeds] = None  # what read() returned after the previous call

    def load(self, feeds: Feeds) -> None:
        """The call's buffers into the program, unless they are what it holds already."""
        if self.last is not None and all(feeds[n] is self.last[n] for n in CACHE_INPUTS):
            return
        if np.any(feeds["past_lengths"] + feeds["x"].shape[1] > self.capacity):
            raise RuntimeError(f"the program's cache holds {self.capacity} entries per row; "
                               "this call writes past them")
        self.set(feeds)

    def set(self, buffers: Feeds) -> None:
        """past_key / past_value (B, K, C', H) into rows [0, B) of the program's buffers."""
        self.write.execute([torch.from_numpy(_fitted(buffers[n], self.capacity))
                            for n in CACHE_INPUTS])  # (B, K, C', H) -> (B, K, C, H)
        self.last = None

    def read(self, feeds: Feeds) -> Feeds:
        """present_*: the buffers read back, cut to the call's rows and its buffers' length
        (entries past the program's capacity: the call's, never written)."""
        b, c = feeds["x"].shape[0], feeds["past_key"].shape[2]
        key, value = (t.numpy() for t in self.read_back.execute([]))
        self.last = {"past_key": _fitted(key[:b], c, feeds["past_key"]),
                     "past_value": _fitted(value[:b], c, feeds["past_value"])}
        return {"present_key": self.last["past_key"], "present_value": self.last["past_value"]}


def _fitted(buffer: np.ndarray, length: int, beyond: Optional[np.ndarray] = None
            ) -> np.ndarray:
    """``buffer`` (B, K, C, H) cut or extended to ``length`` entries (extended with
    ``beyond``'s, or zeros)."""
    if buffer.shape[2] >= length:
        return np.ascontiguousarray(buffer[:, :, :length])
    extra = (beyond[:, :, buffer.shape[2]:length] if beyond is not None
             else np.zeros(buffer.shape[:2] + (length - buffer.shape[2],) + buffer.shape[3:],
                           buffer.dtype))
    return np.concatenate([buffer, extra], axis=2)


def uses_llm_kernels(path: Path) -> bool:
    """Whether the program calls ExecuTorch's LLM kernels (--kernels llm): it names their
    llama:: operators (a program says which operators it needs, by name)."""
    with path.open("rb") as f:
        return any(b"llama::custom_sdpa" in chunk for chunk in iter(lambda: f.read(1 << 24), b""))


def _recorded(folder: Path) -> dict:
    """The artifact's export record (config.json): where the work was placed."""
    try:
        return json.loads((folder / "config.json").read_text()).get("export", {})
    except (OSError, ValueError):
        return {}


def _placement(export: dict) -> str:
    placed = export.get("placement", {})
    parts = [f"{backend} ({n} delegated subgraph{'s' if n != 1 else ''})"
             for backend, n in placed.get("delegated", {}).items()]
    portable = placed.get("portable", {})
    if portable:
        parts.append("not delegated (ExecuTorch's CPU kernels): "
                     + ", ".join(f"{op} x{n}" for op, n in portable.items()))
    return "; ".join(parts) or "placement not recorded"
