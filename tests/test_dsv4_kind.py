"""DeepSeek-V4 as a registered attention kind (kinds/dsv4/kind.py): the tiny random checkpoint of
test_dsv4.py read by the family machinery (``--weights DIR --layer L``), a sliding, a CSA and an
HCA layer exported to TorchScript through the CLI (its check passes), the artifact's y on a
left-padded 40-token prompt (the window and the indexer's top-k acting: test_dsv4.py's planted
faults show it) equal to transformers' module's; a planted fault fails the check; AOTInductor
(CSA, HCA) and ExecuTorch (every type) programs pass their checks; ``--layers all`` lists every
layer; what is not built is one line, exit code 2. ONNX (the form ``dsv4``,
kinds/dsv4/forms.py): every layer type exported through the CLI, full and masked (their checks
pass), model.onnx's y on the same prompt equal to transformers' (CSA: its queries tied on the
top-k boundary not compared, transformers' picks among them unspecified); eval with the ONNX
runner over every layer. CSA's check compares every query, the tied ones too: against an eager
layer whose ties go to the later row, the ONNX, AOTInductor and ExecuTorch programs fail it."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mha_export.artifact import read_artifact
from mha_export.check.parity import check_parity
from mha_export.cli.commands import cli
from mha_export.comparison.torch_runners import TorchScriptRunner
from mha_export.config import MHAConfig
from mha_export.errors import UsageError
from mha_export.kinds.registry import build_module, kind_of
from mha_export.weights.source import load_source
from dsv4_layers import read_layer, with_ties
from mha_export.kinds.dsv4 import compressed
from test_dsv4 import LAYER_TYPES, LENGTH, YARN, _saved, _transformers_y

pytest.importorskip("transformers")

SHORT_SWEEP = dict(seq_lens=[5, 40], batch_sizes=[2], sweep="quick")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _saved(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """layer -> the folder `mha-export torchscript --weights DIR --layer L --attention-mask`
    wrote (its check passed: exit code 0)."""
    _, folder = tiny
    out = {}
    for layer in (0, 1, 2):
        path = tmp_path_factory.mktemp("ts") / f"layer-{layer}"
        r = CliRunner().invoke(cli, ["torchscript", "--weights", str(folder), "--layer",
                                     str(layer), "--attention-mask", "-o", str(path)])
        assert r.exit_code == 0 and "PASS" in r.output, r.output
        out[layer] = path
    return out


def _untied(folder, layer: int, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the real queries compared with transformers' y, those not tied on their
    indexer's top-k boundary (transformers' torch.topk picks among equal scores in no
    specified order; ours: the earlier row); most are (10 or 11 of 73 tied on the prompt)."""
    rows = keep.bool() & ~with_ties(read_layer(folder, layer), x, keep)[1]
    assert rows.sum() >= 0.7 * keep.sum()
    return rows


def test_each_layer_type_reads_as_the_kind_with_its_section(tiny):
    _, folder = tiny
    for layer, layer_type in enumerate(LAYER_TYPES):
        config = load_source(None, folder, layer).config
        assert config.kind == "dsv4" and config.layout == "dsv4"
        assert config.dsv4.layer_type == layer_type and config.kv_heads == 1
        assert MHAConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_a_yarn_compress_rope_is_read_into_the_config(tmp_path_factory):
    """The released checkpoints' "compress" rope (YaRN) through the family record and
    MHAConfig's rope_scaling: the module load_source builds equals transformers' (CSA, HCA;
    CSA's queries tied on the top-k boundary not compared: _untied)."""
    model, folder = _saved(tmp_path_factory, rope_parameters=YARN)
    for layer in (1, 2):
        config = load_source(None, folder, layer).config
        assert config.rope_scaling["rope_type"] == "yarn"
        x, keep, want = _transformers_y(model, layer)
        with torch.no_grad():
            y = load_source(None, folder, layer).module.attend(x, keep, None, None)[0]
        assert float((y - want)[_untied(folder, layer, x, keep)].abs().max()) <= 2e-5


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_the_torchscript_artifact_equals_transformers_on_a_left_padded_prompt(
        tiny, exported, layer):
    """Sliding (0), CSA (1: 10 closed rows, 3 kept), HCA (2): the exported model.pt's y at
    transformers' positions (0..T-1, the padding counted) on every real query (_untied)."""
    model, folder = tiny
    x, keep, want = _transformers_y(model, layer)
    rows = _untied(folder, layer, x, keep)
    art = read_artifact(exported[layer])
    assert art.signature.input_names == ["x", "attention_mask", "position_ids"]
    run = TorchScriptRunner(art.signature, exported[layer] / "model.pt").run
    positions = torch.arange(LENGTH).expand(2, LENGTH)
    y = run({"x": x.numpy(), "attention_mask": keep.numpy(), "position_ids": positions.numpy()})
    worst = np.abs(y["y"] - want.numpy())[rows.numpy()].max()
    assert np.isfinite(y["y"]).all() and worst <= 2e-5


