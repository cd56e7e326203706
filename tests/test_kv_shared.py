"""Cross-layer KV sharing (kinds/kv_shared/): a layer that attends with another layer's keys and
values, given as inputs. Its settings' refusals, its eager call against the plain math, every
call kind exported (ONNX, TorchScript) and checked, planted faults caught, and the CLI's errors.
(Against transformers' Gemma 3n / 4 modules: tests/test_checkpoints.py.)"""
from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

import faults
from mha_export import check_parity, export_onnx, export_torchscript
from mha_export.cli.commands import cli
from mha_export.config import MHAConfig
from mha_export.errors import UsageError
from mha_export.kinds.registry import build_module
from mha_export.signature import make_signature

SHARED = dict(dim=64, heads=4, kv_heads=2, max_seq_len=16, rotary="half",
              kv_shared={"kv_shared_layer": 3})
SWEEP = dict(seq_lens=[1, 6, 17], batch_sizes=[2], providers=["cpu"])
CALLS = {"full": {}, "masked": dict(attention_mask=True), "kv-cache": dict(kv_cache=True),
         "static-cache": dict(static_cache=True)}


def test_settings_refuse_what_acts_on_keys_and_values():
    config = MHAConfig(**SHARED)
    assert (config.kind, config.layout, config.slug()) == (
        "kv_shared", "shared", "shared-h4-d64-kv2-rope16-of3")
    assert MHAConfig.from_dict(config.to_dict()) == config
    for change, msg in ((dict(v_norm_eps=1e-6), "a value norm"), (dict(qkv_clip=1.0), "qkv_clip"),
                        (dict(layout="split"), "layout 'split'"),
                        (dict(kv_shared={"kv_shared_layer": -1}), "layer index >= 0"),
                        (dict(latent={}), "one attention kind")):
        with pytest.raises(UsageError, match=msg):
            MHAConfig(**{**SHARED, **change})
    assert make_signature(config, "kv-cache").kind == "shared-kv-cache"
    with pytest.raises(UsageError, match="is a KV-shared layer's"):
        make_signature(MHAConfig(dim=64, heads=4), "shared")


def _plain(module, x, keys, values, mask, pos):
    """softmax(q k^T / sqrt(H) + causal / padding / window mask) v over the given keys, in the
    textbook order, then o_proj (queries at the last T of the S keys)."""
    c = module.config
    q = module.queries(x, pos)  # (B, N, T, H)
    keys, values = (t.repeat_interleave(c.groups, dim=1) for t in (keys, values))
    scores = q @ keys.transpose(-1, -2) / math.sqrt(c.head_dim)  # (B, N, T, S)
    t, s = x.shape[1], keys.shape[2]
    i = torch.arange(s - t, s).view(-1, 1)
    j = torch.arange(s).view(1, -1)
    hidden = (j > i) | (i - j >= (c.sliding_window or s + 1)) | (mask[:, None, None, :] == 0)
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return module.out_proj((probs @ values).transpose(1, 2).reshape(x.shape[0], t, -1))


@pytest.mark.parametrize("window", [None, 3])
def test_eager_read_is_the_plain_math_over_the_given_keys(window):
    module = build_module(MHAConfig(**SHARED, qk_norm="head", sliding_window=window), seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 64, generator=g)
    keys, values = torch.randn(2, 2, 8, 16, generator=g), torch.randn(2, 2, 8, 16, generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :2] = 0
    pos = torch.tensor([[5, 6, 7], [3, 4, 5]])
    with torch.no_grad():
        got = module.read(x, mask, keys, values, pos)
        want = _plain(module, x, keys, values, mask, pos)
        # a static buffer of 10 slots holding the same 8 entries from slot 0 reads the same
        buffers = [torch.cat([t, torch.randn(2, 2, 2, 16)], dim=2) for t in (keys, values)]
        static = module.read_static(x[:1], *(b[:1] for b in buffers), torch.tensor([5]),
                                    pos[:1])
    assert torch.allclose(got[1:] if window else got, (want[1:] if window else want), atol=1e-5)
    assert torch.allclose(got[0], want[0], atol=1e-5) and torch.allclose(static[0], got[0],
                                                                         atol=1e-5)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_call_kind_exports_and_passes_its_check(tmp_path, call):
    config = MHAConfig(**SHARED, qk_norm="head", sliding_window=5, softcap=20.0)
    for export in (export_onnx, export_torchscript):
        path = export(config, tmp_path / export.__name__, validate=False, **CALLS[call]).path
        report = check_parity(path, **SWEEP)
        assert report.passed and "shared_key" in report.inputs, (call, export.__name__)


