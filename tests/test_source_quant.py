"""--quantize source (issue 34): a GGUF layer exported with the file's own blocks as
MatMulNBits, judged against the file's own function (gguf's dequantize) at fp32's tolerance, with
zero quantization cost against it and the GGUF's own cost said to be unknown; every block type;
planted faults fail; what cannot be kept refuses in one line."""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

gguf = pytest.importorskip("gguf")

from faults import SOURCE_FAULTS, NotApplicable  # noqa: E402
from test_gguf import NEW, Tiny, _hf_model, _metadata  # noqa: E402
from test_gguf_blocks import FP16_FIELDS, random_raw  # noqa: E402
from mha_export import check_parity, export_onnx  # noqa: E402
from mha_export.artifact import read_artifact  # noqa: E402
from mha_export.comparison.comparator import FP32  # noqa: E402
from mha_export.check.report import format_report  # noqa: E402
from mha_export.cli.commands import cli  # noqa: E402
from mha_export.lossy.projections.source import SourceQuantSpec, kept_quantization  # noqa: E402

QUICK = dict(seq_lens=[1, 7, 33], batch_sizes=[1, 2], past_lens=[0, 5])
EXACT = SourceQuantSpec()  # the default: fp32 compute (accuracy level 1)
# a llama layer whose input features are a multiple of 256 (K-quants' super-block)
WIDE = Tiny("llama", "llama", dict(NEW, hidden_size=256, head_dim=64), (0,))
# every block type with an exact MatMulNBits form, four projections a file
TYPE_SETS = [("Q4_K", "Q6_K", "Q5_K", "Q3_K"), ("Q2_K", "Q8_0", "Q4_1", "Q5_1"),
             ("Q4_0", "Q5_0", "Q4_K", "Q8_0")]
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output")


