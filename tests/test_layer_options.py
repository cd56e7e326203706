"""The options of 2025-26 attention layers (q/k norm, softmax scale, softcapping, sinks, output
gate): eager equals its textbook formula, every form that can build them passes the check, a form
that cannot is refused by name, and planted faults in each option fail the check."""

import pytest
import torch

from mha_export import MHAConfig, UsageError, check_parity, export_onnx, export_torchscript
from mha_export.kinds.registry import build_module

import faults

BASE = dict(dim=64, heads=4, kv_heads=2, max_seq_len=16)
ROTARY = dict(rotary="half")
SWEEP = dict(seq_lens=[1, 6, 17, 260], batch_sizes=[2], providers=["cpu"])
ALL = dict(qk_norm="head", norm_offset=1.0, softmax_scale=0.2, softcap=3.0, sinks=True,
           output_gate=True, sliding_window=5, rotary="half")


def test_eager_matches_the_textbook_formula():
    """One head-group by hand: norm (1 + w), scale, softcap, mask, sinks, gate."""
    c = MHAConfig(**{**BASE, **ALL, "rotary": "none"})
    m = build_module(c, seed=1)
    x = torch.randn(1, 9, 64)
    w = m.to_weights()

    def heads(t, n):
        return t.view(1, 9, n, 16).transpose(1, 2)  # (B, n, T, H)

    def norm(t, weight):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + weight)
    q = norm(heads(x @ w.wq.T, 4), w.q_norm)
    k = norm(heads(x @ w.wk.T, 2), w.k_norm).repeat_interleave(2, 1)
    v = heads(x @ w.wv.T, 2).repeat_interleave(2, 1)
    s = 3.0 * torch.tanh(q @ k.transpose(-1, -2) * 0.2 / 3.0)  # (1, 4, 9, 9)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None]
    s = s.masked_fill((j > i) | (i - j >= 5), float("-inf"))
    s = torch.cat([s, w.sinks.view(1, 4, 1, 1).expand(1, 4, 9, 1)], -1).softmax(-1)[..., :-1]
    ctx = (s @ v).transpose(1, 2).reshape(1, 9, 64) * torch.sigmoid(x @ w.wg.T)
    expected = ctx @ w.wo.T + w.bo
    torch.testing.assert_close(m(x), expected, atol=1e-5, rtol=1e-5)


def test_layer_norm_qk_norms_are_torchs_layer_norm_per_head():
    """LayerNorm q/k norms (Phi: a bias; StableLM, Cohere: a weight per head) equal
    torch.nn.functional.layer_norm of each head."""
    c = MHAConfig(**BASE, qk_norm="head", qk_norm_type="layer", qk_norm_bias=True,
                  qk_norm_per_head=True, qk_norm_eps=1e-5)
    norm = build_module(c, seed=1).q_norm
    q = torch.randn(2, 4, 9, 16)  # (B, N, T, H)
    want = torch.stack([torch.nn.functional.layer_norm(
        q[:, i], (16,), norm.weight[i], norm.bias[i], 1e-5) for i in range(4)], 1)
    torch.testing.assert_close(norm(q), want)


@pytest.mark.parametrize("norm", [dict(qk_norm_bias=True), dict(qk_norm_per_head=True),
                                  dict(qk_norm="full", qk_norm_bias=True)])
def test_layer_norm_qk_norms_pass_on_every_target_and_call_kind(tmp_path, norm):
    c = MHAConfig(**BASE, **{"qk_norm": "head", "qk_norm_type": "layer", **norm, **ROTARY})
    for name, export, kw in (("o", export_onnx, dict(kv_cache=True)),
                             ("s", export_onnx, dict(attention_mask=True)),
                             ("ts", export_torchscript, dict(kv_cache=True))):
        report = check_parity(export(c, tmp_path / name, validate=False, **kw).path, **SWEEP,
                              past_lens=[0, 3])
        assert report.passed, (name, [x.error for x in report.results if not x.passed][:3])


@pytest.mark.parametrize("option", [dict(qk_norm="head", qk_norm_after_rope=True),
                                    dict(qk_norm="full", qkv_clip=0.5), dict(qkv_clip=0.3)])
