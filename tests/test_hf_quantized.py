"""Quantized Hugging Face checkpoints exported as shipped (weights/quantized, --quantize source):
GPTQ, AWQ, compressed-tensors and block FP8 folders written as their formats write them
(quant_writers.py). The stored weights equal each format's own dequantization bit for bit, the
kept kernels pass the fp32 check, planted faults fail it, and what has no exact form refuses in
one line."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import numpy_helper

pytest.importorskip("transformers")
from quant_writers import (awq_reference, awq_tensors, compressed_reference,  # noqa: E402
                           compressed_tensors, fp8_reference, fp8_tensors, gptq_reference,
                           gptq_tensors, quantized_folder)
from mha_export import check_parity, export_onnx  # noqa: E402
from mha_export.artifact import read_artifact  # noqa: E402
from mha_export.check.report import format_report  # noqa: E402
from mha_export.cli.commands import cli  # noqa: E402
from mha_export.lossy.projections.source import SourceQuantSpec  # noqa: E402

QUICK = dict(seq_lens=[1, 7, 33], batch_sizes=[1, 2], past_lens=[0, 5])
EXACT = SourceQuantSpec()
OURS = {"q_proj": "W_query.weight", "k_proj": "W_key.weight", "v_proj": "W_value.weight",
        "o_proj": "out_proj.weight"}
LAYER = 1


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """transformers' tiny llama (64 wide, 4 heads, 2 kv heads), saved as floats."""
    from test_checkpoints import _plain
    folder = tmp_path_factory.mktemp("base") / "llama"
    _plain("llama").save_pretrained(folder)
    return folder


def _seed(module: str) -> int:
    return sum(module.encode())  # each projection its own act-order permutation


def gptq(bits, group, sym, act_order, v1, shared_order=False):
    """``shared_order``: every projection quantized in one input order (as GPTQ does for q, k
    and v, which see the same inputs)."""
    qcfg = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym,
            "desc_act": act_order, "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    return (qcfg, lambda module, w: gptq_tensors(w, bits, group, sym, act_order, v1,
                                                 seed=0 if shared_order else _seed(module)),
            lambda t: gptq_reference(t, bits, v1))


def awq(group):
    qcfg = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
            "version": "gemm"}
    return qcfg, lambda module, w: awq_tensors(w, group), lambda t: awq_reference(t, group)


def compressed(args, fmt, activations=None):
    group = {"targets": ["Linear"], "weights": args, "input_activations": activations}
    qcfg = {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": group}}
    return (qcfg, lambda module, w: compressed_tensors(w, args, fmt),
            lambda t: compressed_reference(t, args, fmt))


def fp8(block):
    qcfg = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(block)}
    return (qcfg, lambda module, w: fp8_tensors(w, block),
            lambda t: fp8_reference(t["weight"], t["weight_scale_inv"], block))


INT4 = dict(num_bits=4, type="int", strategy="group", group_size=32)
VARIANTS = {
    "gptq-v1-int4-g32": gptq(4, 32, False, False, True),
    "gptq-v2-int4-g48-sym-act-order": gptq(4, 48, True, True, False),  # 64 = 48 + 16
    "gptq-v1-int8-g32-act-order-shared": gptq(8, 32, False, True, True, shared_order=True),
    "gptq-v2-int4-channel": gptq(4, -1, False, False, False),
    "awq-g32": awq(32),
    "awq-g48": awq(48),
    "ct-int4-g32-sym": compressed(dict(INT4, symmetric=True), "pack-quantized"),
    "ct-int4-g32-asym": compressed(dict(INT4, symmetric=False), "pack-quantized"),
    "ct-int8-channel": compressed(dict(num_bits=8, type="int", strategy="channel",
                                       symmetric=True), "pack-quantized"),
    "ct-fp8-channel": compressed(dict(num_bits=8, type="float", strategy="channel",
                                      symmetric=True), "float-quantized",
                                 dict(num_bits=8, type="float", strategy="token", dynamic=True)),
    "ct-fp8-block": compressed(dict(num_bits=8, type="float", strategy="block",
                                    block_structure=[32, 48], symmetric=True),
                               "float-quantized"),
    "fp8-blocks-32x48": fp8((32, 48)),  # 64 = 48 + 16: partial blocks
}


