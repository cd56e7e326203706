"""Planted faults: edit an exported model after export, the way real export bugs look.
The parity check must fail on every one of them."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from mha_export.kinds.mla.settings import MLAConfig


class NotApplicable(Exception):
    """The fault cannot be expressed in this graph form."""


def _edit(path: Path, fn) -> None:
    model = onnx.load(str(path))
    fn(model)
    onnx.save(model, str(path))


def _initializer(model, name):
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            return i, numpy_helper.to_array(t).copy()
    raise KeyError(name)


def _set_initializer(model, name, value):
    i, _ = _initializer(model, name)
    model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, name))


def all_nodes(graph):
    """Every node, including those inside Loop / If bodies."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(a.g)


def _nodes(model, op_type):
    return [n for n in all_nodes(model.graph) if n.op_type == op_type]


def _attr(node, name, value):
    for a in node.attribute:
        if a.name == name:
            node.attribute.remove(a)
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))


def nudge_weight(path: Path, delta: float = 1e-3) -> None:
    """One weight element moved by delta after export (the query projection's: q_proj, or an
    MLA layer's q_a_proj)."""
    def fn(m):
        names = {t.name for t in m.graph.initializer}
        name = next(n for n in ("q_proj.weight", "q_a_proj.weight") if n in names)
        _, w = _initializer(m, name)
        w[5, 7] += delta
        _set_initializer(m, name, w)
    _edit(path, fn)


def remove_causal_mask(path: Path) -> None:
    def fn(m):
        for node in _nodes(m, "Attention"):
            _attr(node, "is_causal", 0)
        for node in _nodes(m, "MultiHeadAttention"):
            _attr(node, "unidirectional", 0)
        if _nodes(m, "GroupQueryAttention"):
            raise NotApplicable("GroupQueryAttention is causal by construction")
        future = [n for n in all_nodes(m.graph) if n.name == "sliding_future"]
        if future:  # DeepSeek-V4's additive mask: its sliding rows' future keys never hidden
            future[0].input[1] = future[0].input[0]  # key > key: never
            return
        for where in _nodes(m, "Where"):  # feed the unmasked scores straight on
            for n in all_nodes(m.graph):
                n.input[:] = [where.input[2] if i == where.output[0] else i for i in n.input]
    _edit(path, fn)


def permute_heads(path: Path, head_dim: int) -> None:
    """Swap the value projections of heads 0 and 1 (the out projection no longer matches)."""
    def fn(m):
        if "v_proj.weight" not in {t.name for t in m.graph.initializer}:
            raise NotApplicable("no value projection (MLA: see MLA_FAULTS)")
        _, w = _initializer(m, "v_proj.weight")  # (d_in, kv_inner): the value heads
        hd = head_dim
        if w.shape[1] < 2 * hd:
            raise NotApplicable("one value head: nothing to swap")
        w[:, :hd], w[:, hd:2 * hd] = w[:, hd:2 * hd].copy(), w[:, :hd].copy()
        _set_initializer(m, "v_proj.weight", w)
    _edit(path, fn)


def wrong_scale(path: Path, head_dim: int) -> None:
    """1/head_dim instead of 1/sqrt(head_dim)."""
    def fn(m):
        attention = [n for n in all_nodes(m.graph)
                     if any(a.name == "scale" for a in n.attribute)]
        for node in attention:
            _attr(node, "scale", 1.0 / head_dim)
        if attention:
            return
        names = {t.name for t in m.graph.initializer}
        name = next(n for n in ("attn.scale", "softmax_scale") if n in names)  # MLA: the latter
        _, s = _initializer(m, name)
        _set_initializer(m, name, (s * math.sqrt(head_dim) / head_dim).astype(s.dtype))
    _edit(path, fn)


def bake_seq_len(path: Path, t: int = 7) -> None:
    """The sequence axis fixed at export time (as a traced export without dynamic axes does)."""
    def fn(m):
        for vi in (m.graph.input[0], m.graph.output[0]):
            dim = vi.type.tensor_type.shape.dim[1]
            dim.Clear()
            dim.dim_value = t
    _edit(path, fn)


def nudge_torchscript_weight(path: Path, delta: float = 1e-3) -> None:
    ts = torch.jit.load(str(path))
    with torch.no_grad():
        next(iter(ts.parameters()))[0, 0] += delta
    ts.save(str(path))


ONNX_FAULTS = {
    "nudged weight": lambda p, c: nudge_weight(p),
    "causal mask removed": lambda p, c: remove_causal_mask(p),
    "heads permuted": lambda p, c: permute_heads(p, c.head_dim),
    "wrong scale": lambda p, c: wrong_scale(p, c.head_dim),
    "seq len baked in": lambda p, c: bake_seq_len(p),
}


