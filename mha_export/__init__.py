"""mha-export: causal multi-head attention -> TorchScript / ONNX, with a parity check that can fail.

    config -> model -> export (signature, forms, onnx_model) -> runners -> sweep/compare
    -> parity (check_parity) -> report

Names are imported lazily, so that `mha_export.model` alone does not pull in ONNX Runtime (the
benchmark measures each variant's memory in its own process).
"""
from importlib import import_module

_EXPORTS = {
    "MHAConfig": "config", "UsageError": "errors",
    "build_module": "model", "convert": "model", "AttentionWeights": "model",
    "load_module": "weights",
    "export_onnx": "export", "export_torchscript": "export", "ExportResult": "export",
    "check_parity": "parity", "CheckReport": "parity",
    "make_signature": "signature", "Signature": "signature", "FORMS": "forms",
    "compare": "comparator", "Comparison": "comparator", "Tolerance": "comparator",
}
# Old names accepted until 0.3: mha_export.check is now check_parity.
_RENAMED = {"check": ("parity", "check_parity")}
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