# layer -> a tensor of its reference weights moved after the export: the artifact then holds a
# layer whose sinks (sliding), indexer (CSA) or pooling gate (HCA) differ from the check's
FAULTS = {0: "sinks", 1: "compressor.indexer.scorer.weights_proj.weight",
          2: "compressor.position_bias"}


@pytest.mark.parametrize("layer", sorted(FAULTS))
def test_a_planted_fault_fails_the_check(exported, layer, tmp_path):
    from safetensors.torch import load_file, save_file
    import shutil
    path = tmp_path / "a"
    shutil.copytree(exported[layer], path)
    assert check_parity(path, **SHORT_SWEEP).passed
    weights = load_file(str(path / "weights.safetensors"))
    name = FAULTS[layer]
    moved = torch.randn(weights[name].shape, generator=torch.Generator().manual_seed(0))
    weights[name] = weights[name] + moved  # (a constant would not move a softmax's gate)
    save_file(weights, str(path / "weights.safetensors"))
    assert not check_parity(path, **SHORT_SWEEP).passed


@pytest.mark.parametrize("args, says", [
    (["torchscript", "--static-cache"],
     "--static-cache is not built for DeepSeek-V4 attention yet"),
    (["onnx", "--quantize", "int4"], "--quantize is not built for DeepSeek-V4 attention yet"),
])
def test_what_is_not_built_is_one_line(tiny, tmp_path, args, says):
    _, folder = tiny
    r = CliRunner().invoke(cli, [*args, "--weights", str(folder), "--layer", "1", "-o",
                                 str(tmp_path / "x")])
    errors = [line for line in r.stderr.splitlines() if not line.startswith("note:")]
    assert r.exit_code == 2 and len(errors) == 1 and says in errors[0], r.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("target, layer", [("aoti", 2), ("executorch", 0), ("executorch", 2)])
def test_aoti_and_executorch_programs_pass_their_checks(tiny, tmp_path, target, layer):
    """HCA (2) on both, sliding (0) on ExecuTorch (AOTInductor's sliding: as HCA's minus the
    pooled rows), seq dynamic from 1 token: the check's sweep runs up to 257 tokens, the
    pooled rows' count T // 8 from 0 on. (The TorchScript artifact's test above holds the
    same call, spare rows and all, to transformers.) CSA's: csa_exported below."""
    _, folder = tiny
    r = CliRunner().invoke(cli, [target, "--weights", str(folder), "--layer", str(layer),
                                 "--attention-mask", "-o", str(tmp_path / "x")])
    assert r.exit_code == 0 and "PASS" in r.output, r.output


