"""A whole causal LM and its tokenizer, by transformers (the reference our users trust):
an HF checkpoint folder, or a ``.gguf`` file (transformers' own GGUF loader dequantizes it to
float32). Text is tokenized with the checkpoint tokenizer's defaults.

transformers is an optional extra (``pip install 'mha-export[model]'``): without it, one line.
"""
from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..address import Address, split_address
from ..errors import UsageError

INSTALL = "pip install 'mha-export[model]'"


@dataclass
class LoadedModel:
    model: Any  # transformers' *ForCausalLM, float32, eval mode
    tokenizer: Any
    description: dict  # what was loaded, for reports


def require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError(f"this command runs the whole model with transformers: {INSTALL}"
                         ) from None


def _source(path: Path) -> tuple[Path, dict]:
    """Where transformers loads the checkpoint from, and how (a .gguf: its folder and name)."""
    if path.is_file() and path.suffix == ".gguf":
        from ..weights.gguf import open_gguf
        open_gguf(path)  # a truncated or garbled file: one line, before transformers' loader
        return path.parent, {"gguf_file": path.name}
    if path.is_dir() and (path / "config.json").is_file():
        return path, {}
    raise UsageError(f"--weights {path}: expected a Hugging Face checkpoint folder "
                     "(config.json) or a .gguf file")


@contextlib.contextmanager
def _loading(path: Path) -> Iterator[None]:
    try:
        with _quiet():
            yield
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as e:
        raise UsageError(f"--weights {path}: transformers cannot load it "
                         f"({(str(e).strip().splitlines() or [type(e).__name__])[0][:200]})"
                         ) from None


def load_tokenizer(weights: str | Path) -> Any:
    """The checkpoint's tokenizer alone: seconds, where the model takes tens of them (what
    needs only the text's length is checked with it first)."""
    require_transformers()
    from transformers import AutoTokenizer
    path = Path(weights)
    where, extra = _source(path)
    with _loading(path):
        return AutoTokenizer.from_pretrained(where, **extra)


def load_model(weights: str | Path, tokenizer: Any = None) -> LoadedModel:
    """The checkpoint's causal LM in float32 (eval mode) and its tokenizer (``tokenizer``:
    one already loaded)."""
    require_transformers()
    from transformers import AutoModelForCausalLM
    path = Path(weights)
    where, extra = _source(path)
    quantized = not extra and _is_quantized_folder(path)
    tokenizer = load_tokenizer(path) if tokenizer is None else tokenizer
    with _loading(path):
        model = _dequantized_model(path) if quantized else \
            AutoModelForCausalLM.from_pretrained(where, dtype="float32", **extra)
    model.eval()
    description = {"path": str(path), "model_type": model.config.model_type}
    if quantized:
        description["quantization"] = f"{quantized}, dequantized by its format's definition"
    return LoadedModel(model, tokenizer, description)


def _is_quantized_folder(path: Path) -> str:
    """The format's name of a quantized Hugging Face folder, else '' (a config.json that is
    not JSON: one line)."""
    from ..weights.huggingface import hf_config_path, quantization
    cfg = hf_config_path(path)
    try:
        fmt = quantization(cfg)[0] if cfg else None
    except ValueError as e:
        raise UsageError(f"{cfg}: not valid JSON ({e})") from None
    return fmt.name if fmt else ""


def _dequantized_model(path: Path) -> Any:
    """A quantized folder's model as the float one it stores: transformers builds the
    architecture from config.json (its quantization_config left out) and takes every weight as
    the format's own dequantization (weights/quantized) — on CPU transformers cannot load GPTQ
    or AWQ (GPTQModel) nor FP8 blocks that do not divide a weight."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from ..weights.huggingface import dequantized_state
    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _, state = dequantized_state(path)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()},
                                                strict=False)
    model.tie_weights()
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if unexpected or set(missing) - tied:
        odd = (unexpected or sorted(set(missing) - tied))[0]
        raise UsageError(f"--weights {path}: its dequantized weights do not fit the model "
                         f"config.json describes ({odd})")
    return model


def decoder_layers(model: Any) -> list:
    """The decoder layers of a transformers causal LM (model.model.layers and its kin)."""
    for owner in (getattr(model, "model", None), getattr(model, "transformer", None)):
        for name in ("layers", "h"):
            found = getattr(owner, name, None) if owner is not None else None
            if found is not None:
                return list(found)
    raise UsageError(f"{type(model).__name__}: no decoder layers found (model.layers / "
                     "transformer.h)")


def attention_name(layer: Any) -> str:
    """The attribute holding a decoder layer's attention module."""
    for name in ("self_attn", "attn", "attention", "self_attention"):
        if hasattr(layer, name):
            return name
    raise UsageError(f"{type(layer).__name__}: no attention module (self_attn / attn)")


def attention_of(layer: Any) -> Any:
    return getattr(layer, attention_name(layer))


def attention_slot(model: Any, address: Address) -> tuple[Any, str | int]:
    """Where the attention module at a layer address is held: (its decoder layer, the
    attribute), or for N.M (LongCat-Flash) (layer N's list of attention modules, M)."""
    layer, module = split_address(address)
    block = decoder_layers(model)[layer]
    return (block, attention_name(block)) if module is None else (attention_of(block), module)


def attention_at(model: Any, address: Address) -> Any:
    """The attention module at a layer address."""
    owner, key = attention_slot(model, address)
    return owner[key] if isinstance(key, int) else getattr(owner, key)


def set_attention(model: Any, address: Address, module: Any) -> None:
    """The attention module at a layer address replaced by ``module``."""
    owner, key = attention_slot(model, address)
    if isinstance(key, int):
        owner[key] = module
    else:
        setattr(owner, key, module)


def tokenize(tokenizer: Any, text: str) -> list[int]:
    """The text's token ids with the tokenizer's defaults (special tokens as it adds them)."""
    return list(tokenizer(text)["input_ids"])


@contextlib.contextmanager
def _quiet():
    """transformers' progress bars and notices go to stderr; a CLI run shows its own."""
    level = logging.getLogger("transformers").level
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.getLogger("transformers").setLevel(level)
