import dataclasses
import shutil

import numpy as np
import onnx
import pytest

from mha_export import MHAConfig, check_parity, export_onnx, export_torchscript
from mha_export.artifact import read_artifact
from mha_export.graph.forms import Feature
from mha_export.kinds.registry import FORMS
from mha_export.check.sweep import (QUICK_LONG_T, Case, default_past_lens, default_seq_lens,
                                    make_cases)
from mha_export.signature import make_signature

import faults
from mha_export.check.parity import NOTHING_RAN, UNCHECKED
from conftest import BF16_CAPABLE, cuda_expected, unavailable_here

CFG = MHAConfig(dim=64, heads=4, max_seq_len=32)
# Multi-head Latent Attention: its forms' artifacts (q LoRA, yarn's mscale on the softmax)
MLA_CFG = MHAConfig(dim=64, heads=4, max_seq_len=32, rope_scaling={
    "rope_type": "yarn", "factor": 4.0, "mscale": 0.9, "mscale_all_dim": 0.8,
    "original_max_position_embeddings": 16}, latent=dict(
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, q_lora_rank=48))


# every kind's forms but the KV-shared layer's (its check and faults: tests/test_kv_shared.py)
# the forms that build a full-sequence model (contrib-gqa-packed: static-cache models only)
PARITY_FORMS = sorted(f for f in FORMS if FORMS[f].kind != "kv_shared" and not FORMS[f].requires)


# Qwen4-exp's QSA: gated, q/k norms (1 + w), partial rotary, blocks of 4 keys, 2 kept
QSA_CFG = MHAConfig(dim=64, heads=4, kv_heads=2, max_seq_len=32, rotary="half", rotary_dim=8,
                    qk_norm="head", norm_offset=1.0, output_gate=True,
                    qsa=dict(heads=4, head_dim=16, budget=8, compress_ratio=4))


# DeepSeek-V4's HCA layer: its window of 8 and a pooled row every 4 tokens (sinks too)
DSV4_CFG = MHAConfig(dim=64, heads=4, head_dim=32, max_seq_len=32, rotary="interleaved",
                     rotary_dim=8, sliding_window=8,
                     dsv4={"layer_type": "heavily_compressed_attention", "q_lora_rank": 24,
                           "o_groups": 2, "o_lora_rank": 16, "rate": 4})


def config_for(form: str) -> MHAConfig:
    """The layer a form's artifact holds: an MLA layer for the latent forms, a QSA layer for
    QSA's, a DeepSeek-V4 HCA layer for its form."""
    return {"latent": MLA_CFG, "qsa": QSA_CFG, "dsv4": DSV4_CFG}.get(FORMS[form].kind, CFG)
SWEEP = dict(seq_lens=[1, 5, 32, 513], batch_sizes=[1, 2], providers=["cpu"])  # 513: auto's loop




@pytest.fixture(scope="module", params=PARITY_FORMS)
def onnx_artifact(request, tmp_path_factory):
    return export_onnx(config_for(request.param), tmp_path_factory.mktemp("a") / "art",
                       attention=request.param, validate=False).path


