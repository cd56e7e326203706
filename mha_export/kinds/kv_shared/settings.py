"""Cross-layer KV sharing's settings, torch-free: ``SharedKV``, the section MHAConfig nests
(``MHAConfig.kv_shared``, set: the layer reads another layer's keys and values, layout
"shared").

    Gemma 3n / Gemma 4: the last num_kv_shared_layers have no k_proj / v_proj. Each attends with
    the keys (after their norm and rotary) and values of the last earlier layer of its type,
    which the app already holds: the cache that layer writes. The exported layer takes them as
    inputs (``shared_key`` / ``shared_value``), holds no cache and writes nothing.

Everything on the queries' side is the standard layer's (q norm, rotary, window, softcap, sinks,
ALiBi, output gate and norm); what acts on keys or values is the source layer's, so it is
refused here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ...errors import UsageError
from ...layer_option import refused_by
from ..section import section_from_json

NAME = "cross-layer KV sharing"
LAYOUT = "shared"  # its one weight layout (q_proj, o_proj): the checkpoints' shared layers
ROTARY = ("none", "half", "interleaved")  # config.ROTARY (config imports this module)


@dataclass(frozen=True)
class SharedKV:
    """What a KV-shared layer adds to MHAConfig: the layer whose keys and values it reads."""

    kv_shared_layer: int = 0  # the source layer (its cache holds what this layer attends with)

    def __post_init__(self) -> None:
        layer = self.kv_shared_layer
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise UsageError(f"kv_shared_layer must be a layer index >= 0, got {layer!r}")

    def resolve(self, c: Any) -> Dict[str, Any]:
        """The layout it decides; the options that act on keys or values refused (the source
        layer applies them before its cache)."""
        refused = {**refused_by(c, "kv_shared"), "qk_norm_after_rope": c.qk_norm_after_rope,
                   "layout " + repr(c.layout): c.layout not in (None, LAYOUT)}
        for name, on in refused.items():
            if on:
                raise UsageError(f"{name} does not apply to a KV-shared layer ({NAME})")
        return {"layout": LAYOUT}

    rotary_choices = ROTARY

    def check_rope(self, scaling: Optional[dict]) -> None:
        return None

    def cache_shape(self, c: Any) -> Tuple[int, int, int]:
        """(heads, key width, value width) of the source layer's cache it reads."""
        return c.kv_heads, c.head_dim, c.value_dim

    def attended_kv_width(self, c: Any) -> int:
        return c.kv_inner

    def scale(self, c: Any) -> float:
        return c.softmax_scale or 1.0 / math.sqrt(c.head_dim)

    def slug(self, c: Any) -> str:
        """The standard slug with the layout 'shared' and the source layer: 'shared-h8-d512-of3'."""
        plain = c.replace(kv_shared=None, layout="split").slug()
        return f"{LAYOUT}{plain[len('split'):]}-of{self.kv_shared_layer}"

    @property
    def cache_docs(self) -> Dict[str, str]:
        return {"shared_key": f"layer {self.kv_shared_layer}'s keys (after its norm and rotary)",
                "shared_value": f"layer {self.kv_shared_layer}'s values"}

    @classmethod
    def cli_options(cls) -> Dict[str, str]:
        """field -> help of the CLI's options of this section (cli/options.py makes them)."""
        return {"kv_shared_layer": "A KV-shared layer (Gemma 3n/4): it attends with layer N's "
                                   "keys and values, given as inputs shared_key / shared_value "
                                   "(docs/kv-sharing.md) [default: its own]."}

    @classmethod
    def from_options(cls, kw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The section's options popped from the CLI's keywords (None: not given)."""
        if kw.get("kv_shared_layer") is None:
            kw.pop("kv_shared_layer", None)
            return None
        return {"kv_shared_layer": kw.pop("kv_shared_layer")}

    @classmethod
    def from_value(cls, value: Any) -> "SharedKV":
        """A SharedKV, or config.json's object of one (unknown keys refused)."""
        return section_from_json(cls, value, "kv_shared")
