"""Named inputs and outputs of an export, declared once (like Optimum's per-model config).

The ONNX builder, the TorchScript entry point, config.json, the runners and the C++ programs all
read a ``Signature``: names, dtypes, shapes with symbolic (dynamic) axes, in call order.

    full      x                                              -> y
    masked    x, attention_mask                              -> y
    kv-cache  x, attention_mask, past_key, past_value        -> y, present_key, present_value
    static-cache  x, past_key, past_value, past_lengths      -> y, present_key, present_value
              (past/present: one app-owned buffer [batch, kv_heads, max_cache, head_dim],
              written in place at past_lengths[b] ...; entries beyond are never read)
    (rotary layers add position_ids [batch, seq] as the last input of each)
    (Multi-head Latent Attention: past/present_key hold the normalised latent [batch, 1, ...,
    kv_lora_rank], past/present_value the shared rotated key [batch, 1, ..., qk_rope_head_dim],
    as transformers' DynamicCache holds them)
    (an int8 static cache: past/present hold int8 codes, value = code * scale, with the scales
    of config.json export.kv_cache)

A KV-shared layer (kinds/kv_shared/) reads another layer's keys and values and writes nothing:
each kind above becomes its shared counterpart (SHARED_KINDS), the cache replaced by inputs

    shared            x, shared_key, shared_value                 -> y   (keys of this call)
    shared-masked     x, attention_mask, shared_key, shared_value -> y
    shared-kv-cache   x, attention_mask, shared_key, shared_value -> y   (past_seq + seq keys)
    shared-static-cache  x, shared_key, shared_value, past_lengths -> y  (the source layer's
              buffer [batch, kv_heads, max_cache, head_dim] after its write of this call)

A layer's kind can add inputs to every call (``MHAConfig.extra_inputs``), before position_ids:

    topk_indices      (batch, seq, index_k) int64: a GLM-5 shared-top-k layer's source layer's
                      selection, index_k = min(index_topk, the keys the call reads)

and outputs to every call (``MHAConfig.extra_outputs``), after its kind's:

    topk_indices      (batch, seq, index_k) int64: a GLM-5 DSA layer's own selection that later
                      shared layers read, best first (transformers' returned top-k)

A layer's kind can put its own cache tensors in place of past/present key and value (its
section's ``cache_tensors``; ``Signature.axis_sizes`` sizes their axes): DeepSeek-V4's

    kv-cache  x, attention_mask, past_key, past_<state>...   -> y, present_key, present_<state>...
              (past_key [batch, 1, min(past_seq, window - 1), head_dim]: the last rotated
              key = value rows, no past_value; a compressed layer's compressor (CSA: and
              indexer) state past_compressor.buffer_kv ..., docs/deepseek-v4.md)

Adding an input or output: one entry in ``TENSORS`` and its name in the ``KINDS`` that take it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .config import MHAConfig
from .errors import UsageError

FLOAT = "float"  # the model's float dtype (float32, float16 or bfloat16)
BATCH, SEQ, PAST, TOTAL = "batch", "seq", "past_seq", "past_seq + seq"
CACHE = "max_cache"  # the capacity of an app-owned static cache buffer
INDEX_K = "index_k"  # a shared-top-k layer's selected keys per query: min(index_topk, keys)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # FLOAT, "int64" or "int8" (an int8 cache's codes)
    shape: tuple  # ints and symbolic axis names
    doc: str = ""

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "doc": self.doc}


STATIC = "static-cache"
CACHE_NAMES = ("past_key", "past_value", "present_key", "present_value")
INT8 = "int8"
INT8_FLOAT32_ONLY = ("an int8 cache is built for float32 models (queries and accumulation in "
                     "fp32, as GroupQueryAttention's), not {dtype}")


def _cache(c: MHAConfig, kind: str, growing: str, width: int) -> tuple:
    """A cache tensor's shape [batch, heads, length, width]: the length the fixed buffer's
    capacity or the growing cache's; heads and width (1: keys', 2: values') the config's
    ``cache_shape`` (another attention kind's, e.g. MLA's latent and shared rotated key)."""
    shape = c.cache_shape
    return BATCH, shape[0], CACHE if kind == STATIC else growing, shape[width]


TENSORS: dict[str, Callable[[MHAConfig, str], TensorSpec]] = {
    "x": lambda c, kind: TensorSpec("x", FLOAT, (BATCH, SEQ, c.d_in), "this call's tokens"),
    "attention_mask": lambda c, kind: TensorSpec(
        "attention_mask", "int64", (BATCH, TOTAL if kind in CACHED else SEQ),
        "1 = real token, 0 = padding" + (", over the cache and this call"
                                         if kind in CACHED else "")),
    "past_key": lambda c, kind: TensorSpec(
        "past_key", FLOAT, _cache(c, kind, PAST, 1),
        "the key buffer: entries [0, past_lengths[b]) of row b are valid" if kind == STATIC
        else "cached keys; past_seq 0 at prefill"),
    "past_value": lambda c, kind: TensorSpec(
        "past_value", FLOAT, _cache(c, kind, PAST, 2),
        "the value buffer" if kind == STATIC else "cached values"),
    "past_lengths": lambda c, kind: TensorSpec(
        "past_lengths", "int64", (BATCH,),
        "valid cache entries of each row before this call; this call writes the next seq"),
    "position_ids": lambda c, kind: TensorSpec(
        "position_ids", "int64", (BATCH, SEQ), "rotary position of each token of this call"),
    "shared_key": lambda c, kind: TensorSpec(
        "shared_key", FLOAT, (BATCH, c.kv_heads, SHARED_LENGTH[kind], c.head_dim),
        "the keys this call attends with" + SHARED_DOCS[kind]),
    "shared_value": lambda c, kind: TensorSpec(
        "shared_value", FLOAT, (BATCH, c.kv_heads, SHARED_LENGTH[kind], c.value_dim),
        "the values this call attends with" + SHARED_DOCS[kind]),
    "topk_indices": lambda c, kind: TensorSpec(
        "topk_indices", "int64", (BATCH, SEQ, INDEX_K),
        "the key positions each query keeps, of the keys this call reads"),
    "y": lambda c, kind: TensorSpec("y", FLOAT, (BATCH, SEQ, c.dim), "output"),
    "present_key": lambda c, kind: TensorSpec(
        "present_key", FLOAT, _cache(c, kind, TOTAL, 1),
        "the key buffer after this call's write (bind it to past_key's memory: no copy)"
        if kind == STATIC else "past_key + this call's keys"),
    "present_value": lambda c, kind: TensorSpec(
        "present_value", FLOAT, _cache(c, kind, TOTAL, 2),
        "the value buffer after this call's write" if kind == STATIC
        else "past_value + this call's values"),
}
# kind -> (input names, output names), in call order
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "full": (("x",), ("y",)),
    "masked": (("x", "attention_mask"), ("y",)),
    "kv-cache": (("x", "attention_mask", "past_key", "past_value"),
                 ("y", "present_key", "present_value")),
    "static-cache": (("x", "past_key", "past_value", "past_lengths"),
                     ("y", "present_key", "present_value")),
    "shared": (("x", "shared_key", "shared_value"), ("y",)),
    "shared-masked": (("x", "attention_mask", "shared_key", "shared_value"), ("y",)),
    "shared-kv-cache": (("x", "attention_mask", "shared_key", "shared_value"), ("y",)),
    "shared-static-cache": (("x", "shared_key", "shared_value", "past_lengths"), ("y",)),
}
# a KV-shared layer's counterpart of each kind (the CLI's flags name the left ones)
SHARED_KINDS = {"full": "shared", "masked": "shared-masked", "kv-cache": "shared-kv-cache",
                "static-cache": "shared-static-cache"}
CACHED = ("kv-cache", "shared-kv-cache")  # attention_mask covers past_seq + seq
# the shared keys' length, and what they hold, per shared kind
SHARED_LENGTH = {"shared": SEQ, "shared-masked": SEQ, "shared-kv-cache": TOTAL,
                 "shared-static-cache": CACHE}
SHARED_DOCS = {"shared": ": the source layer's of this call's tokens",
               "shared-masked": ": the source layer's of this call's tokens",
               "shared-kv-cache": ": the source layer's present, its cache and this call's "
                                  "(a sliding source's last window - 1 and this call's will "
                                  "do); the queries sit at its last seq entries",
               "shared-static-cache": ": the source layer's buffer after its write of this "
                                      "call; entries [0, past_lengths[b] + seq) of row b are "
                                      "valid"}
# the kinds whose calls follow earlier ones (a past length P: the sweep runs several)
WITH_PAST = ("kv-cache", STATIC, "shared-kv-cache", "shared-static-cache")

AxisSizes = Callable[[int], dict]  # past_seq -> the sizes of a kind's own cache axes


@dataclass(frozen=True)
class Signature:
    kind: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # a kind's own cache's symbolic axes (``kind_cache``): their sizes after past_seq tokens
    axis_sizes: Optional[AxisSizes] = field(default=None, compare=False)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def has_cache(self) -> bool:
        return "past_key" in self.input_names

    @property
    def static_cache(self) -> bool:
        """An app-owned buffer written in place (past_lengths), not a growing cache."""
        return self.kind == STATIC

    @property
    def follows_past(self) -> bool:
        """A call after earlier ones (a cache, or a KV-shared layer's keys of past_seq + seq)."""
        return self.kind in WITH_PAST

    @property
    def shared_kv(self) -> bool:
        """A KV-shared layer's: keys and values are inputs, nothing is written."""
        return self.kind in SHARED_LENGTH

    @property
    def reads_topk(self) -> bool:
        """A shared-top-k layer's: each call takes another layer's selection (topk_indices)."""
        return "topk_indices" in self.input_names

    @property
    def cache_pairs(self) -> list[tuple[str, str]]:
        """(past_<x>, present_<x>) of every cache tensor a call reads and writes, in order."""
        outputs = set(self.output_names)
        return [(n, "present_" + n[len("past_"):]) for n in self.input_names
                if n.startswith("past_") and "present_" + n[len("past_"):] in outputs]

    @property
    def own_cache(self) -> bool:
        """The cache is the kind's own tensors (``kind_cache``), not the call's keys and values."""
        return self.axis_sizes is not None

    def prefill_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """The past_* inputs' shapes at a first call: every symbolic axis but the batch 0."""
        sized = lambda d: batch if d == BATCH else 0 if isinstance(d, str) else d  # noqa: E731
        pasts = dict(self.cache_pairs)
        return {t.name: tuple(sized(d) for d in t.shape) for t in self.inputs if t.name in pasts}

    @property
    def has_mask(self) -> bool:
        return "attention_mask" in self.input_names

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {t.name: t.dynamic_axes for t in (*self.inputs, *self.outputs)}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs],
                "dynamic_axes": self.dynamic_axes}

    def cache_buffer(self, name: str, batch: int, length: int) -> tuple[int, int, int, int]:
        """The concrete shape of cache input ``name`` ("past_key" | "past_value") holding
        ``length`` entries per row: [batch, heads, length, width] as declared."""
        spec = next(t for t in self.inputs if t.name == name)
        return batch, spec.shape[1], length, spec.shape[3]

    @property
    def cache_dtype(self) -> str:
        """FLOAT, or INT8 for a static cache of int8 codes."""
        return next((t.dtype for t in self.inputs if t.name == "past_key"), FLOAT)


