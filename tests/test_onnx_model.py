"""The ONNX builder (onnx_model.build_model) for every graph form and signature, against eager."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from mha_export import MHAConfig, UsageError, build_module
from mha_export.graph.forms import MAX_OPSET
from mha_export.kinds.registry import FORMS, get_form
from mha_export.layer.entry import entry_module
from mha_export.graph.model import build_model
from mha_export.signature import SHARED_KINDS, make_signature
from mha_export.check.sweep import Case, make_feeds, static_capacity, valid_entries
from mha_export.graph.forms import Feature

# a standard layer's call kinds (a KV-shared layer's counterparts: tests/test_kv_shared.py)
LAYER_KINDS = tuple(SHARED_KINDS)

# Multi-head Latent Attention (DeepSeek-V2 shape: no q LoRA, complex-form rope pairs)
MLA = MHAConfig(dim=64, heads=4, rotary="interleaved", latent=dict(
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24))
CONFIGS = [MHAConfig(dim=64, heads=4, qkv_bias=True),
           MHAConfig(dim=48, heads=3, head_dim=20, d_in=40, layout="fused", qkv_bias=True),
           MHAConfig(dim=32, heads=2, layout="stacked"),
           MHAConfig(dim=32, heads=4, causal=False, out_bias=False),
           MHAConfig(dim=64, heads=4, kv_heads=2, qkv_bias=True),  # grouped-query
           MHAConfig(dim=64, heads=4, kv_heads=1, layout="fused"),  # multi-query
           MHAConfig(dim=64, heads=4, kv_heads=2, sliding_window=5),  # Mistral-like
           MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", qkv_bias=True),  # Llama / Qwen2
           MHAConfig(dim=64, heads=4, rotary="half", rotary_dim=4, layout="fused"),  # NeoX partial
           MHAConfig(dim=48, heads=3, rotary="interleaved", rope_theta=500.0,  # GPT-J, llama3
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}),
           MLA,
           # Qwen4-exp's QSA: gated, q/k norms (1 + w), partial rotary; blocks of 4, 2 kept
           MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", rotary_dim=8, qk_norm="head",
                     norm_offset=1.0, output_gate=True,
                     qsa=dict(heads=4, head_dim=16, budget=8, compress_ratio=4)),
           # DeepSeek-V4's HCA layer: window 8 acting, a pooled row every 4 tokens, sinks
           MHAConfig(dim=64, heads=4, head_dim=32, rotary="interleaved", rotary_dim=8,
                     sliding_window=8, dsv4={"layer_type": "heavily_compressed_attention",
                                             "q_lora_rank": 24, "o_groups": 2,
                                             "o_lora_rank": 16, "rate": 4})]


def _signature_of(config: MHAConfig, kind: str):
    """make_signature's; a call kind the layer's kind declares unbuilt (its ``unbuilt_calls``:
    DeepSeek-V4's cached calls, their one-line refusal tested in test_dsv4_kind.py) skipped
    with that refusal as the reason."""
    refused = getattr(config.section, "unbuilt_calls", {}).get(kind)
    if refused:
        pytest.skip(refused)
    return make_signature(config, kind)


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _buildable(form, config, sig) -> bool:
    return form.problem(config, sig) is None


def _signature(form: str, config: MHAConfig):
    """The full-sequence signature, or a static cache's for a form that builds only those."""
    static = Feature.STATIC_CACHE in FORMS[form].requires
    return make_signature(config, "static-cache" if static else "full")


def _for(form: str, config: MHAConfig) -> MHAConfig:
    """config, or a layer of its width of the kind the form builds (an MLA layer; a KV-shared
    layer reading layer 0's keys; a QSA layer; a DeepSeek-V4 HCA layer)."""
    kind = FORMS[form].kind
    if kind == config.kind or _buildable(FORMS[form], config, make_signature(config)):
        return config
    if kind == "latent":
        return MLA.replace(dim=config.dim, d_in=None, max_seq_len=config.max_seq_len)
    if kind == "qsa":  # block_topk 2 of blocks of 2 keys
        return config.replace(layout="qsa", qsa=dict(heads=2, head_dim=config.head_dim,
                                                     budget=4, compress_ratio=2))
    if kind == "dsv4":  # an HCA layer of its width: window 8, a pooled row every 4 tokens
        return MHAConfig(dim=config.dim, heads=4, head_dim=16, max_seq_len=config.max_seq_len,
                         rotary="interleaved", rotary_dim=8, sliding_window=8,
                         dsv4={"layer_type": "heavily_compressed_attention",
                               "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 16,
                               "rate": 4})
    return config.replace(kv_shared={"kv_shared_layer": 0}, layout="shared")


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.slug() + ("" if c.causal else "-noncausal"))  # noqa: E501
def test_matches_eager_at_lengths_never_seen(form, config, kind):
    sig = _signature_of(config, kind)
    if not _buildable(FORMS[form], config, sig):
        pytest.skip(f"{form} cannot build this (export refuses it: tested below)")
    m = build_module(config, seed=0)
    model = build_model(config, m.to_weights(), FORMS[form], signature=sig)
    onnx.checker.check_model(model, full_check=True)
    session, entry = _session(model), entry_module(m, kind, sig.input_names, sig.output_names)
    cases = [Case(1, 1), Case(3, 7), Case(2, 33), Case(1, 300)]
    if sig.has_cache:
        cases += [Case(2, 1, 5), Case(3, 4, 9), Case(1, 520, 3)]
    if sig.has_mask:
        cases += [Case(3, 9, 4 if sig.has_cache else 0, pad) for pad in ("left", "right")]
    if sig.static_cache and not FORMS[form].static_chunks:  # refused by the runtime (tested)
        cases = [c for c in cases if c.batch == 1 or c.seq == 1 or c.past == 0]
    if not FORMS[form].batch_prompts:  # NaN by design (tests/test_packed_gqa.py)
        cases = [c for c in cases if c.batch == 1 or c.seq == 1]
    if FORMS[form].max_cache:  # its cos/sin table: a longer buffer is refused by the runtime
        cases = [c for c in cases if static_capacity(c) <= FORMS[form].max_cache(config)]
    for case in cases:
        feeds = make_feeds(sig, case, seed=1)
        got = dict(zip(sig.output_names, session.run(None, feeds)))
        with torch.inference_mode():
            want = entry(*[torch.from_numpy(feeds[n]) for n in sig.input_names])
        want = dict(zip(sig.output_names, want if isinstance(want, (tuple, list)) else (want,)))
        valid = valid_entries(sig, feeds, case)  # y's real rows, a static buffer's valid entries
        for name in sig.output_names:
            assert np.isfinite(got[name]).all()
            diff = np.abs(got[name] - want[name].numpy())
            if valid.get(name) is not None:
                diff = diff * valid[name]
            assert diff.max(initial=0) <= 1e-5, (name, case)  # (a state may be empty)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("form", FORMS)
