"""GGUF files (llama.cpp's format): one layer's attention, read through the Hugging Face families.

    --weights FILE.gguf --layer N

A GGUF file holds key-value metadata (``llama.attention.head_count``, ...) and tensors named
``blk.N.attn_q.weight``, ``blk.N.attn_output.weight``, ... stored as llama.cpp's converter
(``convert_hf_to_gguf.py``) wrote them: quantized in blocks (Q4_1, Q8_0, K-quants, ...), with the
``llama`` architecture's (and the converter's other LlamaModels') query/key rows permuted for
llama.cpp's rotary kernel, Gemma's and Nemotron's norm weights stored as ``1 + w``, Falcon's
query_key_value regrouped. This module maps the metadata onto the config.json keys of the
Hugging Face model type the architecture came from (one ``GGUFArch`` record per
``general.architecture``; where the file says nothing, llama.cpp's runtime rules), finds the
layer's tensors with gguf's own name map (the inverse of the one the converter used),
dequantizes them to float32 with ``gguf.quants``, undoes the converter's permutation and norm
shift, and hands both to that model type's ``families.Family`` (its ``fields`` and
``convert``): the attention math lives in families/ only. Only the chosen layer's tensors are
read (``gguf.GGUFReader`` memory-maps the file). The records follow llama.cpp 21a4933's
convert_hf_to_gguf.py, llama-model.cpp and src/models/ (glm4moe, ernie4_5-moe, minimax-m2,
afmoe, lfm2, qwen3next, mpt, mistral3, gemma3n and the refusals of phimoe, mimo2 and gemma4:
092b66d's).

``layer_raw_tensors`` gives the same tensors as stored (type, shape, blocks), for exporting the
file's own quantization. The ``gguf`` package (llama.cpp's gguf-py) is needed for .gguf files only.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np

from ..errors import NotAttentionLayer, UsageError
from .families import FAMILIES, Convert, Family
from .families.alibi import paper_slopes, with_slopes
from .families.layer_types import FULL
from .families.llama import qkv_rows_convert
from .gguf_header import HeaderError, header_scalars
from .huggingface import layer_fields, require_layer

MAGIC = b"GGUF"
INSTALL = "pip install gguf"


def is_gguf(path: str | Path) -> bool:
    """A .gguf name, or a file that starts with GGUF's magic."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:  # a folder, a missing file
        return False


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise UsageError(f"reading a .gguf file needs the gguf package (llama.cpp's reader): "
                         f"{INSTALL}") from None
    return gguf


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


# The file ---------------------------------------------------------------------------------------

class GGUFFile:
    """An open GGUF file: metadata by key, tensors by name (memory-mapped, nothing read yet)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(f"weights file not found: {self.path}")
        gguf = _gguf()
        try:  # a truncated or corrupt file fails here: the reader maps every tensor it lists
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as e:
            raise UsageError(f"{self.path}: not a readable GGUF file ({_first_line(e)})") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.value("general.architecture")
        if not isinstance(self.arch, str):
            raise UsageError(f"{self.path}: no general.architecture in its metadata")

    def value(self, key: str, default: Any = None) -> Any:
        """A metadata value; a float32 one as the shortest decimal that rounds to it (1e-05,
        not 9.99999974e-06: what config.json said, before the converter rounded it)."""
        found = self.reader.fields.get(key)
        if found is None:
            return default
        value = found.contents()
        if isinstance(value, float) and found.types == [_gguf().GGUFValueType.FLOAT32]:
            return float(str(np.float32(value)))
        return value

    def arch_value(self, key: str, default: Any = None, layer: Optional[int] = None) -> Any:
        """``{architecture}.key``; a per-layer array's entry for ``layer``."""
        value = self.value(f"{self.arch}.{key}", default)
        if isinstance(value, list) and layer is not None:
            if len(value) <= layer:
                raise UsageError(f"{self.path}: {self.arch}.{key} has no entry for layer {layer}")
            return value[layer]
        return value

    def require(self, key: str, layer: Optional[int] = None) -> Any:
        value = self.arch_value(key, None, layer)
        if value is None:
            raise UsageError(f"{self.path}: no {self.arch}.{key} in its metadata")
        return value


# The tensors, as stored and as read -------------------------------------------------------------

@dataclass(frozen=True)
class RawTensor:
    """One tensor as the file stores it (for exporting the file's own quantization)."""

    name: str  # the file's name, e.g. "blk.5.attn_q.weight"
    ggml_type: str  # GGMLQuantizationType name: "Q4_1", "Q8_0", "F16", "F32", ...
    shape: tuple[int, ...]  # torch's order: (out, in) for a projection (GGUF lists it reversed)
    data: np.ndarray  # its bytes, uint8 (rows, bytes per row), memory-mapped: rows are blocks
    # row i of the Hugging Face tensor is stored row rows[i] (a bias: element i, element rows[i]):
    # llama.cpp's q/k permutation moves whole rows, quantized blocks stay intact; None: stored in
    # Hugging Face's order
    rows: Optional[np.ndarray] = None


