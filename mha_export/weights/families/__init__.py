"""Hugging Face checkpoint families: one ``Family`` record per config.json ``model_type``.

A record says where a layer's attention tensors live, what they are called in our layouts, the
MHAConfig fields config.json gives (both transformers spellings: 4.x rope_theta, rope_scaling,
rotary_pct, rotary_emb_base and 5.x rope_parameters, partial_rotary_factor, layer_types), and
transformers' defaults for the keys a config.json may omit — data in the record, read through
``Settings``. ``huggingface`` does the reading (files, shards, layer selection, errors).

The records live in this package, one module per group of related model types (llama.py, llama4.py,
olmo.py, pairs.py, local_global.py, mimo.py, layernorm.py, qwen.py, gemma.py, gpt.py, classic.py,
alibi.py, deepseek.py, deepseek_v4.py, longcat.py), on shared parts: base.py (``Family``,
``Settings``, ``Extra``), rope.py, layer_types.py and decoder.py (Llama-style fields, extras,
conversions). Adding a model type is one record in its group's ``RECORDS`` (docs/checkpoints.md's
table is generated from them) and a test spec: reuse a fields function (``decoder_fields`` serves
Llama-style decoders: its layer-type rule, biases and extras — q/k norms, softmax scale,
softcapping, sinks, output gate, NoPE layers — are arguments) and write a small one, or a
``convert``, only where the new type's math differs. Multimodal wrappers (Gemma 3, Qwen3.5) are
their text model's record with ``nested`` (config.json's text_config) and ``prefix`` (the language
model's tensors only, never the vision tower's or a multi-token-prediction head's). A record whose
decoder layers hold several attention modules (LongCat-Flash) says how many (``modules``): each is
addressed "L.M" (huggingface.py, ``address``).

A module also says how llama.cpp's converter wrote its model types into GGUF files: its ``GGUF``
(``general.architecture`` -> ``gguf_common.GGUFArch``, with the functions that read the
architecture's metadata) and ``GGUF_REFUSED`` (an architecture refused, and why), gathered here
into ``GGUF`` and ``GGUF_REFUSED`` for ``weights/gguf.py`` (docs/gguf.md's list is generated
from them).

Torch-free on purpose (``convert`` functions only call tensor methods): the CLI reads the
registry for its help without importing torch.
"""
from __future__ import annotations

from . import (alibi, classic, deepseek, deepseek_v4, gemma, gpt, layernorm, llama, llama4,
               local_global, longcat, mimo, olmo, pairs, qwen)
from .base import ANY_PREFIX, INDEXED, Convert, Family, Fields, Settings, unchanged
from .gguf_common import GGUFArch
from .not_yet import NOT_YET

__all__ = ["ANY_PREFIX", "INDEXED", "Convert", "FAMILIES", "Family", "Fields", "GGUF",
           "GGUFArch", "GGUF_REFUSED", "NOT_YET", "Settings", "supported_types", "unchanged"]

# the order of the help's and the docs' lists
GROUPS = (llama, llama4, olmo, pairs, local_global, mimo, layernorm, qwen, gemma, gpt, classic,
          alibi, deepseek, deepseek_v4, longcat)
FAMILIES: dict[str, Family] = {f.model_type: f for group in GROUPS for f in group.RECORDS}


def supported_types() -> str:
    """The model types the registry serves, for help texts and errors: "llama, mistral, ..."."""
    return ", ".join(FAMILIES)


# The GGUF architectures in the order the lists (help, errors, docs/gguf.md) have named them since
# before the records moved next to their families; one added later is listed after these.
GGUF_LISTED = (
    "llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "qwen2moe", "starcoder2",
    "olmo", "olmo2", "olmoe", "granite", "arcee", "smollm3", "llama4", "apertus", "seed_oss",
    "hunyuan-dense", "dots1", "gemma", "nemotron", "ernie4_5", "glm4", "glm4moe", "ernie4_5-moe",
    "minimax-m2", "afmoe", "command-r", "cohere2", "exaone4", "stablelm", "phi2", "bitnet",
    "falcon", "starcoder", "bloom", "dbrx", "lfm2", "mistral3", "qwen3next", "mpt", "gemma3n")


def _listed(item: tuple[str, GGUFArch]) -> int:
    """Where an architecture stands in GGUF_LISTED (one added later: after them, in its group's
    order)."""
    return GGUF_LISTED.index(item[0]) if item[0] in GGUF_LISTED else len(GGUF_LISTED)


GGUF: dict[str, GGUFArch] = dict(sorted(
    ((arch, record) for group in GROUPS for arch, record in getattr(group, "GGUF", {}).items()),
    key=_listed))
GGUF_REFUSED: dict[str, str] = {arch: why for group in GROUPS
                                for arch, why in getattr(group, "GGUF_REFUSED", {}).items()}
