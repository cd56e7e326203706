"""Multi-head Latent Attention (kinds/mla/layer.py), read from Hugging Face folders by the deepseek_v2 /
deepseek_v3 families (one sharded), against transformers' own attention modules (tiny random
configs built here, nothing downloaded): a left-padded batch, full sequence and prefill +
single-token steps with transformers' own cache; y and the latent cache, in the expanded form
and in the absorbed one (the cache read as stored, never expanded); the static cache."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import faults
from hf_decode import capture, decode
from mha_export.comparison.runner import positions
from mha_export.config import MHAConfig
from mha_export.errors import UsageError
from mha_export.kinds.mla.settings import MLAConfig
from mha_export.weights.source import load_source

MOE = dict(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           moe_intermediate_size=16, first_k_dense_replace=1)
COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
              intermediate_size=32, vocab_size=60, max_position_embeddings=64,
              kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24,
              initializer_range=0.2, **MOE)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.9,
        "mscale_all_dim": 0.8, "original_max_position_embeddings": 16}
MODELS = {  # name: (model_type, config)
    "v3-qlora-interleave-yarn": ("deepseek_v3", dict(COMMON, q_lora_rank=48, rope_interleave=True,
                                                     rope_parameters=YARN)),
    "v3-halves-bias": ("deepseek_v3", dict(COMMON, q_lora_rank=48, rope_interleave=False,
                                           attention_bias=True)),
    "v2-lite-no-qlora": ("deepseek_v2", dict(COMMON, q_lora_rank=None)),
}
B, L, PREFILL = 3, 11, 6


@pytest.fixture(scope="module", params=list(MODELS))
def built(request, tmp_path_factory):
    """transformers' model, its layer-1 attention, and ours read from the saved folder by the
    family (the V2 one in 20 KB shards)."""
    kind, settings = MODELS[request.param]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **settings),
                                             attn_implementation="eager").eval()
    attn = model.model.layers[1].self_attn
    with torch.no_grad():  # norms away from their initial ones, which hide a wrong read
        for name, p in attn.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape) * 0.5)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder, **({"max_shard_size": "20KB"} if kind == "deepseek_v2" else {}))
    return request.param, model, attn, load_source(weights=folder, layer=1).module


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 60, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :7] = 0  # left padding
    return ids, mask, torch.from_numpy(positions(mask.numpy()))


def _close(got, want, rows, what):
    diff = (got - want).abs()[rows]
    assert torch.isfinite(got).all() and diff.max() <= 2e-5, (what, float(diff.max()))


@pytest.mark.parametrize("absorbed", [False, True])
def test_full_sequence_equals_transformers(built, absorbed):
    name, model, attn, ours = built
    ids, mask, pos = _batch()
    calls, handle = capture(attn)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    x, want = (torch.from_numpy(a) for a in calls[0])
    with torch.inference_mode():
        y, latent, k_rot = ours.attend(x, mask, None, None, pos, absorbed)
    assert latent.shape == (B, 1, L, 32) and k_rot.shape == (B, 1, L, 8)
    _close(y, want, mask.bool(), f"{name} absorbed={absorbed}")


@pytest.mark.parametrize("absorbed", [False, True])
def test_cached_decode_equals_transformers_with_its_own_latent_cache(built, absorbed):
    """Prefill, then single-token steps: y at every real position, and the final cache equal to
    the latent and rotated key transformers' DynamicCache holds for the layer."""
    name, model, attn, ours = built
    ids, mask, pos = _batch()
    calls, cache = decode(model, attn, ids, mask, pos, PREFILL)
    latent = k_rot = None
    start = 0
    for x, want in ((torch.from_numpy(a), torch.from_numpy(b)) for a, b in calls):
        end = start + x.shape[1]
        with torch.inference_mode():
            y, latent, k_rot = ours.attend(x, mask[:, :end], latent, k_rot, pos[:, start:end],
                                           absorbed)
        _close(y, want, mask[:, start:end].bool(), f"{name} tokens {start}-{end}")
        start = end
    theirs = cache.layers[1]
    real = mask.bool()
    for got, held in ((latent, theirs.keys), (k_rot, theirs.values)):
        diff = (got - held).abs().transpose(1, 2)[real]
        assert diff.max() <= 2e-5, (name, "cache vs transformers'", float(diff.max()))


def test_the_absorbed_form_never_expands_the_cache(built):
    """The decode form reads the latent cache as stored: no kv_b_proj over the cache (its
    weights are folded into the query and the output), and its result is the expanded one's."""
    _, _, _, ours = built
    calls = []
    handle = ours.kv_b_proj.register_forward_hook(lambda m, a, o: calls.append(a[0].shape))
    x = torch.randn(2, 1, 64)
    past = torch.randn(2, 1, 40, 32), torch.randn(2, 1, 40, 8)
    with torch.inference_mode():
        fast = ours.attend(x, None, *past, None, True)[0]
        assert calls == []
        slow = ours.attend(x, None, *past, None, False)[0]
    handle.remove()
    assert calls == [(2, 41, 32)]  # the expanded form multiplies every cached latent
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)


