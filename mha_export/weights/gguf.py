"""GGUF files (llama.cpp's format): one layer's attention, read through the Hugging Face families.

    --weights FILE.gguf --layer N

A GGUF file holds key-value metadata (``llama.attention.head_count``, ...) and tensors named
``blk.N.attn_q.weight``, ``blk.N.attn_output.weight``, ... stored as llama.cpp's converter
(``convert_hf_to_gguf.py``) wrote them: quantized in blocks (Q4_1, Q8_0, K-quants, ...), with the
``llama`` architecture's (and the converter's other LlamaModels') query/key rows permuted for
llama.cpp's rotary kernel, Gemma's and Nemotron's norm weights stored as ``1 + w``, Falcon's
query_key_value regrouped. This module maps the metadata onto the config.json keys of the
Hugging Face model type the architecture came from (one ``GGUFArch`` record per
``general.architecture``, kept beside its family: each families/ module's ``GGUF``, see
families/gguf_common.py; where the file says nothing, llama.cpp's runtime rules), finds the
layer's tensors with gguf's own name map (the inverse of the one the converter used),
dequantizes them to float32 with ``gguf.quants``, undoes the converter's permutation and norm
shift, and hands both to that model type's ``families.Family`` (its ``fields`` and
``convert``): the attention math lives in families/ only. Only the chosen layer's tensors are
read (``gguf.GGUFReader`` memory-maps the file).

``layer_raw_tensors`` gives the same tensors as stored (type, shape, blocks), for exporting the
file's own quantization. The ``gguf`` package (llama.cpp's gguf-py) is needed for .gguf files only.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from ..errors import NotAttentionLayer, UsageError
from .families import FAMILIES, GGUF, GGUF_REFUSED, Family
from .families.gguf_common import GGUFArch, Metadata, head_dim, present
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


# Architectures: the families' records (each family module's GGUF and GGUF_REFUSED) ----------

ARCHITECTURES: dict[str, GGUFArch] = GGUF
REFUSED: dict[str, str] = GGUF_REFUSED


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
            **present(attention_factor=f.arch_value("rope.scaling.attn_factor"))}
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
        return {"rope_type": "yarn", "factor": factor, **present(  # original: top-level
            beta_fast=f.arch_value("rope.scaling.yarn_beta_fast"),
            beta_slow=f.arch_value("rope.scaling.yarn_beta_slow"))}
    raise UsageError(f"{f.path}: rope scaling {kind!r} with {', '.join(tuned) or 'no factor'} is "
                     "not read")


def _shape(f: Metadata, layer: int) -> dict:
    """The config.json keys of the attention's shape: heads of one width (key_length, else
    n_embd / n_head), values of the same width, the rotated fraction."""
    heads, width = f.require("attention.head_count", layer), head_dim(f, layer)
    if f.arch_value("attention.value_length", width) != width:
        raise UsageError(f"{f.path}: value heads of another width than key heads "
                         f"({f.arch_value('attention.value_length')} vs {width}) are not read")
    return {"num_attention_heads": heads, "head_dim": width,
            "num_key_value_heads": f.arch_value("attention.head_count_kv", heads, layer),
            "partial_rotary_factor": f.arch_value("rope.dimension_count", width) / width}


def _config(f: GGUFFile, arch: GGUFArch, layer: int, biases: bool) -> dict:
    """The config.json a Hugging Face checkpoint of the layer would have (the keys its family
    reads), from the metadata llama.cpp's converter wrote and its runtime's defaults."""
    rope = arch.rope(f, _rope_scaling) if arch.rope else _rope_scaling(f)
    config = present(
        model_type=arch.model_type, num_hidden_layers=f.require("block_count"),
        hidden_size=f.require("embedding_length"), **(arch.shape or _shape)(f, layer),
        rope_theta=f.arch_value("rope.freq_base", 10000.0),  # llama.cpp's
        rope_scaling=rope, rms_norm_eps=f.arch_value("attention.layer_norm_rms_epsilon"),
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
    # the projections' biases (a sparse indexer's key norm, a LayerNorm, has one of its own)
    biases = any(n.endswith(".bias") and not n.startswith("indexer.") for n in raw)
    config = _config(f, arch, layer, biases)
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
    if qkv is None:
        return
    rows = (fields["heads"] + 2 * fields["kv_heads"]) * fields["head_dim"]
    if qkv.shape[0] != rows:
        raise UsageError(f"{f.path}: {qkv.name} has {qkv.shape[0]} rows, not the {rows} of "
                         f"{fields['heads']} query and {fields['kv_heads']} key/value heads")
