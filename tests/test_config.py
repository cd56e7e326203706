import pytest

from mha_export import MHAConfig, UsageError


def test_defaults_resolve():
    c = MHAConfig(dim=768, heads=12)
    assert (c.d_in, c.head_dim, c.inner, c.layout, c.causal, c.max_seq_len) == (768, 64, 768, "split", True, 1024)


def test_inner_width_may_differ_from_dim():
    c = MHAConfig(dim=48, heads=3, head_dim=20)
    assert c.inner == 60 and c.dim == 48


@pytest.mark.parametrize("kw, msg", [
    (dict(dim=768, heads=7), "not divisible"),
    (dict(heads=0), "heads must be a positive integer"),
    (dict(heads=-2), "heads must be a positive integer"),
    (dict(dim=0), "dim must be"),
    (dict(layout="diagonal"), "unknown layout"),
    (dict(layout="single", heads=2, dim=64), "exactly one head"),
    (dict(layout="stacked", dim=48, heads=3, head_dim=20), "must equal dim"),
    (dict(dropout=1.5), "dropout"),
    (dict(max_seq_len=0), "max_seq_len"),
])
def test_invalid(kw, msg):
    with pytest.raises(UsageError, match=msg):
        MHAConfig(**kw)


def test_round_trip_and_slug():
    c = MHAConfig(dim=48, heads=3, head_dim=20, d_in=32, qkv_bias=True)
    assert MHAConfig.from_dict(c.to_dict()) == c
    assert c.slug() == "split-h3-d48-in32-hd20"
    with pytest.raises(UsageError, match="unknown fields"):
        MHAConfig.from_dict({**c.to_dict(), "colour": 1})