# --- faults of Multi-head Latent Attention (issue 23) -------------------------------------------

def _rebuild(path: Path, config, patch=None) -> None:
    """model.onnx rebuilt from the artifact's source weights with ``config`` (a wrong reading of
    the layer) and/or under ``patch`` (a context manager replacing a builder function): an
    export bug, written where the export put the file."""
    import contextlib
    import json

    from mha_export.kinds.registry import get_form
    from mha_export.graph.model import build_model
    from mha_export.kinds.registry import build_module
    from mha_export.signature import signature_from_meta
    from mha_export.weights.files import load_strict, read_state_dict
    folder = Path(path).parent
    meta = json.loads((folder / "config.json").read_text())
    module = build_module(config)
    load_strict(module, read_state_dict(folder / "weights.safetensors"))
    with patch or contextlib.nullcontext():
        model = build_model(config, module.to_weights(), get_form(meta["export"]["attention"]),
                            meta["export"]["opset"], meta["export"]["dtype"],
                            signature_from_meta(config, meta))
    onnx.save(model, str(path))


def mscale_dropped(path: Path, c) -> None:
    """yarn's mscale(factor, mscale_all_dim)^2 left out of the softmax scale."""
    if not (c.rope_scaling or {}).get("mscale_all_dim"):
        raise NotApplicable("no mscale_all_dim: the scale has no mscale")
    def fn(m):
        _, s = _initializer(m, "softmax_scale")
        _set_initializer(m, "softmax_scale", np.array(c.head_dim ** -0.5, s.dtype))
    _edit(path, fn)


def rope_interleave_ignored(path: Path, c) -> None:
    """DeepSeek-V3's rope_interleave (pairs in, halves out) read as rotating halves."""
    if c.rotary == "half":
        raise NotApplicable("the layer rotates halves")
    _rebuild(path, c.replace(rotary="half"))


def latent_cached_before_norm(path: Path, c) -> None:
    """The cache (and attention) take the latent before kv_a_layernorm."""
    def fn(m):
        node = next(n for n in all_nodes(m.graph) if n.name == "latent_4d")
        node.input[0] = "kv_parts_0"  # the split's latent, before the RMSNorm
    _edit(path, fn)


def kv_b_split_wrong(path: Path, c) -> None:
    """kv_b_proj's rows per head read as [v | k_nope] instead of [k_nope | v]: W_UK and W_UV
    (and the expanded k_nope, v) split at the wrong row."""
    from mha_export.weights.files import read_state_dict
    m_ = MLAConfig.of(c)
    w = read_state_dict(Path(path).parent / "weights.safetensors")["kv_b_proj.weight"]
    per_head = w.reshape(m_.heads, -1, m_.kv_lora_rank)  # (N, Hn+Hv, R)
    swapped = torch.cat([per_head[:, m_.v_head_dim:], per_head[:, :m_.v_head_dim]], dim=1)
    def fn(m):
        names = {t.name for t in m.graph.initializer}
        values = {"kv_b_proj.key_heads.weight": swapped[:, :m_.qk_nope_head_dim],
                  "kv_b_proj.value_heads_t.weight":
                      swapped[:, m_.qk_nope_head_dim:].transpose(1, 2),
                  "kv_b_proj.t.weight": swapped.reshape(-1, m_.kv_lora_rank).t()}
        for name, value in values.items():
            if name in names:
                _set_initializer(m, name, value.contiguous().numpy().astype(np.float32))
    _edit(path, fn)