def test_yarn_mscale_scales_the_softmax_and_bad_configs_are_refused():
    base = dict(dim=64, heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                v_head_dim=24)
    plain = MLAConfig(**base)
    assert plain.scale == pytest.approx(24 ** -0.5) and plain.cache_widths() == (32, 8)
    yarn = MLAConfig(**base, rope_scaling=dict(YARN))
    m = 0.1 * 0.8 * np.log(4.0) + 1.0
    assert yarn.scale == pytest.approx(24 ** -0.5 * m * m)
    with pytest.raises(UsageError, match="qk_rope_head_dim must be even"):
        MLAConfig(**{**base, "qk_rope_head_dim": 7})
    with pytest.raises(UsageError, match="kv_lora_rank must be a positive integer"):
        MLAConfig(**{**base, "kv_lora_rank": 0})


def test_static_cache_rows_of_different_lengths_equal_each_row_alone(built):
    """The app-owned buffers written in place at each row's past_lengths: a right-padded
    prefill (rows of 7, 5 and 3 real tokens), then each row's length set to its own, then two
    single-token steps, equal each row's real tokens run alone; the buffers hold each row's
    latent and rotated key (the padding's entries overwritten)."""
    _, _, _, ours = built
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 9, 64, generator=g)
    real = [7, 5, 3]
    buffers = torch.randn(3, 1, 12, 32), torch.randn(3, 1, 12, 8)  # random beyond the writes
    lengths = torch.zeros(3, dtype=torch.long)
    ys = []
    with torch.inference_mode():
        y, *buffers = ours.forward_static(x[:, :7], *buffers, lengths)
        ys.append(y)
        lengths = torch.tensor(real)
        for step in (7, 8):
            y, *buffers = ours.forward_static(x[:, step:step + 1], *buffers, lengths)
            ys.append(y)
            lengths = lengths + 1
        for r, n in enumerate(real):
            tokens = torch.cat([x[r:r + 1, :n], x[r:r + 1, 7:9]], dim=1)  # (1, n + 2, 64)
            want, latent, k_rot = ours.attend(tokens, None, None, None)
            got = torch.cat([ys[0][r:r + 1, :n], ys[1][r:r + 1], ys[2][r:r + 1]], dim=1)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
            torch.testing.assert_close(buffers[0][r:r + 1, :, :n + 2], latent)
            torch.testing.assert_close(buffers[1][r:r + 1, :, :n + 2], k_rot)


# --- exports: the check of MLA artifacts, and the planted faults it must catch -------------------

MLA_CFG = MHAConfig(dim=64, heads=4, max_seq_len=32, rope_scaling=dict(YARN), latent=dict(
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, q_lora_rank=48))
SWEEP = dict(seq_lens=[1, 5, 32, 200], batch_sizes=[1, 2], providers=["cpu"])  # 200: expanded


@pytest.fixture(scope="module", params=["static-cache", "kv-cache"])
def mla_artifact(request, tmp_path_factory):
    from mha_export import export_onnx
    kind = {"static_cache": request.param == "static-cache",
            "kv_cache": request.param == "kv-cache"}
    return export_onnx(MLA_CFG, tmp_path_factory.mktemp("mla") / "art", validate=False,
                       **kind).path


@pytest.mark.parametrize("fault", sorted(faults.MLA_FAULTS))
def test_planted_mla_fault_makes_check_exit_1(mla_artifact, fault, tmp_path):
    import shutil

    from click.testing import CliRunner

    from mha_export import check_parity
    from mha_export.cli.commands import cli
    copy = tmp_path / "copy"
    shutil.copytree(mla_artifact, copy)
    assert check_parity(copy, **SWEEP).passed  # the copy passes before the fault ...
    faults.MLA_FAULTS[fault](copy / "model.onnx", MLA_CFG)
    assert not check_parity(copy, **SWEEP).passed  # ... and fails after it
    r = CliRunner().invoke(cli, ["check", str(copy), "--seq-lens", "1,5", "--batch-sizes", "2"])
    assert r.exit_code == 1, r.output