def test_io_declares_named_inputs_with_symbolic_axes(form, kind):
    c = _for(form, MHAConfig(dim=64, heads=4))
    sig = _signature_of(c, kind)
    if not _buildable(FORMS[form], c, sig):
        pytest.skip("not buildable")
    model = build_model(c, build_module(c, seed=0).to_weights(), FORMS[form], signature=sig)
    declared = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
                for vi in [*model.graph.input, *model.graph.output]}
    assert list(declared) == sig.input_names + sig.output_names
    for spec in (*sig.inputs, *sig.outputs):
        assert declared[spec.name] == list(spec.shape)
    assert declared["x"] == ["batch", "seq", 64]


@pytest.mark.parametrize("form", FORMS)
def test_no_baked_mask_or_sequence_sized_constant(form):
    """Nothing in the graph has a max_seq_len-sized dimension (the textbook buffer would)."""
    c = _for(form, MHAConfig(dim=64, heads=4, max_seq_len=97))
    model = build_model(c, build_module(c, seed=0).to_weights(), FORMS[form],
                        signature=_signature(form, c))
    for t in model.graph.initializer:
        assert 97 not in t.dims, t.name
        # weights (an RMSNorm's mean; DeepSeek-V4's compressor's learned (rate, width) bias)
        if not t.name.endswith((".weight", ".bias", ".mean", ".position_bias")):
            assert np.prod(t.dims) <= 8, t.name


