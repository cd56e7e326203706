import pytest
import torch

from mha_export import MHAConfig, UsageError, build_module, convert
from mha_export.layer.attention import causal_mask

from mha_export.bench.baselines import CausalAttention, MultiHeadAttention, MultiHeadAttentionWrapper

LAYOUTS = ["single", "stacked", "split", "fused"]


def _config(layout, **kw):
    if layout == "single":
        return MHAConfig(dim=16, heads=1, layout=layout, **kw)
    return MHAConfig(dim=64, heads=4, layout=layout, **kw)


def test_causal_mask_from_runtime_shape():
    m = causal_mask(3, 3, torch.device("cpu"))
    assert m.tolist() == [[False, True, True], [False, False, True], [False, False, False]]


@pytest.mark.parametrize("source", ["stacked", "split", "fused"])
def test_every_layout_agrees_with_every_other(source):
    """Random weights in one layout, converted to every layout that can hold them: same function."""
    torch.manual_seed(0)
    src = build_module(MHAConfig(dim=64, heads=4, layout=source, qkv_bias=True), seed=1)
    x = torch.randn(2, 11, 64)
    y = src(x)
    converted = 0
    for target in ["stacked", "split", "fused"]:
        try:
            dst = convert(src, target)
        except UsageError:
            assert source in ("split", "fused") and target == "stacked"
            continue
        converted += 1
        assert (dst(x) - y).abs().max() < 1e-6, (source, target)
        assert (convert(dst, source)(x) - y).abs().max() < 1e-6
    assert converted >= 2


def test_single_converts_to_stacked_split_fused():
    src = build_module(MHAConfig(dim=16, heads=1, layout="single"), seed=2)
    x = torch.randn(1, 9, 16)
    for target in ["stacked", "split", "fused"]:
        assert (convert(src, target)(x) - src(x)).abs().max() < 1e-6


@pytest.mark.parametrize("layout", LAYOUTS)
def test_causality_and_dynamic_length(layout):
    """Output at position t depends only on inputs <= t, at lengths up to and past max_seq_len."""
    m = build_module(_config(layout, max_seq_len=8), seed=0)
    x = torch.randn(2, 12, m.config.d_in)
    y = m(x)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 6, m.config.d_in)
    assert torch.allclose(m(x2)[:, :6], y[:, :6], atol=1e-6)
    assert not torch.allclose(m(x2)[:, 6:], y[:, 6:], atol=1e-3)
    assert m(x[:, :1]).shape == (2, 1, m.config.dim)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attention_probabilities_for_inspection(layout):
    m = build_module(_config(layout), seed=0)
    x = torch.randn(2, 5, m.config.d_in)
    y, probs = m.forward_with_weights(x)
    assert probs.shape == (2, m.config.heads, 5, 5)
    assert torch.allclose(probs.sum(-1), torch.ones(2, m.config.heads, 5))
    assert probs.triu(1).abs().max() == 0  # causal: no weight on future keys
    assert (y - m(x)).abs().max() < 1e-6  # plain path == fast (SDPA) path


def test_non_causal_attends_everywhere():
    m = build_module(MHAConfig(dim=32, heads=2, causal=False), seed=0)
    _, probs = m.forward_with_weights(torch.randn(1, 4, 32))
    assert probs[..., 0, 1:].min() > 0  # the first query sees every key


def test_dropout_only_in_training():
    m = build_module(MHAConfig(dim=32, heads=2, dropout=0.5), seed=0)
    x = torch.randn(1, 6, 32)
    assert torch.equal(m(x), m(x))  # eval: deterministic
    m.train()
    torch.manual_seed(0)
    a = m(x)
    assert not torch.allclose(a, m(x))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torchscript_scriptable(layout):
    m = build_module(_config(layout), seed=0)
    ts = torch.jit.script(m)
    for t in (1, 7, 40):
        x = torch.randn(3, t, m.config.d_in)
        assert torch.equal(ts(x), m(x))


