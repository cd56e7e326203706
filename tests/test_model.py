import pytest
import torch

from mha_export import MHAConfig, UsageError, build_module, convert
from mha_export.attention import causal_mask

from mha_export.textbook import CausalAttention, MultiHeadAttention, MultiHeadAttentionWrapper

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