def make_signature(config: MHAConfig, kind: str = "full", cache_dtype: str = FLOAT
                   ) -> Signature:
    """``cache_dtype`` INT8: a static cache's buffers hold int8 codes (--kv-cache-dtype int8)."""
    if kind not in KINDS:
        raise UsageError(f"unknown signature {kind!r}: choose one of {', '.join(KINDS)}")
    if cache_dtype not in (FLOAT, INT8):
        raise UsageError(f"unknown cache dtype {cache_dtype!r}: choose {FLOAT} or {INT8}")
    if cache_dtype == INT8 and kind != STATIC:
        raise UsageError(f"an int8 cache needs the static-cache signature (--static-cache), "
                         f"got {kind!r}")
    kind = _layer_kind(config, kind)
    unbuilt = getattr(config.section, "unbuilt_calls", {})  # a kind's calls not built yet
    if kind in unbuilt:
        raise UsageError(unbuilt[kind])
    ins, outs = KINDS[kind]
    own, sizes = kind_cache(config, kind)
    ins, outs = _with_own(ins, own), _with_own(outs, own)
    ins += config.extra_inputs  # the kind's own (a shared-top-k layer's indices)
    outs += config.extra_outputs  # (a DSA layer's selection that shared layers read)
    rotates = config.rotary not in ("none", "unrotated")  # (unrotated: NoPE MLA, Kimi Linear)
    ins += ("position_ids",) if rotates else ()  # rotary layers: the last input
    spec = lambda n: own.get(n) or _documented(  # noqa: E731
        _cached(TENSORS[n](config, kind), cache_dtype), config)
    return Signature(kind, tuple(spec(n) for n in ins), tuple(spec(n) for n in outs),
                     sizes)


