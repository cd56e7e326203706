"""The parity check: runners (``runners/``, a registry), the sweep of cases and the multi-call
scenarios, comparison, and the report. Never imports export code; ONNX Runtime runners never
import torch."""
