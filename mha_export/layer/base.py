"""The shared forward of every weight layout (project -> q/k norm -> rotary -> attention core ->
merge heads -> output gate -> output projection), the cached call, and ``AttentionWeights``, the
layout-neutral weights used for conversions and by the ONNX graph builder."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ..alibi import geometric_slopes
from ..config import MHAConfig
from .attention import Scoring, attention, merge_heads
from .norm import QKNorm
from .rotary import RopeTables, cos_sin, rope_tables, rotate


@dataclass
class AttentionWeights:
    """Layout-neutral weights in nn.Linear orientation ([out, in])."""

    wq: Tensor  # (inner, d_in)
    wk: Optional[Tensor]  # (kv_inner, d_in); None: a KV-shared layer's (kinds/kv_shared/)
    wv: Optional[Tensor]
    bq: Optional[Tensor] = None  # (inner,)
    bk: Optional[Tensor] = None
    bv: Optional[Tensor] = None
    wo: Optional[Tensor] = None  # (dim, inner); None: no output projection
    bo: Optional[Tensor] = None  # (dim,)
    q_norm: Optional[Tensor] = None  # (H,) each head | (N, H) per head | (N*H,) whole projection
    k_norm: Optional[Tensor] = None  # (H,) | (K, H) | (K*H,)
    q_norm_bias: Optional[Tensor] = None  # as q_norm (a LayerNorm's bias)
    k_norm_bias: Optional[Tensor] = None
    sinks: Optional[Tensor] = None  # (N,) one logit per query head
    wg: Optional[Tensor] = None  # (inner, d_in) output gate
    bg: Optional[Tensor] = None  # (inner,)
    out_norm: Optional[Tensor] = None  # (inner,) the RMSNorm before the output projection
    alibi_slopes: Optional[Tensor] = None  # (N,) ALiBi's slope per head


class AttentionBase(nn.Module):
    """Shared forward: project -> attention core -> merge heads -> (optional) output projection."""

    def __init__(self, config: MHAConfig):
        super().__init__()
        self.config = config
        self.whole_buffer = False  # static calls attend over the whole buffer (valid_end)
        self.n_head = config.heads
        self.head_dim = config.head_dim
        self.value_dim = config.value_dim
        self.kv_heads = config.kv_heads
        self.causal = config.causal
        self.dropout = config.dropout
        self.scale = config.scale
        self.window = config.sliding_window or 0
        self.chunk = config.attention_chunk or 0
        self.rotary = config.rotary != "none"
        self.interleaved = config.rotary == "interleaved"
        rope = rope_tables(config.rotary_dim, config.rope_theta, config.rope_scaling) \
            if self.rotary else RopeTables(torch.zeros(0))
        self.register_buffer("inv_freq", rope.inv_freq, persistent=False)  # (rd/2,)
        self.register_buffer("long_inv_freq", rope.long_or_empty(),
                             persistent=False)  # (rd/2,) longrope's long table, else (0,)
        self.rope_switch = rope.switch_len  # longrope: long table once max(pos) + 1 > this
        self.rope_factor = rope.attention_factor  # multiplies cos and sin (yarn, longrope)
        self.rope_long_factor = rope.long_attention_factor  # longrope's long table: its own
        self._add_extras(config)
        # an int8 cache (use_int8_cache): static scales (1,) | (1, K, 1, H); empty while off
        self.int8_cache = False
        self.register_buffer("k_scale", torch.ones(0), persistent=False)
        self.register_buffer("v_scale", torch.ones(0), persistent=False)

    def use_int8_cache(self, k_scale: Tensor, v_scale: Tensor) -> "AttentionBase":
        """Hold the cache as int8 codes (the function of --kv-cache-dtype int8): keys (after
        rotary) and values quantized on write with these static scales (round half to even,
        clipped to [-128, 127]) and dequantized on read; a call's own keys too."""
        self.int8_cache = True
        self.k_scale = k_scale.to(self.inv_freq.device, torch.float32)
        self.v_scale = v_scale.to(self.inv_freq.device, torch.float32)
        return self

    def _add_extras(self, c: MHAConfig) -> None:
        """The weights of the newer layers' options (Identity / empty where off: TorchScript
        compiles every branch, and the state dict holds only what the layer has)."""
        self.qk_norm = c.qk_norm
        self.norm_after_rope = c.qk_norm_after_rope
        self.qkv_clip = float(c.qkv_clip or 0.0)  # 0: no clamp
        self.query_beta = float(c.query_scale_beta or 0.0)  # 0: queries not scaled by position
        self.query_length = float(c.query_scale_length or 1)
        self.query_by_slot = c.query_scale_by == "slot"  # Llama 4: (slot + 1), not position
        self.value_multiplier = float(c.value_multiplier or 1.0)  # MiMo-V2: values times it
        self.v_norm: nn.Module = QKNorm((c.value_dim,), c.v_norm_eps, learned=False) \
            if c.v_norm_eps else nn.Identity()  # Gemma 3n: weightless
        self.softcap = c.softcap or 0.0
        self.has_sinks = c.sinks
        self.gated = c.output_gate
        self.q_norm: nn.Module = nn.Identity()
        self.k_norm: nn.Module = nn.Identity()
        if c.qk_norm != "none":
            self.q_norm = qk_norm(c, c.heads, c.inner)
            self.k_norm = qk_norm(c, c.kv_heads, c.kv_inner)
        if c.sinks:
            self.sinks = nn.Parameter(torch.zeros(c.heads))  # (N,)
        else:
            self.register_buffer("sinks", torch.zeros(0), persistent=False)
        self.has_alibi = c.alibi  # slopes: saved with the weights, the paper's by default
        self.register_buffer("alibi_slopes", torch.tensor(geometric_slopes(c.heads))
                             if c.alibi else torch.zeros(0), persistent=c.alibi)  # (N,)
        self.W_gate: nn.Module = nn.Linear(c.d_in, c.v_inner, bias=c.qkv_bias) \
            if c.output_gate else nn.Identity()
        self.out_norm: nn.Module = QKNorm((c.v_inner,), c.out_norm_eps) if c.out_norm_eps \
            else nn.Identity()  # (N*Hv,): BitNet's attn_sub_norm

    def forward(self, x: Tensor) -> Tensor:
        return self.attend(x, None, None, None)[0]

    def forward_step(self, x: Tensor, attention_mask: Tensor, past_key: Tensor,
                     past_value: Tensor, position_ids: Optional[Tensor] = None
                     ) -> Tuple[Tensor, Tensor, Tensor]:
        """The KV-cache call: (y (B, T, dim), present_key, present_value (B, K, P+T, H)).
        Query i sits at position P + i and sees every earlier-or-equal key that attention_mask
        (B, P+T) marks 1. Rotary layers rotate by position_ids (B, T) (default P + i)."""
        return self.attend(x, attention_mask, past_key, past_value, position_ids)

    def attend(self, x: Tensor, attention_mask: Optional[Tensor], past_key: Optional[Tensor],
               past_value: Optional[Tensor], position_ids: Optional[Tensor] = None
               ) -> Tuple[Tensor, Tensor, Tensor]:
        y, k, v, _ = self._attend(x, attention_mask, past_key, past_value, False, position_ids)
        return y, k, v

    @torch.jit.ignore
    def forward_with_weights(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """Eager only: (y, attention probabilities (B, heads, T, T))."""
        y, _, _, probs = self._attend(x, None, None, None, True)
        assert probs is not None
        return y, probs

    def _attend(self, x: Tensor, attention_mask: Optional[Tensor], past_key: Optional[Tensor],
                past_value: Optional[Tensor], need_weights: bool,
                position_ids: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        q, k, v, position_ids = self._call_qkv(x, past_key, position_ids)
        if self.int8_cache:  # the cache (and what this returns) holds codes
            k, v = int8_codes(k, self.k_scale), int8_codes(v, self.v_scale)
        if past_key is not None and past_value is not None:
            k = torch.cat([past_key, k], dim=2)  # (B, N, P+T, H)
            v = torch.cat([past_value, v], dim=2)
        p = self.dropout if self.training else 0.0
        keys, values = self._read_cache(k, v, q.dtype)  # (B, K, S, H): K heads (the cache)
        ctx, probs = attention(q, keys, values, self.scoring(), attention_mask,
                               dropout_p=p, need_weights=need_weights)
        return self._output(x, ctx), k, v, probs

    def _call_qkv(self, x: Tensor, past_key: Optional[Tensor], position_ids: Optional[Tensor]
                  ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """(q, k, v, position_ids) of a call after P cached keys: its keys at cache slots
        P + i, rotated at position_ids (B, T) (default P + i)."""
        past = 0 if past_key is None else past_key.size(2)
        slots = torch.arange(past, past + x.size(1), device=x.device).view(1, -1)  # (1, T)
        if position_ids is None:
            position_ids = slots.expand(x.size(0), x.size(1))  # (B, T)
        q, k, v = self._queries_keys_values(x, position_ids, slots)
        return q, k, v, position_ids

    def forward_static(self, x: Tensor, past_key: Tensor, past_value: Tensor,
                       past_lengths: Tensor, position_ids: Optional[Tensor] = None
                       ) -> Tuple[Tensor, Tensor, Tensor]:
        """The static-cache call: past_key/past_value (B, K, C, H) are app-owned buffers, written
        in place at positions past_lengths[b] ... past_lengths[b] + T - 1 of row b and returned
        as present_*; query i of row b sees keys j <= past_lengths[b] + i (and its window), so
        only the prefix [0, max(past_lengths) + T) is read. Rotary default: past_lengths[b] + i."""
        b, t = x.size(0), x.size(1)
        slots = past_lengths.view(b, 1) + torch.arange(t, device=x.device)  # (B, T): where
        # row b's new entries go
        if position_ids is None:
            position_ids = slots  # (B, T)
        q, k, v = self._queries_keys_values(x, position_ids, slots)  # (B, N|K, T, H)
        rows = torch.arange(b, device=x.device).view(b, 1)  # (B, 1)
        if self.int8_cache:  # quantized on write
            k, v = int8_codes(k, self.k_scale), int8_codes(v, self.v_scale)
        # index_put_ (gpt-fast's cache write): AOTInductor re-inplaces it into the caller's
        # buffer (a scatter_ became a copy of the whole buffer there)
        past_key[rows, :, slots] = k.transpose(1, 2).to(past_key.dtype)  # (B, T, K, H)
        past_value[rows, :, slots] = v.transpose(1, 2).to(past_value.dtype)
        y = self._attend_static(x, q, past_key, past_value, past_lengths)
        return y, past_key, past_value

    def read_static(self, x: Tensor, past_key: Tensor, past_value: Tensor,
                    past_lengths: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        """y of a static-cache call whose keys and values the buffers already hold (a runtime
        under test wrote them): nothing is written. An int8 cache's check reads the codes the
        runtime wrote, so that a rounding tie flipped by its last bit is judged once, as a
        code (never again in y)."""
        q = self.static_queries(x, past_lengths, position_ids)
        return self._attend_static(x, q, past_key, past_value, past_lengths)

    def static_queries(self, x: Tensor, past_lengths: Tensor,
                       position_ids: Optional[Tensor] = None) -> Tensor:
        """The queries (B, N, T, H) of a static-cache call (rotary default: past_lengths[b] +
        i), for ``read_static_with``: the same for every runtime's buffers."""
        b, t = x.size(0), x.size(1)
        slots = past_lengths.view(b, 1) + torch.arange(t, device=x.device)  # (B, T)
        if position_ids is None:
            position_ids = slots
        q, _, _ = self._queries_keys_values(x, position_ids, slots)  # (B, N, T, H)
        return q

    def read_static_with(self, x: Tensor, q: Tensor, past_key: Tensor, past_value: Tensor,
                         past_lengths: Tensor) -> Tensor:
        """``read_static`` with the call's queries already made (``static_queries``)."""
        return self._attend_static(x, q, past_key, past_value, past_lengths)

    def _attend_static(self, x: Tensor, q: Tensor, past_key: Tensor, past_value: Tensor,
                       past_lengths: Tensor) -> Tensor:
        """Queries q (B, N, T, H) over the buffers' valid prefix, row b's from past_lengths[b]
        (rows [0, B) of the buffers)."""
        end = valid_end(past_lengths, q.size(2), past_key.size(2),
                        self.whole_buffer)  # the longest row's valid prefix
        b = q.size(0)  # the buffers may hold more rows (an ExecuTorch program's): the call's
        keys, values = self._read_cache(past_key[:b, :, :end], past_value[:b, :, :end],
                                        q.dtype)  # (B, K, S, H)
        ctx, _ = attention(q, keys, values, self.scoring(),
                           query_start=past_lengths)  # (B, N, T, H)
        return self._output(x, ctx)

    def scoring(self) -> Scoring:
        """How this layer scores its keys (attention's record)."""
        return Scoring(self.scale, self.causal, self.window, self.chunk, self.softcap,
                       self.sinks if self.has_sinks else None,
                       self.alibi_slopes if self.has_alibi else None)

    def _read_cache(self, keys: Tensor, values: Tensor, dtype: torch.dtype
                    ) -> Tuple[Tensor, Tensor]:
        """The cache as attention reads it: an int8 cache's codes dequantized (code * scale)."""
        if not self.int8_cache:
            return keys, values
        return (keys.to(dtype) * self.k_scale.to(dtype),
                values.to(dtype) * self.v_scale.to(dtype))

    def keys_values(self, x: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """What a call writes into the cache before any quantizing: keys after q/k norm and
        rotary, values, (B, K, T, H) each (calibration and the check's clip rates read it)."""
        _, k, v = self._queries_keys_values(x, position_ids, position_ids)
        return k, v

    def _queries_keys_values(self, x: Tensor, position_ids: Tensor, slots: Tensor
                             ) -> Tuple[Tensor, Tensor, Tensor]:
        """Projections -> q/k norm -> clamp -> rotary at position_ids (B, T) (-> q/k norm, where
        it comes after rotary) -> queries scaled by position or cache slot (B|1, T): q (B, N, T,
        H), k and v (B, K, T, H) (the cache holds rotated keys)."""
        q, k, v = self.project_qkv(x)
        if self.value_multiplier != 1.0:
            v = v * self.value_multiplier  # (B, K, T, Hv)
        v = self.v_norm(v)  # (B, K, T, Hv)
        if not self.norm_after_rope:
            q, k = self._normalize_qk(q, k)
        if self.qkv_clip > 0.0:
            c = self.qkv_clip
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        if self.rotary:
            cos, sin = cos_sin(position_ids, self.inv_freq, q.dtype, self.long_inv_freq,
                               self.rope_switch, self.rope_factor,
                               self.rope_long_factor)  # (B, 1, T, rd/2)
            q = rotate(q, cos, sin, self.interleaved)
            k = rotate(k, cos, sin, self.interleaved)
        if self.norm_after_rope:
            q, k = self._normalize_qk(q, k)
        if self.query_beta > 0.0:
            q = q * self._query_scale(position_ids, slots).to(q.dtype)  # (B, N, T, H)
        return q, k, v

    def _query_scale(self, position_ids: Tensor, slots: Tensor) -> Tensor:
        """(B|1, 1, T, 1): 1 + beta * log(1 + floor(n / length)), n the position (Ministral 3)
        or the cache slot + 1 (Llama 4's temperature tuning), in float32."""
        n = (slots + 1).float() if self.query_by_slot else position_ids.float()  # (B|1, T)
        scale = 1.0 + self.query_beta * torch.log(1.0 + torch.floor(n / self.query_length))
        return scale[:, None, :, None]

    def _output(self, x: Tensor, ctx: Tensor) -> Tensor:
        """(B, N, T, H) context -> merged heads -> output gate -> output norm -> output
        projection."""
        merged = merge_heads(ctx)  # (B, T, N*H)
        if self.gated:
            merged = merged * torch.sigmoid(self.W_gate(x))
        return self.project_out(self.out_norm(merged))

    def _normalize_qk(self, q: Tensor, k: Tensor) -> Tuple[Tensor, Tensor]:
        """The q/k norm over each head's features, or over the whole projection (OLMo 2)."""
        if self.qk_norm == "head":
            return self.q_norm(q), self.k_norm(k)
        if self.qk_norm == "full":
            q = self._split_heads(self.q_norm(merge_heads(q)), self.n_head)  # (B, N, T, H)
            k = self._split_heads(self.k_norm(merge_heads(k)), self.kv_heads)  # (B, K, T, H)
        return q, k

    def _split_heads(self, t: Tensor, heads: int, width: int = 0) -> Tensor:
        """(B, T, heads * width) -> (B, heads, T, width); width 0: head_dim."""
        b, n, _ = t.shape
        if width == 0:  # (not `width or ...`: TorchScript makes that a bool)
            width = self.head_dim
        return t.view(b, n, heads, width).transpose(1, 2)  # (B, heads, T, W)

    def project_qkv(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def project_out(self, merged: Tensor) -> Tensor:
        return merged

    # --- conversions -----------------------------------------------------------------------
    def to_weights(self) -> AttentionWeights:
        raise NotImplementedError

    def extra_weights(self) -> dict[str, Optional[Tensor]]:
        """AttentionWeights' fields for the options' weights (None where off)."""
        def weight(m: nn.Module, name: str) -> Optional[Tensor]:
            t = getattr(m, name, None)
            return None if t is None else t.detach()
        def bias(m: nn.Module) -> Optional[Tensor]:
            return m.bias.detach() if getattr(m, "has_bias", False) else None
        return {"q_norm": weight(self.q_norm, "weight"), "k_norm": weight(self.k_norm, "weight"),
                "q_norm_bias": bias(self.q_norm), "k_norm_bias": bias(self.k_norm),
                "sinks": self.sinks.detach() if self.has_sinks else None,
                "wg": weight(self.W_gate, "weight"), "bg": weight(self.W_gate, "bias"),
                "out_norm": weight(self.out_norm, "weight"),
                "alibi_slopes": self.alibi_slopes.detach() if self.has_alibi else None}

    def load_extra_weights(self, w: AttentionWeights) -> None:
        with torch.no_grad():
            for module, t, b in ((self.q_norm, w.q_norm, w.q_norm_bias),
                                 (self.k_norm, w.k_norm, w.k_norm_bias)):
                if isinstance(module, QKNorm):
                    module.weight.copy_(t if t is not None else 1.0 - module.offset)
                    if module.has_bias:
                        module.bias.copy_(b if b is not None else torch.zeros_like(module.bias))
            if self.has_sinks:
                self.sinks.copy_(w.sinks if w.sinks is not None else torch.zeros_like(self.sinks))
            if isinstance(self.W_gate, nn.Linear) and w.wg is not None:
                copy_linear(self.W_gate, w.wg, w.bg)
            if isinstance(self.out_norm, QKNorm):
                self.out_norm.weight.copy_(w.out_norm if w.out_norm is not None else 1.0)
            if self.has_alibi and w.alibi_slopes is not None:
                self.alibi_slopes.copy_(w.alibi_slopes)

    def load_weights(self, w: AttentionWeights) -> None:
        raise NotImplementedError


def qk_norm(c: MHAConfig, heads: int, width: int) -> QKNorm:
    """The q (heads N, width N*H) or k (K, K*H) norm the config asks for."""
    shape = ((heads, c.head_dim) if c.qk_norm_per_head else (c.head_dim,)) \
        if c.qk_norm == "head" else (width,)
    return QKNorm(shape, c.qk_norm_eps, c.norm_offset, c.qk_norm_type == "layer",
                  c.qk_norm_bias, learned=not c.qk_norm_weightless)


def copy_linear(dst: nn.Linear, weight: Tensor, bias: Optional[Tensor]) -> None:
    with torch.no_grad():
        dst.weight.copy_(weight)
        if dst.bias is not None:
            dst.bias.copy_(bias if bias is not None else torch.zeros_like(dst.bias))


def int8_codes(x: Tensor, scale: Tensor) -> Tensor:
    """An int8 cache's write: clip(round_half_to_even(x / scale), -128, 127) as int8 (what
    ONNX Runtime's GroupQueryAttention writes; lossy/int8_cache/codes.py in numpy)."""
    return torch.clamp(torch.round(x / scale.to(x.dtype)), -128.0, 127.0).to(torch.int8)


def valid_end(past_lengths: Tensor, t: int, capacity: int, whole: bool = False) -> int:
    """max(past_lengths) + t: the end of the longest row's valid prefix after this call's write
    (data-dependent: torch.export gets it as an unbacked size, bounded by the buffer).
    ``whole``: the capacity, a static size (ExecuTorch's XNNPACK delegates no tensor of an
    unbacked size); the entries past each row's are masked as ever, and must be finite."""
    if whole:
        return capacity
    if torch.jit.is_scripting():
        return int(past_lengths.max()) + t
    end = past_lengths.max().item() + t
    torch._check(end >= t)
    torch._check(end > 0)
    torch._check(end <= capacity)
    return end