@pytest.fixture(scope="module")
def folders(base, tmp_path_factory):
    made = {}

    def make(name):
        if name not in made:
            qcfg, quantize, reference = VARIANTS[name]
            out = tmp_path_factory.mktemp("q") / name
            quantized_folder(base, out, qcfg, quantize)
            made[name] = (out, reference)
        return made[name]
    return make


def _module_tensors(folder, module):
    from safetensors.torch import load_file
    state = load_file(str(folder / "model.safetensors"))
    prefix = f"model.layers.{LAYER}.self_attn.{module}."
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


@pytest.fixture(scope="module")
def exported(folders, tmp_path_factory):
    made = {}

    def export(name):
        if name not in made:
            folder, _ = folders(name)
            made[name] = export_onnx(weights=folder, layer=LAYER, quantize=EXACT,
                                     output=tmp_path_factory.mktemp("x") / name,
                                     validate=False).path
        return made[name]
    return export


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_kept_weights_are_the_formats_own_dequantization_and_pass(folders, exported, name):
    from safetensors.numpy import load_file
    folder, reference = folders(name)
    art = exported(name)
    stored = load_file(str(art / "weights.safetensors"))
    for module, ours in OURS.items():  # the check's reference: the format's own function
        want = reference(_module_tensors(folder, module)).numpy()
        np.testing.assert_array_equal(stored[ours], want, err_msg=f"{name} {module}")
    record = read_artifact(art).export["quantize"]
    assert record["quantizer"] == "source" and set(record["projections"]) == \
        {"q_proj", "k_proj", "v_proj", "out"}
    model = onnx.load(str(art / "model.onnx"))
    assert not any(t.name.endswith(("q_proj.weight", "out.weight"))
                   for t in model.graph.initializer)  # no float copy of a kept projection
    report = check_parity(art, **QUICK)
    assert report.passed, format_report(report)
    assert all(q.deviation.max_abs == 0 for q in report.costs["quantization"])
    assert "own cost is unknown" in format_report(report)
    activations = VARIANTS[name][0].get("config_groups", {}).get("group_0", {}).get(
        "input_activations")
    assert ("float8 dynamic per token activation quantization is not reproduced" in
            format_report(report)) == bool(activations)


@pytest.mark.parametrize("name,orders,gathers", [
    ("gptq-v2-int4-g48-sym-act-order", 4, 7),  # q, k, v in each of auto's branches, out once
    ("gptq-v1-int8-g32-act-order-shared", 1, 3),  # q, k and v share one Gather per branch
])
def test_act_order_is_one_gather_per_input_and_order(exported, name, orders, gathers):
    from faults import all_nodes
    model = onnx.load(str(exported(name) / "model.onnx"))
    found = [n for n in all_nodes(model.graph) if n.op_type == "Gather" and "act_order" in n.name]
    indices = {numpy_helper.to_array(t).tobytes() for t in model.graph.initializer
               if t.name.startswith("input_order")}
    assert (len(indices), len(found)) == (orders, gathers)


def test_the_float8_weights_are_dequantize_linear_of_the_codes(exported):
    model = onnx.load(str(exported("fp8-blocks-32x48") / "model.onnx"))
    assert model.opset_import[0].version >= 21
    f8 = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT8E4M3FN]
    assert len(f8) == 4 and not any(n.op_type == "MatMulNBits" for n in model.graph.node)
    props = {p.key: p.value for p in model.metadata_props}  # what an app must set, in the file
    assert json.loads(props["mha_export.session_options"]) == {"session.disable_quant_qdq": "1"}
    report = check_parity(exported("fp8-blocks-32x48"), **QUICK)
    assert "float8 weights dequantized once at load" in format_report(report)