@pytest.fixture
def fresh_copy(onnx_artifact, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(onnx_artifact, dst)
    return dst


def test_default_sweep_covers_one_max_and_beyond():
    assert default_seq_lens(1024) == [1, 2, 7, 64, 100, 257, 1023, 1024, 1025]
    assert default_seq_lens(4) == [1, 2, 3, 4, 5]
    assert {511, 512, 768, 769} <= set(default_seq_lens(32, FORMS["auto"].switch_seq_lens))  # both branches of the If
    assert {256, 257} <= set(default_seq_lens(32, FORMS["blocked"].switch_seq_lens))


def test_good_artifact_passes_default_sweep(onnx_artifact):
    report = check_parity(onnx_artifact, providers=["cpu"])
    assert report.passed
    seqs = {r.seq for r in report.results}
    assert {1, 31, 32, 33} <= seqs
    runners = {r.runner for r in report.results}
    assert runners == {"eager-fp32", "ort-cpu"}
    for r in report.results:
        assert r.vs_reference.max_abs < 1e-5


@pytest.mark.parametrize("fault", sorted(faults.ONNX_FAULTS))
def test_planted_fault_is_caught(fresh_copy, fault):
    assert check_parity(fresh_copy, **SWEEP).passed  # the copy passes before the fault ...
    try:
        faults.ONNX_FAULTS[fault](fresh_copy / "model.onnx",
                                  read_artifact(fresh_copy).config)
    except faults.NotApplicable as e:
        pytest.skip(str(e))
    report = check_parity(fresh_copy, **SWEEP)
    assert not report.passed  # ... and fails after it
    failed = [r for r in report.results if not r.passed]
    assert failed and all(r.runner == "ort-cpu" for r in failed)


def test_torchscript_fault_is_caught(tmp_path):
    path = export_torchscript(CFG, tmp_path / "ts", validate=False).path
    good = check_parity(path, **SWEEP).outcome()
    assert good.passed and good.why_failed == "" and good.worst_runner == "torchscript"
    faults.nudge_torchscript_weight(path / "model.pt")
    report = check_parity(path, **SWEEP)
    assert not report.passed
    assert {r.runner for r in report.results if not r.passed} == {"torchscript"}
    outcome = report.outcome()  # the verdict in one record (a fan-out's row)
    assert not outcome.passed and outcome.worst_runner == "torchscript"
    assert outcome.worst_rel > 100 * good.worst_rel
    assert outcome.why_failed.startswith("torchscript y ") and " rel " in outcome.why_failed


def test_tampered_source_weights_are_the_truth(fresh_copy):
    """The checker rebuilds eager from weights.safetensors; a model that disagrees fails."""
    from mha_export import build_module
    from mha_export.weights.files import save_weights
    save_weights(build_module(read_artifact(fresh_copy).config, seed=99),
                 fresh_copy / "weights.safetensors")
    assert not check_parity(fresh_copy, **SWEEP).passed


def test_cuda_is_never_a_cpu_run(onnx_artifact):
    report = check_parity(onnx_artifact, providers=["cpu", "cuda"], seq_lens=[3], batch_sizes=[1])
    cuda = [i for i in report.runners if i.name == "ort-cuda"]
    assert len(cuda) == 1
    if cuda_expected():
        assert cuda[0].status == "ran" and "CUDAExecutionProvider" in cuda[0].device
        assert any(r.runner == "ort-cuda" for r in report.results)
    else:
        assert cuda[0].status == "skipped" and "CUDAExecutionProvider" in cuda[0].reason
        assert not any(r.runner == "ort-cuda" for r in report.results)
        assert report.passed  # skipped is not failed ...
        strict = check_parity(onnx_artifact, providers=["cpu"], seq_lens=[3], batch_sizes=[1],
                       require_cuda=True)
        assert not strict.passed  # ... unless CUDA is required
        assert [i.status for i in strict.runners if i.name == "ort-cuda"] == ["failed"]


def test_tolerance_override_applies(onnx_artifact):
    report = check_parity(onnx_artifact, providers=["cpu"], seq_lens=[4], batch_sizes=[1], atol=1e-12, rtol=0)
    assert not report.passed  # fp32 vs fp64 is never exact: the check can fail


def test_a_check_of_nothing_never_passes(onnx_artifact, monkeypatch):
    """Only a runner that cannot run here asked for: nothing under test ran, so no PASS."""
    from mha_export.check import runners
    absent = dataclasses.replace(runners.RUNNERS["ort-cpu"], name="ort-absent",
                                 unavailable=lambda: "not on this machine")
    monkeypatch.setitem(runners.RUNNERS, "ort-absent", absent)
    report = check_parity(onnx_artifact, runners=["ort-absent"], seq_lens=[2], batch_sizes=[1])
    assert [(i.name, i.status) for i in report.runners] == [("eager-fp32", "ran"),
                                                             ("ort-absent", "skipped")]
    assert not report.tested and not report.passed
    assert report.verdict == UNCHECKED  # not a parity failure: nothing was compared
    assert report.outcome().why_failed == NOTHING_RAN
    assert report.outcome().worst_rel is None
    assert "ort-cpu" in report.runnable_here and not report.picked  # named: none run instead
    assert "ort-absent" not in report.runnable_here


def test_a_bfloat16_file_is_checked_on_a_runner_that_can_run_it(tmp_path, monkeypatch):
    """ONNX Runtime's CPU provider has no bf16 kernels and no GPU is here: the default check
    picks OpenVINO, which has them, says so in one line, and its rows are the verdict."""
    pytest.importorskip("openvino")
    unavailable_here(monkeypatch, "ort-cuda", "ort-cuda-graph")
    path = export_onnx(CFG, tmp_path / "bf16", dtype="bfloat16", validate=False).path
    report = check_parity(path, seq_lens=[1, 7], batch_sizes=[1])
    status = {i.name: i.status for i in report.runners}
    assert status == {"eager-fp32": "ran", "ort-cpu": "skipped", "ort-cuda": "skipped",
                      "openvino-cpu": "ran"}
    assert report.picked.startswith("openvino-cpu picked") and "ort-cpu, ort-cuda" in report.picked
    assert report.passed and any(r.runner == "openvino-cpu" for r in report.results)


def test_a_file_no_runner_here_can_run_is_unchecked_not_failed(tmp_path, monkeypatch):
    """Nor OpenVINO nor a GPU here: each runner tried says why not, and the verdict says nothing
    here could check it (not a pass, not a parity failure)."""
    unavailable_here(monkeypatch, *BF16_CAPABLE)
    path = export_onnx(CFG, tmp_path / "bf16", dtype="bfloat16", validate=False).path
    report = check_parity(path, seq_lens=[1, 7], batch_sizes=[1])
    assert {i.name: i.status for i in report.runners} == {
        "eager-fp32": "ran", **{name: "skipped" for name in ("ort-cpu", *BF16_CAPABLE)}}
    assert report.verdict == UNCHECKED and not report.picked and not report.runnable_here
    assert report.to_dict()["verdict"] == UNCHECKED and not report.to_dict()["passed"]


@pytest.mark.parametrize("form", PARITY_FORMS)
def test_float16_models_pass_with_the_float16_tolerance(tmp_path, form):
    """fp16 graphs: finite mask fill (no NaN at T=1 or past a block), within atol 2e-3/rtol 2e-2."""
    path = export_onnx(config_for(form), tmp_path / "f16", attention=form, dtype="float16",
                       validate=False).path
    # a QSA layer's block selection is discrete: in half precision its index scores reorder
    # near-tied blocks against the float32 reference, as the eager layer's own float16 run
    # does (T = 513, seed 0: 7 rows of eager float16 past the tolerance, 4 of the graph's);
    # its float16 proof stops at 33 keys (8 complete blocks, 2 kept)
    longest = 33 if FORMS[form].kind == "qsa" else 513
    report = check_parity(path, seq_lens=[1, 7, longest], batch_sizes=[2], providers=["cpu"])
    assert report.passed, [r.error for r in report.results if not r.passed]
    ort_rows = [r for r in report.results if r.runner == "ort-cpu"]
    assert ort_rows and all(r.vs_reference.nonfinite == 0 for r in ort_rows)
    assert max(r.vs_reference.max_abs for r in ort_rows) > 1e-5  # really ran in half precision


KV_FORMS = [f for f in PARITY_FORMS if Feature.KV_CACHE in FORMS[f].supports]
KV_SWEEP = dict(seq_lens=[1, 4], batch_sizes=[1, 3], past_lens=[0, 3], providers=["cpu"])


@pytest.fixture(scope="module", params=KV_FORMS)
def kv_artifact(request, tmp_path_factory):
    return export_onnx(config_for(request.param), tmp_path_factory.mktemp("kv") / "art",
                       attention=request.param, kv_cache=True, validate=False).path


def test_kv_artifact_passes_the_sweep_and_the_generation_scenarios(kv_artifact):
    report = check_parity(kv_artifact, providers=["cpu"], seq_lens=[1, 2, 9])  # default pasts
    assert report.passed, [r.error for r in report.results if not r.passed][:3]
    sig = read_artifact(kv_artifact).signature  # DeepSeek-V4's: its own cache (no value)
    assert report.outputs == sig.output_names and report.outputs[:2] == ["y", "present_key"]
    assert sig.own_cache or report.outputs == ["y", "present_key", "present_value"]
    cases = {r.case for r in report.results}
    assert {c.past for c in cases} >= {0, 1, 5, CFG.max_seq_len - 1}
    assert {c.padding for c in cases} == {"none", "left", "right"}
    scenarios = {c.scenario.split()[0] for c in cases if c.scenario}
    assert scenarios == {"generate", "padded-vs-alone"}
    generated = [r for r in report.results if r.runner == "ort-cpu" and r.scenario.startswith(
        "generate") and r.output == "y"]
    assert generated and all(r.vs_reference.max_abs < 1e-5 for r in generated)


@pytest.mark.parametrize("fault", sorted(faults.CACHE_FAULTS))
def test_planted_cache_fault_is_caught(kv_artifact, tmp_path, fault):
    copy = tmp_path / "copy"
    shutil.copytree(kv_artifact, copy)
    try:
        faults.CACHE_FAULTS[fault](copy / "model.onnx")
    except faults.NotApplicable as e:
        pytest.skip(str(e))
    report = check_parity(copy, **KV_SWEEP)
    assert not report.passed
    assert {r.runner for r in report.results if not r.passed} == {"ort-cpu"}


def test_generation_scenarios_catch_a_decode_model_that_ignores_its_past(tmp_path):
    """A decode model that drops the cache passes no generation scenario."""
    path = export_onnx(CFG, tmp_path / "kv", kv_cache=True, attention="decomposed",
                       validate=False).path
    def fn(m):
        for n in faults.all_nodes(m.graph):
            if n.name in ("all_keys", "all_values"):  # present = this call only (past dropped)
                n.op_type = "Identity"
                del n.input[0]
                del n.attribute[:]
    faults._edit(path / "model.onnx", fn)
    report = check_parity(path, **KV_SWEEP)
    failing = {r.scenario.split()[0] for r in report.results if not r.passed and r.scenario}
    assert {"generate", "padded-vs-alone"} <= failing


def test_torchscript_kv_model_passes(tmp_path):
    path = export_torchscript(CFG, tmp_path / "ts", kv_cache=True, validate=False).path
    report = check_parity(path, **KV_SWEEP)
    assert report.passed and {r.runner for r in report.results} == {"eager-fp32", "torchscript"}


@pytest.mark.parametrize("form", KV_FORMS)
def test_float16_kv_models_stay_finite_and_within_tolerance(tmp_path, form):
    path = export_onnx(config_for(form), tmp_path / "f16", attention=form, kv_cache=True,
                       dtype="float16",
                       validate=False).path
    report = check_parity(path, **KV_SWEEP)
    assert report.passed, [r.error for r in report.results if not r.passed][:3]


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_query_cache_models_pass_and_keep_kv_heads(tmp_path, kv_heads):
    cfg = CFG.replace(kv_heads=kv_heads)
    path = export_onnx(cfg, tmp_path / "gqa", kv_cache=True, validate=False).path
    report = check_parity(path, **KV_SWEEP)
    assert report.passed
    ts = export_torchscript(cfg, tmp_path / "ts", kv_cache=True, validate=False).path
    assert check_parity(ts, **KV_SWEEP).passed
    faults.padding_ignored(path / "model.onnx")
    assert not check_parity(path, **KV_SWEEP).passed


def test_sliding_window_cache_model_passes_past_the_window_and_a_wrong_window_fails(tmp_path):
    cfg = CFG.replace(kv_heads=2, sliding_window=4)
    path = export_onnx(cfg, tmp_path / "w", kv_cache=True, validate=False).path
    assert check_parity(path, **KV_SWEEP).passed  # pasts and scenarios reach past the window
    def widen(m):
        for n in faults.all_nodes(m.graph):
            if n.name.endswith("window_behind"):
                n.op_type = "Greater"  # keys never count as too old ... (and some new ones do)
    faults._edit(path / "model.onnx", widen)
    assert not check_parity(path, **KV_SWEEP).passed


@pytest.mark.parametrize("rotary", ["half", "interleaved"])
def test_rotary_cache_models_pass_with_a_position_offset_and_a_wrong_rotation_fails(tmp_path, rotary):
    cfg = CFG.replace(kv_heads=2, rotary=rotary, rotary_dim=8)
    path = export_onnx(cfg, tmp_path / "r", kv_cache=True, validate=False).path
    report = check_parity(path, **KV_SWEEP)
    assert report.passed and report.inputs[-1] == "position_ids"
    ts = export_torchscript(cfg, tmp_path / "ts", kv_cache=True, validate=False).path
    assert check_parity(ts, **KV_SWEEP).passed
    def wrong_theta(m):  # frequencies 1% off: a wrong rope_theta or scaling
        i, freq = faults._initializer(m, "rotary.inv_freq")
        faults._set_initializer(m, "rotary.inv_freq", (freq * 1.01).astype(freq.dtype))
    faults._edit(path / "model.onnx", wrong_theta)
    assert not check_parity(path, **KV_SWEEP).passed


def test_a_rotary_model_that_ignores_its_position_ids_fails(tmp_path):
    """The sweep shifts each row's positions, so positions taken from the shape are caught."""
    cfg = CFG.replace(rotary="half")
    path = export_onnx(cfg, tmp_path / "r", attention="decomposed", validate=False).path
    assert check_parity(path, **SWEEP).passed
    def from_shape(m):  # positions = Range(0, T) from x's shape, position_ids left unread
        h, nh = onnx.helper, onnx.numpy_helper
        m.graph.initializer.extend([nh.from_array(np.array(v, np.int64), n) for n, v in (
            ("fp_axes0", [0]), ("fp_zero", 0), ("fp_one", 1))])
        nodes = [h.make_node("Shape", ["x"], ["fp_len"], start=1, end=2),
                 h.make_node("Squeeze", ["fp_len", "fp_axes0"], ["fp_t"]),
                 h.make_node("Range", ["fp_zero", "fp_t", "fp_one"], ["fp_range"]),
                 h.make_node("Unsqueeze", ["fp_range", "fp_axes0"], ["fp_positions"])]
        for n in m.graph.node:
            if n.name == "positions":
                n.input[0] = "fp_positions"
        for i, n in enumerate(nodes):
            m.graph.node.insert(i, n)
    faults._edit(path / "model.onnx", from_shape)
    report = check_parity(path, **SWEEP)
    assert not report.passed


BF16_CASES = [("decomposed", {}), ("blocked-plain", {"kv_cache": True}),
              ("blocked", {"static_cache": True})]


@pytest.mark.parametrize("form,kind", BF16_CASES, ids=lambda v: str(v))
def test_bfloat16_models_pass_on_openvino_with_the_bfloat16_tolerance(tmp_path, form, kind):
    """bf16 graphs (ONNX Runtime's CPU provider has no bf16 kernels: OpenVINO runs them here),
    within atol 3e-2 / rtol 5e-2, finite, and really rounded to bf16."""
    pytest.importorskip("openvino")
    from mha_export.comparison.comparator import BFLOAT16
    path = export_onnx(CFG, tmp_path / "bf16", attention=form, dtype="bfloat16",
                       validate=False, **kind).path
    report = check_parity(path, runners=["openvino-cpu"], seq_lens=[1, 7], batch_sizes=[2],
                          past_lens=[0, 3])
    assert report.passed, [r.error for r in report.results if not r.passed][:3]
    rows = [r for r in report.results if r.runner == "openvino-cpu"]
    assert rows and all(r.tolerance == BFLOAT16 and r.vs_reference.nonfinite == 0 for r in rows)
    assert max(r.vs_reference.max_abs for r in rows) > 1e-4  # really ran on bf16 values


def test_a_planted_fault_fails_a_bfloat16_model(tmp_path):
    """The bf16 tolerance still catches a wrong graph: the causal mask removed."""
    pytest.importorskip("openvino")
    path = export_onnx(CFG, tmp_path / "bf16", attention="decomposed", dtype="bfloat16",
                       validate=False).path
    faults.remove_causal_mask(path / "model.onnx")
    report = check_parity(path, runners=["openvino-cpu"], seq_lens=[7], batch_sizes=[1])
    assert report.tested and not report.passed


# --- the quick sweep (the export-time check's): fewer long cases, every fault still caught ----
QUICK_CFG = MHAConfig(dim=64, heads=4, max_seq_len=128)  # lengths past QUICK_LONG_T (64)


def test_the_quick_sweep_keeps_short_calls_everywhere_and_long_ones_at_batch_one():
    sig = make_signature(QUICK_CFG, "kv-cache")
    lens, pasts = default_seq_lens(128, (100,)), default_past_lens(128)
    full = make_cases(sig, [1, 3], lens, pasts)
    quick = make_cases(sig, [1, 3], lens, pasts, sweep="quick")
    assert set(quick) < set(full) and len(quick) >= 20
    assert {c for c in full if c.seq <= QUICK_LONG_T} <= set(quick)  # steps, the cache full
    assert {c.seq for c in quick if (c.batch, c.past) == (1, 0)} == set(lens)  # every path
    assert Case(1, 129, 1) in quick and Case(1, 128, 1) not in quick  # longest over a cache
    long_unpadded = [c for c in quick if c.seq > QUICK_LONG_T and c.padding == "none"]
    assert {c.batch for c in long_unpadded} == {1}
    assert [c for c in quick if c.padding != "none"] == [c for c in full if c.padding != "none"]


# fewer elements compared: the smallest nudge of one q_proj weight the quick sweep catches on
# this layer is 1.5e-3 (the full sweep: 1e-3, barely; measured 2026-11-27, AMD EPYC Zen 3)
QUICK_FAULTS = {**faults.ONNX_FAULTS, "nudged weight": lambda p, c: faults.nudge_weight(p, 2e-3)}


@pytest.mark.parametrize("fault", sorted(QUICK_FAULTS))
def test_the_quick_sweep_catches_every_planted_fault(tmp_path, fault):
    path = export_onnx(QUICK_CFG, tmp_path / "a", validate=False).path
    try:
        QUICK_FAULTS[fault](path / "model.onnx", QUICK_CFG)
    except faults.NotApplicable as e:
        pytest.skip(str(e))
    report = check_parity(path, providers=["cpu"], sweep="quick")
    assert report.sweep == "quick" and not report.passed


@pytest.mark.parametrize("fault", sorted(faults.CACHE_FAULTS))
def test_the_quick_sweep_catches_every_planted_cache_fault(tmp_path, fault):
    path = export_onnx(QUICK_CFG, tmp_path / "a", kv_cache=True, validate=False).path
    try:
        faults.CACHE_FAULTS[fault](path / "model.onnx")
    except faults.NotApplicable as e:
        pytest.skip(str(e))
    assert not check_parity(path, providers=["cpu"], sweep="quick").passed


def test_an_unknown_sweep_is_bad_input(onnx_artifact):
    from mha_export.errors import UsageError
    with pytest.raises(UsageError, match="one of full, quick"):
        check_parity(onnx_artifact, sweep="fast")
