"""contrib-gqa-packed (issue 64): the CUDA decode step as ONNX Runtime's XQA kernel takes it —
one packed q/k/v projection, GroupQueryAttention with do_rotary and cos/sin tables, past and
present one buffer — proven on ONNX Runtime's CPU provider by the check (prefill + steps with
the cache inside, rows at different positions, the buffer read back), and by planted faults;
auto's static short calls take it at float16 / bfloat16 where XQA takes the layer."""
import numpy as np
import onnx
import pytest

from mha_export import MHAConfig, check_parity, export_onnx
from mha_export.graph.forms.auto import decode_form
from mha_export.lossy.projections.rtn import QuantSpec

import faults

FORM = "contrib-gqa-packed"
# H = 32 (x 4 heads), 2 kv heads; the cos/sin table (max_seq_len) holds every call's buffer
CFG = MHAConfig(dim=128, heads=4, kv_heads=2, max_seq_len=40, rotary="half")
XQA_CFG = MHAConfig(dim=256, heads=4, kv_heads=2, max_seq_len=40, rotary="half")  # H = 64
SWEEP = dict(seq_lens=[1, 4, 9], batch_sizes=[1, 3], past_lens=[0, 5], providers=["cpu"])


def _export(tmp_path, config=CFG, dtype="float32", name="p", **options):
    return export_onnx(config, tmp_path / name, attention=FORM, static_cache=True, dtype=dtype,
                       validate=False, **options).path


def _check(path):
    report = check_parity(path, **SWEEP)
    failed = [(r.scenario, r.error) for r in report.results if not r.passed]
    return report, failed


def _nodes(path):
    return onnx.load(str(path / "model.onnx")).graph.node


@pytest.mark.parametrize("dtype", ["float32", "float16"])  # ORT's CPU GQA: fp32 and fp16
def test_the_packed_node_passes_the_check_with_its_scenarios(tmp_path, dtype):
    path = _export(tmp_path, dtype=dtype)
    report, failed = _check(path)
    assert report.passed, failed[:3]
    scenarios = {r.scenario.split(" ")[1] for r in report.results if r.scenario}
    assert scenarios == {"generate"}  # batch-1 prefill + steps + a chunk (B > 1 prompts: NaN)
    assert any(r.case.batch == 3 and r.case.seq == 1 and r.case.past == 5
               for r in report.results)  # rows at different past lengths and positions


def test_the_graph_is_one_projection_and_one_node(tmp_path):
    nodes = _nodes(_export(tmp_path))
    ops = [n.op_type for n in nodes]
    assert ops.count("MatMul") == 2  # qkv_proj and out
    gqa = next(n for n in nodes if n.op_type == "GroupQueryAttention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 0
    assert list(gqa.input)[1:3] == ["", ""] and list(gqa.input)[3:5] == ["past_key",
                                                                         "past_value"]
    assert list(gqa.output)[1:] == ["present_key", "present_value"]  # no copy after it
    assert "RotaryEmbedding" not in ops and "ScatterND" not in ops and "If" not in ops


@pytest.mark.parametrize("config", [
    CFG.replace(kv_heads=4, qkv_bias=True),  # biases on q, k and v: one Add
    XQA_CFG.replace(kv_heads=1, rotary="interleaved"),  # GPT-J pairs, multi-query
    CFG.replace(rotary_dim=16, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                             "original_max_position_embeddings": 16}),
], ids=["bias", "interleaved", "partial-yarn"])
def test_layers_it_builds_pass(tmp_path, config):
    report, failed = _check(_export(tmp_path, config))
    assert report.passed, failed[:3]


def test_int4_projections_are_one_matmulnbits(tmp_path):
    path = _export(tmp_path, quantize=QuantSpec(bits=4, block_size=32))
    nbits = [n.name for n in _nodes(path) if n.op_type == "MatMulNBits"]
    assert nbits == ["qkv_proj_matmul", "out_matmul"]
    report, failed = _check(path)
    assert report.passed, failed[:3]


def _swap_cos_sin_halves(path):
    def fn(model):
        _, cos = faults._initializer(model, "rotary.cos_cache")
        half = cos.shape[1] // 2
        faults._set_initializer(model, "rotary.cos_cache",
                                np.concatenate([cos[:, half:], cos[:, :half]], axis=1))
    faults._edit(path, fn)


def _swap_two_value_heads(path):
    """The last two value heads' weight columns swapped in the packed projection."""
    def fn(model):
        _, w = faults._initializer(model, "qkv_proj.weight")  # (d_in, (N + 2K)*H)
        h = CFG.head_dim
        w[:, -2 * h:] = np.concatenate([w[:, -h:], w[:, -2 * h:-h]], axis=1)
        faults._set_initializer(model, "qkv_proj.weight", w)
    faults._edit(path, fn)


