"""What ExecuTorch (1.5.1) has, each measured on it: its backends, and the operators it has no
kernel for. Torch-free: the target's record reads it."""
from __future__ import annotations

BACKENDS = ("xnnpack", "portable")
# the operators a layer may need (its kind's ``needs``) that ExecuTorch has no kernel for
LACKS = {"aten.sort": "ExecuTorch's edge dialect refuses aten.sort (not core ATen; neither "
                      "XNNPACK nor the portable kernels have one)",
        "top-k of call-length rows": "torch.export within ExecuTorch's bounds on seq refuses "
                                     "it (torch 2.13: Constraints violated (seq): it guards T "
                                     "// rate against 0, 1 and k); spare rows that keep it "
                                     "dynamic change torch.topk's picks among equal scores (4% "
                                     "of random rows), so it would no longer equal "
                                     "transformers'"}
