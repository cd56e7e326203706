"""A layer's address in a checkpoint (``--layer``, a ``--layers`` row): its index (3), or, where a
model type's decoder layers hold several attention modules (LongCat-Flash's self_attn.0 and .1),
"L.M" (3.1: layer 3's module 1). An index stays an int everywhere (folder layer-3, a
layers.json row's "layer": 3); an "L.M" address is a string in the same places (layer-3.1,
"layer": "3.1"). Torch-free: the CLI parses with it."""
from __future__ import annotations

import re
from typing import Iterable, Optional, Union

Address = Union[int, str]  # 3, or "3.1"
FORM = re.compile(r"(\d+)(?:\.(\d+))?", re.ASCII)


def parse_address(text: str) -> Address:
    """"3" -> 3, "3.1" -> "3.1" (leading zeros dropped); anything else a ValueError."""
    match = FORM.fullmatch(text.strip())
    if match is None:
        raise ValueError(text)
    layer, module = match.groups()
    return int(layer) if module is None else f"{int(layer)}.{int(module)}"


def split_address(address: Address) -> tuple[int, Optional[int]]:
    """(the decoder layer, its module or None)."""
    if isinstance(address, int):
        return address, None
    layer, module = address.split(".")
    return int(layer), int(module)


def address_key(address: Address) -> tuple[int, int]:
    """The order of a checkpoint's addresses: by layer, then module."""
    layer, module = split_address(address)
    return layer, -1 if module is None else module


def addresses(layers: Iterable[int], modules: int = 1) -> list[Address]:
    """The addresses of these layers: the layers themselves (one attention module each), else
    each one's modules ("L.0", "L.1", ...)."""
    if modules == 1:
        return list(layers)
    return [f"{layer}.{module}" for layer in layers for module in range(modules)]