# faults go into the output projection: y is linear in it, so a one-weight fault is not
# diluted by a softmax (transformers' init weights are ~0.02)
def _flip_code(model):
    t = next(t for t in model.graph.initializer if t.name.startswith("out.weight_q"))
    a = numpy_helper.to_array(t).copy()
    a.reshape(-1)[3] ^= 0x0F
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def _scale_off(model):
    t = next(t for t in model.graph.initializer if t.name in ("out.weight_scales",
                                                              "out.weight_scales_t"))
    a = numpy_helper.to_array(t).copy()
    a.reshape(-1)[0] *= 1.1
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def _zero_point_off(model):
    t = next(t for t in model.graph.initializer if t.name == "out.weight_zero_points")
    a = numpy_helper.to_array(t).copy()
    low = a[0] & 0x0F
    a[0] = (a[0] & 0xF0) | (low + 1 if low < 15 else low - 1)
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def _order_swapped(model):
    matmul = next(n for n in model.graph.node if n.name == "out_matmul")
    gather = next(n for n in model.graph.node if n.output[0] == matmul.input[0])
    t = next(t for t in model.graph.initializer if t.name == gather.input[1])
    a = numpy_helper.to_array(t).copy()
    a[[0, 1]] = a[[1, 0]]
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def _float8_code_flipped(model):
    t = next(t for t in model.graph.initializer if t.name == "out.weight_f8_t")
    raw = bytearray(t.raw_data)
    raw[5] ^= 0x08  # one mantissa / exponent bit of one weight
    t.raw_data = bytes(raw)


FAULTS = [("gptq-v1-int4-g32", _flip_code), ("gptq-v1-int4-g32", _scale_off),
          ("gptq-v1-int4-g32", _zero_point_off), ("gptq-v2-int4-g48-sym-act-order", _order_swapped),
          ("awq-g32", _zero_point_off), ("ct-int8-channel", _scale_off),
          ("fp8-blocks-32x48", _float8_code_flipped), ("fp8-blocks-32x48", _scale_off)]


@pytest.mark.parametrize("name,fault", FAULTS, ids=[f"{n}-{f.__name__[1:]}" for n, f in FAULTS])
def test_planted_faults_in_kept_weights_fail(exported, tmp_path, name, fault):
    faulty = tmp_path / "faulty"
    shutil.copytree(exported(name), faulty)
    model = onnx.load(str(faulty / "model.onnx"))
    fault(model)
    onnx.save(model, str(faulty / "model.onnx"))
    assert not check_parity(faulty, **QUICK).passed


def test_a_decoder_fault_is_caught_by_the_formats_reference(folders, monkeypatch, tmp_path):
    """AWQ's field order and GPTQ v1's zero - 1, decoded wrongly: the weights differ from the
    format's own dequantization. The check's reference comes from the same decoder, so this
    comparison is what holds the decoders to the formats."""
    from mha_export.weights.huggingface import kept_weights
    from mha_export.weights.quantized import awq

    def q_proj(folder):
        return kept_weights(folder, LAYER)[1]["W_query.weight"].dequantized()

    folder, reference = folders("awq-g32")
    want = reference(_module_tensors(folder, "q_proj")).numpy()
    np.testing.assert_array_equal(q_proj(folder), want)
    monkeypatch.setattr(awq, "ORDER", np.arange(8))  # the order not undone
    assert not np.array_equal(q_proj(folder), want)

    folder, reference = folders("gptq-v1-int4-g32")
    want = reference(_module_tensors(folder, "q_proj")).numpy()
    as_v2 = tmp_path / "as-v2"  # v1's zero points read as stored: one step off
    shutil.copytree(folder, as_v2)
    cfg = json.loads((as_v2 / "config.json").read_text())
    cfg["quantization_config"]["checkpoint_format"] = "gptq_v2"
    (as_v2 / "config.json").write_text(json.dumps(cfg))
    np.testing.assert_array_equal(q_proj(folder), want)
    assert not np.array_equal(q_proj(as_v2), want)


