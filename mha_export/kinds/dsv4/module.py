"""DeepSeek-V4's eager layers on the project's module interface (``build_module(config)``): the
sliding or compressed layer of the config's layer type, holding its MHAConfig, called as every
entry point calls a layer (``attend``, layer.py's). Their parameters carry transformers' names,
so a checkpoint's tensors load by name (weights/families/deepseek.py's record)."""
from __future__ import annotations

from torch import nn

from ...config import MHAConfig
from .compressed import DSV4CompressedAttention
from .layer import DSV4SlidingAttention
from .settings import SLIDING


class SlidingLayer(DSV4SlidingAttention):
    def __init__(self, config: MHAConfig):
        super().__init__(config.dsv4.shape(config))
        self.config = config


class CompressedLayer(DSV4CompressedAttention):
    def __init__(self, config: MHAConfig):
        super().__init__(config.dsv4.shape(config))
        self.config = config


def dsv4_layer(config: MHAConfig) -> nn.Module:
    """The eager layer of the config's layer type (the kind's layout "dsv4")."""
    sliding = config.dsv4.layer_type == SLIDING
    return (SlidingLayer if sliding else CompressedLayer)(config)
