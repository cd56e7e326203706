"""``mha-export capture``: each chosen layer's real attention input — the hidden states after
the layer's input norm, as its attention module receives them — on a real text, written as
``layers.{L}.x`` float32 [sequences, tokens, d_in] to a safetensors file (``check --inputs``,
``--calibration``).

The text is tokenized once with the checkpoint tokenizer's defaults; sequence s is tokens
[s*N, (s+1)*N), each run from position 0 as its own sequence (one batch, no padding).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..address import Address, address_key, split_address
from ..artifact import readable
from ..errors import UsageError
from .loading import LoadedModel, attention_at, decoder_layers, load_model, load_tokenizer, tokenize


@dataclass
class Capture:
    inputs: dict[int, np.ndarray]  # layer -> (S, N, d_in) float32
    token_ids: np.ndarray  # (S, N) int64
    meta: dict  # written as the file's metadata


def read_text(path: str | Path) -> str:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--text {path}: cannot be read as UTF-8 text ({e})") from None
    if not text.strip():
        raise UsageError(f"--text {path}: empty")
    return text


def token_block(tokenizer: Any, text: str, tokens: int, sequences: int = 1,
                where: str = "--text") -> np.ndarray:
    """(sequences, tokens) of the text's token ids; a text too short is bad input (the message
    names --sequences only where it was asked for)."""
    ids = tokenize(tokenizer, text)
    if len(ids) < tokens * sequences:
        raise UsageError(f"{where}: the text has {len(ids)} tokens; "
                         f"{_asked(tokens, sequences)} needs {tokens * sequences}")
    return np.asarray(ids[:tokens * sequences], np.int64).reshape(sequences, tokens)


# every token of a byte-level BPE or SentencePiece tokenizer covers at least one byte of the
# text, but for the special tokens it adds (BOS, EOS, a dummy prefix): a bound on them
TOKENS_WITHOUT_BYTES = 8


def _asked(tokens: int, sequences: int) -> str:
    """The options that set the length (--sequences only where capture was given it)."""
    return f"--tokens {tokens}" + (f" x --sequences {sequences}" if sequences > 1 else "")


def require_layers(layers: Sequence[Address], count: int) -> None:
    bad = [layer for layer in layers if not 0 <= split_address(layer)[0] < count]
    if bad:
        raise UsageError(f"--layers {bad[0]} is out of range: the model has {count} "
                         f"layers (0-{count - 1})")


def checked_before_loading(weights: str | Path, text: str, tokens: int, sequences: int,
                           layers: Sequence[Address]) -> tuple[Any, np.ndarray]:
    """What the checkpoint's header and tokenizer can tell, before the model loads (seconds,
    not tens of them): the layers in range, the text long enough. (tokenizer, token ids)."""
    from ..weights.source import checkpoint_layers
    require_layers(layers, checkpoint_layers(weights))
    size, needed = len(text.encode()), tokens * sequences
    if size + TOKENS_WITHOUT_BYTES < needed:  # known without the tokenizer (tens of seconds
        raise UsageError(f"--text: the text has {size} bytes, at most "  # for a GGUF's)
                         f"{size + TOKENS_WITHOUT_BYTES} tokens; {_asked(tokens, sequences)} "
                         f"needs {needed}")
    tokenizer = load_tokenizer(weights)
    return tokenizer, token_block(tokenizer, text, tokens, sequences)


def capture(loaded: LoadedModel, token_ids: np.ndarray, layers: Sequence[Address]) -> dict:
    """layer address -> its attention input (S, N, d_in) float32, one forward of the whole
    model (an address N.M: module M of layer N, where layers hold several)."""
    import torch
    require_layers(layers, len(decoder_layers(loaded.model)))
    seen: dict[Address, np.ndarray] = {}
    hooks = []
    for layer in layers:
        def keep(module, args, kwargs, layer=layer):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            seen[layer] = x.detach().float().numpy().copy()
        hooks.append(_module_at(loaded, layer).register_forward_pre_hook(keep, with_kwargs=True))
    try:
        with torch.inference_mode():
            loaded.model(input_ids=torch.from_numpy(token_ids), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _module_at(loaded: LoadedModel, layer: Address) -> Any:
    """The attention module at ``layer``; an address past a layer's modules: one line."""
    try:
        return attention_at(loaded.model, layer)
    except (IndexError, TypeError, AttributeError):
        raise UsageError(f"--layers {layer}: the model's layer {split_address(layer)[0]} "
                         "holds no such attention module") from None


def capture_text(weights: str | Path, text_path: str | Path, layers: Sequence[Address],
                 tokens: int = 512, sequences: int = 1,
                 loaded: Optional[LoadedModel] = None) -> Capture:
    """The chosen layers' inputs on the text's first ``tokens`` x ``sequences`` tokens."""
    text = read_text(text_path)
    if loaded is None:
        tokenizer, ids = checked_before_loading(weights, text, tokens, sequences, layers)
        loaded = load_model(weights, tokenizer)
    else:
        ids = token_block(loaded.tokenizer, text, tokens, sequences)
    inputs = capture(loaded, ids, layers)
    meta = {"weights": str(weights), "model_type": loaded.description["model_type"],
            "text": str(text_path), "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "tokens": str(tokens), "sequences": str(sequences),
            "layers": ",".join(map(str, layers)),
            "what": "layers.{L}.x: layer L's attention input (after its input norm), float32 "
                    "[sequences, tokens, d_in]"}
    return Capture(inputs, ids, meta)


def write_capture(result: Capture, output: str | Path) -> Path:
    """The file, written whole or not at all (a temporary file, then renamed)."""
    from safetensors.numpy import save_file
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"layers.{layer}.x": np.ascontiguousarray(x, np.float32)
               for layer, x in sorted(result.inputs.items(),
                                      key=lambda item: address_key(item[0]))}
    tensors["token_ids"] = result.token_ids
    partial = output.with_name(f".{output.name}.partial")
    try:
        save_file(tensors, str(partial), metadata=result.meta)
        readable(partial)
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)
    return output