def kind_cache(config: MHAConfig, kind: str) -> tuple[dict[str, TensorSpec], Optional[AxisSizes]]:
    """A kind's own cache tensors in place of past/present key and value, where its section
    declares them (``cache_tensors(config, kind, batch)``: past and present (shape, doc) by
    name, and their axes' sizes after past_seq tokens; DeepSeek-V4's key = value rows and
    compressor state), float; none elsewhere."""
    declared = getattr(config.section, "cache_tensors", None)
    found = declared(config, kind, BATCH) if declared else None
    if found is None:
        return {}, None
    past, present, sizes = found
    own = {n: TensorSpec(n, FLOAT, shape, doc)
           for n, (shape, doc) in {**past, **present}.items()}
    return own, sizes


def _with_own(names: tuple[str, ...], own: dict[str, TensorSpec]) -> tuple[str, ...]:
    """names with the cache's (CACHE_NAMES) replaced, in place, by the own cache's past (in
    inputs) or present (in outputs) tensors."""
    cache = [i for i, n in enumerate(names) if n in CACHE_NAMES]
    if not own or not cache:
        return names
    side = "past_" if names[cache[0]].startswith("past_") else "present_"
    mine = tuple(n for n in own if n.startswith(side))
    rest = tuple(n for n in names if n not in CACHE_NAMES)
    return rest[:cache[0]] + mine + rest[cache[0]:]


