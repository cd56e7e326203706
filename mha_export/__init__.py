"""mha-export: causal multi-head attention -> TorchScript / ONNX, with a parity check that can fail.

    config -> model -> export -> runners -> compare -> check/report
"""
from .check import CheckReport, check
from .compare import Comparison, Tolerance, compare
from .config import MHAConfig
from .errors import UsageError
from .export import ExportResult, export_onnx, export_torchscript
from .model import AttentionWeights, build_module, convert
from .weights import load_module

__all__ = ["MHAConfig", "build_module", "convert", "load_module", "AttentionWeights",
           "export_onnx", "export_torchscript", "ExportResult", "check", "CheckReport",
           "compare", "Comparison", "Tolerance", "UsageError"]
