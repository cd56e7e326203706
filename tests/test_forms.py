"""Graph-form specifics: the query-block loop and auto's switch, through ORT CPU and onnx's
reference evaluator (which runs the standard-op forms), with and without a cache."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from mha_export.config import MHAConfig
from mha_export.errors import UsageError
from mha_export.graph.forms import Feature, Memory
from mha_export.kinds.registry import FORMS
from mha_export.layer.entry import entry_module
from mha_export.kinds.registry import build_module
from mha_export.graph.model import build_model
from mha_export.signature import make_signature
from mha_export.check.sweep import Case, make_feeds, real_queries

CONFIGS = {
    "d64h4": MHAConfig(dim=64, heads=4, qkv_bias=True),
    "d48h3hd20": MHAConfig(dim=48, heads=3, head_dim=20, qkv_bias=True),
}
QSA = MHAConfig(dim=32, heads=4, kv_heads=2, rotary="interleaved", rotary_dim=4, qk_norm="head",
                norm_offset=1.0, output_gate=True,
                qsa=dict(heads=2, head_dim=8, budget=4, compress_ratio=2))  # block_topk 2
# DeepSeek-V4's HCA layer: its window of 8 and a pooled row every 4 tokens
DSV4 = MHAConfig(dim=64, heads=4, head_dim=32, rotary="interleaved", rotary_dim=8,
                 sliding_window=8, dsv4={"layer_type": "heavily_compressed_attention",
                                         "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 16,
                                         "rate": 4})
VARIANTS = {"attention_op": "blocked", "plain": "blocked-plain"}
MLA = MHAConfig(dim=32, heads=4, latent=dict(kv_lora_rank=16, qk_nope_head_dim=8,
                                            qk_rope_head_dim=4, v_head_dim=12, q_lora_rank=24))


def _model(config: MHAConfig, form: str, kind: str = "full", **core_args):
    """A model of ``form`` with its core's keyword arguments changed (block size, threshold)."""
    base = FORMS[form]
    core = functools.partial(base.core, **core_args)
    record = dataclasses.replace(base, core=core)
    module = build_module(config, seed=0)
    sig = make_signature(config, kind)
    return build_model(config, module.to_weights(), record, signature=sig), module, sig


def _check(model, module, sig, cases, run=None, atol: float = 1e-5) -> None:
    if run is None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        run = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"]).run
    entry = entry_module(module, sig.kind, sig.input_names, sig.output_names)
    for case in cases:
        feeds = make_feeds(sig, case, seed=1)
        got = run(None, feeds)
        with torch.inference_mode():
            want = entry(*[torch.from_numpy(feeds[n]) for n in sig.input_names])
        want = want if isinstance(want, (tuple, list)) else (want,)
        rows = real_queries(feeds, case)
        for name, g, w in zip(sig.output_names, got, want):
            d = np.abs(g - w.numpy())
            if name == "y" and rows is not None:
                d = d * rows
            assert d.max(initial=0) <= atol, (name, case)  # (a state may be empty)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("block", [256, 16])
def test_blocked_matches_eager(variant: str, config_name: str, block: int) -> None:
    model, module, sig = _model(CONFIGS[config_name], VARIANTS[variant], block=block)
    onnx.checker.check_model(model, full_check=True)
    seqs = [1, 2, 7, block - 1, block, block + 1, 3 * block + 5]
    _check(model, module, sig, [Case(b, t) for b in (1, 3) for t in seqs])