def test_a_float_export_of_a_quantized_folder_is_its_dequantization(folders, tmp_path):
    folder, reference = folders("awq-g32")
    art = export_onnx(weights=folder, layer=LAYER, output=tmp_path / "f", validate=False).path
    config = json.loads((art / "config.json").read_text())
    assert config["weights"]["source"]["quantization"] == "AWQ"
    assert "quantize" not in read_artifact(art).export
    from safetensors.numpy import load_file
    want = reference(_module_tensors(folder, "v_proj")).numpy()
    np.testing.assert_array_equal(load_file(str(art / "weights.safetensors"))["W_value.weight"],
                                  want)


@pytest.mark.parametrize("change,message", [
    ({"bits": 3}, "GPTQ int3 is not kept"),
    ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin' is not read"),
    ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not read"),
])
def test_a_config_without_an_exact_form_refuses_in_one_line(folders, tmp_path, change, message):
    folder, _ = folders("gptq-v1-int4-g32")
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (bad / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(bad), "--layer", "1", "--quantize",
                                 "source", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_tensors_that_do_not_match_the_config_refuse_naming_the_tensor(folders, tmp_path):
    """An AWQ folder whose config says GPTQ: the tensors are read as GPTQ's and their shapes
    disagree; a folder whose qzeros are gone names the tensor."""
    folder, _ = folders("gptq-v1-int4-g32")
    from safetensors.torch import load_file, save_file
    bad = tmp_path / "noz"
    shutil.copytree(folder, bad)
    state = load_file(str(bad / "model.safetensors"))
    gone = f"model.layers.{LAYER}.self_attn.k_proj.qzeros"
    del state[gone]
    save_file(state, str(bad / "model.safetensors"))
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(bad), "--layer", "1", "--quantize",
                                 "source", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and gone in r.output and "Traceback" not in r.output, r.output


def test_a_group_that_is_no_multiple_of_16_refuses_in_one_line(base, tmp_path):
    qcfg, quantize, _ = gptq(4, 8, False, False, False)
    quantized_folder(base, tmp_path / "g8", qcfg,
                     lambda module, w: gptq_tensors(w, 4, 8, False, False, False))
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(tmp_path / "g8"), "--layer", "1",
                                 "--quantize", "source", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "group size 8 is not a multiple of 16" in r.output, r.output


def test_a_deepseek_v3_fp8_mla_layer_keeps_its_blocks(tmp_path):
    """DeepSeek-V3's own format (128 x 128 blocks; 64-wide projections: one partial block
    each) on a Multi-head Latent Attention layer: its quantizable projections kept as float8,
    kv_b_proj (which the kind keeps float) as its dequantization."""
    from test_mla import MODELS
    from transformers import AutoConfig, AutoModelForCausalLM
    kind, settings = MODELS["v3-qlora-interleave-yarn"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **settings)).save_pretrained(
        tmp_path / "v3")
    qcfg, quantize, reference = fp8((128, 128))
    quantized_folder(tmp_path / "v3", tmp_path / "v3-fp8", qcfg, quantize, projections=(
        "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))
    art = export_onnx(weights=tmp_path / "v3-fp8", layer=1, quantize=EXACT,
                      output=tmp_path / "a", validate=False).path
    kept = read_artifact(art).export["quantize"]["projections"]
    assert set(kept) == {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"}
    from safetensors.numpy import load_file
    stored = load_file(str(art / "weights.safetensors"))
    from safetensors.torch import load_file as load_torch
    state = load_torch(str(tmp_path / "v3-fp8" / "model.safetensors"))
    prefix = "model.layers.1.self_attn.kv_b_proj."
    want = reference({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    np.testing.assert_array_equal(stored["kv_b_proj.weight"], want.numpy())
    report = check_parity(art, **QUICK)
    assert report.passed, format_report(report)
    assert "float8 dynamic activation quantization is not reproduced (its cost unknown)" in \
        format_report(report)
    assert "dequantized at run time" in format_report(report)


@pytest.fixture(scope="module")
def smollm2_gptq(smollm2_model, tmp_path_factory):
    """SmolLM2-135M (float32, from its GGUF) with every layer's attention projections in
    GPTQ v1 int4, group 64, act-order: a folder transformers cannot load on CPU."""
    pytest.importorskip("accelerate")
    from safetensors.torch import save_file
    folder = tmp_path_factory.mktemp("smollm2")
    (folder / "float").mkdir()
    model = smollm2_model.model
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # transformers' GGUF loader's mark
    (folder / "float" / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()
               if not (k == "lm_head.weight" and model.config.tie_word_embeddings)},
              str(folder / "float" / "model.safetensors"))
    smollm2_model.tokenizer.save_pretrained(folder / "gptq")
    qcfg, _, _ = gptq(4, 64, False, True, True)
    quantized_folder(folder / "float", folder / "gptq", qcfg,
                     lambda module, w: gptq_tensors(w, 4, 64, False, True, True,
                                                    seed=_seed(module)))
    shutil.rmtree(folder / "float")
    return folder / "gptq"


def test_eval_runs_a_gptq_folder_against_its_own_dequantization(smollm2_gptq, tmp_path):
    """The float model is the folder's own dequantization; the exported layers keep its blocks
    (act-order included): inside the model they change nothing it notices."""
    from conftest import REAL_TEXT
    from mha_export.model.eval import evaluate
    from mha_export.model.loading import load_model
    loaded = load_model(smollm2_gptq)
    assert "GPTQ" in loaded.description["quantization"]
    ev = evaluate(smollm2_gptq, REAL_TEXT, 48, "0,5", options={"quantize": EXACT},
                  generate=3, loaded=loaded, folder=tmp_path)
    assert np.isfinite(ev.eager_perplexity) and ev.main.kl_mean < 1e-8
    assert ev.main.top1_agreement == 1.0


def test_compressed_tensors_picks_the_best_matching_config_group(base, tmp_path):
    """A name or pattern beats "Linear", as compressed-tensors ranks them: q_proj in int8 per
    channel beside the other projections' int4 groups."""
    from mha_export.weights.huggingface import kept_weights
    int8 = dict(num_bits=8, type="int", strategy="channel", symmetric=True)
    int4 = dict(INT4, symmetric=False)
    qcfg = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"all": {"targets": ["Linear"], "weights": int4},
                              "q": {"targets": ["re:.*q_proj$"], "weights": int8}}}

    def write(module, w):
        return compressed_tensors(w, int8 if module.endswith("q_proj") else int4,
                                  "pack-quantized")
    quantized_folder(base, tmp_path / "mixed", qcfg, write)
    _, kept = kept_weights(tmp_path / "mixed", LAYER)
    assert kept["W_query.weight"].bits == 8 and kept["W_key.weight"].bits == 4
    for module, args in (("q_proj", int8), ("k_proj", int4)):
        want = compressed_reference(_module_tensors(tmp_path / "mixed", module), args,
                                    "pack-quantized").numpy()
        np.testing.assert_array_equal(kept[OURS[module]].dequantized(), want)


def test_a_compressed_tensors_strategy_without_an_exact_form_refuses(folders, tmp_path):
    folder, _ = folders("ct-int4-g32-sym")
    bad = tmp_path / "block"
    shutil.copytree(folder, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        strategy="block", block_structure=[16, 32])
    (bad / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(bad), "--layer", "1", "--quantize",
                                 "source", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "strategy 'block'" in r.output and "Traceback" not in r.output