def _raw(tensor: Any, rows: Optional[np.ndarray]) -> RawTensor:
    shape = tuple(int(n) for n in reversed(tensor.shape))
    data = np.asarray(tensor.data)
    data = data.reshape(int(np.prod(shape[:-1], dtype=np.int64)), -1).view(np.uint8)
    return RawTensor(tensor.name, tensor.tensor_type.name, shape, data, rows)


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``LlamaModel.permute`` of q/k rows (each head's two rotary halves
    interleaved, for its rotate-pairs kernel): (heads, H/2, 2, ...) -> (heads, 2, H/2, ...)."""
    return rows.reshape(heads, -1, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def dequantized(raw: RawTensor, path: Path) -> np.ndarray:
    """float32 values in torch's shape and Hugging Face's row order."""
    gguf = _gguf()
    try:
        values = gguf.quants.dequantize(raw.data, gguf.GGMLQuantizationType[raw.ggml_type])
    except NotImplementedError:
        raise UsageError(f"{path}: {raw.name} is {raw.ggml_type}, a tensor type gguf "
                         f"{_version()} cannot dequantize") from None
    values = np.asarray(values, dtype=np.float32).reshape(raw.shape)
    return values[raw.rows] if raw.rows is not None else np.array(values)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


# Architectures ----------------------------------------------------------------------------------

Extra = Callable[[GGUFFile, int], dict]  # (file, layer) -> config.json keys an architecture adds


def nothing(f: GGUFFile, layer: int) -> dict:
    return {}


@dataclass(frozen=True)
class GGUFArch:
    """How llama.cpp's converter wrote one Hugging Face model type."""

    model_type: str  # the families/ record its layers are read through
    permuted: bool = False  # q/k rows permuted (LlamaModel.permute): undone
    norm_shift: float = 0.0  # added to every norm weight (Gemma's 1 + w): subtracted
    extra: Extra = nothing
    bias: str = "attention_bias"  # the config.json key saying the layer has biases
    prefix: str = "model."  # before the family's attention path in the converter's names
    # the layer's modules under the converter's (Hugging Face) names -> ours, where they differ
    # from the family's (a tensor the converter merged or renamed); None: the family's
    tensors: Optional[dict[str, str]] = None
    convert: Optional[Convert] = None  # where the stored layout is not the family's
    # rope_scaling from the metadata where the architecture writes its own keys (None: yarn,
    # linear, longrope as ``_rope_scaling`` reads them)
    rope: Optional[Callable[["GGUFFile"], Optional[dict]]] = None


def _has(f: GGUFFile, layer: int, name: str) -> bool:
    """The file holds blk.{layer}.{name} ("attn_q_norm.weight", ...)."""
    return f"blk.{layer}.{name}" in f.tensors


def _one_rope_base(f: GGUFFile) -> None:
    """Families of one rope theta: a different sliding-layer base (rope.freq_base_swa) is
    refused."""
    swa = f.arch_value("rope.freq_base_swa")
    if swa is not None and swa != f.arch_value("rope.freq_base", 10000.0):
        raise UsageError(f"{f.path}: a rope base of its own for sliding layers "
                         f"(rope.freq_base_swa {swa}) is not read for {f.arch}")


def _swa_period(f: GGUFFile) -> int:
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


def full_attention(f: GGUFFile, layer: int) -> dict:
    """Qwen2/Qwen3: llama.cpp attends fully on every layer (no sliding window)."""
    return {"use_sliding_window": False}


def no_window(f: GGUFFile, layer: int) -> dict:
    """StarCoder2, dots.llm1: llama.cpp writes and uses no window (every layer full)."""
    return {"sliding_window": None}


def gemma_scale(layers_27b: int) -> Callable[[GGUFFile, int], float]:
    """Gemma's query_pre_attn_scalar, which no GGUF key holds: llama.cpp's rule (its
    llama-model.cpp) — n_embd / n_head for the 27B model (known by its layer count), else
    head_dim."""
    def scalar(f: GGUFFile, layer: int) -> float:
        if f.require("block_count") == layers_27b:
            return f.require("embedding_length") / f.require("attention.head_count", layer)
        return _head_dim(f, layer)
    return scalar


def _present(**values: Any) -> dict:
    return {k: v for k, v in values.items() if v is not None}


def gemma2(f: GGUFFile, layer: int) -> dict:
    """Softcapping and the window as written; every 2nd layer full (llama.cpp's pattern 2, the
    family's default)."""
    return _present(query_pre_attn_scalar=gemma_scale(46)(f, layer),
                    attn_logit_softcapping=f.arch_value("attn_logit_softcapping"),
                    sliding_window=f.arch_value("attention.sliding_window"))


