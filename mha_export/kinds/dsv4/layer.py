"""DeepSeek-V4's sliding_attention layer, eager (docs/deepseek-v4.md): a full-sequence call with
a padding mask. Its parameters carry transformers' names (``self_attn.*`` of
DeepseekV4Attention), so its state dict and transformers' are the same."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ...layer.rotary import cos_sin, rope_tables, rotate
from .settings import DSV4Shape, state_keys


def rms(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last axis, the mean in float32."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


class WeightedRMSNorm(nn.Module):
    """RMSNorm with a weight, in float32 (transformers' DeepseekV4RMSNorm)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return (self.weight * rms(x.float(), self.eps)).to(x.dtype)


def rotate_tail(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, heads, T, d): its trailing 2 * cos.size(-1) channels rotated in interleaved pairs
    (V4 lays a head out [nope | rope])."""
    rd = 2 * cos.size(-1)
    if rd == 0:
        return x
    nope, tail = x[..., : x.size(-1) - rd], x[..., x.size(-1) - rd:]
    return torch.cat([nope, rotate(tail, cos, sin, interleaved=True)], dim=-1)


def unrotate_output(o: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """o (B, H, T, d): the value's rotation undone, each query's rows rotated back by its own
    position (cos, -sin)."""
    return rotate_tail(o, cos, -sin)


def sliding_mask(query_pos: Tensor, key_pos: Tensor, keep: Tensor, window: int) -> Tensor:
    """(B, 1, T, S) additive mask: query i sees key j iff i - window < j <= i (positions,
    query_pos (B, T), key_pos (B, S)) and j is kept (``keep`` (B, S): 1 for tokens, 0 for
    padding)."""
    qp, kp = query_pos.unsqueeze(-1), key_pos.unsqueeze(-2)  # (B, T, 1), (B, 1, S)
    seen = (kp <= qp) & (kp > qp - window) & (keep.unsqueeze(1) != 0)  # (B, T, S)
    zero = torch.zeros([1], dtype=torch.float32, device=query_pos.device)  # broadcast
    lowest = torch.full_like(zero, -3.4028234663852886e38)  # float32's lowest: masked
    return torch.where(seen, zero, lowest).unsqueeze(1)


def attend_with_sinks(q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float
                      ) -> Tensor:
    """q (B, H, T, d), kv (B, 1, Tk, d) the key and the value, mask (B, 1, T, Tk), sinks (H,):
    softmax over [logits | sink_h], the sink's column dropped -> (B, H, T, d)."""
    logits = torch.matmul(q, kv.transpose(-1, -2)) * scale + mask  # (B, H, T, Tk)
    sink = sinks.reshape(1, -1, 1, 1).expand(q.size(0), -1, q.size(2), 1)  # (B, H, T, 1)
    both = torch.cat([logits, sink.to(logits.dtype)], dim=-1)
    both = both - both.amax(dim=-1, keepdim=True)
    probs = torch.softmax(both, dim=-1)[..., :-1]
    return torch.matmul(probs.to(kv.dtype), kv)


class DSV4SlidingAttention(nn.Module):
    """y = o_b(grouped o_a(inverse-rotary(attention(q, kv, kv)))) for one sliding layer, over
    this call's rows and a past of rotated key = value rows (transformers' sliding cache: the
    last window - 1 of them)."""

    # the cached call's state tensors, in the signature's order (a type for torch.jit.script:
    # the sliding layer's list is empty)
    __annotations__ = {"state_names": List[str]}

    def __init__(self, shape: DSV4Shape):
        super().__init__()
        s = self.shape = shape
        # plain ints for torch.jit.script (it does not read the dataclass)
        self.heads, self.head_dim, self.window, self.eps = s.heads, s.head_dim, s.window, s.eps
        self.groups, self.group_width, self.rank = s.o_groups, s.group_width, s.o_lora_rank
        self.q_a_proj = nn.Linear(s.dim, s.q_lora_rank, bias=False)
        self.q_a_norm = WeightedRMSNorm(s.q_lora_rank, s.eps)
        self.q_b_proj = nn.Linear(s.q_lora_rank, s.heads * s.head_dim, bias=False)
        self.kv_proj = nn.Linear(s.dim, s.head_dim, bias=False)
        self.kv_norm = WeightedRMSNorm(s.head_dim, s.eps)
        # (G * Ro, H * d / G): group g's rows [g * Ro, (g + 1) * Ro)
        self.o_a_proj = nn.Linear(s.group_width, s.o_groups * s.o_lora_rank, bias=False)
        self.o_b_proj = nn.Linear(s.o_groups * s.o_lora_rank, s.dim, bias=False)
        self.sinks = nn.Parameter(torch.zeros(s.heads))
        inv_freq = rope_tables(s.rope_dim, s.rope_theta, s.rope_scaling).inv_freq  # (rd/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.state_names = list(state_keys(s.layer_type))  # (settings.py's)

    def grouped_output(self, o: Tensor) -> Tensor:
        """o (B, T, H, d) -> (B, T, D): each group of H / G heads through its own o_a rows."""
        b, t, g = o.size(0), o.size(1), self.groups
        grouped = o.reshape(b, t, g, self.group_width).transpose(0, 2)  # (G, T, B, Hd/G)
        w = self.o_a_proj.weight.view(g, self.rank, self.group_width)  # (G, Ro, Hd/G)
        low = torch.matmul(grouped.reshape(g, t * b, -1), w.transpose(1, 2))  # (G, TB, Ro)
        low = low.reshape(g, t, b, self.rank).transpose(0, 2)  # (B, T, G, Ro)
        return self.o_b_proj(low.reshape(b, t, g * self.rank))

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) -> q (B, H, T, d) and kv (B, 1, T, d), normalised and rotated, and the
        query's low-rank residual q_a_norm(q_a_proj(x)) (B, T, Rq)."""
        b, t = x.size(0), x.size(1)
        residual = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(residual)
        q = rms(q.view(b, t, self.heads, self.head_dim).transpose(1, 2), self.eps)  # B,H,T,d
        q = rotate_tail(q.float(), cos, sin).to(x.dtype)
        kv = self.kv_norm(self.kv_proj(x)).unsqueeze(1)  # (B, 1, T, d)
        return q, rotate_tail(kv.float(), cos, sin).to(x.dtype), residual

    def extra_rows(self, x: Tensor, residual: Tensor, positions: Tensor,
                   state: Dict[str, Tensor], spare: bool = False) -> Tuple[Tensor, Tensor]:
        """The key = value rows attended after the sliding ones (B, 1, n, d) and their mask
        (B, 1, T, n): none for a sliding layer (compressed.py's layers pool some, reading and
        writing ``state``; ``spare``: a few more, never seen, the state not kept)."""
        b, t = x.size(0), x.size(1)
        return x.new_zeros(b, 1, 0, self.head_dim), x.new_zeros(b, 1, t, 0)

    def forward(self, x: Tensor, keep: Optional[Tensor] = None,
                positions: Optional[Tensor] = None, past: Optional[Tensor] = None,
                past_keep: Optional[Tensor] = None, state: Optional[Dict[str, Tensor]] = None,
                trim: bool = True) -> Tuple[Tensor, Tensor, Tensor, Dict[str, Tensor]]:
        """x (B, T, D); keep (B, T) 1 for tokens, 0 for padding (default all 1); positions
        (B, T) (default P..P+T-1; transformers gives a left-padded prompt 0..T-1); past
        (B, 1, P, d) the rotated key = value rows of the P positions before these, past_keep
        (B, P); state a compressed layer's other caches (compressed.py; empty for a sliding
        layer) -> y (B, T, D), present (B, 1, min(P + T, window - 1), d), its keep, state
        (``trim`` False: every row, P + T: torch.export cannot keep seq dynamic over 1.. with
        a shape min(P + T, window - 1), it guards seq to one side of the window)."""
        b, t = x.size(0), x.size(1)
        if past is None:
            past = x.new_zeros(b, 1, 0, self.head_dim)
        held_state: Dict[str, Tensor] = {}  # a copy: the caller's stays as it was
        if state is not None:
            for name, value in state.items():
                held_state[name] = value
        held = past.size(2)
        if positions is None:
            positions = torch.arange(held, held + t, device=x.device).unsqueeze(0).expand(b, t)
        if keep is None:
            keep = torch.ones(b, t, dtype=torch.long, device=x.device)
        if past_keep is None:
            past_keep = torch.ones(b, held, dtype=keep.dtype, device=x.device)
        cos, sin = cos_sin(positions, self.inv_freq, torch.float32)  # (B, 1, T, rd/2)
        q, kv, residual = self.project(x, cos, sin)
        kv, keep = torch.cat([past, kv], dim=2), torch.cat([past_keep.to(keep.dtype), keep], 1)
        key_pos = torch.arange(-held, t, device=x.device) + positions[:, :1]  # (B, P + T)
        mask = sliding_mask(positions, key_pos, keep, self.window).to(x.dtype)
        rows, bias = self.extra_rows(x, residual, positions, held_state,
                                     not trim)  # B,1,n,d / B,1,T,n
        o = attend_with_sinks(q, torch.cat([kv, rows], dim=2),
                              torch.cat([mask, bias.to(mask.dtype)], dim=-1), self.sinks,
                              self.head_dim ** -0.5)  # (B, H, T, d)
        o = unrotate_output(o.float(), cos, sin).to(x.dtype)
        y = self.grouped_output(o.transpose(1, 2))  # (B, T, H, d) -> (B, T, D)
        if not trim:
            return y, kv, keep, held_state
        start = max(kv.size(2) - (self.window - 1), 0)
        return y, kv[:, :, start:], keep[:, start:], held_state

    def attend(self, x: Tensor, attention_mask: Optional[Tensor], past_key: Optional[Tensor],
               past_value: Optional[Tensor], position_ids: Optional[Tensor] = None
               ) -> Tuple[Tensor, Tensor, Tensor]:
        """The project's call of a layer (layer/entry.py's entry points), full-sequence:
        attention_mask (B, T) 1 = token, 0 = padding; position_ids (B, T) (default 0..T-1, as
        transformers gives a padded prompt too) -> y (B, T, D), and twice this call's rotated
        key = value rows, untrimmed (B, 1, T, d: the sliding cache keeps the last window - 1,
        ``forward``). A cache is not read (the cached call: ``step``)."""
        y, present, _, _ = self.forward(x, attention_mask, position_ids, trim=False)
        return y, present, present

    def step(self, x: Tensor, attention_mask: Tensor, past_key: Tensor, state: List[Tensor],
             position_ids: Optional[Tensor] = None) -> List[Tensor]:
        """The project's cached call (signature "kv-cache", settings.py's cache_tensors):
        attention_mask (B, past_seq + seq), its last P + T columns the past rows' and this
        call's; past_key (B, 1, P, d) the last P <= W - 1 rotated key = value rows; ``state``
        the compressed layer's tensors in ``state_names``' order (an overlap of 0 rows: no
        window closed yet); position_ids (B, T) (default past_seq ..) -> [y, present_key,
        the state after the call in the same order (an overlap still unset: the past's)]."""
        t, held, total = x.size(1), past_key.size(2), attention_mask.size(1)
        keep = attention_mask[:, total - t:]  # (B, T)
        past_keep = attention_mask[:, total - t - held: total - t]  # (B, P)
        if position_ids is None:
            position_ids = torch.arange(total - t, total, device=x.device).expand(x.size(0), t)
        given: Dict[str, Tensor] = {}
        for name, value in zip(self.state_names, state):
            if value.size(1) > 0 or name.find(".overlap_") < 0:
                given[name] = value  # (an overlap's absence: window 0's fill)
        y, present, _, after = self.forward(x, keep, position_ids, past_key, past_keep, given)
        out = [y, present]
        for name, value in zip(self.state_names, state):
            out.append(after[name] if name in after else value)
        return out

    @torch.jit.ignore
    def to_weights(self) -> Dict[str, Tensor]:
        """The weights an ONNX graph of the layer reads (a kind's ``form.layer``, as MLA's):
        the state dict, transformers' names (a compressed layer's under ``compressor.``)."""
        return {k: v.detach() for k, v in self.state_dict().items()}

    @torch.jit.ignore
    def load_weights(self, w: Dict[str, Tensor]) -> None:
        """The weights ``to_weights`` gives (its one layout: a copy)."""
        self.load_state_dict(w)