@pytest.fixture(scope="module")
def csa_exported(tiny, tmp_path_factory):
    """target -> the folder `mha-export TARGET --weights DIR --layer 1 --attention-mask` wrote
    for the CSA layer (its check passed: exit code 0). Seq dynamic from 1 token: the check's
    sweep runs up to 257 tokens (ExecuTorch's 255), the closed rows T // 4 from 0 to 64, so
    the top-3 acts from 16 tokens on, its boundary tied on about 1 query in 5."""
    _, folder = tiny
    out = {}
    for target in ("onnx", "aoti", "executorch"):
        path = tmp_path_factory.mktemp("csa") / target
        r = CliRunner().invoke(cli, [target, "--weights", str(folder), "--layer", "1",
                                     "--attention-mask", "-o", str(path)])
        assert r.exit_code == 0 and "PASS" in r.output, (target, r.output)
        out[target] = path
    return out


def _later_ties(scores, closed, k, pick=compressed.top_rows):  # ties to the later row
    return pick(scores.flip(-1), closed.flip(-1), k).flip(-1)  # the rows' order reversed


@pytest.mark.parametrize("target", ["onnx", "aoti", "executorch"])
def test_a_csa_program_fails_a_check_whose_ties_go_to_the_later_row(csa_exported, target,
                                                                    monkeypatch):
    """The program passed its check (csa_exported); against an eager layer whose top-k ties
    go to the later row (planted) it fails: the check compares the tied queries too."""
    assert check_parity(csa_exported[target], **SHORT_SWEEP).passed
    monkeypatch.setattr(compressed, "top_rows", _later_ties)
    assert not check_parity(csa_exported[target], **SHORT_SWEEP).passed


def test_layers_all_lists_every_layer(tiny, tmp_path):
    from mha_export.fanout import export_layers
    _, folder = tiny
    summary = export_layers("torchscript", folder, "all", tmp_path / "run", validate=False,
                            attention_mask=True)
    assert summary.passed
    rows = json.loads((tmp_path / "run" / "layers.json").read_text())["layers"]
    assert [(r["layer"], r["status"]) for r in rows] == [(i, "exported") for i in range(4)]


def test_a_random_layer_of_each_type_builds_and_its_records_answer():
    """A config without a checkpoint (seeded weights): the kind's module, projections, flops."""
    for layer_type, own in (("sliding_attention", {}),
                            ("heavily_compressed_attention", {"rate": 8}),
                            ("compressed_sparse_attention", {
                                "rate": 4, "index_heads": 2, "index_head_dim": 16,
                                "index_topk": 3})):
        c = MHAConfig(dim=64, heads=4, head_dim=32, rotary="interleaved", rotary_dim=8,
                      sliding_window=8, dsv4={"layer_type": layer_type, "q_lora_rank": 24,
                                              "o_groups": 2, "o_lora_rank": 16, **own})
        module = build_module(c, seed=0)
        shapes = {n: tuple(t.shape) for n, t in module.state_dict().items()}
        assert all(shapes[f"{p}.weight"] == s for p, s in kind_of(c).projections(c).items())
        assert kind_of(c).call_flops(c, 16, 100.0, 0) > 0
        y, _, _ = module.attend(torch.randn(2, 16, 64), None, None, None)
        assert y.shape == (2, 16, 64) and torch.isfinite(y).all()
        copy = build_module(c)
        copy.load_weights(module.to_weights())  # what an ONNX form's layer will read
        assert copy.to_weights().keys() == module.state_dict().keys()


