"""What a kind of attention layer is to every stage: one record per kind (registry.py lists
them). The torch-free stages (config, signature, the bench worker) ask the config's section
instead (``MHAConfig.section``: cache widths, the softmax scale, derived fields).

    config section  -> MHAConfig.section (settings, validation, cache shape)
    eager module    -> layouts: layout name -> nn.Module class
    graph           -> forms (each carries its kind's layer builder), default_form
    weights         -> anchors (the tensor that identifies a layout in a file), projections
                       (name -> [out, in] shape), map_projections (a module with new weights)
    lossy steps     -> quantizable projections; unbuilt: step -> why it is refused
    export targets  -> needs: operator -> (the feature, how it uses it): a target lacking one
                       refuses the layer (targets/base.py's ``lacks``); example_seq: the
                       length a tracing export's example call has
    bench           -> call_flops
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from torch import Tensor, nn

from ..config import MHAConfig
from ..errors import UsageError
from ..graph.forms.base import GraphForm

# (projection name, weight [out, in]) -> the weight to hold instead
WeightMap = Callable[[str, Tensor], Tensor]


@dataclass(frozen=True)
class AttentionKind:
    name: str  # MHAConfig.kind
    summary: str
    # layout -> the eager module's class (nn.Module), or what builds one of the config
    # (DeepSeek-V4's: its layer type's class)
    layouts: Mapping[str, Callable[[MHAConfig], nn.Module]]
    anchors: Mapping[str, str]  # layout -> the tensor name that identifies it in a file
    forms: tuple[GraphForm, ...]  # its ONNX graph forms, the default first
    # name -> [out, in] of every projection weight (the bench's bytes)
    projections: Callable[[MHAConfig], dict[str, tuple[int, int]]]
    quantizable: Callable[[MHAConfig], list[str]]  # what --quantize turns into MatMulNBits
    # a module of the same config holding fn(name, weight) for each quantizable projection
    map_projections: Callable[[nn.Module, WeightMap], nn.Module]
    # FLOPs of one row's call: (config, T, causal (query, key) pairs within it, past length)
    call_flops: Callable[[MHAConfig, int, float, int], float]
    unbuilt: Mapping[str, str] = field(default_factory=dict)  # lossy step -> why refused
    # config -> the operators its layer needs that a target may lack (every target has MatMul,
    # Softmax, ...): operator -> (the feature that needs it, how it uses it)
    needs: Callable[[MHAConfig], Mapping[str, tuple[str, str]]] = lambda config: {}
    # (config, call kind: signature.py's) -> what that call needs beyond ``needs`` (a cached call's
    # own operators), as ``needs``
    call_needs: Callable[[MHAConfig, str], Mapping[str, tuple[str, str]]] = (
        lambda config, kind: {})
    # a call length that takes every path of its layer: a tracing export (torch.export)
    # specialises an axis whose example skips one (QSA's: more complete blocks than it keeps)
    example_seq: Callable[[MHAConfig], int] = lambda config: 3

    def refuse(self, step: str) -> None:
        """A lossy step not built for this kind: its one-line refusal."""
        if step in self.unbuilt:
            raise UsageError(self.unbuilt[step])