def test_textbook_checkpoints_load_and_agree():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 24)
    cases = [
        (CausalAttention(24, 16, 32, qkv_bias=True), dict(dim=16, heads=1, d_in=24, layout="single", qkv_bias=True)),
        (MultiHeadAttentionWrapper(24, 8, 32, 0.0, num_heads=3), dict(dim=24, heads=3, d_in=24, layout="stacked")),
        (MultiHeadAttention(24, 32, 32, 0.0, num_heads=4), dict(dim=32, heads=4, d_in=24, layout="split")),
    ]
    for ref, kw in cases:
        ref.eval()
        m = build_module(MHAConfig(**kw))
        sd = {k: v for k, v in ref.state_dict().items() if not k.endswith("mask")}
        m.load_state_dict(sd)  # the same key names, unchanged
        assert (m(x) - ref(x)).abs().max() < 1e-6, kw["layout"]


# --- the cached call (forward_step) -------------------------------------------------------------

def _steps(m, x, mask, split):
    b = x.shape[0]
    pk = pv = torch.zeros(b, m.config.heads, 0, m.config.head_dim)
    ys, pos = [], 0
    for n in split:
        y, pk, pv = m.forward_step(x[:, pos:pos + n], mask[:, :pos + n], pk, pv)
        ys.append(y)
        pos += n
    return torch.cat(ys, 1), pk, pv


@pytest.mark.parametrize("layout", ["single", "stacked", "split", "fused"])
def test_prefill_and_steps_equal_one_full_forward(layout):
    c = MHAConfig(dim=32, heads=1 if layout == "single" else 4, layout=layout, qkv_bias=True)
    m = build_module(c, seed=0)
    x = torch.randn(2, 11, 32)
    ones = torch.ones(2, 11, dtype=torch.long)
    with torch.inference_mode():
        y, k, v = _steps(m, x, ones, [4, 1, 1, 3, 2])
        full, fk, fv = m.attend(x, None, None, None)
    assert torch.allclose(y, full, atol=1e-6) and torch.allclose(m(x), full)
    assert torch.allclose(k, fk, atol=1e-6) and torch.allclose(v, fv, atol=1e-6)


def test_a_cached_step_is_aligned_bottom_right_not_like_sdpa_is_causal():
    """SDPA's is_causal aligns top-left when Tq != Tk: the last query would see only key 0."""
    m = build_module(MHAConfig(dim=32, heads=4), seed=0)
    x = torch.randn(1, 6, 32)
    with torch.inference_mode():
        _, pk, pv = m.attend(x[:, :5], None, None, None)
        step, _, _ = m.forward_step(x[:, 5:], torch.ones(1, 6, dtype=torch.long), pk, pv)
        q, k, v = m.project_qkv(x)
        top_left = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, 5:], k, v, is_causal=True)  # (1, nh, 1, hs): sees key 0 only
        wrong = m.project_out(top_left.transpose(1, 2).reshape(1, 1, 32))
        assert torch.allclose(step, m(x)[:, 5:], atol=1e-6)
    assert not torch.allclose(step, wrong, atol=1e-3)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_equal_each_sequence_alone_and_padding_rows_stay_finite(side):
    m = build_module(MHAConfig(dim=32, heads=4), seed=0)
    x = torch.randn(3, 9, 32)
    mask = torch.ones(3, 9, dtype=torch.long)
    pads = [0, 2, 8]  # the last row has one real token
    for r, n in enumerate(pads):
        if n:
            mask[r, :n] = 0 if side == "left" else 1
            if side == "right":
                mask[r, 9 - n:] = 0
    with torch.inference_mode():
        y, _, _ = _steps(m, x, mask, [6, 1, 2])
        assert torch.isfinite(y).all()
        for r in range(3):
            real = mask[r] == 1
            alone = m(x[r:r + 1, real])
            assert torch.allclose(y[r, real], alone[0], atol=1e-5), (side, r)


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("layout", ["split", "fused"])
def test_grouped_query_heads_read_kv_head_h_div_groups(layout, kv_heads):
    """Query head h uses key/value head h // (heads / kv_heads): Hugging Face's repeat_kv."""
    c = MHAConfig(dim=32, heads=4, kv_heads=kv_heads, layout=layout, qkv_bias=True)
    m = build_module(c, seed=0)
    x = torch.randn(2, 7, 32)
    with torch.inference_mode():
        q, k, v = m.project_qkv(x)  # (B, 4, T, 8), (B, kv_heads, T, 8) x 2
        assert k.shape[1] == kv_heads
        heads = []
        for h in range(4):
            j = h // (4 // kv_heads)
            s = (q[:, h] @ k[:, j].transpose(-1, -2)) / 8 ** 0.5
            s = s.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
            heads.append(s.softmax(-1) @ v[:, j])
        want = m.project_out(torch.stack(heads, 1).transpose(1, 2).reshape(2, 7, 32))
        y, present_key, _ = m.attend(x, None, None, None)
        y_plain, probs = m.forward_with_weights(x)  # the plain path repeats the kv heads
    assert torch.allclose(y, want, atol=1e-6) and present_key.shape == (2, kv_heads, 7, 8)
    assert torch.allclose(y_plain, want, atol=1e-6) and probs.shape == (2, 4, 7, 7)
    assert torch.allclose(convert(m, "split" if layout == "fused" else "fused")(x), y, atol=1e-6)