@pytest.mark.parametrize("plant", [_swap_cos_sin_halves, _swap_two_value_heads],
                         ids=["cos-halves", "value-heads"])
def test_planted_fault_is_caught(tmp_path, plant):
    path = _export(tmp_path)
    plant(path / "model.onnx")
    assert not check_parity(path, **SWEEP).passed


def test_refusals_say_why():
    from mha_export.graph.forms.contrib_packed import CONTRIB_GQA_PACKED, xqa_problem
    from mha_export.signature import STATIC, make_signature
    problem = lambda c: CONTRIB_GQA_PACKED.problem(c, make_signature(c, STATIC))
    assert "rotary_dim % 16" in problem(CFG.replace(rotary_dim=8))
    assert "q/k norm" in problem(CFG.replace(qk_norm="head"))
    assert "softcap" in problem(CFG.replace(softcap=30.0))
    assert "sliding-window" in problem(CFG.replace(sliding_window=8))
    assert "head sizes" in xqa_problem(CFG)  # H = 32
    assert xqa_problem(XQA_CFG) is None  # H = 64, groups of 2
    assert "groups" in xqa_problem(MHAConfig(dim=768, heads=12, kv_heads=4))  # H 64, groups 3


def test_auto_takes_it_for_gpu_dtypes_where_xqa_does():
    xqa = XQA_CFG
    assert decode_form("float16", xqa)[0].name == FORM
    assert decode_form("bfloat16", xqa)[0].name == FORM
    assert decode_form("float32", xqa)[0].name == "contrib-gqa"
    form, why = decode_form("float16", CFG)  # H = 32: XQA refuses
    assert form.name == "contrib-gqa" and "head sizes" in why


def test_auto_float16_static_routes_short_calls_to_it_and_passes(tmp_path):
    path = export_onnx(XQA_CFG, tmp_path / "a", static_cache=True, dtype="float16",
                       validate=False).path
    branch_if = next(n for n in _nodes(path) if n.op_type == "If")
    assert FORM in branch_if.doc_string
    then = next(a.g for a in branch_if.attribute if a.name == "then_branch")
    assert {"GroupQueryAttention", "MatMul"} <= {n.op_type for n in then.node}
    report = check_parity(path, seq_lens=[1, 4, 45], batch_sizes=[1, 3], past_lens=[0, 5],
                          providers=["cpu"])  # 45: a buffer past the table (the loop)
    assert report.passed, [(r.scenario, r.error) for r in report.results if not r.passed][:3]


def _optimized_ops(model, tmp_path, **dims) -> list[str]:
    """The ops ONNX Runtime (CPU provider) keeps of the model once these symbolic dimensions
    are fixed, as a CUDA-graph session fixes them (ort_graphs.GraphReplays)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    for name, size in dims.items():
        options.add_free_dimension_override_by_name(name, size)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]


def test_auto_float16_step_folds_to_the_packed_node_once_its_shape_is_fixed(tmp_path):
    """CUDA-graph capture refuses control flow; with the step's shape fixed ONNX Runtime folds
    auto's If to its short branch: the packed projection and the one node, no If, no Loop;
    the NaN guard of a call the node cannot run folds away too (each node left is a kernel
    in the replayed graph): the step's only other node is past_lengths + (T - 1).
    A batch of prompts keeps the blocked loop (a Loop: that shape runs without a graph)."""
    path = export_onnx(XQA_CFG, tmp_path / "a", static_cache=True, dtype="float16",
                       validate=False).path
    for batch in (1, 3):  # a decode step at any batch
        ops = _optimized_ops(path / "model.onnx", tmp_path, batch=batch, seq=1, max_cache=40)
        assert ops.count("GroupQueryAttention") == 1 and not {"If", "Loop"} & set(ops), ops
        assert "RotaryEmbedding" not in ops and "ScatterND" not in ops  # rotary in the node
        kernels = [o for o in ops if o not in ("Cast", "Reshape")]  # + the CPU's fp16 casts
        assert kernels in (["MatMul", "Add", "GroupQueryAttention", "Gemm"],  # bias fused
                           ["MatMul", "Add", "GroupQueryAttention", "MatMul", "Add"]), ops
    prompts = _optimized_ops(path / "model.onnx", tmp_path, batch=3, seq=4, max_cache=40)
    assert "Loop" in prompts and "GroupQueryAttention" not in prompts