@pytest.mark.parametrize("form", FORMS)
def test_every_supported_opset_loads(form):
    c = _for(form, MHAConfig(dim=32, heads=2))
    w = build_module(c, seed=0).to_weights()
    sig = _signature(form, c)
    x = make_feeds(sig, Case(1, 3), seed=0)
    outs = [_session(build_model(c, w, FORMS[form], opset, signature=sig)).run(None, x)[0]
            for opset in range(FORMS[form].min_opset, MAX_OPSET + 1)]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], atol=1e-6)


@pytest.mark.parametrize("config, msg", [(MHAConfig(dim=32, heads=2, causal=False), "does not support non-causal"),
                                         (MHAConfig(dim=48, heads=4), "head_dim % 8")])
def test_gqa_refuses_what_its_kernel_cannot_do(config, msg):
    with pytest.raises(UsageError, match=msg):
        build_model(config, build_module(config, seed=0).to_weights(), FORMS["contrib-gqa"])


def test_a_form_without_the_cache_names_the_forms_that_have_it():
    c = MHAConfig(dim=32, heads=2)
    with pytest.raises(UsageError, match=r"'contrib-mha' does not support attention-mask, "
                                         r"kv-cache \(forms that can: auto, decomposed"):
        build_model(c, build_module(c, seed=0).to_weights(), FORMS["contrib-mha"],
                    signature=make_signature(c, "kv-cache"))


def test_renamed_and_unknown_form_names_are_refused():
    with pytest.raises(UsageError, match="called 'attention-op' since 0.2"):
        get_form("fused")
    with pytest.raises(UsageError, match="unknown attention form 'flash'"):
        get_form("flash")


def test_opset_outside_the_form_is_refused():
    c = MHAConfig(dim=32, heads=2)
    with pytest.raises(UsageError, match=r"opset 17 cannot be produced .* 'auto' \(supported: 23-26\)"):
        build_model(c, build_module(c, seed=0).to_weights(), FORMS["auto"], 17)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("form", FORMS)
def test_bfloat16_models_build_with_bfloat16_io_and_weights(form, kind):
    """--dtype bfloat16: every form and call kind builds and passes onnx's full check; float
    I/O and the weights are bf16 (the rotary frequencies stay float32, as in fp16 models), and
    the mask fill is bf16's lowest finite value."""
    import ml_dtypes
    from onnx import TensorProto, numpy_helper
    c = _for(form, MHAConfig(dim=64, heads=4, rotary="half"))
    sig = _signature_of(c, kind)
    if not _buildable(FORMS[form], c, sig):
        pytest.skip("not buildable")
    w = build_module(c, seed=0)
    model = build_model(c, w.to_weights() if not c.latent else w.state_dict(), FORMS[form],
                        dtype="bfloat16", signature=sig)
    onnx.checker.check_model(model, full_check=True)
    floats = {spec.name for spec in (*sig.inputs, *sig.outputs) if spec.dtype == "float"}
    io = {vi.name: vi.type.tensor_type.elem_type for vi in [*model.graph.input,
                                                           *model.graph.output]}
    assert floats and {io[n] for n in floats} == {TensorProto.BFLOAT16}
    stored = {t.name: t.data_type for t in model.graph.initializer}
    # the rotary frequencies, a QSA indexer's constants (its pooling and scores float32) and
    # GroupQueryAttention's NaN guard (chosen in float32: ONNX Runtime folds it, contrib.py)
    float32 = ("rotary.", "index_", "guard_f32.")
    assert {t for n, t in stored.items() if not n.startswith(float32)} - {
        TensorProto.INT64, TensorProto.BOOL} == {TensorProto.BFLOAT16}
    fills = [numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "mask_fill"]
    assert all(f == ml_dtypes.finfo(ml_dtypes.bfloat16).min for f in fills)