def test_kv_heads_must_divide_heads_and_need_a_grouped_layout():
    with pytest.raises(UsageError, match="multiple of kv_heads"):
        MHAConfig(dim=48, heads=6, kv_heads=4)
    with pytest.raises(UsageError, match="kv_heads must equal heads"):
        MHAConfig(dim=32, heads=4, kv_heads=2, layout="stacked")
    assert MHAConfig(dim=32, heads=4, kv_heads=2).slug() == "split-h4-d32-kv2"


def test_sliding_window_sees_only_the_last_window_keys_also_through_the_cache():
    c = MHAConfig(dim=32, heads=4, sliding_window=3)
    m = build_module(c, seed=0)
    x = torch.randn(2, 9, 32)
    with torch.inference_mode():
        q, k, v = m.project_qkv(x)
        i, j = torch.arange(9).unsqueeze(1), torch.arange(9).unsqueeze(0)
        allowed = (j <= i) & (i - j < 3)
        s = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~allowed, float("-inf"))
        want = m.project_out((s.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 32))
        assert torch.allclose(m(x), want, atol=1e-6)
        stepped, _, _ = _steps(m, x, torch.ones(2, 9, dtype=torch.long), [4, 1, 1, 3])
    assert torch.allclose(stepped, want, atol=1e-6)
    with pytest.raises(UsageError, match="sliding window needs a causal"):
        MHAConfig(dim=32, heads=4, sliding_window=3, causal=False)


def test_rotary_layouts_match_their_textbook_definitions_and_refuse_unknown_scaling():
    from mha_export.layer.rotary import cos_sin, inv_freq, rotate
    x = torch.randn(1, 1, 3, 8)
    pos = torch.tensor([[0, 1, 5]])
    cos, sin = cos_sin(pos, inv_freq(8, 10000.0), torch.float32)  # (1, 1, 3, 4)
    # rotate_half (GPT-NeoX / Llama): x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin)
    x1, x2 = x[..., :4], x[..., 4:]
    half = x * torch.cat([cos, cos], -1) + torch.cat([-x2, x1], -1) * torch.cat([sin, sin], -1)
    assert torch.allclose(rotate(x, cos, sin, False), half, atol=1e-6)
    # GPT-J: rotate_every_two with cos/sin repeated per pair
    c2, s2 = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    every_two = torch.stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)
    assert torch.allclose(rotate(x, cos, sin, True), x * c2 + every_two * s2, atol=1e-6)
    assert torch.allclose(inv_freq(8, 10000.0, {"rope_type": "linear", "factor": 4.0}),
                          inv_freq(8, 10000.0) / 4)
    with pytest.raises(UsageError, match="unsupported rope scaling type 'dynamic'"):
        MHAConfig(dim=32, heads=4, rotary="half", rope_scaling={"rope_type": "dynamic"})
    with pytest.raises(UsageError, match="rotary_dim must be even"):
        MHAConfig(dim=32, heads=4, rotary="half", rotary_dim=5)
