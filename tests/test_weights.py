
import pytest
import torch
from safetensors.torch import save_file

from mha_export import MHAConfig, UsageError, build_module, load_module
from mha_export.weights.files import read_block

from mha_export.bench.baselines import MultiHeadAttention
from gpt2_reference import gpt2_attention, gpt2_checkpoint

X = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(0))


def _save(tmp_path, sd, name):
    path = tmp_path / name
    if name.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        torch.save(sd, path)
    return path


@pytest.mark.parametrize("layout", ["single", "stacked", "split", "fused"])
@pytest.mark.parametrize("prefix", ["", "attn.", "h.3.attn.", "transformer.h.3.attn."])
@pytest.mark.parametrize("ext", [".safetensors", ".pt"])
def test_each_layout_loads_its_keys_with_any_prefix(tmp_path, layout, prefix, ext):
    c = MHAConfig(dim=16, heads=1, layout=layout) if layout == "single" else MHAConfig(dim=64, heads=4, layout=layout)
    src = build_module(c, seed=3)
    sd = {prefix + k: v for k, v in src.state_dict().items()}
    if layout in ("single", "split"):  # textbook checkpoints carry the mask buffer
        sd[prefix + "mask"] = torch.triu(torch.ones(32, 32), 1)
    if layout == "stacked":
        sd[prefix + "heads.0.mask"] = torch.triu(torch.ones(32, 32), 1)
    path = _save(tmp_path, sd, "w" + ext)
    assert read_block(path).layout == layout
    m = load_module(c, path)
    x = X[..., : c.d_in]
    assert torch.equal(m(x), src(x))


def test_weights_convert_to_requested_layout(tmp_path):
    src = build_module(MHAConfig(dim=64, heads=4, layout="fused", qkv_bias=True), seed=1)
    path = _save(tmp_path, src.state_dict(), "w.safetensors")
    m = load_module(MHAConfig(dim=64, heads=4, layout="split", qkv_bias=True), path)
    assert type(m).__name__ == "SplitHeadsAttention"
    assert (m(X) - src(X)).abs().max() < 1e-6


def test_textbook_multihead_checkpoint(tmp_path):
    ref = MultiHeadAttention(64, 64, 32, 0.0, num_heads=4).eval()
    path = _save(tmp_path, ref.state_dict(), "mha.pth")
    m = load_module(MHAConfig(dim=64, heads=4), path)
    assert (m(X) - ref(X)).abs().max() < 1e-6


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_gpt2_checkpoint_layer_and_conv1d_transpose(tmp_path, prefix):
    sd = gpt2_checkpoint(n_layer=3, d=64, n_head=4, prefix=prefix)
    path = _save(tmp_path, sd, "model.safetensors")
    cfg = MHAConfig(dim=64, heads=4, layout="fused", qkv_bias=True)
    with pytest.raises(UsageError, match="pick one with --layer"):
        load_module(cfg, path)
    p = f"{prefix}h.2.attn."
    expected = gpt2_attention(X, sd[p + "c_attn.weight"], sd[p + "c_attn.bias"],
                              sd[p + "c_proj.weight"], sd[p + "c_proj.bias"], n_head=4)
    m = load_module(cfg, path, layer=2)
    assert (m(X) - expected).abs().max() < 1e-5
    with pytest.raises(UsageError, match="no attention weights for layer 7"):
        load_module(cfg, path, layer=7)


def test_conv1d_orientation_detected_by_shape(tmp_path):
    """d_in != 3*inner: an attention-only Conv1D file is recognised by its [in, out] shape."""
    src = build_module(MHAConfig(dim=64, heads=4, layout="fused", qkv_bias=True), seed=0)
    sd = {k: (v.t() if k.endswith("weight") else v) for k, v in src.state_dict().items()}
    m = load_module(src.config, _save(tmp_path, sd, "conv1d.bin"))
    assert torch.equal(m(X), src(X))


def test_bias_mismatch_names_the_tensor(tmp_path):
    src = build_module(MHAConfig(dim=64, heads=4, qkv_bias=True), seed=0)
    path = _save(tmp_path, src.state_dict(), "w.pt")
    with pytest.raises(UsageError, match=r"unexpected tensor W_query.bias.*--qkv-bias"):
        load_module(MHAConfig(dim=64, heads=4), path)


def test_missing_tensor_names_it(tmp_path):
    sd = build_module(MHAConfig(dim=64, heads=4), seed=0).state_dict()
    del sd["W_value.weight"]
    with pytest.raises(UsageError, match="missing tensor attn.W_value.weight"):
        load_module(MHAConfig(dim=64, heads=4), _save(tmp_path, {"attn." + k: v for k, v in sd.items()}, "w.pt"))


def test_wrong_shape_names_it(tmp_path):
    sd = build_module(MHAConfig(dim=64, heads=4), seed=0).state_dict()
    with pytest.raises(UsageError, match=r"tensor W_query.weight has shape \[64, 64\], expected \[128, 64\]"):
        load_module(MHAConfig(dim=64, heads=4, head_dim=32), _save(tmp_path, sd, "w.pt"))


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickle_with_code_is_refused(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"W_query.weight": torch.zeros(2, 2), "payload": Evil()}, path)
    with pytest.raises(UsageError, match="refused to unpickle"):
        load_module(MHAConfig(dim=64, heads=4), path)
    assert "pwned" not in capsys.readouterr().out


@pytest.mark.parametrize("name, data, msg", [
    ("w.safetensors", b"not a safetensors file", "not a readable safetensors"),
    ("w.pt", b"\x00garbage", "not a readable torch state dict"),
    ("w.npz", b"", "unsupported weights format"),
])
def test_corrupt_files(tmp_path, name, data, msg):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(UsageError, match=msg):
        load_module(MHAConfig(dim=64, heads=4), tmp_path / name)


def test_non_tensor_values_and_no_attention(tmp_path):
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(UsageError, match="state dict"):
        load_module(MHAConfig(), tmp_path / "list.pt")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "other.pt")
    with pytest.raises(UsageError, match="no attention weights found"):
        load_module(MHAConfig(), tmp_path / "other.pt")
