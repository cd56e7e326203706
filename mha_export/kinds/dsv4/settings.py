"""DeepSeek-V4's attention settings (torch-free): ``DSV4Shape``, one layer's shape (read from a
checkpoint's config.json by weights/families/deepseek_v4.py; docs/deepseek-v4.md says what each
layer type computes), and
``DeepSeekV4``, the section MHAConfig nests (``MHAConfig.dsv4``: the kind "dsv4", layout "dsv4"):
what of the shape MHAConfig's own fields do not hold (dim, heads, head_dim, rotary_dim,
rope_theta, rope_scaling and sliding_window do).

    queries   q_b_proj(RMSNorm(q_a_proj(x))) -> (B, S, H, d), then an unweighted RMSNorm per head
    key=value RMSNorm(kv_proj(x)) -> (B, S, d): one head, the key and the value of every head
    rotary    interleaved pairs on the trailing rope_dim channels (q, kv; inverse on the output)
    attention softmax with a per-head sink column, sliding-window causal mask with padding
    output    grouped low rank: o_groups groups of heads -> o_lora_rank each -> o_b_proj

    compressed  (compressed_sparse_attention, heavily_compressed_attention) windows of ``rate``
              tokens pooled into extra key = value rows; CSA's lightning indexer keeps the top
              ``index_topk`` of them per query

Every layer type is built, full-sequence and cached calls (the growing cache, --kv-cache:
``cache_tensors``; --static-cache is refused, ``UNBUILT_CALLS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ... import rope_types
from ...errors import UsageError, require_positive
from ...layer_option import declared
from ..section import ConfigOnlySection

SLIDING = "sliding_attention"
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
NAME = "DeepSeek-V4 attention"
LAYOUT = "dsv4"  # its one weight layout: transformers' DeepseekV4Attention's tensor names
# the call kinds (signature.py) not built for it: a static cache is one app-owned key buffer
# written at past_lengths, its compressed layers' state is more (``cache_tensors``)
UNBUILT_CALLS = {"static-cache": f"--static-cache is not built for {NAME} yet: its cache is "
                                 "more than one key buffer written in place at past_lengths "
                                 "(a compressed layer's open window and pooled rows, "
                                 "past_lengths % rate and past_lengths // rate of them per "
                                 "row); --kv-cache carries it"}


@dataclass(frozen=True)
class DSV4Shape:
    """One sliding_attention layer of DeepSeek-V4 (V4-Flash's numbers by default)."""

    dim: int = 4096  # hidden_size (D)
    heads: int = 64  # num_attention_heads (H)
    head_dim: int = 512  # d: the query, key and value width of a head
    rope_dim: int = 64  # qk_rope_head_dim: the trailing channels rotated
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    window: int = 128  # sliding_window: a query sees itself and the window - 1 before it
    rope_theta: float = 10000.0  # the "main" rope's (sliding layers), "compress" (the others)
    eps: float = 1e-6  # rms_norm_eps
    layer_type: str = SLIDING  # LAYER_TYPES
    rate: int = 0  # compress_rates[layer_type]: tokens pooled into one row (0: sliding)
    index_heads: int = 0  # CSA's indexer: index_n_heads (Hi)
    index_head_dim: int = 0  # di
    index_topk: int = 0  # k
    rope_scaling: Optional[Mapping[str, Any]] = None  # the rope's scaling (yarn: "compress")

    def __post_init__(self) -> None:
        for name in ("dim", "heads", "head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
                     "window"):
            require_positive(name, getattr(self, name))
        if self.rope_dim % 2 or not 0 <= self.rope_dim <= self.head_dim:
            raise UsageError(f"qk_rope_head_dim {self.rope_dim} must be even and at most "
                             f"head_dim {self.head_dim}")
        if self.layer_type not in LAYER_TYPES:
            raise UsageError(f"unknown DeepSeek-V4 layer type {self.layer_type!r}: choose one "
                             f"of {', '.join(LAYER_TYPES)}")
        if self.layer_type != SLIDING:
            require_positive(f"compress_rates' {self.layer_type}", self.rate)
        if self.layer_type == CSA:
            for name in ("index_heads", "index_head_dim", "index_topk"):
                require_positive(name, getattr(self, name))
            if self.rope_dim > self.index_head_dim:
                raise UsageError(f"index_head_dim {self.index_head_dim} must hold the rotated "
                                 f"{self.rope_dim} channels")
        scaling = rope_types.normalized_scaling(self.rope_scaling, self.rope_dim)
        if rope_types.attention_factor(scaling) != 1.0:
            raise UsageError(f"a rope attention_factor other than 1 is not built (DeepSeek-V4's "
                             f"is 1), got {rope_types.attention_factor(scaling)}")
        if self.heads % self.o_groups:
            raise UsageError(f"o_groups {self.o_groups} must divide num_attention_heads "
                             f"{self.heads}")

    @property
    def group_width(self) -> int:
        """The input width of one output group: H * d / o_groups."""
        return self.heads * self.head_dim // self.o_groups


OWN_OPTIONS = ("qk_norm_eps",)  # declared options it reads or ignores (its eps: DeepSeekV4's)
# DSV4Shape's fields MHAConfig holds itself: the shape's name -> MHAConfig's
SHARED_FIELDS = {"dim": "dim", "heads": "heads", "head_dim": "head_dim",
                 "rope_dim": "rotary_dim", "window": "sliding_window",
                 "rope_theta": "rope_theta", "rope_scaling": "rope_scaling"}


@dataclass(frozen=True)
class DeepSeekV4(ConfigOnlySection):
    """The layer's own settings (DSV4Shape's fields MHAConfig does not hold)."""

    json_name = "dsv4"  # MHAConfig's field, config.json's key (no annotation: not a field)

    layer_type: str = SLIDING  # LAYER_TYPES
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    eps: float = 1e-6  # rms_norm_eps
    rate: int = 0  # tokens pooled into one row (0: sliding)
    index_heads: int = 0  # CSA's indexer
    index_head_dim: int = 0
    index_topk: int = 0

    def shape(self, c: Any) -> DSV4Shape:
        """The eager layer's shape (its checks: DSV4Shape's)."""
        shared = {name: getattr(c, field) for name, field in SHARED_FIELDS.items()}
        own = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return DSV4Shape(**shared, **own)

    def resolve(self, c: Any) -> Dict[str, Any]:
        """The layout, one key = value head, sinks; the options its layer does not have
        refused, the shape checked."""
        options = {f.name: getattr(c, f.name) for f, _ in declared(c)
                   if f.name not in OWN_OPTIONS}  # the declared ones it has none of
        refused = {**options, "attention chunks": c.attention_chunk,
                   "alibi": c.alibi, "softcap": c.softcap, "a non-causal layer": not c.causal,
                   "q/k/v biases": c.qkv_bias, "an output gate": c.output_gate,
                   "d_in other than dim": c.d_in not in (None, c.dim),
                   "v_head_dim other than head_dim": c.v_head_dim not in (None, c.head_dim),
                   "a q/k norm other than its own": c.qk_norm != "none",
                   "layout " + repr(c.layout): c.layout not in (None, LAYOUT)}
        for name, on in refused.items():
            if on:
                raise UsageError(f"{name} does not apply to {NAME}")
        missing = [name for name in ("head_dim", "sliding_window", "rotary_dim")
                   if getattr(c, name) is None]
        if missing:
            raise UsageError(f"{NAME} needs {', '.join(missing)}")
        self.shape(c)
        return {"layout": LAYOUT, "kv_heads": 1, "sinks": True, "out_bias": False}

    rotary_choices = ("interleaved",)

    def check_rope(self, scaling: Optional[dict]) -> None:
        return None  # DSV4Shape's (resolve): an attention_factor of 1

    def cache_shape(self, c: Any) -> Tuple[int, int, int]:
        """(heads, key width, value width): one rotated key = value row per token."""
        return 1, c.head_dim, c.head_dim

    def attended_kv_width(self, c: Any) -> int:
        return c.head_dim

    def scale(self, c: Any) -> float:
        return float(c.head_dim) ** -0.5

    def slug(self, c: Any) -> str:
        """'dsv4-csa4-h4-d64-hd32-w8' (sliding: 'dsv4-sliding-h4-...')."""
        kind = {SLIDING: "sliding", CSA: "csa", HCA: "hca"}[self.layer_type]
        rate = str(self.rate) if self.rate else ""
        return f"{LAYOUT}-{kind}{rate}-h{c.heads}-d{c.dim}-hd{c.head_dim}-w{c.sliding_window}"

    unbuilt_calls = UNBUILT_CALLS
    # its keys' positions are their slots after a call's first query's (the window, the pooled
    # windows: transformers'), so a left-padded row is not its tokens alone (check/scenarios.py)
    slot_positions = True

    def cache_tensors(self, c: Any, kind: str, batch: str
                      ) -> Optional[Tuple["Tensors", "Tensors", Callable]]:
        """The growing cache's own tensors (kind "kv-cache", signature.py): past and present
        ones by name (shape, what it holds), and their axes' sizes after past_seq tokens."""
        return cache_tensors(self.shape(c), batch) if kind == "kv-cache" else None

    @property
    def cache_docs(self) -> Dict[str, str]:
        return {}


def config_fields(shape: DSV4Shape) -> Dict[str, Any]:
    """MHAConfig's fields of a layer's shape (the family record's, from config.json)."""
    own = {name: getattr(shape, name) for name in DeepSeekV4.__dataclass_fields__}
    shared = {field: getattr(shape, name) for name, field in SHARED_FIELDS.items()}
    scaling = shared["rope_scaling"]
    return {**shared, "rope_scaling": dict(scaling) if scaling else None,
            "rotary": "interleaved", "causal": True, "dsv4": own}


# The cached call's cache (``cache_tensors``, the section's hook signature.py reads, in place of
# past_key/past_value; docs/deepseek-v4.md): what transformers' DeepseekV4 caches hold, the eager
# layers (layer.py, compressed.py) and the ONNX graph (graph.py, graph_state.py) carry.
#
#   past_key               (B, 1, min(past_seq, W - 1), d) the rotated key = value rows of the
#                          last positions (transformers' sliding cache; no past_value)
#   past_<cache>.<entry>   a compressed layer's state: <cache> ``compressor`` (CSA: and
#                          ``indexer``), <entry> the eager state dict's (transformers' cache's)
#     buffer_kv, buffer_gate    (B, past_buffer, c) the tokens since the last closed window,
#                               past_buffer = past_seq % m
#     compressed_kv             (B, past_rows, w) every row pooled so far, past_seq // m
#     overlap_kv, overlap_gate  (B, past_overlap, w) CSA: the last closed window's first series,
#                               m once a window closed, else 0
#   present_*              the same after the call (PRESENT_AXES)
#
# Shape legend: B batch, W window, d head width, m = rate, w a row's width (d, or the indexer's
# di), c a projection's (2w with overlapping windows, else w).
ENTRIES = ("buffer_kv", "buffer_gate", "compressed_kv", "overlap_kv", "overlap_gate")
# symbolic axes of the state inputs and outputs
BUFFER, ROWS, OVERLAP = "past_buffer", "past_rows", "past_overlap"
WINDOW, PRESENT_WINDOW = "min(past_seq, window - 1)", "min(past_seq + seq, window - 1)"
PRESENT_AXES = {BUFFER: "(past_buffer + seq) % rate",
                ROWS: "past_rows + (past_buffer + seq) // rate",
                OVERLAP: "rate if a window closed else past_overlap",
                WINDOW: PRESENT_WINDOW}
PAST, PRESENT = "past_", "present_"  # a state tensor's input and output names: prefix + key
DOCS = {"buffer_kv": "the projections of the tokens since the last closed window",
        "buffer_gate": "their gate projections (before the position bias)",
        "compressed_kv": "every row pooled so far",
        "overlap_kv": "the last closed window's first series (none before a window closed)",
        "overlap_gate": "its gate with the position bias (none before a window closed)"}
Tensors = Dict[str, Tuple[tuple, str]]  # name -> (shape, what it holds)


def state_keys(layer_type: str) -> Tuple[str, ...]:
    """The eager state dict's keys of a layer type, in the call's order: HCA's compressor
    without overlap entries, CSA's compressor and indexer with them."""
    if layer_type == SLIDING:
        return ()
    caches = ("compressor", "indexer") if layer_type == CSA else ("compressor",)
    entries = ENTRIES if layer_type == CSA else ENTRIES[:3]
    return tuple(f"{cache}.{entry}" for cache in caches for entry in entries)


def state_shapes(s: DSV4Shape, batch: str) -> Dict[str, List]:
    """key -> the past input's shape, symbolic axes named (BUFFER, ROWS, OVERLAP)."""
    shapes: Dict[str, List] = {}
    for key in state_keys(s.layer_type):
        cache, entry = key.split(".")
        width = s.head_dim if cache == "compressor" else s.index_head_dim
        series = 2 * width if s.layer_type == CSA else width
        axis = {"buffer": BUFFER, "compressed": ROWS, "overlap": OVERLAP}[entry.split("_")[0]]
        shapes[key] = [batch, axis, series if axis == BUFFER else width]
    return shapes


def axis_sizes(s: DSV4Shape) -> Callable[[int], Dict[str, int]]:
    """The cache axes' sizes after ``past`` tokens went through the layer (a sweep's inputs)."""
    def sizes(past: int) -> Dict[str, int]:
        rate = max(s.rate, 1)  # (a sliding layer has no state axes)
        return {WINDOW: min(past, s.window - 1), BUFFER: past % rate, ROWS: past // rate,
                OVERLAP: rate if past >= rate else 0}
    return sizes


def cache_tensors(s: DSV4Shape, batch: str) -> Tuple[Tensors, Tensors, Callable]:
    """The cached call's own cache (signature.py's hook): past tensors, present tensors, in
    call order, and ``axis_sizes``."""
    rows = (batch, 1, WINDOW, s.head_dim)
    past: Tensors = {"past_key": (rows, "the rotated key = value rows of the last "
                                        "min(past_seq, window - 1) positions (keys = values; "
                                        "none at prefill)")}
    present: Tensors = {"present_key": ((*rows[:2], PRESENT_WINDOW, rows[3]),
                                        "past_key's and this call's rows, the last window - 1")}
    for key, shape in state_shapes(s, batch).items():
        cache, entry = key.split(".")
        doc = f"the {cache}'s state: {DOCS[entry]}"
        past[PAST + key] = (tuple(shape), doc + " (none at prefill)")
        present[PRESENT + key] = (tuple(PRESENT_AXES.get(d, d) for d in shape),
                                  doc + ", after this call")
    return past, present, axis_sizes(s)