def k_rot_per_head(path: Path, c) -> None:
    """The shared rotated key handled as per-head keys: rotated as N heads of Hr / N features
    (each head's frequencies restarting), not as one head of Hr."""
    from unittest import mock

    import mha_export.kinds.mla.graph as mla
    hr, heads = MLAConfig.of(c).qk_rope_head_dim, c.heads
    if hr % (2 * heads):
        raise NotApplicable("Hr does not split into heads")
    original = mla._rotate

    def per_head(g, c_, x, n, cos, sin, name):
        if name != "k_rot":
            return original(g, c_, x, n, cos, sin, name)
        half = g.op("Slice", [cos, g.ints("zero_1d", [0]), g.ints("per_head_1d", [hr // heads // 2]),
                              g.ints("last_1d", [-1])], name="per_head_cos")
        half_sin = g.op("Slice", [sin, g.ints("zero_1d", [0]), g.ints("per_head_1d", [hr // heads // 2]),
                                  g.ints("last_1d", [-1])], name="per_head_sin")
        return mla.rotate_heads(g, x, heads, hr // heads, hr // heads, True, half, half_sin,
                                name)
    _rebuild(path, c, mock.patch.object(mla, "_rotate", per_head))


MLA_FAULTS = {
    "mscale dropped from the softmax scale": mscale_dropped,
    "rope_interleave ignored": rope_interleave_ignored,
    "latent cached before its RMSNorm": latent_cached_before_norm,
    "k_nope / v split at the wrong row": kv_b_split_wrong,
    "k_rot not shared (rotated per head)": k_rot_per_head,
}


# --- faults of KV-cache models (the decode contract) -------------------------------------------

def top_left_causal(path: Path) -> None:
    """Queries aligned to the first key instead of the last (SDPA's is_causal with Tq != Tk)."""
    def fn(m):
        hit = False
        for n in all_nodes(m.graph):
            if n.name.endswith("causal_offset"):  # t_k - t_q -> t_q - t_q = 0
                n.input[0] = n.input[1]
                hit = True
            elif n.name.endswith(("first_key", "first_query")):  # past + start -> start
                n.op_type = "Identity"
                del n.input[0]
                del n.attribute[:]
                hit = True
        if not hit:
            raise NotApplicable("no causal offset in this graph")
    _edit(path, fn)


def padding_ignored(path: Path) -> None:
    """attention_mask read but never applied: padded keys leak into real rows."""
    def fn(m):
        hit = [n for n in all_nodes(m.graph) if n.name.endswith("padding_keys")]
        if not hit:
            raise NotApplicable("no padding mask in this graph")
        for n in hit:  # mask == 0 -> mask < 0 (never)
            n.op_type = "Less"
    _edit(path, fn)


def cache_mixed_up(path: Path) -> None:
    """present = [this call, past] instead of [past, this call] (a Concat), or past_key and
    past_value swapped (an Attention node that appends to the cache itself)."""
    def fn(m):
        hit = False
        for n in all_nodes(m.graph):
            if n.name.endswith(("all_keys", "all_values", "all_latents", "all_rope")):
                n.input[0], n.input[1] = n.input[1], n.input[0]
                hit = True
            elif n.op_type == "Attention" and len(n.input) == 6:
                n.input[4], n.input[5] = n.input[5], n.input[4]
                hit = True
        if not hit:
            raise NotApplicable("no cache in this graph")
    _edit(path, fn)


CACHE_FAULTS = {
    "top-left causal alignment": top_left_causal,
    "padding mask ignored": padding_ignored,
    "cache mixed up": cache_mixed_up,
}


# --- faults of the newer layers' options (issue 13) ----------------------------------------------

def _bypass(m, node_name: str, keep_input: int = 0) -> None:
    """Every consumer of node ``node_name`` reads its input ``keep_input`` instead: the node's
    effect is skipped."""
    node = next(n for n in all_nodes(m.graph) if n.name == node_name)
    out, src = node.output[0], node.input[keep_input]
    for n in all_nodes(m.graph):
        n.input[:] = [src if i == out else i for i in n.input]
    for o in m.graph.output:
        if o.name == out:
            raise NotApplicable(f"{node_name} is a graph output")


def qk_norm_skipped(path: Path) -> None:
    """q and k go on un-normalised (the norms' nodes stay, unread)."""
    norm_skipped(path, "q_norm")
    norm_skipped(path, "k_norm")


def norm_offset_dropped(path: Path, offset: float) -> None:
    """Gemma's (1 + w) read as w."""
    def fn(m):
        for name in ("q_norm.weight", "k_norm.weight"):
            _, w = _initializer(m, name)
            _set_initializer(m, name, (w - offset).astype(w.dtype))
    _edit(path, fn)


def full_norm_per_head(path: Path, head_dim: int) -> None:
    """OLMo 2's norm over the whole projection computed per head instead: the mean-square column
    (W, 1) of 1/W becomes a block-diagonal (W, W) of per-head means."""
    def fn(m):
        for name in ("q_norm.mean", "k_norm.mean"):
            _, col = _initializer(m, name)
            width = col.shape[0]
            blocks = np.kron(np.eye(width // head_dim), np.full((head_dim, head_dim), 1 / head_dim))
            _set_initializer(m, name, blocks.astype(col.dtype))
    _edit(path, fn)


def layer_norm_uncentered(path: Path) -> None:
    """A LayerNorm q/k norm computed as an RMSNorm: the mean no longer subtracted."""
    def fn(m):
        _bypass(m, "q_norm_centered")
        _bypass(m, "k_norm_centered")
    _edit(path, fn)


def norm_skipped(path: Path, name: str) -> None:
    """The norm ``name`` (its nodes ``<name>_square`` ... ``<name>_scaled``, or
    ``<name>_flat`` over heads) unread: its consumers take its input."""
    def fn(m):
        names = {n.name for n in all_nodes(m.graph)}
        last = f"{name}_flat" if f"{name}_flat" in names else f"{name}_scaled"
        first = next(n for n in all_nodes(m.graph) if n.name == f"{name}_square")
        out = next(n for n in all_nodes(m.graph) if n.name == last).output[0]
        for n in all_nodes(m.graph):
            n.input[:] = [first.input[0] if i == out else i for i in n.input]
    _edit(path, fn)


def zeroed(path: Path, *names: str) -> None:
    """Initializers set to 0 (a norm's bias dropped)."""
    def fn(m):
        for name in names:
            _, w = _initializer(m, name)
            _set_initializer(m, name, np.zeros_like(w))
    _edit(path, fn)


def per_head_weights_shared(path: Path) -> None:
    """StableLM's / Cohere's per-head norm weights (N, H) read as the first head's for all."""
    def fn(m):
        for name in ("q_norm.weight", "k_norm.weight"):
            _, w = _initializer(m, name)
            _set_initializer(m, name, np.broadcast_to(w[:1], w.shape).copy())
    _edit(path, fn)


def softcap_after_mask(path: Path) -> None:
    """cap * tanh(s / cap) applied to the masked scores: a masked score becomes -cap, not the
    lowest value, and leaks probability (the order ONNX's spec once had, onnx/onnx#7865)."""
    def fn(m):
        graphs = [m.graph] + [a.g for n in all_nodes(m.graph) for a in n.attribute
                              if a.type == onnx.AttributeProto.GRAPH]
        for g in graphs:
            nodes = {n.name.rsplit("/", 1)[-1]: n for n in g.node}
            if "capped_in" not in nodes:
                continue
            div, mul, where = nodes["capped_in"], nodes["capped_scores"], nodes["masked_scores"]
            raw, capped, masked = div.input[0], mul.output[0], where.output[0]
            for n in g.node:  # softmax (or the sinks' concat) reads the capped masked scores
                if n is not div:
                    n.input[:] = [capped if i == masked else i for i in n.input]
            where.input[2], div.input[0] = raw, masked
            order = [n for n in g.node if n is not where]
            order.insert(order.index(div), where)  # Where now runs before the cap
            del g.node[:]
            g.node.extend(order)
    _edit(path, fn)


def sinks_dropped(path: Path) -> None:
    """The sink logits no longer take any probability (a softmax over the keys alone)."""
    def fn(m):
        _, s = _initializer(m, "attn.sinks")
        _set_initializer(m, "attn.sinks", np.full_like(s, -1e4))
    _edit(path, fn)


def output_gate_skipped(path: Path) -> None:
    _edit(path, lambda m: _bypass(m, "gated_context"))


def alibi_reversed(path: Path) -> None:
    """Head h takes head N-1-h's ALiBi slope (a slope table read in the wrong order)."""
    def fn(m):
        _, s = _initializer(m, "attn.alibi_slopes")  # (1, N, 1, 1)
        _set_initializer(m, "attn.alibi_slopes", s[:, ::-1].copy())
    _edit(path, fn)


def value_heads_swapped(path: Path, config) -> None:
    """Each value head (v_head_dim wide, unlike the keys) read as the next one: v_proj's
    output columns rolled by one value head."""
    def fn(m):
        _, w = _initializer(m, "v_proj.weight")  # (d_in, K*Hv)
        _set_initializer(m, "v_proj.weight", np.roll(w, config.value_dim, axis=1))
    _edit(path, fn)


# name -> (layer options, fault)
OPTION_FAULTS = {
    "q/k norm skipped": (dict(qk_norm="head"), lambda p, c: qk_norm_skipped(p)),
    "(1 + w) norm read as w": (dict(qk_norm="head", norm_offset=1.0),
                               lambda p, c: norm_offset_dropped(p, c.norm_offset)),
    "OLMo 2 norm applied per head": (dict(qk_norm="full"),
                                     lambda p, c: full_norm_per_head(p, c.head_dim)),
    "softcap after the mask": (dict(softcap=2.0), lambda p, c: softcap_after_mask(p)),
    "sinks dropped": (dict(sinks=True), lambda p, c: sinks_dropped(p)),
    "output gate skipped": (dict(output_gate=True), lambda p, c: output_gate_skipped(p)),
    "LayerNorm q/k norm without its mean": (dict(qk_norm="head", qk_norm_type="layer"),
                                            lambda p, c: layer_norm_uncentered(p)),
    "q/k norm bias dropped": (dict(qk_norm="head", qk_norm_type="layer", qk_norm_bias=True),
                              lambda p, c: zeroed(p, "q_norm.bias", "k_norm.bias")),
    "q/k norm after rotary skipped": (dict(qk_norm="head", qk_norm_after_rope=True),
                                      lambda p, c: qk_norm_skipped(p)),
    "query scale by position dropped": (dict(query_scale_beta=0.5, query_scale_length=4),
                                        lambda p, c: _edit(p, lambda m: _bypass(
                                            m, "query_scale_scaled"))),
    "value norm skipped": (dict(v_norm_eps=1e-6), lambda p, c: norm_skipped(p, "v_norm")),
    "output norm skipped": (dict(out_norm_eps=1e-5), lambda p, c: norm_skipped(p, "out_norm")),
    "q/k/v clamp dropped": (dict(qkv_clip=0.5), lambda p, c: _edit(p, lambda m: [
        _bypass(m, f"qkv_clip_clipped_{i}") for i in range(3)])),
    "per-head q/k norm weights shared": (dict(qk_norm="head", qk_norm_type="layer",
                                              qk_norm_per_head=True),
                                         lambda p, c: per_head_weights_shared(p)),
    "weightless q/k norm skipped": (dict(qk_norm="head", qk_norm_weightless=True,
                                         qk_norm_after_rope=True),
                                    lambda p, c: qk_norm_skipped(p)),
    "a chunk starting one key early": (dict(attention_chunk=4),
                                       lambda p, c: _edit(p, lambda m: _shift_output(
                                           m, "chunk_inside"))),
    "ALiBi slopes in reverse head order": (dict(alibi=True), lambda p, c: alibi_reversed(p)),
    "value multiplier dropped": (dict(value_multiplier=0.7), lambda p, c: _edit(
        p, lambda m: _bypass(m, "value_multiplied"))),
    "value heads of their own width swapped": (dict(v_head_dim=8),
                                               lambda p, c: value_heads_swapped(p, c)),
    "temperature tuning's slot without its + 1": (
        dict(query_scale_beta=0.5, query_scale_length=4, query_scale_by="slot"),
        lambda p, c: rope_initializer_set(p, "query_scale.one_slot", 0)),
}


def rope_initializer_set(path: Path, name: str, value) -> None:
    def fn(m):
        _, old = _initializer(m, name)
        _set_initializer(m, name, np.asarray(value, dtype=old.dtype).reshape(old.shape))
    _edit(path, fn)


def longrope_stuck_short(path: Path) -> None:
    def fn(m):
        _, short = _initializer(m, "rotary.inv_freq")
        _set_initializer(m, "rotary.long_inv_freq", short)
    _edit(path, fn)


def rope_base_swapped(path: Path, rotary_dim: int, theta: float) -> None:
    """Gemma 3's local and global bases swapped: the layer rotates with the other base."""
    freq = 1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    rope_initializer_set(path, "rotary.inv_freq", freq)


def rotary_on_nope_layer(path: Path, config) -> None:
    """A NoPE layer (SmolLM3's no_rope_layers) exported with rotary at positions 0, 1, ...: the
    model of the same weights with rotary, its position_ids made from the call's length."""
    from mha_export.kinds.registry import get_form
    from mha_export.graph.model import build_model
    from mha_export.artifact import read_artifact
    from mha_export.signature import make_signature
    art = read_artifact(path.parent)
    roped = config.replace(rotary="half")
    model = build_model(roped, art.load_source_module().to_weights(),
                        get_form(art.export["attention"]), signature=make_signature(roped))
    g = model.graph
    g.input.remove(next(i for i in g.input if i.name == "position_ids"))
    helper = onnx.helper
    g.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n)
                          for n, v in (("nope_zero", 0), ("nope_one", 1), ("nope_axis0", [0]))])
    g.node.insert(0, helper.make_node("Unsqueeze", ["nope_range", "nope_axis0"], ["position_ids"]))
    g.node.insert(0, helper.make_node("Range", ["nope_zero", "nope_len", "nope_one"],
                                      ["nope_range"]))
    g.node.insert(0, helper.make_node("Squeeze", ["nope_len_1d"], ["nope_len"]))
    g.node.insert(0, helper.make_node("Shape", ["x"], ["nope_len_1d"], start=1, end=2))
    onnx.save(model, str(path))


ROPE = dict(rotary="half")
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
            "long_factor": [2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0],
            "original_max_position_embeddings": 8, "factor": 4.0}  # rotary_dim 16
OPTION_FAULTS.update({
    "yarn attention factor dropped": (
        dict(ROPE, rope_scaling={"rope_type": "yarn", "factor": 8.0,
                                 "original_max_position_embeddings": 8}),
        lambda p, c: rope_initializer_set(p, "rotary.attention_factor", 1.0)),
    "longrope stuck on the short factors": (dict(ROPE, rope_scaling=LONGROPE),
                                            lambda p, c: longrope_stuck_short(p)),
    "longrope's long mscale read as the short one": (
        dict(ROPE, rope_scaling={**LONGROPE, "short_mscale": 1.1, "long_mscale": 1.3}),
        lambda p, c: rope_initializer_set(p, "rotary.long_attention_factor", 1.1)),
    "proportional rope's zero frequencies rotating": (
        dict(ROPE, rope_scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25}),
        lambda p, c: rope_initializer_set(p, "rotary.inv_freq", 1.0 / 10000.0 ** (
            np.arange(0, c.rotary_dim, 2) / c.rotary_dim))),
    "local and global rope bases swapped": (
        dict(ROPE, rope_theta=10000.0), lambda p, c: rope_base_swapped(p, c.rotary_dim, 1e6)),
    "rotary applied on a NoPE layer": (dict(rotary="none"),
                                       lambda p, c: rotary_on_nope_layer(p, c)),
})


# --- faults of static-cache models (issue 17) ----------------------------------------------------

def _shift_output(m, node_suffix: str, delta: int = 1) -> None:
    """Every consumer of the output of the node named ``*node_suffix`` reads it + delta."""
    node = next((n for n in all_nodes(m.graph) if n.name.endswith(node_suffix)), None)
    if node is None:
        raise NotApplicable(f"no {node_suffix} in this graph")
    out, shifted = node.output[0], node.output[0] + "_fault"
    for n in all_nodes(m.graph):
        n.input[:] = [shifted if i == out else i for i in n.input]
    if not any(t.name == "fault_delta" for t in m.graph.initializer):  # one for every shift
        m.graph.initializer.append(numpy_helper.from_array(np.array(delta, np.int64),
                                                           "fault_delta"))
    graph = _graph_holding(m.graph, node)  # the top level, or an If branch / Loop body
    index = list(graph.node).index(node) + 1
    graph.node.insert(index, onnx.helper.make_node("Add", [out, "fault_delta"], [shifted]))


def _graph_holding(graph, node):
    if any(n is node for n in graph.node):
        return graph
    for n in graph.node:
        for attr in n.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found = _graph_holding(attr.g, node)
                if found is not None:
                    return found
    return None


def static_write_off_by_one(path: Path) -> None:
    """This call's keys written one entry too far (past_lengths + i + 1)."""
    def fn(m):
        names = {n.name for n in all_nodes(m.graph)}
        _shift_output(m, "write_positions" if "write_positions" in names else "row_ends")
    _edit(path, fn)


def static_reads_past_its_length(path: Path) -> None:
    """Row b's query i also sees key past_lengths[b] + i + 1 (beyond what is valid for it)."""
    _edit(path, lambda m: _shift_output(m, "row_query_start"))


def _every_node(path: Path, suffix: str, fault) -> None:
    """``fault(model, name)`` on every node named ``*suffix`` (each form's, in an If's
    branches)."""
    def fn(m):
        for name in sorted({n.name for n in all_nodes(m.graph) if n.name.endswith(suffix)}):
            fault(m, name)
    _edit(path, fn)


def shared_topk_off_by_one(path: Path) -> None:
    """A shared-top-k layer keeps the key after each given position."""
    _every_node(path, "given_clamped", _shift_output)


def shared_topk_ignored(path: Path) -> None:
    """A shared-top-k layer's given selection never hides a key."""
    _every_node(path, "given_hides", _bypass)


def _output_produced_as(m, output: str, inner: str):
    """The node computing graph output ``output`` writes ``inner`` instead (a fault then
    computes ``output`` from it)."""
    node = next(n for n in all_nodes(m.graph) if output in n.output)
    node.output[:] = [inner if o == output else o for o in node.output]


def selection_shifted(path: Path) -> None:
    """A DSA layer's output topk_indices each one position later (attention's own unchanged)."""
    def fn(m):
        _output_produced_as(m, "topk_indices", "topk_indices_fault")
        m.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "fault_one"))
        m.graph.node.append(onnx.helper.make_node("Add", ["topk_indices_fault", "fault_one"],
                                                  ["topk_indices"]))
    _edit(path, fn)


