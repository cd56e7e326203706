"""mha-export: causal multi-head attention -> TorchScript / ONNX, with a parity check that can fail.

    config -> layer/ (eager module) <- weights/ (files, checkpoints); kinds/ (what each kind
           of attention layer is to every stage: standard, Multi-head Latent Attention)
           -> graph/ (ONNX forms) -> export/ (artifact folder) -> check/ (runners, sweep,
           compare, report) ; bench/ measures ; cli/ is a thin click layer

Names are imported lazily, so that `mha_export.layer` alone does not pull in ONNX Runtime (the
benchmark measures each variant's memory in its own process).
"""
from importlib import import_module

# the package's version, written here only: pyproject.toml reads it (setuptools' dynamic
# version), and `mha-export --version`, every artifact's and report's `versions` say it
__version__ = "0.6.0"

_EXPORTS = {
    "MHAConfig": "config", "UsageError": "errors",
    "build_module": "kinds.registry", "convert": "kinds.registry",
    "AttentionWeights": "layer.layouts", "load_module": "weights.files",
    "export_to": "export.pipeline", "ExportResult": "export.pipeline",
    "check_parity": "check.parity", "CheckReport": "check.parity",
    "make_signature": "signature", "Signature": "signature", "FORMS": "kinds.registry",
    "compare": "comparison.comparator", "Comparison": "comparison.comparator",
    "Tolerance": "comparison.comparator",
}
# the export functions of 0.6, kept as thin aliases: export_onnx(...) = export_to("onnx", ...)
_ALIASES = {f"export_{target}": target for target in ("onnx", "torchscript", "aoti",
                                                      "executorch")}
__all__ = sorted([*_EXPORTS, *_ALIASES])


def _alias(target: str):
    def export_(config=None, output=None, **options):
        return __getattr__("export_to")(target, config, output, **options)
    export_.__name__ = export_.__qualname__ = f"export_{target}"
    export_.__doc__ = (f"``export_to({target!r}, config, output, **options)``: the 0.6 name, "
                       "kept.")
    return export_


def __getattr__(name: str):
    if name in _ALIASES:
        return _alias(_ALIASES[name])
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'mha_export' has no attribute {name!r}")