def gemma3(f: GGUFFile, layer: int) -> dict:
    """Every 6th layer full (llama.cpp's hard-coded pattern), local rope theta 10000 unless the
    file says (rope.freq_base_swa); no window written (or 0): every layer full, as llama.cpp."""
    window = f.arch_value("attention.sliding_window")
    out = {"query_pre_attn_scalar": gemma_scale(62)(f, layer), "sliding_window_pattern": 6,
           "rope_local_base_freq": f.arch_value("rope.freq_base_swa", 10000.0)}
    if window:
        return {**out, "sliding_window": window}
    return {**out, "layer_types": ["full_attention"] * f.require("block_count")}


GEMMA3N_SHARED_FROM = 20  # llama.cpp's n_layer_kv_from_start for gemma3n (hard-coded)


def gemma3n(f: GGUFFile, layer: int) -> dict:
    """Gemma 3n as llama.cpp runs it (hard-coded, whatever the file's pattern array and
    shared_kv_layers say): every 5th layer full, the others sliding (rope.freq_base_swa, default
    10000); the layers from 20 on attend with layer 18's (sliding) or 19's (full) keys and
    values — transformers' rule gives the same sources for that split."""
    count = f.require("block_count")
    return {"layer_types": ["full_attention" if i % 5 == 4 else "sliding_attention"
                            for i in range(count)],
            "num_kv_shared_layers": max(count - GEMMA3N_SHARED_FROM, 0),
            "sliding_window": f.require("attention.sliding_window"),
            "rope_local_base_freq": f.arch_value("rope.freq_base_swa", 10000.0)}


def phi3(f: GGUFFile, layer: int) -> dict:
    """A window of 0 means none (the converter writes 0 for Phi-4)."""
    return {"sliding_window": f.arch_value("attention.sliding_window") or None}


def olmo(f: GGUFFile, layer: int) -> dict:
    """OLMo: q, k, v clamped to attention.clamp_kqv (written from clip_qkv). llama.cpp's olmo
    has no attention biases (the converter permutes q/k weights only)."""
    if any(_has(f, layer, f"attn_{n}.bias") for n in ("q", "k", "v", "output")):
        raise UsageError(f"{f.path}: attention biases in an olmo file are not read (llama.cpp's "
                         "olmo has none)")
    return {"clip_qkv": f.arch_value("attention.clamp_kqv") or None}


def olmo2(f: GGUFFile, layer: int) -> dict:
    """OLMo 2: every layer full; OLMo 3 (olmo2 with a window: sliding layers, a rope of their
    own) is refused."""
    if f.arch_value("attention.sliding_window"):
        raise UsageError(f"{f.path}: an olmo2 file with a sliding window (OLMo 3) is not read: "
                         "export from the Hugging Face checkpoint")
    return {}


def olmoe(f: GGUFFile, layer: int) -> dict:
    """OLMoE: llama.cpp clamps nothing (its olmoe reads no clamp_kqv)."""
    return {"clip_qkv": None}


def granite(f: GGUFFile, layer: int) -> dict:
    """Granite: the softmax scale is attention.scale (attention_multiplier), else llama.cpp's
    1 / sqrt(head_dim); rope.scaling.finetuned false turns its rope off: refused."""
    if f.arch_value("rope.scaling.finetuned") is False:
        raise UsageError(f"{f.path}: a granite file without rope (rope.scaling.finetuned false) "
                         "is not read")
    return {"attention_multiplier": f.arch_value("attention.scale")
            or _head_dim(f, layer) ** -0.5}


def layer_norm_qk(key: str) -> Extra:
    """StableLM (qk_layernorm), Command R (use_qk_norm): LayerNorm q/k norms when the file has
    them, attention.layer_norm_epsilon their epsilon."""
    return lambda f, layer: _present(
        **{key: _has(f, layer, "attn_q_norm.weight")},
        layer_norm_eps=f.arch_value("attention.layer_norm_epsilon"))


def cohere2(f: GGUFFile, layer: int) -> dict:
    """Cohere 2: the window as written, every n-th layer full (llama.cpp's period); one rope
    base."""
    _one_rope_base(f)
    return {"sliding_window": f.require("attention.sliding_window"),
            "sliding_window_pattern": _swa_period(f)}


def exaone4(f: GGUFFile, layer: int) -> dict:
    """EXAONE 4: llama.cpp slides only in the 64-layer (32B) model (window 4096 unless written,
    every n-th layer full, those NoPE); other sizes attend fully and rotate on every layer."""
    if f.require("block_count") != 64:
        return {"sliding_window": None}
    _one_rope_base(f)
    return {"sliding_window": f.arch_value("attention.sliding_window", 4096),
            "sliding_window_pattern": _swa_period(f)}


def glm4(f: GGUFFile, layer: int) -> dict:
    """GLM-4: its vision models' M-RoPE (rope.dimension_sections, q/k rows moved for it) is
    refused."""
    if f.arch_value("rope.dimension_sections") is not None:
        raise UsageError(f"{f.path}: GLM-4's M-RoPE (rope.dimension_sections) is not read")
    return {}