def selection_kth_pick_wrong(path: Path, topk: int) -> None:
    """A DSA layer's output topk_indices keeps each query's (k+1)-th key in place of its k-th
    (its TopK of k + 1, the k-th dropped)."""
    def fn(m):
        _set_initializer(m, "selection_topk", np.array([topk + 1], np.int64))
        _output_produced_as(m, "topk_indices", "topk_indices_fault")
        for name, value in (("fault_zero", [0]), ("fault_head", [topk - 1]),
                            ("fault_tail", [topk]), ("fault_end", [topk + 1]),
                            ("fault_axis", [2])):
            m.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
        make = onnx.helper.make_node
        m.graph.node.extend([
            make("Slice", ["topk_indices_fault", "fault_zero", "fault_head", "fault_axis"],
                 ["fault_best"]),
            make("Slice", ["topk_indices_fault", "fault_tail", "fault_end", "fault_axis"],
                 ["fault_next"]),
            make("Concat", ["fault_best", "fault_next"], ["topk_indices"], axis=2)])
    _edit(path, fn)


def qsa_indexer_ignored(path: Path) -> None:
    """A QSA layer's indexer hides nothing: attention reads the causal and padding mask."""
    _every_node(path, "hidden", _bypass)


def qsa_blocks_start_late(path: Path) -> None:
    """A QSA layer's blocks start one visible key late (each key's rank + 1)."""
    _every_node(path, "block_rank", _shift_output)


