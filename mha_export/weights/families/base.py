"""A family record (``Family``) and config.json as it reads it (``Settings``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional


@dataclass(frozen=True)
class Settings:
    """config.json, read-only; a key it omits takes the family's default (transformers')."""

    config: Mapping[str, Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __contains__(self, key: str) -> bool:
        return key in self.config or key in self.defaults

    def __getitem__(self, key: str) -> Any:
        return self.config[key] if key in self.config else self.defaults[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def first(self, *keys: str) -> Any:
        """The first of keys that config.json sets, else the default of the first that has one
        (one setting under its old and new names)."""
        for source in (self.config, self.defaults):
            for key in keys:
                if key in source:
                    return source[key]
        raise KeyError(" / ".join(keys))


Fields = Callable[[Settings, int], dict]  # config.json (with defaults), layer -> MHAConfig fields
Convert = Callable[[dict, dict], dict]  # (fields, {our-named tensors}) -> our state dict
# What a model type adds to a decoder layer: (config.json, layer, its layer type, the fields so
# far) -> the fields it sets.
Extra = Callable[[Settings, int, str, dict], dict]
ANY_PREFIX = r"(?:^|\.)"  # tensor names: anything (or nothing) before the attention module
# a module name ending so stands for one module per index (StableLM's q_layernorm.norms.0, .1,
# ...), each read under our name with its index ("q_norm.0")
INDEXED = ".N"


def unchanged(fields: dict, tensors: dict) -> dict:
    """Tensors already in our layout once renamed."""
    return tensors


def same_as(record: "Family", model_type: str) -> "Family":
    """Another model type whose attention and config.json keys are ``record``'s."""
    return dataclasses.replace(record, model_type=model_type,
                               summary=f"as {record.model_type}")


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type, e.g. "llama"
    layout: str  # our layout its tensors map onto: "split" | "fused" | "latent"
    attention: str  # the layer's attention module, after the prefix ("model.", "transformer.")
    tensors: dict[str, str]  # checkpoint module (or parameter, or INDEXED) -> ours
    #                        ({"q_proj": "W_query"})
    defaults: dict[str, Any]  # transformers' defaults for the config.json keys `fields` reads
    fields: Fields
    convert: Convert = unchanged
    layer_count: str = "num_hidden_layers"  # the config.json key (no default: never guessed)
    context: str = "max_position_embeddings"  # the config.json key of the context length
    nested: Optional[str] = None  # multimodal: the key of the text model's config ("text_config")
    prefix: str = ANY_PREFIX  # regex matched right before `attention` in tensor names
    summary: str = ""  # what it reads from config.json, for the docs' table / help
    # attention modules per decoder layer: more than one (LongCat-Flash's 2) are addressed
    # "L.M" (--layer 3.1), `attention` naming each by {module}
    modules: int = 1
    # why `eval` leaves a layer's attention to the model ("": an exported layer stands in)
    eval_left: Callable[[Settings, int], str] = lambda s, layer: ""