def test_norm_after_rotary_and_the_qkv_clamp_equal_their_formula(option):
    """Hunyuan: RMSNorm after rotary; DBRX / OLMo: q, k, v clamped before rotary."""
    c = MHAConfig(**BASE, **ROTARY, **option)
    m = build_module(c, seed=3)
    x = torch.randn(1, 7, 64) * 3
    pos = torch.arange(7)[None]
    q, k, v = m.project_qkv(x)
    if not c.qk_norm_after_rope:
        q, k = m._normalize_qk(q, k)
    if c.qkv_clip:
        q, k, v = (t.clamp(-c.qkv_clip, c.qkv_clip) for t in (q, k, v))
        assert (q.abs() == c.qkv_clip).any()  # the clamp acts
    from mha_export.layer.rotary import cos_sin, rotate
    cos, sin = cos_sin(pos, m.inv_freq, q.dtype, m.long_inv_freq, m.rope_switch, m.rope_factor)
    q, k = rotate(q, cos, sin, False), rotate(k, cos, sin, False)
    if c.qk_norm_after_rope:
        q, k = m.q_norm(q), m.k_norm(k)
    got = m._queries_keys_values(x, pos, pos)
    for a, b in zip(got, (q, k, v)):
        torch.testing.assert_close(a, b)


# (folder, exporter, call kind): the ONNX default form's three kinds and TorchScript's cache
CALL_KINDS = (("o", export_onnx, dict(kv_cache=True)),
              ("m", export_onnx, dict(attention_mask=True)),
              ("s", export_onnx, dict(static_cache=True)),
              ("ts", export_torchscript, dict(kv_cache=True)))


def _passes_every_call_kind(c: MHAConfig, tmp_path, kinds=CALL_KINDS) -> None:
    for name, export, kw in kinds:
        report = check_parity(export(c, tmp_path / name, validate=False, **kw).path, **SWEEP,
                              past_lens=[0, 3])
        assert report.passed, (name, [x.error for x in report.results if not x.passed][:3])


LLAMA4 = dict(rotary="interleaved", attention_chunk=4, qk_norm="head", qk_norm_weightless=True,
              qk_norm_after_rope=True, query_scale_beta=0.5, query_scale_length=2,
              query_scale_by="slot")


