"""How llama.cpp's converter wrote a model type into a GGUF file: the ``GGUFArch`` record each
family module keeps in its ``GGUF`` (one per ``general.architecture``, registered with the
families; ``GGUF_REFUSED``: the architectures refused, saying why), and the small rules the
records' functions share. ``weights/gguf.py`` reads the file and assembles the config.json from
a record; the records only read metadata through ``Metadata`` (a ``gguf.GGUFFile``), so this
module and the families never import the file reader. The records follow llama.cpp 21a4933's
convert_hf_to_gguf.py, llama-model.cpp and src/models/ (glm4moe, ernie4_5-moe, minimax-m2,
afmoe, lfm2, qwen3next, mpt, mistral3, gemma3n and the refusals of phimoe, mimo2 and gemma4:
092b66d's); where the file says nothing, llama.cpp's runtime rules."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from ...errors import UsageError
from .base import Convert


class Metadata(Protocol):
    """What a record's functions read of an open GGUF file (``gguf.GGUFFile``)."""

    path: Path
    arch: str  # general.architecture
    tensors: dict[str, Any]  # by the file's name ("blk.5.attn_q.weight")

    def arch_value(self, key: str, default: Any = None, layer: Optional[int] = None) -> Any: ...

    def require(self, key: str, layer: Optional[int] = None) -> Any: ...


# (file, layer) -> the config.json keys an architecture adds
GGUFExtra = Callable[[Metadata, int], dict]
RopeScaling = Callable[[Metadata], Optional[dict]]  # rope_scaling from the metadata
# an architecture's own rope_scaling: (file, the generic reading: yarn, linear, longrope)
Rope = Callable[[Metadata, RopeScaling], Optional[dict]]
FROM_HF = ": export from the Hugging Face checkpoint"  # the end of a refusal


def nothing(f: Metadata, layer: int) -> dict:
    return {}


@dataclass(frozen=True)
class GGUFArch:
    """How llama.cpp's converter wrote one Hugging Face model type."""

    model_type: str  # the families/ record its layers are read through
    permuted: bool = False  # q/k rows permuted (LlamaModel.permute): undone
    norm_shift: float = 0.0  # added to every norm weight (Gemma's 1 + w): subtracted
    extra: GGUFExtra = nothing
    bias: str = "attention_bias"  # the config.json key saying the layer has biases
    prefix: str = "model."  # before the family's attention path in the converter's names
    # the layer's modules under the converter's (Hugging Face) names -> ours, where they differ
    # from the family's (a tensor the converter merged or renamed); None: the family's
    tensors: Optional[dict[str, str]] = None
    convert: Optional[Convert] = None  # where the stored layout is not the family's
    # rope_scaling from the metadata where the architecture writes its own keys (None: yarn,
    # linear, longrope as the generic reading takes them)
    rope: Optional[Rope] = None
    # the attention's shape keys (heads, widths) where they are not heads of one width
    # (Multi-head Latent Attention's); None: the generic reading
    shape: Optional[GGUFExtra] = None


def has(f: Metadata, layer: int, name: str) -> bool:
    """The file holds blk.{layer}.{name} ("attn_q_norm.weight", ...)."""
    return f"blk.{layer}.{name}" in f.tensors


def present(**values: Any) -> dict:
    return {k: v for k, v in values.items() if v is not None}


def head_dim(f: Metadata, layer: int) -> int:
    """attention.key_length, else n_embd / n_head (llama.cpp's default)."""
    return f.arch_value("attention.key_length") or (
        f.require("embedding_length") // f.require("attention.head_count", layer))


def one_rope_base(f: Metadata) -> None:
    """Families of one rope theta: a different sliding-layer base (rope.freq_base_swa) is
    refused."""
    swa = f.arch_value("rope.freq_base_swa")
    if swa is not None and swa != f.arch_value("rope.freq_base", 10000.0):
        raise UsageError(f"{f.path}: a rope base of its own for sliding layers "
                         f"(rope.freq_base_swa {swa}) is not read for {f.arch}")


def swa_period(f: Metadata) -> int:
    """llama.cpp's sliding pattern for Cohere 2, EXAONE 4 and OLMo 3: every n-th layer full
    (attention.sliding_window_pattern as a number, default 4). It ignores a per-layer array
    (the converter's): one that says otherwise is refused."""
    pattern = f.arch_value("attention.sliding_window_pattern", 4)
    if not isinstance(pattern, list):
        return int(pattern)
    if pattern != [(i + 1) % 4 != 0 for i in range(len(pattern))]:
        raise UsageError(f"{f.path}: a per-layer sliding pattern other than every 4th layer "
                         "full is not read (llama.cpp reads every 4th layer full)")
    return 4


def no_window(f: Metadata, layer: int) -> dict:
    """StarCoder2, dots.llm1, Ministral 3: llama.cpp writes and uses no window (every layer
    full)."""
    return {"sliding_window": None}