def test_mla_exports_name_the_latent_cache_and_refuse_what_does_not_apply(tmp_path):
    """config.json declares the latent cache's widths; options without meaning for MLA are
    one-line errors that write nothing."""
    from mha_export import export_onnx, export_torchscript
    from mha_export.artifact import read_artifact
    art = read_artifact(export_onnx(MLA_CFG, tmp_path / "s", static_cache=True,
                                    validate=False).path)
    shapes = {t.name: t.shape for t in art.signature.inputs}
    assert shapes["past_key"] == ("batch", 1, "max_cache", 32)
    assert shapes["past_value"] == ("batch", 1, "max_cache", 8)
    assert art.export["attention"] == "latent" and art.config.layout == "latent"
    assert art.config.slug() == "latent-h4-d64-r32-rope8-q48"
    cases = [(dict(attention="auto"), "'auto' builds standard layers only"),
             (dict(static_cache=True, kv_cache_dtype="int8"), "Multi-head Latent Attention")]
    for options, msg in cases:
        with pytest.raises(UsageError, match=msg):
            export_onnx(MLA_CFG, tmp_path / "x", validate=False, **options)
        assert not (tmp_path / "x").exists()
    for bad, msg in ((dict(sliding_window=4), "a sliding window does not apply"),
                     (dict(kv_heads=2), "kv_heads of a Multi-head Latent Attention layer is 1"),
                     (dict(layout="split"), "layout 'split' does not apply"),
                     (dict(rotary="yarn"), "unknown rotary 'yarn'")):
        with pytest.raises(UsageError, match=msg):
            MLA_CFG.replace(**bad)
    with pytest.raises(UsageError, match="layout 'latent' is Multi-head Latent Attention"):
        MHAConfig(dim=64, heads=4, layout="latent")
    export_torchscript(MLA_CFG, tmp_path / "ts", validate=False)


@pytest.mark.parametrize("target", ["torchscript", "aoti"])
def test_torch_targets_export_the_static_latent_cache_and_pass_the_check(target, tmp_path):
    """TorchScript scripts the layer; AOTInductor compiles its static-cache step (the absorbed
    core in plain matmuls: SDPA over a concatenated key failed to lower with the data-dependent
    valid length). Each export's own check passes (ragged rows, steps, both buffers)."""
    from mha_export.export.pipeline import export_artifact
    result = export_artifact(target, MLA_CFG.replace(max_seq_len=16), tmp_path / target,
                             static_cache=True, check_options=dict(
                                 seq_lens=[1, 3, 16], batch_sizes=[1, 3]))
    assert result.passed and result.report.tested


def test_the_families_read_what_transformers_builds(tmp_path):
    """The latent norms' eps is RMSNorm's 1e-6 whatever rms_norm_eps says (transformers builds
    them so); MLA flags are checked one by one against config.json; a quantized (FP8)
    checkpoint is refused, never read as plain floats."""
    import json

    from mha_export.weights.families import FAMILIES, Settings
    from mha_export.weights.huggingface import merge_fields
    family = FAMILIES["deepseek_v3"]
    fields = family.fields(Settings(dict(COMMON, rms_norm_eps=1e-5), family.defaults), 1)
    assert fields["latent"]["norm_eps"] == 1e-6 and fields["out_bias"] is False
    assert merge_fields(fields, {"latent": {"kv_lora_rank": 32}})["latent"] == fields["latent"]
    with pytest.raises(UsageError, match=r"--kv-lora-rank 16 contradicts .*kv_lora_rank = 32"):
        merge_fields(fields, {"latent": {"kv_lora_rank": 16}})
    folder = tmp_path / "fp8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(
        COMMON, model_type="deepseek_v3", quantization_config={"quant_method": "fp8"})))
    with pytest.raises(UsageError, match="FP8 quantization_config without weight_block_size"):
        load_source(weights=folder, layer=1)


def test_bench_refuses_what_mla_does_not_build():
    from mha_export.bench.driver import run_bench
    with pytest.raises(UsageError, match="--kv-cache-dtype int8"):
        run_bench(MLA_CFG, seq_lens=[1], providers=["cpu"], mem_limit_gib=4.0, budget_s=0.1,
                  int8_cache=True,
                  static_cache=True)


# DeepSeek-V2-Lite's kind of layer (q_proj, no q LoRA): the quantized-projection faults edit q_proj
MLA_V2 = MHAConfig(dim=64, heads=4, max_seq_len=16, rotary="interleaved", latent=dict(
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24))


@pytest.mark.parametrize("fault", sorted(faults.QUANT_FAULTS))
def test_quantized_mla_projections_pass_and_their_faults_fail(fault, tmp_path):
    """--quantize int4 on an MLA layer: q_proj, kv_a_proj_with_mqa and o_proj as MatMulNBits
    (kv_b_proj's W_UK / W_UV stay float). The export's own check passes at level 4 (int8
    activations, and the file at fp32 compute); each planted fault then fails at fp32
    compute."""
    import json

    from mha_export import check_parity, export_onnx
    from mha_export.lossy.projections.rtn import QuantSpec
    spec = QuantSpec(bits=4, accuracy_level=4, symmetric=fault != "a zero point off by one")
    result = export_onnx(MLA_V2, tmp_path / "q", static_cache=True, quantize=spec)
    assert result.passed and result.report.costs["quantization"]
    record = json.loads((result.path / "config.json").read_text())["export"]["quantize"]
    assert record["projections"] == ["q_proj", "kv_a_proj_with_mqa", "o_proj"]
    try:
        faults.QUANT_FAULTS[fault](result.path / "model.onnx")
    except faults.NotApplicable as e:
        pytest.skip(str(e))
    report = check_parity(result.path, seq_lens=[1, 5, 16], batch_sizes=[2], providers=["cpu"])
    assert any(not r.passed for r in report.results if r.runner == "ort-cpu-fp32-compute")