def glm4moe(f: GGUFFile, layer: int) -> dict:
    """GLM-4.5: q/k norms where the file has them (no key says use_qk_norm); its last
    nextn_predict_layers blocks are multi-token-prediction layers, which neither llama.cpp nor
    transformers runs as decoder layers (refused); M-RoPE refused as GLM-4's."""
    count = f.require("block_count") - f.arch_value("nextn_predict_layers", 0)
    if layer >= count:
        raise UsageError(f"{f.path}: layer {layer} is a next-token-prediction (MTP) layer, not "
                         f"one of the {count} decoder layers")
    return {**glm4(f, layer), "num_hidden_layers": count,
            "use_qk_norm": _has(f, layer, "attn_q_norm.weight")}


def afmoe(f: GGUFFile, layer: int) -> dict:
    """AFMoE as llama.cpp runs it: every 4th layer full and NoPE (hard-coded), the others
    rotating and sliding within attention.sliding_window (none written: every layer attends
    fully, still NoPE every 4th); one rope base."""
    _one_rope_base(f)
    return {"global_attn_every_n_layers": 4, "layer_types": None,
            "sliding_window": f.arch_value("attention.sliding_window") or None}


def lfm2(f: GGUFFile, layer: int) -> dict:
    """LFM2: the converter marks its short-convolution layers with head_count_kv 0 (a per-layer
    array); the others attend fully (a sliding window, the audio tokenizer's, refused)."""
    if f.arch_value("attention.sliding_window"):
        raise UsageError(f"{f.path}: an lfm2 file with a sliding window is not read")
    kv = f.require("attention.head_count_kv")
    kinds = [FULL if n else "conv" for n in (kv if isinstance(kv, list)
                                              else [kv] * f.require("block_count"))]
    return {"layer_types": kinds, "norm_eps": f.arch_value("attention.layer_norm_rms_epsilon")}


def qwen3next(f: GGUFFile, layer: int) -> dict:
    """Qwen3-Next: every full_attention_interval-th layer attends (llama.cpp's rule: the
    others are linear attention, refused as the family refuses them)."""
    return {"full_attention_interval": f.arch_value("full_attention_interval", 4),
            "layer_types": None}


def mpt(f: GGUFFile, layer: int) -> dict:
    """MPT: its own config.json spelling, q/k/v clamped to attention.clamp_kqv. transformers
    applies ALiBi with a bias max of 8 on every layer and reads no kv heads, biases or q/k
    norms: a file whose llama.cpp layer has any other is refused."""
    heads = f.require("attention.head_count", layer)
    differ = {"ALiBi with another max bias than 8":
              f.arch_value("attention.max_alibi_bias", 0.0) != 8.0,
              "fewer key/value heads": f.arch_value("attention.head_count_kv", heads,
                                                    layer) != heads,
              "attention biases": _has(f, layer, "attn_qkv.bias"),
              "q/k norms": _has(f, layer, "attn_q_norm.weight")}
    for what, on in differ.items():
        if on:
            raise UsageError(f"{f.path}: an mpt layer with {what} is not read (transformers' MPT "
                             "attention has none)")
    return {"n_heads": heads, "d_model": f.require("embedding_length"),
            "n_layers": f.require("block_count"), "max_seq_len": f.arch_value("context_length"),
            "attn_config": {"clip_qkv": f.arch_value("attention.clamp_kqv") or None}}


def mistral3_rope(f: GGUFFile) -> Optional[dict]:
    """Ministral 3 as llama.cpp runs it: yarn with mscale 1 and mscale_all_dim the converter's
    rope.scaling.yarn_log_multiplier; queries scaled by position (attention.temperature_scale,
    llama_4_scaling_beta) over the original context. A yarn attention or extrapolation factor,
    which llama.cpp does not read, is refused."""
    if f.arch_value("rope.scaling.type", "none") != "yarn":
        return _rope_scaling(f)
    unread = [k for k in ("yarn_attn_factor", "yarn_ext_factor")
              if f.arch_value(f"rope.scaling.{k}") is not None]
    if unread:
        raise UsageError(f"{f.path}: rope.scaling.{unread[0]} is not read by llama.cpp's mistral3 "
                         "(transformers would apply it)")
    original = f.require("rope.scaling.original_context_length")
    return _present(rope_type="yarn", factor=f.require("rope.scaling.factor"),
                    original_max_position_embeddings=original, mscale=1.0,
                    mscale_all_dim=f.arch_value("rope.scaling.yarn_log_multiplier"),
                    beta_fast=f.arch_value("rope.scaling.yarn_beta_fast"),
                    beta_slow=f.arch_value("rope.scaling.yarn_beta_slow"),
                    llama_4_scaling_beta=f.arch_value("attention.temperature_scale"))


def seed_oss(f: GGUFFile, layer: int) -> dict:
    """Seed-OSS: the output bias is a key of its own."""
    return {"attention_out_bias": _has(f, layer, "attn_output.bias")}


def smollm3(f: GGUFFile, layer: int) -> dict:
    """SmolLM3: llama.cpp's every 4th layer NoPE (hard-coded), no window."""
    return {"no_rope_layer_interval": 4, "use_sliding_window": False}