def layer_like_raw(name: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random blocks (any bytes with finite scales are a valid block) whose fp16 scales and
    minimums are a trained layer's size (1e-4 to 2e-3: weights of at most ~1), so that one
    sub-block's defect is not lost in a layer of giant weights; types without a test layout
    (IQ4_NL): random bytes with a small d first."""
    rng = np.random.default_rng(seed)
    if name not in FP16_FIELDS:
        qk, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        b = rng.integers(0, 256, (n * k // qk, size), dtype=np.uint8)
        b[:, :2] = np.full(len(b), 1e-3, np.float16).view(np.uint8).reshape(-1, 2)
        return b.reshape(n, -1)
    b = random_raw(name, n, k, seed).reshape(-1, gguf.GGML_QUANT_SIZES[
        gguf.GGMLQuantizationType[name]][1])
    for at in FP16_FIELDS[name]:
        small = rng.uniform(1e-4, 2e-3, len(b)).astype(np.float16)
        b[:, at:at + 2] = small.view(np.uint8).reshape(-1, 2)
    return b.reshape(n, -1)


def write_blocks(path, types: tuple) -> str:
    """A tiny llama GGUF whose layer-0 projections hold random blocks of the given types (any
    bytes with finite scales are a valid block), the rest float32."""
    model = _hf_model(WIDE)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    _metadata(w, "llama", cfg)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    chosen = dict(zip(PROJECTIONS, types))
    for i, (name, t) in enumerate(model.state_dict().items()):
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        part = new.split(".")[2] if new.startswith("blk.0.") else None
        if part in chosen and new.endswith(".weight"):
            qtype = chosen[part]
            w.add_tensor(new, layer_like_raw(qtype, t.shape[0], t.shape[1], seed=i),
                         raw_dtype=gguf.GGMLQuantizationType[qtype])
        else:
            w.add_tensor(new, t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _kernel_rows(report, runner="ort-cpu"):
    return [r for r in report.results if r.runner == runner]


# fp32's unit roundoff, and the confidence of the probabilistic rounding bound below: a sum of n
# rounded terms is off by more than lambda * sqrt(n) * u of its terms' absolute sum with
# probability below 2n exp(-lambda^2 / 2) (Higham & Mary, SIAM J. Sci. Comput. 2019, thm 3.1):
# 2e-11 for one output at n ~ 600, whatever order or FMA a CPU's kernel uses.
U = 2.0 ** -24
LAMBDA = 8.0


def kernel_alone(spec, name: str, k: int) -> onnx.ModelProto:
    """Projection ``name`` as the export writes it (the step's own MatMulNBits writer: one node,
    two summed, or the packed kernel plus each block's sum of x times its min), x (B, T, K)."""
    from onnx import TensorProto, helper
    from mha_export.graph.builder import GraphBuilder
    from mha_export.graph.nodes import CONTRIB
    from mha_export.lossy.projections.graph import MatMulNBitsProjections
    g = GraphBuilder()
    y = MatMulNBitsProjections(spec)(g, "x", name, torch.zeros(0))
    graph = helper.make_graph(
        g.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", k])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], g.initializers)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(CONTRIB, 1)])


def rounding_bound(spec, name: str, x: np.ndarray) -> np.ndarray:
    """The largest fp32 rounding error of the kernel's own arithmetic, per output (B, T, N).

    The kernel does not compute x @ W^T from W: it sums the terms of its form, scale * (code -
    zero point) * x per weight, and for float zero points (GGUF's mins) scale * code * x plus
    each block's min * sum(x over the block). Those terms can be large and of opposite sign
    where W is small, so the rounding follows sum_i |x_i| * (sum of |terms| of weight i), not
    |y|: on a layer whose inputs have a mean (real activations do) the kernel sits 10-60x
    eager's error (Intel 2026-11-25: 4x on the layer), by arithmetic, not by defect. Bound:
    lambda * sqrt(n) * u times that absolute sum, n = K plus the block sums, the forms' Adds and
    the min term's Add."""
    from mha_export.lossy.projections.source import _forms
    forms = _forms(spec.blocks[name])
    magnitude = 0.0
    for b in forms:  # (N, K) each: the absolute terms of every weight
        scales = np.abs(b.scales.astype(np.float64))[..., None]
        if b.float_zero_points:
            terms = b.codes * scales + np.abs(b.zero_points.astype(np.float64))[..., None] * scales
        else:
            terms = np.abs(b.codes.astype(np.float64) - b.zero_points[..., None]) * scales
        magnitude = magnitude + terms.reshape(b.n, b.k)
    depth = forms[0].k + 2 * len(forms) + 2
    gamma = np.expm1(LAMBDA * np.sqrt(depth) * U + depth * U * U / (1 - U))
    return gamma * (np.abs(x.astype(np.float64)) @ magnitude.T)


def assert_kernels_within_rounding(spec, reference=None, seed: int = 0) -> None:
    """Every kept projection of ``spec``, as its own graph on this CPU's ONNX Runtime kernel,
    equals the file's dequantized weights (``reference``'s blocks: the same spec unless a fault
    was planted) in fp64 to within its arithmetic's rounding bound: on centred inputs and on
    inputs with a mean (where the min terms are largest)."""
    truth = reference or spec
    rng = np.random.default_rng(seed)
    for name, blocks in spec.blocks.items():
        session = ort.InferenceSession(kernel_alone(spec, name, blocks.k).SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        w = truth.blocks[name].dequantized().astype(np.float64)  # (N, K): the file's function
        for mean in (0.0, 3.0):
            x = (rng.standard_normal((2, 33, blocks.k)) + mean).astype(np.float32)
            err = np.abs(session.run(None, {"x": x})[0] - x.astype(np.float64) @ w.T)
            bound = rounding_bound(truth, name, x)
            assert (err <= bound).all(), (name, blocks.ggml_type, mean,
                                          float((err / bound).max()))


@pytest.mark.parametrize("types", TYPE_SETS, ids=["-".join(t) for t in TYPE_SETS])
def test_every_block_type_is_kept_exactly(tmp_path, types):
    gguf_file = write_blocks(tmp_path / "w.gguf", types)
    art = export_onnx(weights=gguf_file, layer=0, output=tmp_path / "a", quantize=EXACT,
                      static_cache=True, validate=False).path
    record = read_artifact(art).export["quantize"]
    assert record["quantizer"] == "source"
    assert [record["projections"][p]["type"] for p in ("q_proj", "k_proj", "v_proj", "out")] \
        == list(types)
    model = onnx.load(str(art / "model.onnx"))
    assert not any(t.name.endswith(("q_proj.weight", "k_proj.weight")) for t in
                   model.graph.initializer)  # no float copy of a kept projection
    report = check_parity(art, **QUICK)
    assert report.passed, format_report(report)
    rows = _kernel_rows(report)
    assert rows and all(r.tolerance == FP32 for r in rows)
    assert_kernels_within_rounding(kept_quantization(gguf_file, 0, None, 1))
    assert all(q.deviation.max_abs == 0 for q in report.costs["quantization"])
    assert "the GGUF's own cost is unknown" in format_report(report)


def test_the_stored_weights_are_ggufs_own_dequantization(tmp_path):
    from mha_export.weights.gguf import layer_raw_tensors
    from safetensors.numpy import load_file
    gguf_file = write_blocks(tmp_path / "w.gguf", TYPE_SETS[0])
    art = export_onnx(weights=gguf_file, layer=0, output=tmp_path / "a", quantize=EXACT,
                      validate=False).path
    stored = load_file(str(art / "weights.safetensors"))
    raw = layer_raw_tensors(gguf_file, 0)
    for ours in ("W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight"):
        t = raw[ours]
        want = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType[t.ggml_type])
        want = want if t.rows is None else want[t.rows]
        np.testing.assert_array_equal(stored[ours], want)


@pytest.fixture(scope="module")
def smollm2_kept(smollm2_gguf, tmp_path_factory):
    return export_onnx(weights=smollm2_gguf, layer=5, output=tmp_path_factory.mktemp("src") /
                       "l5", quantize=EXACT, kv_cache=True, validate=False).path


def test_smollm2_layer_keeps_its_q4_1_blocks_and_passes_tightly(smollm2_kept, smollm2_inputs,
                                                                smollm2_gguf):
    art = read_artifact(smollm2_kept)
    assert {p["type"] for p in art.export["quantize"]["projections"].values()} == {"Q4_1"}
    report = check_parity(smollm2_kept, inputs=smollm2_inputs, **QUICK)
    assert report.passed, format_report(report)
    assert_kernels_within_rounding(kept_quantization(smollm2_gguf, 5, None, 1))
    ran = next(i for i in report.runners if i.name == "ort-cpu")
    # Q4_1's float zero points as the packed kernel + each block's min: never dequantized per call
    assert "fp32 compute" in ran.device and "every call" not in ran.device + ran.reason


@pytest.mark.parametrize("fault", sorted(SOURCE_FAULTS))
def test_planted_faults_in_kept_blocks_fail(smollm2_kept, tmp_path, fault):
    faulty = tmp_path / "faulty"
    shutil.copytree(smollm2_kept, faulty)
    try:
        SOURCE_FAULTS[fault](faulty / "model.onnx")
    except NotApplicable as e:
        pytest.skip(str(e))
    report = check_parity(faulty, **QUICK)
    assert not report.passed and any(not r.passed for r in _kernel_rows(report))


BLOCK_FAULTS = {  # the same faults as SOURCE_FAULTS, planted in the blocks themselves
    "one sub-block's scale x1.1": lambda b: dataclasses.replace(
        b, scales=_at(b.scales, (0, 0), lambda v: v * 1.1)),
    "a 4-bit code flipped": lambda b: dataclasses.replace(
        b, codes=_at(b.codes, (0, 0, 0), lambda v: v ^ 8)),
    "a block's min one code step off": lambda b: dataclasses.replace(
        b, zero_points=_at(b.zero_points, (0, 0), lambda v: v + 1)),
    "two sub-blocks' scales swapped": lambda b: dataclasses.replace(
        b, scales=_at(b.scales, (0, slice(0, 2)), lambda v: v[::-1])),
}


def _at(a: np.ndarray, index, fn) -> np.ndarray:
    out = a.copy()
    out[index] = fn(out[index])
    return out


@pytest.mark.parametrize("fault", sorted(BLOCK_FAULTS))
def test_the_rounding_bound_still_fails_planted_faults(smollm2_gguf, fault):
    """The derived bound is no loose allowance: a fault in one block of a real layer's kept
    projection puts the kernel outside it."""
    spec = kept_quantization(smollm2_gguf, 5, None, 1)
    faulty = dataclasses.replace(spec, blocks={"q_proj": BLOCK_FAULTS[fault](
        spec.blocks["q_proj"])})
    with pytest.raises(AssertionError):
        assert_kernels_within_rounding(faulty, reference=spec)


def test_super_block_scales_swapped_fail_a_k_quant(tmp_path):
    gguf_file = write_blocks(tmp_path / "w.gguf", TYPE_SETS[0])  # q_proj: Q4_K
    art = export_onnx(weights=gguf_file, layer=0, output=tmp_path / "a", quantize=EXACT,
                      validate=False).path
    SOURCE_FAULTS["two sub-blocks' scales swapped"](art / "model.onnx")
    assert not check_parity(art, **QUICK).passed


@pytest.mark.parametrize("args, message", [
    (["--quantize", "source", "--heads", "2", "--dim", "16"], "needs --weights FILE.gguf"),
    (["--quantize", "source", "--block-size", "64"], "does not apply to --quantize source"),
    (["--quantize", "source", "--dtype", "float16"], "float32 only"),
    (["--quantize", "source", "--layout", "fused"], "in its layout (split)"),
])
def test_what_cannot_be_kept_is_one_line_exit_2(smollm2_gguf, tmp_path, args, message):
    weights = [] if "--heads" in args else ["--weights", str(smollm2_gguf), "--layer", "0"]
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["onnx", *weights, *args, "-o", str(out)])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_a_type_without_an_exact_form_refuses_naming_the_tensor(tmp_path):
    gguf_file = write_blocks(tmp_path / "w.gguf", ("IQ4_NL", "Q8_0", "Q8_0", "Q8_0"))
    result = CliRunner().invoke(cli, ["onnx", "--weights", gguf_file, "--layer", "0",
                                      "--quantize", "source", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "blk.0.attn_q.weight" in result.output and "IQ4_NL" in result.output
    float_export = CliRunner().invoke(cli, ["onnx", "--weights", gguf_file, "--layer", "0",
                                            "--no-check", "-o", str(tmp_path / "f")])
    assert float_export.exit_code == 0, float_export.output
