"""mha-export: causal multi-head attention -> TorchScript / ONNX, with a parity check that can fail.

    config -> layer/ (eager module) <- weights/ (files, checkpoints)
           -> graph/ (ONNX forms) -> export/ (artifact folder) -> check/ (runners, sweep,
           compare, report) ; bench/ measures ; cli/ is a thin click layer

Names are imported lazily, so that `mha_export.layer` alone does not pull in ONNX Runtime (the
benchmark measures each variant's memory in its own process).
"""
from importlib import import_module

_EXPORTS = {
    "MHAConfig": "config", "UsageError": "errors",
    "build_module": "layer.layouts", "convert": "layer.layouts",
    "AttentionWeights": "layer.layouts", "load_module": "weights.files",
    "export_onnx": "export.pipeline", "export_torchscript": "export.pipeline",
    "ExportResult": "export.pipeline",
    "check_parity": "check.parity", "CheckReport": "check.parity",
    "make_signature": "signature", "Signature": "signature", "FORMS": "graph.forms",
    "compare": "check.comparator", "Comparison": "check.comparator",
    "Tolerance": "check.comparator",
}
# Old names accepted until 0.3: mha_export.check is now check_parity.
_RENAMED = {"check": ("check.parity", "check_parity")}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _RENAMED:
        module, new = _RENAMED[name]
        import warnings
        warnings.warn(f"mha_export.{name} is now mha_export.{new}", DeprecationWarning, 2)
        return getattr(import_module(f".{module}", __name__), new)
    raise AttributeError(f"module 'mha_export' has no attribute {name!r}")