def llama4(f: GGUFFile, layer: int) -> dict:
    """Llama 4 as llama.cpp runs it (llama-model.cpp): chunks of 8192 and temperature tuning
    (attn_scale 0.1, floor_scale 8192) hard-coded, every n-th layer (sliding_window_pattern,
    default 4) NoPE and full, the q/k norm unless the file has 128 experts; one rope base. A
    sliding_window of 0 (MobileLLM) is refused: llama.cpp then leaves its last layer unrotated
    with no temperature length."""
    if f.arch_value("attention.sliding_window") == 0:
        raise UsageError(f"{f.path}: a llama4 file without chunks (attention.sliding_window 0) "
                         "is not read")
    _one_rope_base(f)
    return {"no_rope_layer_interval": _swa_period(f), "attention_chunk_size": 8192,
            "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
            "use_qk_norm": f.arch_value("expert_count") != 128}


def bloom(f: GGUFFile, layer: int) -> dict:
    """BLOOM: its own config.json spelling. llama.cpp's ALiBi (max bias 8, ggml's slopes) is
    the paper's sequence, as transformers computes it."""
    return {"n_head": f.require("attention.head_count", layer),
            "n_layer": f.require("block_count")}


def falcon(f: GGUFFile, layer: int) -> dict:
    """Falcon: the converter stacks query_key_value's rows as query, key, value (head_count_kv
    key heads, any layout it came from); biases on all four or none."""
    heads = f.require("attention.head_count", layer)
    return {"new_decoder_architecture": True, "alibi": False,
            "num_kv_heads": f.arch_value("attention.head_count_kv", heads, layer)}


def starcoder(f: GGUFFile, layer: int) -> dict:
    """StarCoder (gpt_bigcode): one key/value head (the converter writes 1, llama.cpp reads
    c_attn so), scores scaled by 1 / sqrt(head_dim)."""
    if f.arch_value("attention.head_count_kv", 1, layer) != 1:
        raise UsageError(f"{f.path}: a starcoder file with several key/value heads is not read")
    return {"n_head": f.require("attention.head_count", layer), "multi_query": True,
            "n_embd": f.require("embedding_length"), "n_layer": f.require("block_count"),
            "n_positions": f.arch_value("context_length"), "scale_attn_weights": True}


def dbrx(f: GGUFFile, layer: int) -> dict:
    """DBRX: its own config.json spelling; q, k, v clamped to attention.clamp_kqv."""
    heads = f.require("attention.head_count", layer)
    return {"n_heads": heads, "d_model": f.require("embedding_length"),
            "n_layers": f.require("block_count"), "max_seq_len": f.arch_value("context_length"),
            "attn_config": {"kv_n_heads": f.arch_value("attention.head_count_kv", heads, layer),
                            "clip_qkv": f.arch_value("attention.clamp_kqv") or None}}


LLAMA_TENSORS = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value",
                 "o_proj": "out_proj"}