def qsa_blocks_rotated_late(path: Path) -> None:
    """A QSA layer's block keys rotated one position after their first key."""
    _every_node(path, "block_rot_first", _shift_output)


def qsa_tail_dropped(path: Path) -> None:
    """A QSA layer's queries keep only their top blocks, not the keys after their last
    complete block."""
    _every_node(path, "dropped_or", _bypass)


STATIC_FAULTS = {
    "write at the wrong index (off by one)": static_write_off_by_one,
    "a row reads past its valid length": static_reads_past_its_length,
}


# --- faults of quantized projections (issue 22) --------------------------------------------------
# Each edits q_proj's MatMulNBits inputs (lossy/projections/rtn.py's layout: codes packed per output
# row and block, low nibble first; one scale and zero point per block).

def _edit_initializer(path: Path, suffix: str, fn) -> None:
    def edit(m):
        name = next(t.name for t in m.graph.initializer if t.name.endswith(suffix))
        _, value = _initializer(m, name)
        _set_initializer(m, name, fn(value))
    _edit(path, edit)


def block_scale_off(path: Path) -> None:
    """One block's scale x 1.1."""
    def fn(scales):
        scales[0] *= 1.1
        return scales
    _edit_initializer(path, "q_proj.weight_scales", fn)


def nibble_flipped(path: Path) -> None:
    """One 4-bit code flipped (its four bits inverted): one weight off by up to 15 steps."""
    def fn(codes):
        codes.reshape(-1)[0] ^= 0x0F
        return codes
    _edit_initializer(path, "q_proj.weight_q4", fn)