def test_chunks_mask_what_their_formula_says():
    """Query i of row b sees key j <= i when (j - s) // C == (i - s) // C, s = its row's left
    padding (transformers' chunked mask), bottom-right aligned over a cache."""
    from mha_export.layer.attention import score_mask
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    got = score_mask(5, 9, True, mask, torch.device("cpu"), chunk=3)  # (B, 1, 5, 9)
    for b, s in ((0, 0), (1, 3)):
        for i in range(5):
            q = 4 + i
            want = [not (k <= q and (k - s) // 3 == (q - s) // 3 and mask[b, k] == 1)
                    for k in range(9)]
            assert got[b, 0, i].tolist() == want, (b, i)


def test_llama4_options_pass_on_every_target_and_call_kind(tmp_path):
    """Chunks, the weightless norm after rotary and the slot-scaled queries, together."""
    _passes_every_call_kind(MHAConfig(**BASE, **LLAMA4), tmp_path,
                            CALL_KINDS + (("tss", export_torchscript, dict(static_cache=True)),))


@pytest.mark.parametrize("options, message", [
    (dict(sliding_window=4, attention_chunk=4), "a sliding window or attention chunks, not both"),
    (dict(attention_chunk=4, causal=False), "attention chunks needs a causal layer"),
    (dict(attention_chunk=0), "attention_chunk"),
    (dict(qk_norm_weightless=True), "qk_norm_weightless shapes the q/k norm"),
    (dict(qk_norm="full", qk_norm_weightless=True), "needs qk_norm head"),
    (dict(qk_norm="head", qk_norm_type="layer", qk_norm_weightless=True), "needs qk_norm head"),
    (dict(query_scale_beta=0.1, query_scale_length=4, query_scale_by="token"),
     "unknown query_scale_by 'token'"),
    (dict(query_scale_beta=0.1, query_scale_length=4), "it needs rotary"),
])
def test_llama4_options_refuse_what_they_cannot_mean(options, message):
    with pytest.raises(UsageError, match=message):
        MHAConfig(**BASE, **options)


VALUE_WIDTH = dict(v_head_dim=24, output_gate=True, out_norm_eps=1e-5, v_norm_eps=1e-6,
                   sinks=True, sliding_window=5)


@pytest.mark.parametrize("layout", ["split", "fused"])
def test_value_heads_of_their_own_width_pass_on_every_target_and_call_kind(tmp_path, layout):
    """MiMo-V2: v_head_dim unlike head_dim, with the options whose width follows the values
    (output gate, output norm, value norm); the default form falls to one that builds it."""
    c = MHAConfig(**BASE, **ROTARY, **VALUE_WIDTH, layout=layout)
    m = build_module(c, seed=1)
    assert m.to_weights().wv.shape == (2 * 24, 64) and m.to_weights().wo.shape == (64, 4 * 24)
    _passes_every_call_kind(c, tmp_path)


def test_value_heads_of_their_own_width_are_refused_where_they_cannot_be_built(tmp_path):
    with pytest.raises(UsageError, match="v_head_dim must equal head_dim"):
        MHAConfig(dim=64, heads=4, layout="stacked", v_head_dim=8)
    with pytest.raises(UsageError, match="does not support value-head-width"):
        export_onnx(MHAConfig(**BASE, v_head_dim=8), tmp_path / "x", attention="auto")


def test_alibi_adds_each_heads_slope_times_the_distance():
    """The eager core's bias, against the formula over a cache (bottom-right) and a static
    cache's rows; the default slopes are the paper's (BLOOM's for 4 and 6 heads)."""
    from mha_export.alibi import geometric_slopes, mpt_slopes
    from mha_export.layer.attention import alibi_bias
    assert geometric_slopes(4) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]
    assert geometric_slopes(6)[4:] == pytest.approx([2 ** -1, 2 ** -3])
    assert mpt_slopes(4) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]
    assert mpt_slopes(3) == [2 ** -4, 2 ** -8, 2 ** -2]
    slopes = torch.tensor([0.5, 0.25])
    got = alibi_bias(slopes, 2, 5)  # queries at 3 and 4
    want = torch.tensor([[j - i for j in range(5)] for i in (3, 4)], dtype=torch.float32)
    torch.testing.assert_close(got, slopes.view(1, 2, 1, 1) * want)
    rows = alibi_bias(slopes, 1, 5, torch.tensor([0, 2]))  # (2, 2, 1, 5)
    torch.testing.assert_close(rows[1, 0, 0], 0.5 * (torch.arange(5.0) - 2))
    m = build_module(MHAConfig(**BASE, alibi=True), seed=0)
    torch.testing.assert_close(m.alibi_slopes, torch.tensor(geometric_slopes(4)))


def test_alibi_passes_on_every_target_and_call_kind(tmp_path):
    c = MHAConfig(**BASE, alibi=True, sliding_window=5)
    _passes_every_call_kind(c, tmp_path)