ARCHITECTURES: dict[str, GGUFArch] = {
    "llama": GGUFArch("llama", permuted=True),  # Llama, SmolLM2, Mistral (the converter's)
    "qwen2": GGUFArch("qwen2", extra=full_attention),
    "qwen3": GGUFArch("qwen3", extra=full_attention),
    "qwen3moe": GGUFArch("qwen3_moe", extra=full_attention),
    "gemma2": GGUFArch("gemma2", norm_shift=1.0, extra=gemma2),
    "gemma3": GGUFArch("gemma3_text", norm_shift=1.0, extra=gemma3),
    "phi3": GGUFArch("phi3", extra=phi3),
    "qwen2moe": GGUFArch("qwen2_moe", extra=full_attention, bias="qkv_bias"),
    "starcoder2": GGUFArch("starcoder2", extra=no_window, bias="use_bias"),
    "olmo": GGUFArch("olmo", permuted=True, extra=olmo),
    "olmo2": GGUFArch("olmo2", extra=olmo2),
    "olmoe": GGUFArch("olmoe", extra=olmoe),
    "granite": GGUFArch("granite", permuted=True, extra=granite),
    "arcee": GGUFArch("arcee", permuted=True),
    "smollm3": GGUFArch("smollm3", permuted=True, extra=smollm3),
    "llama4": GGUFArch("llama4_text", extra=llama4),  # the converter's undo_permute = False
    "apertus": GGUFArch("apertus"),  # the converter's undo_permute = False
    "seed_oss": GGUFArch("seed_oss", extra=seed_oss),
    "hunyuan-dense": GGUFArch("hunyuan_v1_dense"),  # rope.freq_base: alpha already applied
    "dots1": GGUFArch("dots1", extra=no_window),
    "gemma": GGUFArch("gemma", norm_shift=1.0),
    "nemotron": GGUFArch("nemotron", norm_shift=1.0),  # LayerNorm1P: 1 + w (none in attention)
    "ernie4_5": GGUFArch("ernie4_5", bias="use_bias"),
    "glm4": GGUFArch("glm4", extra=glm4),
    "glm4moe": GGUFArch("glm4_moe", extra=glm4moe),
    "ernie4_5-moe": GGUFArch("ernie4_5_moe", bias="use_bias"),
    "minimax-m2": GGUFArch("minimax_m2"),  # (its converter may write rope.freq_base_swa -1)
    "afmoe": GGUFArch("afmoe", extra=afmoe),  # the converter skips LlamaModel's permute
    "command-r": GGUFArch("cohere", extra=layer_norm_qk("use_qk_norm")),
    "cohere2": GGUFArch("cohere2", extra=cohere2),
    "exaone4": GGUFArch("exaone4", extra=exaone4),
    "stablelm": GGUFArch("stablelm", extra=layer_norm_qk("qk_layernorm"), bias="use_qkv_bias",
                         tensors={**LLAMA_TENSORS, "q_layernorm": "q_norm",
                                  "k_layernorm": "k_norm"}),  # per-head norms stacked (N, H)
    "phi2": GGUFArch("phi", extra=layer_norm_qk("qk_layernorm")),
    "bitnet": GGUFArch("bitnet", tensors={**LLAMA_TENSORS, "inner_attn_ln": "out_norm"}),
    "falcon": GGUFArch("falcon", extra=falcon, bias="bias", prefix="transformer.",
                       tensors={"query_key_value": "qkv_proj", "dense": "out_proj"},
                       convert=qkv_rows_convert),
    "starcoder": GGUFArch("gpt_bigcode", extra=starcoder, prefix="transformer."),
    "bloom": GGUFArch("bloom", extra=bloom, prefix="transformer.",
                      tensors={"query_key_value": "qkv_proj", "dense": "out_proj"},
                      convert=with_slopes(paper_slopes, qkv_rows_convert)),  # [q; k; v]
    "dbrx": GGUFArch("dbrx", extra=dbrx, prefix="transformer."),
    "lfm2": GGUFArch("lfm2", extra=lfm2),
    # Ministral 3 (its converter permutes q/k as LlamaModel's); llama.cpp has no window
    "mistral3": GGUFArch("ministral3", permuted=True, extra=no_window, rope=mistral3_rope),
    "qwen3next": GGUFArch("qwen3_next", norm_shift=1.0, extra=qwen3next),  # q/k norms: 1 + w
    "mpt": GGUFArch("mpt", extra=mpt, prefix="transformer."),
    "gemma3n": GGUFArch("gemma3n_text", extra=gemma3n),  # norms stored as w (no shift)
}
# Architectures whose layers do not map onto a family cleanly: refused, saying why.
MLA_STORED = ("Multi-head Latent Attention as llama.cpp stores it (kv_b_proj split into "
              "transposed k_b/v_b, yarn's mscale folded into a log multiplier) is not read")
FROM_HF = ": export from the Hugging Face checkpoint"
REFUSED = {
    "deepseek2": MLA_STORED + FROM_HF,
    "kimi-linear": MLA_STORED + FROM_HF,
    "glm-dsa": MLA_STORED + " (nor the lightning indexer beside it)" + FROM_HF,
    "phimoe": ("llama.cpp's phimoe differs from transformers' PhiMoE attention: the converter's "
               "longrope attention factor instead of short_mscale / long_mscale, factors "
               "chosen by context size, no sliding window" + FROM_HF),
    "mimo2": ("llama.cpp's mimo2 never applies MiMo's attention_value_scale, which "
              "transformers does" + FROM_HF),
    "gemma4": ("Gemma 4 as llama.cpp stores it (sliding layers' own head width key_length_swa, "
               "the proportional rope as rope_freqs factors) is not read" + FROM_HF),
}


def supported_architectures() -> str:
    return ", ".join(ARCHITECTURES)


def _architecture(f: GGUFFile) -> GGUFArch:
    if f.arch in REFUSED:
        raise UsageError(f"{f.path}: GGUF architecture {f.arch!r}: {REFUSED[f.arch]}")
    if f.arch not in ARCHITECTURES:
        raise UsageError(f"{f.path}: unsupported GGUF architecture {f.arch!r} (supported: "
                         f"{supported_architectures()})")
    return ARCHITECTURES[f.arch]


# Metadata -> config.json ------------------------------------------------------------------------