def zero_point_off_by_one(path: Path) -> None:
    """One block's 4-bit zero point one step off (a model exported with --asymmetric)."""
    def fn(zero_points):
        low = zero_points[0] & 0x0F
        zero_points[0] = (zero_points[0] & 0xF0) | (low + 1 if low < 15 else low - 1)
        return zero_points
    _edit_initializer(path, "q_proj.weight_zero_points", fn)


def wrong_block_size(path: Path) -> None:
    """The same codes dequantized with twice the block size: pairs of blocks read as one, with
    the first block's scale (a consistent model that loads and runs, computing the wrong W)."""
    def fn(m):
        nodes = [n for n in all_nodes(m.graph) if n.name.endswith("q_proj_matmul")]
        node = nodes[0]  # every If branch's q projection reads the same weights
        block = next(a.i for a in node.attribute if a.name == "block_size")
        for n in nodes:
            _attr(n, "block_size", 2 * block)
        _, codes = _initializer(m, node.input[1])  # (N, blocks, block * bits / 8)
        n, blocks, blob = codes.shape
        if blocks % 2:
            raise NotApplicable("an odd number of blocks")
        _set_initializer(m, node.input[1], codes.reshape(n, blocks // 2, 2 * blob))
        _, scales = _initializer(m, node.input[2])  # (N * blocks,)
        _set_initializer(m, node.input[2], np.ascontiguousarray(
            scales.reshape(n, blocks)[:, ::2].reshape(-1)))
    _edit(path, fn)


QUANT_FAULTS = {
    "one block's scale x1.1": block_scale_off,
    "a 4-bit code flipped": nibble_flipped,
    "a zero point off by one": zero_point_off_by_one,
    "dequantized with the wrong block size": wrong_block_size,
}


# --- faults of a GGUF's kept blocks (--quantize source, issue 34) -------------------------------
# q_proj's blocks as kept: weight_q{bits}, weight_scales, float weight_zero_points (Q4_1, K-quants)

def block_min_off(path: Path) -> None:
    """One block's min (a float zero point, -zp * scale: kept as the graph's weight_mins_t)
    one code step off."""
    def fn(m):
        _, scales = _initializer(m, "q_proj.weight_scales")
        _, mins = _initializer(m, "q_proj.weight_mins_t")  # (n_blocks, N)
        mins[0, 0] += scales[0]
        _set_initializer(m, "q_proj.weight_mins_t", mins)
    _edit(path, fn)


def sub_block_scales_swapped(path: Path) -> None:
    """The first two sub-blocks of row 0 take each other's scale (a super-block's scales applied
    to the wrong sub-block)."""
    def fn(scales):
        if scales[0] == scales[1]:
            raise NotApplicable("the two sub-blocks share one scale")
        scales[[0, 1]] = scales[[1, 0]]
        return scales
    _edit_initializer(path, "q_proj.weight_scales", fn)


SOURCE_FAULTS = {
    "one sub-block's scale x1.1": block_scale_off,
    "a 4-bit code flipped": nibble_flipped,
    "a block's min (its float zero point) one code step off": block_min_off,
    "two sub-blocks' scales swapped": sub_block_scales_swapped,
}


# --- faults of an int8 KV cache (issue 24) -------------------------------------------------------
# Graph names: int8 writes are Div -> Round (key_rounded) -> Clip (key_clipped) -> Cast; reads
# Cast -> Mul (key_read); GroupQueryAttention takes kv_cache.k_scale / v_scale as inputs 12-13.

def _named(m, op_type: str, stem: str) -> list:
    return [n for n in all_nodes(m.graph)
            if n.op_type == op_type and n.name.split("/")[-1].split("_")[:2] == stem.split("_")]


def _scale_name(m, which: str) -> str:
    return next(t.name for t in m.graph.initializer if t.name.endswith(f"kv_cache.{which}"))


def key_scale_off_on_read(path: Path) -> None:
    """Keys dequantized with their scale x 1.1 (a copy read by every key_read Mul). A
    GroupQueryAttention node has one scale input for its write and read: it gets the copy too
    (its codes then differ as well)."""
    def fn(m):
        name = _scale_name(m, "k_scale")
        _, scale = _initializer(m, name)
        m.graph.initializer.append(numpy_helper.from_array(scale * 1.1, name + "_off"))
        edited = _named(m, "Mul", "key_read") + _nodes(m, "GroupQueryAttention")
        if not edited:
            raise NotApplicable("no key read in this graph")
        for node in edited:
            node.input[:] = [name + "_off" if i == name else i for i in node.input]
    _edit(path, fn)


def _written(m, op_type: str, step: str) -> list:
    """The standard-op write's ``step`` nodes (key_<step>, value_<step>) of every branch."""
    nodes = [n for which in ("key", "value") for n in _named(m, op_type, f"{which}_{step}")]
    if not nodes:
        raise NotApplicable("GroupQueryAttention writes its own codes")
    return nodes


def floor_on_write(path: Path) -> None:
    """Keys and values written with floor instead of round half to even."""
    def fn(m):
        for node in _written(m, "Round", "rounded"):
            node.op_type = "Floor"
    _edit(path, fn)


def no_clipping(path: Path) -> None:
    """The write casts without clipping: values beyond the scale wrap around in int8."""
    def fn(m):
        for clip in _written(m, "Clip", "clipped"):
            for n in all_nodes(m.graph):
                n.input[:] = [clip.input[0] if i == clip.output[0] else i for i in n.input]
    _edit(path, fn)


def per_channel_as_per_tensor(path: Path) -> None:
    """The per-channel scales of keys and values replaced by one (each one's first channel's)
    for all channels (GroupQueryAttention needs both of one granularity)."""
    def fn(m):
        for which in ("k_scale", "v_scale"):
            name = _scale_name(m, which)
            _, scale = _initializer(m, name)
            if scale.size == 1:
                raise NotApplicable("scaled per tensor")
            _set_initializer(m, name, scale.reshape(-1)[:1].copy())
        for node in _nodes(m, "GroupQueryAttention"):
            _attr(node, "k_quant_type", "PER_TENSOR")
            _attr(node, "v_quant_type", "PER_TENSOR")
    _edit(path, fn)


KV_FAULTS = {
    "key scale x1.1 on read": key_scale_off_on_read,
    "floor instead of round half to even on write": floor_on_write,
    "no clipping (int8 wrap-around)": no_clipping,
    "per-channel scales applied per tensor": per_channel_as_per_tensor,
}


def exit_on_layer(layer: int, job):
    """A fan-out's unit of work whose worker dies mid-layer (``os._exit``) on ``layer``, the
    real one (``run_layer``) on the others: pass as ``work=functools.partial(exit_on_layer,
    L)``."""
    import os
    from mha_export.fanout.work import run_layer
    if job.layer == layer:
        os._exit(3)
    return run_layer(job)


HELD = []  # what a worker holds until it exits


def holding_a_semaphore(job):
    """A fan-out's unit of work (the real one) whose worker holds a multiprocessing lock until it
    exits, as tqdm's class-level lock in torch.export's worker does, and takes a second to exit
    (a large runtime's teardown): ``work=`` this."""
    import multiprocessing
    import time
    from multiprocessing.util import Finalize
    from mha_export.fanout.work import run_layer
    HELD.append(multiprocessing.RLock())
    Finalize(None, time.sleep, (1.0,), exitpriority=10)  # before the lock's own (0)
    return run_layer(job)
