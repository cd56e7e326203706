"""Entry points: the eager module's call for each signature kind (signature.KINDS), inputs in the
declared order (rotary layers: position_ids last, optional in eager). torch.jit.script compiles
them for TorchScript export; the declared names travel
inside model.pt as the attributes input_names / output_names (libtorch reads them)."""
from __future__ import annotations

from typing import List, Optional, Tuple

from torch import Tensor, nn

from .layouts import AttentionBase

class EntryPoint(nn.Module):
    def __init__(self, inner: AttentionBase, input_names: List[str], output_names: List[str]):
        super().__init__()
        self.inner = inner
        self.input_names = input_names
        self.output_names = output_names


class FullSequence(EntryPoint):
    def forward(self, x: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        return self.inner.attend(x, None, None, None, position_ids)[0]


class MaskedSequence(EntryPoint):
    def forward(self, x: Tensor, attention_mask: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        return self.inner.attend(x, attention_mask, None, None, position_ids)[0]


class CachedStep(EntryPoint):
    def forward(self, x: Tensor, attention_mask: Tensor, past_key: Tensor, past_value: Tensor,
                position_ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        return self.inner.forward_step(x, attention_mask, past_key, past_value, position_ids)


class StaticCacheStep(EntryPoint):
    def forward(self, x: Tensor, past_key: Tensor, past_value: Tensor, past_lengths: Tensor,
                position_ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        return self.inner.forward_static(x, past_key, past_value, past_lengths, position_ids)


class SharedKeys(EntryPoint):
    """A KV-shared layer's call (kinds/kv_shared/): the keys and values are inputs."""

    def forward(self, x: Tensor, shared_key: Tensor, shared_value: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        return self.inner.read(x, None, shared_key, shared_value, position_ids)


class SharedKeysMasked(EntryPoint):
    def forward(self, x: Tensor, attention_mask: Tensor, shared_key: Tensor,
                shared_value: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        return self.inner.read(x, attention_mask, shared_key, shared_value, position_ids)


class SharedStaticStep(EntryPoint):
    def forward(self, x: Tensor, shared_key: Tensor, shared_value: Tensor, past_lengths: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        return self.inner.read_static(x, shared_key, shared_value, past_lengths, position_ids)


ENTRY_POINTS = {"full": FullSequence, "masked": MaskedSequence, "kv-cache": CachedStep,
                "static-cache": StaticCacheStep, "shared": SharedKeys,
                "shared-masked": SharedKeysMasked, "shared-kv-cache": SharedKeysMasked,
                "shared-static-cache": SharedStaticStep}


def entry_module(module: AttentionBase, kind: str, input_names: List[str],
                 output_names: List[str]) -> EntryPoint:
    """The module to call (and to script) for a signature kind."""
    return ENTRY_POINTS[kind](module, list(input_names), list(output_names)).eval()
