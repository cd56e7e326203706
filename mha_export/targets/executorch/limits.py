"""What ExecuTorch (1.5.1) has, each measured on it: its backends, and the operators it has no
kernel for. Torch-free: the target's record reads it."""
from __future__ import annotations

BACKENDS = ("xnnpack", "portable")
# the operators a layer may need (its kind's ``needs``) that ExecuTorch has no kernel for
LACKS = {"aten.sort": "ExecuTorch's edge dialect refuses aten.sort (not core ATen; neither "
                      "XNNPACK nor the portable kernels have one)"}