def test_quantized_projections_pass_their_check(tmp_path):
    """--quantize int4: q_proj and o_proj as MatMulNBits (it has no key or value projection)."""
    from mha_export.lossy.projections.rtn import QuantSpec
    path = export_onnx(MHAConfig(**SHARED), tmp_path / "q", validate=False, kv_cache=True,
                       quantize=QuantSpec(bits=4)).path
    report = check_parity(path, **SWEEP)
    assert report.passed and report.to_dict()["quantization"]


SHARED_FAULTS = {
    "q norm skipped": (dict(qk_norm="head"), "kv-cache",
                       lambda p: faults.norm_skipped(p, "q_norm")),
    "queries aligned to the first key": ({}, "kv-cache", faults.top_left_causal),
    "padding mask ignored": ({}, "kv-cache", faults.padding_ignored),
    "a row reads past its valid length": ({}, "static-cache",
                                          faults.static_reads_past_its_length),
    "the window widened": (dict(sliding_window=3), "masked",
                           lambda p: faults.rope_initializer_set(p, "window", 1000)),
}


@pytest.mark.parametrize("fault", sorted(SHARED_FAULTS))
def test_planted_fault_is_caught(tmp_path, fault):
    options, call, plant = SHARED_FAULTS[fault]
    path = export_onnx(MHAConfig(**{**SHARED, **options}), tmp_path / "a", validate=False,
                       **CALLS[call]).path
    assert check_parity(path, **SWEEP).passed
    plant(path / "model.onnx")
    assert not check_parity(path, **SWEEP).passed


@pytest.mark.parametrize("args, msg", [
    (["--kv-shared-layer", "3", "--static-cache", "--kv-cache-dtype", "int8"],
     "--kv-cache-dtype int8 does not apply to a KV-shared layer"),
    (["--kv-shared-layer", "-2"], "kv_shared_layer must be a layer index >= 0"),
    (["--kv-shared-layer", "3", "--v-norm-eps", "1e-6"], "a value norm (the source layer's)"),
    (["--kv-shared-layer", "3", "--attention", "decomposed"], "builds standard layers only"),
])
def test_cli_refusals_are_one_line(tmp_path, args, msg):
    r = CliRunner().invoke(cli, ["onnx", "--heads", "4", "--dim", "64", *args, "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists(), r.output
    assert len(r.stderr.splitlines()) == 1 and msg in r.stderr, r.stderr


FLAGS = {"full": [], "masked": ["--attention-mask"], "kv-cache": ["--kv-cache"],
         "static-cache": ["--static-cache"]}
SUFFIX = {"full": "", "masked": "-masked", "kv-cache": "-kv", "static-cache": "-static"}
SHARED_FLAGS = ["--heads", "4", "--dim", "64", "--kv-heads", "2", "--rotary", "half",
                "--max-seq-len", "16", "--kv-shared-layer", "99"]


@pytest.mark.parametrize("target", ["onnx", "torchscript"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_call_without_o_lands_in_its_default_folder(tmp_path, monkeypatch, target, call):
    """No -o: models/<slug>-<call>-<target>, as a standard layer's (was KeyError: 'shared')."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, [target, *SHARED_FLAGS, *FLAGS[call], "--no-check"])
    assert r.exit_code == 0, (r.output, r.exception)
    folder = tmp_path / "models" / f"shared-h4-d64-kv2-rope16-of99{SUFFIX[call]}-{target}"
    assert (folder / "config.json").is_file()


@pytest.mark.parametrize("call", ["full", "masked"])  # its cached calls: refused (one line)
def test_an_executorch_export_without_o_names_its_default_folder(tmp_path, monkeypatch, call):
    """Refused before lowering where the default folder already holds an artifact: the name is
    made (was KeyError: 'shared') and said."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "models" / f"shared-h4-d64-kv2-rope16-of99{SUFFIX[call]}-executorch"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"config": {}, "export": {"file": "model.pte"}}')
    r = CliRunner().invoke(cli, ["executorch", *SHARED_FLAGS, *FLAGS[call], "--no-check"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert f"{folder.relative_to(tmp_path)} already holds an mha-export artifact" in r.stderr, \
        r.output