def _head_dim(f: GGUFFile, layer: int) -> int:
    """attention.key_length, else n_embd / n_head (llama.cpp's default)."""
    return f.arch_value("attention.key_length") or (
        f.require("embedding_length") // f.require("attention.head_count", layer))


def _rope_scaling(f: GGUFFile) -> Optional[dict]:
    """rope_scaling from rope.scaling.*: none, linear, yarn, or longrope (Phi-3), whose factors
    are tensors (rope_factors_long / _short). Llama 3's scaling is stored only as per-frequency
    factors (rope_freqs): refused."""
    if "rope_freqs.weight" in f.tensors:
        raise UsageError(f"{f.path}: its rope scaling is stored as per-frequency factors "
                         "(rope_freqs, Llama 3's llama3 scaling), which is not read: export from "
                         "the Hugging Face checkpoint")
    kind = f.arch_value("rope.scaling.type", "none")
    factors = {n: f.tensors.get(f"rope_factors_{n}.weight") for n in ("long", "short")}
    if None not in factors.values():
        return {"rope_type": "longrope", **{
            f"{n}_factor": dequantized(_raw(t, None), f.path).tolist() for n, t in factors.items()},
            **_present(attention_factor=f.arch_value("rope.scaling.attn_factor"))}
    if kind == "none":
        return None
    factor = f.arch_value("rope.scaling.factor")
    if kind == "linear" and factor == 1.0:  # BitNet's converter writes it: no scaling
        return None
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": factor}
    tuned = [k for k in ("yarn_attn_factor", "yarn_log_multiplier", "yarn_ext_factor")
             if f.arch_value(f"rope.scaling.{k}") is not None]
    if kind == "yarn" and factor and not tuned:
        return {"rope_type": "yarn", "factor": factor, **_present(  # original: top-level
            beta_fast=f.arch_value("rope.scaling.yarn_beta_fast"),
            beta_slow=f.arch_value("rope.scaling.yarn_beta_slow"))}
    raise UsageError(f"{f.path}: rope scaling {kind!r} with {', '.join(tuned) or 'no factor'} is "
                     "not read")


def _config(f: GGUFFile, arch: GGUFArch, layer: int, biases: bool) -> dict:
    """The config.json a Hugging Face checkpoint of the layer would have (the keys its family
    reads), from the metadata llama.cpp's converter wrote and its runtime's defaults."""
    heads = f.require("attention.head_count", layer)
    head_dim = _head_dim(f, layer)
    if f.arch_value("attention.value_length", head_dim) != head_dim:
        raise UsageError(f"{f.path}: value heads of another width than key heads "
                         f"({f.arch_value('attention.value_length')} vs {head_dim}) are not read")
    config = _present(
        model_type=arch.model_type, num_hidden_layers=f.require("block_count"),
        hidden_size=f.require("embedding_length"), num_attention_heads=heads,
        num_key_value_heads=f.arch_value("attention.head_count_kv", heads, layer),
        head_dim=head_dim, rope_theta=f.arch_value("rope.freq_base", 10000.0),  # llama.cpp's
        partial_rotary_factor=f.arch_value("rope.dimension_count", head_dim) / head_dim,
        rope_scaling=(arch.rope or _rope_scaling)(f), rms_norm_eps=f.arch_value(
            "attention.layer_norm_rms_epsilon"),
        max_position_embeddings=f.arch_value("context_length"), **{arch.bias: biases},
        original_max_position_embeddings=f.arch_value("rope.scaling.original_context_length"))
    return {**config, **arch.extra(f, layer)}


# One layer --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def _opened(path: Path, mtime_ns: int, size: int) -> GGUFFile:
    """One reader per file version: opening parses the whole metadata (a 49152-token
    vocabulary: ~1.7 s), and an evaluation reads every layer of one file."""
    return GGUFFile(path)


def gguf_layer_count(path: str | Path) -> int:
    """``{arch}.block_count`` from the header alone (gguf_header.py: a layer range is refused
    before the vocabulary is parsed); a header it cannot read goes to gguf-py's reader, which
    says what is wrong."""
    try:
        values = header_scalars(path)
        return int(values[f"{values['general.architecture']}.block_count"])
    except (HeaderError, OSError, KeyError, ValueError):
        return int(open_gguf(path).require("block_count"))


def open_gguf(path: str | Path) -> GGUFFile:
    path = Path(path).resolve()
    if not path.is_file():
        raise UsageError(f"weights file not found: {path}")
    stat = path.stat()
    return _opened(path, stat.st_mtime_ns, stat.st_size)


def _open_layer(path: str | Path, layer: Optional[int]) -> tuple[GGUFFile, GGUFArch, Family]:
    f = open_gguf(path)
    arch = _architecture(f)
    require_layer(layer, f.require("block_count"), f"{f.path} is a GGUF {f.arch} model", "file")
    return f, arch, FAMILIES[arch.model_type]


def _name_map(f: GGUFFile, layer: int) -> Any:
    """gguf's map of Hugging Face tensor names to the file's (the converter's), blocks 0..layer."""
    gguf = _gguf()
    kind = next((k for k, name in gguf.MODEL_ARCH_NAMES.items() if name == f.arch), None)
    if kind is None:
        raise UsageError(f"{f.path}: gguf {_version()} does not know architecture {f.arch!r}: "
                         f"{INSTALL} --upgrade")
    return gguf.get_tensor_name_map(kind, layer + 1)


def _rows(f: GGUFFile, arch: GGUFArch, module: str, tensor: Any, layer: int
          ) -> Optional[np.ndarray]:
    """Where each Hugging Face row of a permuted q/k tensor is stored; None: as stored."""
    if not arch.permuted or module not in ("q_proj", "k_proj"):
        return None
    heads = f.require("attention.head_count", layer)
    if module == "k_proj":
        heads = f.arch_value("attention.head_count_kv", heads, layer)
    return unpermute(np.arange(int(tensor.shape[-1])), heads)


# the attention's own tensors in llama.cpp's names; one the family does not read is refused
ATTENTION_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "attn_q_norm",
                     "attn_k_norm", "attn_sub_norm", "attn_gate", "attn_sinks")


