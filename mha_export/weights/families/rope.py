"""Rotary position embeddings as config.json spells them (5.x rope_parameters, 4.x keys)."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from .base import Extra, Settings
from .layer_types import FULL

RopeAliases = Mapping[str, str]  # a model type's old rope type names -> ours (Phi-3: su)
LONG_CONTEXT = ("llama3", "yarn", "longrope")  # rope types with original_max_position_embeddings
OWN_KEYS = ("rope_theta", "rope_type", "type", "partial_rotary_factor")


def rope_scaling(s: Settings, params: Mapping[str, Any],
                 aliases: Optional[RopeAliases] = None) -> Optional[dict]:
    """MHAConfig's rope_scaling from one rope dict, completed as transformers completes it:
    original_max_position_embeddings from config.json's top level first (Phi-3 keeps it there,
    and transformers prefers it), else the dict's, else max_position_embeddings; yarn's and
    longrope's factor, when null or absent, max_position_embeddings / that. The type is checked
    later (MHAConfig), so an unsupported one is an error naming it."""
    kind = params.get("rope_type") or params.get("type") or "default"
    kind = (aliases or {}).get(kind, kind)
    if kind == "default":
        return None
    extra = {k: v for k, v in params.items() if k not in OWN_KEYS}
    if kind == "proportional":  # its fraction shapes the table itself (over the whole head)
        extra["partial_rotary_factor"] = params.get("partial_rotary_factor", 1.0)
    if kind in LONG_CONTEXT:
        original = s.get("original_max_position_embeddings") or extra.get(
            "original_max_position_embeddings") or s["max_position_embeddings"]
        extra["original_max_position_embeddings"] = original
        if kind != "llama3" and extra.get("factor") is None:
            extra["factor"] = s["max_position_embeddings"] / original
    return {"rope_type": kind, **extra}


def rope(s: Settings, partial_key: str = "partial_rotary_factor",
         aliases: Optional[RopeAliases] = None) -> dict:
    """theta, rotated fraction and scaling: 5.x rope_parameters, else the 4.x keys (rope_theta or
    rotary_emb_base, rope_scaling, partial_key)."""
    params = {**(s.get("rope_scaling") or {}), **(s.get("rope_parameters") or {})}
    theta = params["rope_theta"] if "rope_theta" in params else s.first(
        "rope_theta", "rotary_emb_base")
    partial = params.get("partial_rotary_factor", s[partial_key])
    return {"rope_theta": float(theta), "partial": float(partial),
            "rope_scaling": rope_scaling(s, params, aliases)}


def rotary_fields(s: Settings, head_dim: int, partial_key: str = "partial_rotary_factor",
                  aliases: Optional[RopeAliases] = None) -> dict:
    """MHAConfig's rotary fields (rotate_half style) for heads of head_dim."""
    r = rope(s, partial_key, aliases)
    return {"rotary": "half", "rotary_dim": int(head_dim * r["partial"]),
            "rope_theta": r["rope_theta"], "rope_scaling": r["rope_scaling"]}


def rope_by_layer_type(sliding_theta: Optional[str]) -> Extra:
    """Gemma 3, OLMo 3: a rope per layer type. 5.x rope_parameters keyed by layer type; 4.x
    rope_theta (full layers) and `sliding_theta` (sliding ones: Gemma 3's rope_local_base_freq;
    None: the record's default theta, as transformers 5.23 gives OLMo 3's sliding layers);
    rope_scaling applies to full layers only; a theta a dict omits comes from those keys."""
    def extra(s: Settings, layer: int, kind: str, fields: dict) -> dict:
        params = dict((s.get("rope_parameters") or {}).get(kind) or {})
        if kind == FULL:
            params.update(s.get("rope_scaling") or {})
        default = s["rope_theta"] if kind == FULL else (
            s[sliding_theta] if sliding_theta else s.defaults["rope_theta"])
        whole = params.get("rope_type") == "proportional"  # Gemma 4: zeros past its fraction
        rotary_dim = fields["head_dim"] if whole else int(
            fields["head_dim"] * params.get("partial_rotary_factor", 1.0))
        return {"rotary": "half", "rope_theta": float(params.get("rope_theta", default)),
                "rotary_dim": rotary_dim, "rope_scaling": rope_scaling(s, params)}
    return extra