def test_the_v_head_dim_flag_is_the_standard_layers_without_kv_lora_rank(tmp_path):
    """--v-head-dim alone: the standard layer's value width (MiMo-V2); with --kv-lora-rank:
    the MLA section's; another MLA option alone still needs --kv-lora-rank."""
    import json
    from click.testing import CliRunner
    from mha_export.cli.commands import cli
    base = ["onnx", "--heads", "4", "--dim", "64", "--max-seq-len", "16", "--no-check"]
    r = CliRunner().invoke(cli, base + ["--v-head-dim", "8", "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())["config"]
    assert config["v_head_dim"] == 8 and config["latent"] is None
    r = CliRunner().invoke(cli, base + ["--v-head-dim", "8", "--qk-rope-head-dim", "8", "-o",
                                        str(tmp_path / "b")])
    assert r.exit_code == 2 and "needs --kv-lora-rank" in r.output


def test_queries_scaled_by_slot_need_no_rotary():
    c = MHAConfig(**BASE, query_scale_beta=0.1, query_scale_length=4, query_scale_by="slot")
    assert c.rotary == "none" and c.query_scale_by == "slot"


def test_qk_norm_shapes_need_a_qk_norm():
    with pytest.raises(UsageError, match="qk_norm_type shapes the q/k norm: it needs"):
        MHAConfig(**BASE, qk_norm_type="layer")
    with pytest.raises(UsageError, match="qk_norm_per_head gives each head its own"):
        MHAConfig(**BASE, qk_norm="full", qk_norm_per_head=True)


@pytest.mark.parametrize("form", ["decomposed", "blocked-plain"])
@pytest.mark.parametrize("kind", ["full", "kv-cache"])
def test_every_option_together_passes_the_check(tmp_path, form, kind):
    r = export_onnx(MHAConfig(**BASE, **ALL), tmp_path / "a", attention=form,
                    kv_cache=kind == "kv-cache", validate=False)
    report = check_parity(r.path, **SWEEP, past_lens=[0, 3])
    assert report.passed, [x.error for x in report.results if not x.passed][:3]


def test_torchscript_and_the_default_form(tmp_path):
    c = MHAConfig(**BASE, **ALL)
    assert check_parity(export_torchscript(c, tmp_path / "ts", validate=False).path,
                        **SWEEP).passed
    r = export_onnx(c, tmp_path / "o", validate=False)  # auto cannot (sinks): blocked-plain can
    assert r.path.joinpath("config.json").read_text().count('"attention": "blocked-plain"') == 1


def test_a_form_that_cannot_build_an_option_names_those_that_can(tmp_path):
    with pytest.raises(UsageError, match="forms that can: decomposed, blocked-plain"):
        export_onnx(MHAConfig(**BASE, sinks=True), tmp_path / "x", attention="auto")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("form", ["auto", "attention-op", "blocked"])
@pytest.mark.parametrize("kind", ["full", "kv-cache"])
def test_softcap_through_the_attention_node(tmp_path, form, kind):
    """The standard Attention node's softcap attribute (transformers' order, proven below)."""
    r = export_onnx(MHAConfig(**BASE, softcap=3.0, sliding_window=5, rotary="half"),
                    tmp_path / "a", attention=form, kv_cache=kind == "kv-cache", validate=False)
    report = check_parity(r.path, **SWEEP, past_lens=[0, 3])
    assert report.passed, [x.error for x in report.results if not x.passed][:3]


@pytest.mark.parametrize("mask", ["bool", "additive", "is_causal"])
def test_onnx_runtime_applies_softcap_before_the_mask(mask):
    """ONNX's softcap was once specified after the mask (onnx/onnx#7865): a masked score would
    become -cap and leak probability. ONNX Runtime 1.31 applies it before, as transformers."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    b, n, t, h, cap = 1, 2, 5, 8, 2.0
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, t, n * h)).astype(np.float32) * 3 for _ in range(3))
    keep = np.tril(np.ones((t, t), bool))
    feeds = {"q": q, "k": k, "v": v}
    if mask != "is_causal":
        feeds["mask"] = keep if mask == "bool" else np.where(
            keep, 0, np.finfo(np.float32).min).astype(np.float32)
    node = helper.make_node("Attention", list(feeds), ["y"], softcap=cap, scale=1.0,
                            q_num_heads=n, kv_num_heads=n, is_causal=int(mask == "is_causal"))
    info = [helper.make_tensor_value_info(
        name, TensorProto.BOOL if a.dtype == bool else TensorProto.FLOAT, list(a.shape))
        for name, a in feeds.items()]
    graph = helper.make_graph([node], "softcap", info,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    y = ort.InferenceSession(model.SerializeToString(),
                             providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    def heads(a):
        return a.reshape(b, t, n, h).transpose(0, 2, 1, 3)  # (B, N, T, H)

    scores = heads(q) @ heads(k).transpose(0, 1, 3, 2)  # (B, N, T, T)
    capped = np.where(keep, cap * np.tanh(scores / cap), -np.inf)  # cap, then mask
    probs = np.exp(capped - capped.max(-1, keepdims=True))
    want = ((probs / probs.sum(-1, keepdims=True)) @ heads(v)).transpose(0, 2, 1, 3).reshape(
        b, t, n * h)
    np.testing.assert_allclose(y, want, atol=1e-5)


def test_options_need_a_layout_that_holds_their_weights():
    with pytest.raises(UsageError, match="sinks has weights only the split and fused"):
        MHAConfig(dim=64, heads=4, layout="stacked", sinks=True)


@pytest.mark.parametrize("fault", sorted(faults.OPTION_FAULTS))
@pytest.mark.parametrize("form", ["decomposed", "blocked-plain"])
def test_planted_option_fault_is_caught(tmp_path, fault, form):
    options, plant = faults.OPTION_FAULTS[fault]
    config = MHAConfig(**{"rotary": "half", **BASE, **options})
    path = export_onnx(config, tmp_path / "a", attention=form, validate=False).path
    assert check_parity(path, **SWEEP).passed  # passes before the fault ...
    plant(path / "model.onnx", config)
    report = check_parity(path, **SWEEP)
    assert not report.passed  # ... and fails after it
    assert {r.runner for r in report.results if not r.passed} == {"ort-cpu"}


def test_the_sweep_crosses_a_longrope_switch_beyond_the_context(tmp_path):
    """original_max_position_embeddings 64 > the checked context (16): the sweep still runs
    calls whose max(position_ids) + 1 is 64 and 65 (both tables)."""
    scaling = {**faults.LONGROPE, "original_max_position_embeddings": 64}
    path = export_onnx(MHAConfig(**BASE, rotary="half", rope_scaling=scaling), tmp_path / "a",
                       validate=False).path
    report = check_parity(path, seq_lens=[3], batch_sizes=[2], providers=["cpu"])
    assert report.passed
    assert {r.case.positions_end for r in report.results} == {0, 64, 65}
    faults.longrope_stuck_short(path / "model.onnx")
    failed = {r.case.positions_end for r in check_parity(path, seq_lens=[3], batch_sizes=[2],
                                                          providers=["cpu"]).results
              if not r.passed}
    assert failed == {65}


@pytest.mark.parametrize("locality", [dict(sliding_window=40), dict(attention_chunk=40)])
@pytest.mark.parametrize("kind", ["full", "kv-cache", "static-cache"])
def test_the_sweep_crosses_a_window_longer_than_the_context(tmp_path, kind, locality):
    """A window (or chunk) of 40 over a checked context of 16: the sweep adds a call that
    crosses it."""
    config = MHAConfig(**BASE, **locality)
    path = export_onnx(config, tmp_path / "a", kv_cache=kind == "kv-cache",
                       static_cache=kind == "static-cache", validate=False).path
    report = check_parity(path, seq_lens=[3], batch_sizes=[1], past_lens=[0])
    assert report.passed
    assert ((41, 0) if kind == "full" else (2, 40)) in {(r.seq, r.past) for r in report.results}


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("option", [dict(), dict(window=3), dict(chunk=4), dict(softcap=0.5),
                                    dict(sinks=True), dict(alibi=True)])
def test_grouped_attention_over_a_whole_buffer_is_attention_over_the_valid_prefix(kv_heads,
                                                                                  option):
    """The ExecuTorch step's core (query heads grouped per kv head, the keys stored
    transposed, every slot of the buffer read and those past the row's queries masked) equals
    ``attention`` over the row's valid prefix, with each option."""
    from mha_export.layer.attention import Scoring, attention, grouped_attention
    torch.manual_seed(0)
    n, h, c, t, start = 4, 8, 16, 3, 5
    q = torch.randn(n, t, h, dtype=torch.float64)
    keys, values = (torch.randn(kv_heads, c, h, dtype=torch.float64) for _ in range(2))
    sinks = torch.randn(n, dtype=torch.float64) if option.get("sinks") else None
    alibi = torch.rand(n, dtype=torch.float64) if option.get("alibi") else None
    scoring = Scoring(0.3, True, option.get("window", 0), option.get("chunk", 0),
                      option.get("softcap", 0.0), sinks, alibi)
    got = grouped_attention(q, keys.transpose(1, 2), values, scoring, torch.tensor([start]))
    end = start + t
    want, _ = attention(q[None], keys[None, :, :end], values[None, :, :end], scoring,
                        query_start=torch.tensor([start]))
    torch.testing.assert_close(got, want[0], rtol=1e-12, atol=1e-12)