@pytest.mark.parametrize("kv_heads, window", [(4, None), (2, None), (1, None), (2, 3), (4, 11)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_blocked_with_cache_and_padding(variant: str, kv_heads: int, window) -> None:
    """Blocks start at key position P + i*bs; each block's padding keys come from the mask;
    grouped-query and multi-query caches keep kv_heads heads; with a sliding window a block
    reads only the keys its window reaches."""
    config = CONFIGS["d64h4"].replace(kv_heads=kv_heads, sliding_window=window)
    model, module, sig = _model(config, VARIANTS[variant], "kv-cache", block=8)
    onnx.checker.check_model(model, full_check=True)
    cases = [Case(b, t, p) for b in (1, 3) for t in (1, 7, 8, 9, 30) for p in (0, 1, 13)]
    cases += [Case(3, t, p, pad) for t in (9, 30) for p in (0, 5) for pad in ("left", "right")]
    _check(model, module, sig, cases)


@pytest.mark.parametrize("variant", VARIANTS)
def test_blocked_non_causal(variant: str) -> None:
    config = CONFIGS["d64h4"].replace(causal=False)
    model, module, sig = _model(config, VARIANTS[variant], block=8)
    onnx.checker.check_model(model, full_check=True)
    _check(model, module, sig, [Case(1, t) for t in (1, 7, 8, 9, 30)])


def test_blocked_graph_has_no_quadratic_buffer() -> None:
    """Only weights and small shape constants are stored; the mask comes from Range/Greater."""
    model, _, _ = _model(CONFIGS["d64h4"], "blocked")
    weights = {f"{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")} | {
        "out.weight", "out.bias"}
    for init in model.graph.initializer:
        if init.name not in weights:
            assert int(np.prod(init.dims)) <= 8, init.name
    ops = {n.op_type for n in model.graph.node}
    assert "Loop" in ops and "Trilu" not in ops


@pytest.mark.parametrize("kind", ["full", "kv-cache"])
def test_auto_switches_between_one_node_and_blocks(kind: str) -> None:
    model, module, sig = _model(CONFIGS["d48h3hd20"], "auto", kind, threshold=20, block=8)
    onnx.checker.check_model(model, full_check=True)
    past = (0, 6) if kind == "kv-cache" else (0,)
    _check(model, module, sig, [Case(2, t, p) for t in (1, 7, 19, 20, 21, 45) for p in past])


@pytest.mark.parametrize("kind", ["full", "kv-cache"])
@pytest.mark.parametrize("form", [f.name for f in FORMS.values() if f.standard and f.min_opset == 17])
def test_reference_evaluator_runs_the_portable_forms(form: str, kind: str) -> None:
    """Standard ops only, rotary (in plain ops at opset 17) and grouped-query included."""
    config = MHAConfig(dim=32, heads=4, kv_heads=2, qkv_bias=True, rotary="interleaved",
                       rotary_dim=4)
    # Multi-head Latent Attention's forms, a KV-shared layer's, a QSA layer's, DeepSeek-V4's
    if FORMS[form].kind != "standard":
        config = {"latent": MLA, "kv_shared": config.replace(
            kv_shared={"kv_shared_layer": 0}, layout="shared"), "qsa": QSA,
            "dsv4": DSV4}[FORMS[form].kind]
    if Feature.KV_CACHE not in FORMS[form].supports and kind == "kv-cache":
        with pytest.raises(UsageError):  # refused: by the signature or the form's problem()
            build_model(config, build_module(config, seed=0).to_weights(), FORMS[form],
                        signature=make_signature(config, kind))
        return
    args = {"block": 3} if form == "blocked-plain" else {}
    if form == "decomposed" or config.kind != "standard":
        module = build_module(config, seed=0)
        sig = make_signature(config, kind)
        model = build_model(config, module.to_weights(), FORMS[form], signature=sig)
    else:
        model, module, sig = _model(config, form, kind, **args)
    cases = [Case(2, 7, 4 if kind == "kv-cache" else 0, "left" if kind == "kv-cache" else "none")]
    _check(model, module, sig, cases, run=ReferenceEvaluator(model).run)


def test_registry_records_are_complete() -> None:
    for name, form in FORMS.items():
        assert form.name == name and form.min_opset in range(17, 27) and form.summary
        assert form.supports <= frozenset(Feature) and isinstance(form.memory, Memory)
        assert (form.kind == "latent") == (form.problem(MLA, make_signature(MLA)) is None)
        assert all(isinstance(t, int) for t in form.switch_seq_lens)


@pytest.mark.parametrize("kind", ["full", "static-cache"])
def test_gqa_always_asks_for_its_present_outputs(kind: str) -> None:
    """ONNX Runtime's CUDA GroupQueryAttention (fp16/bf16) refuses to run without present_key
    and present_value ("present_key and present_value are required"): without a cache the form
    still names them, as scratch the graph drops."""
    config = MHAConfig(dim=64, heads=4, kv_heads=2)
    model, module, sig = _model(config, "contrib-gqa", kind)
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 1 and len(gqa[0].output) == 3 and all(gqa[0].output)
    if kind == "full":
        _check(model, module, sig, [Case(1, 5), Case(2, 17)])