def _layer_kind(config: MHAConfig, kind: str) -> str:
    """A KV-shared layer's counterpart of a kind (its own names pass); a shared kind is a
    KV-shared layer's only."""
    if config.kind == "kv_shared":
        if kind not in SHARED_KINDS and kind not in SHARED_LENGTH:
            raise UsageError(f"signature {kind!r} is not a KV-shared layer's")
        return SHARED_KINDS.get(kind, kind)
    if kind in SHARED_LENGTH:
        raise UsageError(f"signature {kind!r} is a KV-shared layer's (--kv-shared-layer)")
    return kind


def _documented(t: TensorSpec, config: MHAConfig) -> TensorSpec:
    """A cache tensor says what it holds where the attention kind says (an MLA layer's)."""
    doc = config.cache_docs.get(t.name)
    return t if doc is None else TensorSpec(t.name, t.dtype, t.shape, f"{doc}: {t.doc}")


def _cached(t: TensorSpec, cache_dtype: str) -> TensorSpec:
    """An int8 cache's buffers: int8 codes of the same shape."""
    if cache_dtype == FLOAT or t.name not in CACHE_NAMES:
        return t
    return TensorSpec(t.name, INT8, t.shape,
                      t.doc + "; int8 codes: value = code * scale (config.json export.kv_cache)")


def signature_kind(kv_cache: bool = False, attention_mask: bool = False,
                   static_cache: bool = False) -> str:
    """The CLI's --kv-cache / --static-cache / --attention-mask flags as a signature kind."""
    if sum((kv_cache, attention_mask, static_cache)) > 1:
        raise UsageError("choose one of --kv-cache, --static-cache and --attention-mask")
    return ("kv-cache" if kv_cache else STATIC if static_cache
            else "masked" if attention_mask else "full")


def signature_from_meta(config: MHAConfig, meta: dict) -> Signature:
    """The signature an artifact declares (config.json 'io'); artifacts written before named
    I/O (no 'kind') are full-sequence models."""
    io = meta.get("io", {})
    cache = next((t.get("dtype", FLOAT) for t in io.get("inputs", ())
                  if t.get("name") == "past_key"), FLOAT)
    return make_signature(config, io.get("kind", "full"), cache)
