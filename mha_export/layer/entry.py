"""Entry points: the eager module's call for each signature kind (signature.KINDS), inputs in the
declared order (rotary layers: position_ids last, optional in eager). torch.jit.script compiles
them for TorchScript export; the declared names travel
inside model.pt as the attributes input_names / output_names (libtorch reads them)."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
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


class TopKSequence(EntryPoint):
    """A GLM-5 shared-top-k layer's calls (kinds/dsa/): its source layer's selection an input
    before position_ids."""

    def forward(self, x: Tensor, topk_indices: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        return self.inner.attend(x, None, None, None, position_ids, False, topk_indices)[0]


class TopKMaskedSequence(EntryPoint):
    def forward(self, x: Tensor, attention_mask: Tensor, topk_indices: Tensor,
                position_ids: Optional[Tensor] = None) -> Tensor:
        return self.inner.attend(x, attention_mask, None, None, position_ids, False,
                                 topk_indices)[0]


Written = Tuple[Tensor, Tensor, Tensor]  # y, present_key, present_value


class TopKCachedStep(EntryPoint):
    def forward(self, x: Tensor, attention_mask: Tensor, past_key: Tensor, past_value: Tensor,
                topk_indices: Tensor, position_ids: Optional[Tensor] = None) -> Written:
        return self.inner.forward_step(x, attention_mask, past_key, past_value, position_ids,
                                       topk_indices)


class TopKStaticStep(EntryPoint):
    """The static-cache step: topk_indices are slots of the buffers, written in place."""

    def forward(self, x: Tensor, past_key: Tensor, past_value: Tensor, past_lengths: Tensor,
                topk_indices: Tensor, position_ids: Optional[Tensor] = None) -> Written:
        return self.inner.forward_static(x, past_key, past_value, past_lengths, position_ids,
                                         topk_indices)


def _kept(kept: Optional[Tensor]) -> Tensor:
    """A DSA layer's selection (B, T, K), which its calls always make."""
    if kept is None:
        raise RuntimeError("a layer outputting topk_indices selects its keys (DSA)")
    return kept


class SelectingSequence(EntryPoint):
    """A GLM-5 DSA layer whose selection later shared layers read (kinds/dsa/): its
    topk_indices (B, T, K) an output after the kind's."""

    def forward(self, x: Tensor, position_ids: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor]:
        y, _, _, kept = self.inner.attend_selecting(x, None, None, None, position_ids)
        return y, _kept(kept)


class SelectingMaskedSequence(EntryPoint):
    def forward(self, x: Tensor, attention_mask: Tensor,
                position_ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        y, _, _, kept = self.inner.attend_selecting(x, attention_mask, None, None, position_ids)
        return y, _kept(kept)


Selected = Tuple[Tensor, Tensor, Tensor, Tensor]  # y, present_key, present_value, topk_indices


class SelectingCachedStep(EntryPoint):
    def forward(self, x: Tensor, attention_mask: Tensor, past_key: Tensor, past_value: Tensor,
                position_ids: Optional[Tensor] = None) -> Selected:
        y, key, value, kept = self.inner.attend_selecting(x, attention_mask, past_key,
                                                          past_value, position_ids, True)
        return y, key, value, _kept(kept)


class SelectingStaticStep(EntryPoint):
    def forward(self, x: Tensor, past_key: Tensor, past_value: Tensor, past_lengths: Tensor,
                position_ids: Optional[Tensor] = None) -> Selected:
        y, key, value, kept = self.inner.static_selecting(x, past_key, past_value,
                                                          past_lengths, position_ids)
        return y, key, value, _kept(kept)


class KeyStep(EntryPoint):
    """A cached call whose cache is the kind's own (signature.py's ``kind_cache``): past_key and
    no past_value (key = value rows), then the kind's state tensors, here none (DeepSeek-V4's
    sliding layer, ``step``: y, present_key, the state after the call, as a list)."""

    def forward(self, x: Tensor, attention_mask: Tensor, past_key: Tensor,
                position_ids: Optional[Tensor] = None) -> List[Tensor]:
        none = torch.jit.annotate(List[Tensor], [])
        return self.inner.step(x, attention_mask, past_key, none, position_ids)


class KeyStep3(EntryPoint):
    """Three state tensors (DeepSeek-V4's HCA layer: its compressor's buffer_kv, buffer_gate,
    compressed_kv)."""

    def forward(self, x: Tensor, attention_mask: Tensor, past_key: Tensor, s0: Tensor,
                s1: Tensor, s2: Tensor, position_ids: Optional[Tensor] = None) -> List[Tensor]:
        return self.inner.step(x, attention_mask, past_key, [s0, s1, s2], position_ids)


class KeyStep10(EntryPoint):
    """Ten (DeepSeek-V4's CSA layer: its compressor's and indexer's five each)."""

    def forward(self, x: Tensor, attention_mask: Tensor, past_key: Tensor, s0: Tensor,
                s1: Tensor, s2: Tensor, s3: Tensor, s4: Tensor, s5: Tensor, s6: Tensor,
                s7: Tensor, s8: Tensor, s9: Tensor, position_ids: Optional[Tensor] = None
                ) -> List[Tensor]:
        state = [s0, s1, s2, s3, s4, s5, s6, s7, s8, s9]
        return self.inner.step(x, attention_mask, past_key, state, position_ids)


ENTRY_POINTS = {"full": FullSequence, "masked": MaskedSequence, "kv-cache": CachedStep,
                "static-cache": StaticCacheStep, "shared": SharedKeys,
                "shared-masked": SharedKeysMasked, "shared-kv-cache": SharedKeysMasked,
                "shared-static-cache": SharedStaticStep}
# the calls of a layer taking another layer's top-k (signature: topk_indices)
TOPK_ENTRY_POINTS = {"full": TopKSequence, "masked": TopKMaskedSequence,
                     "kv-cache": TopKCachedStep, "static-cache": TopKStaticStep}
# the calls of a layer giving its own top-k (signature: the output topk_indices)
SELECTING_ENTRY_POINTS = {"full": SelectingSequence, "masked": SelectingMaskedSequence,
                          "kv-cache": SelectingCachedStep, "static-cache": SelectingStaticStep}


# a cached call of the kind's own cache (no past_value) by its state tensors' count
KEY_STEPS = {0: KeyStep, 3: KeyStep3, 10: KeyStep10}


def entry_module(module: AttentionBase, kind: str, input_names: List[str],
                 output_names: List[str]) -> EntryPoint:
    """The module to call (and to script) for a signature kind (and its inputs: a shared-top-k
    layer's take topk_indices, a layer whose selection shared layers read gives it)."""
    table = (TOPK_ENTRY_POINTS if "topk_indices" in input_names else SELECTING_ENTRY_POINTS
             if "topk_indices" in output_names else ENTRY_POINTS)
    entry = table[kind]
    if "past_key" in input_names and "past_value" not in input_names and kind == "kv-cache":
        state = [n for n in input_names if n.startswith("past_") and n != "past_key"]
        entry = KEY_STEPS[len(state)]  # the kind's own cache: key = value rows and state
    return entry(module, list(input_names), list(output_names)).eval()