def _layer_tensors(f: GGUFFile, arch: GGUFArch, family: Family, layer: int
                   ) -> dict[str, RawTensor]:
    """The layer's attention tensors under our module names (the family's "W_query.weight",
    "qkv_proj.weight", ...): each family module's Hugging Face name through gguf's name map."""
    names = _name_map(f, layer)
    found = {}
    for module, ours in (arch.tensors or family.tensors).items():
        base = names.get_name(f"{arch.prefix}{family.attention.format(layer=layer)}.{module}")
        for part in ("weight", "bias"):
            tensor = f.tensors.get(f"{base}.{part}") if base else None
            if tensor is not None:
                found[f"{ours}.{part}"] = _raw(tensor, _rows(f, arch, module, tensor, layer))
    if not found:
        raise UsageError(f"{f.path}: no attention tensors for layer {layer}")
    ours = re.compile(rf"blk\.{layer}\.({'|'.join(ATTENTION_TENSORS)})\.\w+")
    unread = sorted(set(filter(ours.fullmatch, f.tensors)) - {t.name for t in found.values()})
    if unread:  # a fused qkv where the family reads q, k, v; a per-tensor scale (BitNet's)
        raise UsageError(f"{f.path}: {', '.join(unread)} not read for a GGUF {f.arch} layer: "
                         "export from the Hugging Face checkpoint")
    return found


def layer_raw_tensors(path: str | Path, layer: int) -> dict[str, RawTensor]:
    """The layer's attention tensors as the file stores them (quantized blocks, llama.cpp's row
    order, Gemma's norms as 1 + w), under our module names before the family's conversion
    (Phi-3: "qkv_proj.weight", its query, key and value rows stacked)."""
    f, arch, family = _open_layer(path, layer)
    return _layer_tensors(f, arch, family, layer)


def read_gguf_layer(path: str | Path, layer: Optional[int]) -> tuple[dict, dict, dict]:
    """(MHAConfig fields, state dict in their layout, source description) of one layer, as
    ``huggingface.read_layer`` gives them for a checkpoint folder."""
    import torch
    f, arch, family = _open_layer(path, layer)
    _require_attention(f, arch, family, layer)
    raw = _layer_tensors(f, arch, family, layer)
    config = _config(f, arch, layer, any(name.endswith(".bias") for name in raw))
    fields = layer_fields(f.path, family, config, layer)
    _check_stacked(f, fields, raw)
    named = {}
    for name, tensor in raw.items():
        values = dequantized(tensor, f.path)
        if tensor.name.endswith("norm.weight"):  # the converter's rule
            values = values - np.float32(arch.norm_shift)  # Gemma's 1 + w
        named[name] = torch.from_numpy(values)
    source = {"kind": "gguf", "path": str(f.path), "architecture": f.arch,
              "model_type": family.model_type, "layer": layer,
              "max_position_embeddings": config.get(family.context),
              "tensor_types": {t.name.split(".", 2)[2]: t.ggml_type for t in raw.values()}}
    return fields, (arch.convert or family.convert)(fields, named), source


def _require_attention(f: GGUFFile, arch: GGUFArch, family: Family, layer: int) -> None:
    """A layer that is not attention (LFM2's convolutions) is said first, in the family's one
    line naming the nearest attention layers; any other problem the read itself reports."""
    try:
        layer_fields(f.path, family, _config(f, arch, layer, False), layer)
    except NotAttentionLayer:
        raise
    except UsageError:
        pass


def gguf_non_attention_layers(path: str | Path, layers: Iterable[int]) -> dict[int, str]:
    """Which of ``layers`` are not softmax attention (LFM2's convolutions, Qwen3-Next's linear
    attention), by type; the metadata alone."""
    f = open_gguf(path)
    arch = _architecture(f)
    family, kinds = FAMILIES[arch.model_type], {}
    for layer in layers:
        try:
            layer_fields(f.path, family, _config(f, arch, layer, False), layer)
        except NotAttentionLayer as e:
            kinds[layer] = e.kind
    return kinds


def _check_stacked(f: GGUFFile, fields: dict, raw: dict[str, RawTensor]) -> None:
    """A stacked qkv_proj (query, key, value rows) has the rows the heads say (a StarCoder file
    converted from a checkpoint with several key/value heads does not)."""
    qkv = raw.get("qkv_proj.weight")
    rows = (fields["heads"] + 2 * fields["kv_heads"]) * fields["head_dim"]
    if qkv is not None and qkv.shape[0] != rows:
        raise UsageError(f"{f.path}: {qkv.name} has {qkv.shape[0]} rows, not the {rows} of "
                         f"{fields['heads']} query and {fields['kv_heads']} key/value heads")