@pytest.mark.parametrize("change, says", [
    (dict(softcap=30.0), "softcap does not apply to DeepSeek-V4 attention"),
    (dict(sliding_window=None), "DeepSeek-V4 attention needs sliding_window"),
    (dict(rotary="half"), "unknown rotary 'half': choose one of interleaved"),
    (dict(dsv4={"layer_type": "compressed_sparse_attention", "rate": 4}),
     "index_heads must be a positive integer"),
    (dict(dsv4={"o_groups": 3}), "o_groups 3 must divide num_attention_heads 4"),
])
def test_bad_settings_are_one_line(change, says):
    base = dict(dim=64, heads=4, head_dim=32, rotary="interleaved", rotary_dim=8,
                sliding_window=8, dsv4={"q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 16})
    with pytest.raises(UsageError, match=says):
        MHAConfig(**{**base, **change})


def test_eval_runs_the_layers_inside_the_model(tiny, tmp_path):
    """eval with the TorchScript runner: every layer exported (full sequence), run inside
    transformers' model, nothing it would notice; with the ONNX runner (the default) too, and
    through the CLI."""
    import hybrid
    from mha_export.model.eval import evaluate
    _, folder = tiny
    hybrid.save_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog, again and again. " * 4)
    d = evaluate(folder, text, 20, "all", runner="torchscript",
                 folder=tmp_path / "exports").to_dict()
    assert [x["layer"] for x in d["layers"]] == [0, 1, 2, 3]
    assert d["exported"]["kl_max"] < 1e-6 and all(x["rel"] < 1e-4 for x in d["layers"])
    d = evaluate(folder, text, 20, "all", folder=tmp_path / "onnx").to_dict()
    assert [x["layer"] for x in d["layers"]] == [0, 1, 2, 3]
    assert d["exported"]["kl_max"] < 1e-6 and all(x["rel"] < 1e-4 for x in d["layers"])
    r = CliRunner().invoke(cli, ["eval", "--weights", str(folder), "--text", str(text),
                                 "--tokens", "20"])
    assert r.exit_code == 0, r.output + r.stderr


@pytest.fixture(scope="module")
def onnx_exported(tiny, tmp_path_factory):
    """layer -> the folder `mha-export onnx --weights DIR --layer L --attention-mask` wrote
    (its check passed: exit code 0), the sliding (0), CSA (1) and HCA (2) layers."""
    _, folder = tiny
    out = {}
    for layer in (0, 1, 2):
        path = tmp_path_factory.mktemp("onnx") / f"layer-{layer}"
        r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", str(layer),
                                     "--attention-mask", "-o", str(path)])
        assert r.exit_code == 0 and "PASS" in r.output, r.output
        out[layer] = path
    return out


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_the_onnx_artifact_equals_transformers_on_a_left_padded_prompt(
        tiny, onnx_exported, layer):
    """Sliding (0), CSA (1: 10 closed rows, 3 kept), HCA (2: 5 closed rows): model.onnx's y
    at transformers' positions on every real query (CSA: but those tied on the indexer's
    top-k boundary, where transformers' torch.topk picks in no specified order)."""
    import onnxruntime as ort
    model, folder = tiny
    x, keep, want = _transformers_y(model, layer)
    rows = _untied(folder, layer, x, keep)
    art = read_artifact(onnx_exported[layer])
    assert art.signature.input_names == ["x", "attention_mask", "position_ids"]
    session = ort.InferenceSession(str(onnx_exported[layer] / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    positions = torch.arange(LENGTH).expand(2, LENGTH)
    y = session.run(["y"], {"x": x.numpy(), "attention_mask": keep.numpy(),
                            "position_ids": positions.numpy()})[0]
    worst = np.abs(y - want.numpy())[rows.numpy()].max()
    assert np.isfinite(y).all() and worst <= 2e-5


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_the_full_sequence_onnx_export_passes_its_check(tiny, layer, tmp_path):
    """Without --attention-mask: every token kept (the layer's own all-ones mask)."""
    _, folder = tiny
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", str(layer),
                                 "-o", str(tmp_path / "a")])
    assert r.exit_code == 0 and "PASS" in r.output, r.output
    assert read_artifact(tmp_path / "a").signature.input_names == ["x", "position_ids"]


def test_onnx_layers_all_lists_and_passes_every_layer(tiny, tmp_path):
    from mha_export.fanout import export_layers
    _, folder = tiny
    summary = export_layers("onnx", folder, "all", tmp_path / "run", attention_mask=True)
    assert summary.passed
    rows = json.loads((tmp_path / "run" / "layers.json").read_text())["layers"]
    assert [(r["layer"], r["status"]) for r in rows] == [(i, "pass") for i in range(4)]
