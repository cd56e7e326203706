"""Query-block attention (mha_export.onnx_blocked) against the eager module, through ORT CPU."""
from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from mha_export import onnx_graph
from mha_export.config import MHAConfig
from mha_export.model import build_module
from mha_export.onnx_blocked import (MIN_OPSET_ATTENTION_OP, MIN_OPSET_PLAIN, auto_core,
                                     blocked_core)

CONFIGS = {
    "d64h4": MHAConfig(dim=64, heads=4, qkv_bias=True),
    "d48h3hd20": MHAConfig(dim=48, heads=3, head_dim=20, qkv_bias=True),
}
VARIANTS = {"attention_op": (True, MIN_OPSET_ATTENTION_OP), "plain": (False, MIN_OPSET_PLAIN)}


def _model(config: MHAConfig, core, opset: int) -> tuple[onnx.ModelProto, torch.nn.Module]:
    name = f"test_{id(core)}"
    onnx_graph.CORES[name] = core
    try:
        module = build_module(config, seed=0)
        model = onnx_graph.build_model(config, module.to_weights(), name, opset)
    finally:
        del onnx_graph.CORES[name]
    return model, module


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _check(model: onnx.ModelProto, module: torch.nn.Module, seqs: list[int],
           batches=(1, 3), atol: float = 1e-5) -> None:
    sess = _session(model)
    gen = torch.Generator().manual_seed(1)
    for b in batches:
        for t in seqs:
            x = torch.randn(b, t, module.config.d_in, generator=gen)
            with torch.inference_mode():
                want = module(x).numpy()
            got = sess.run(None, {"x": x.numpy()})[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=f"B={b} T={t}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("block", [256, 16])
def test_blocked_matches_eager(variant: str, config_name: str, block: int) -> None:
    use_op, opset = VARIANTS[variant]
    model, module = _model(CONFIGS[config_name], functools.partial(
        blocked_core, block=block, use_attention_op=use_op), opset)
    onnx.checker.check_model(model, full_check=True)
    seqs = [1, 2, 7, block - 1, block, block + 1, 3 * block + 5]
    _check(model, module, seqs)


@pytest.mark.parametrize("variant", VARIANTS)
def test_blocked_non_causal(variant: str) -> None:
    use_op, opset = VARIANTS[variant]
    config = CONFIGS["d64h4"].replace(causal=False)
    model, module = _model(config, functools.partial(
        blocked_core, block=8, use_attention_op=use_op), opset)
    onnx.checker.check_model(model, full_check=True)
    _check(model, module, [1, 7, 8, 9, 30])


def test_blocked_graph_has_no_quadratic_buffer() -> None:
    """Only weights and small shape constants are stored; the mask comes from Range/Greater."""
    config = CONFIGS["d64h4"]
    model, _ = _model(config, blocked_core, MIN_OPSET_ATTENTION_OP)
    weights = {"qkv.weight", "qkv.bias", "out.weight", "out.bias"}
    for init in model.graph.initializer:
        if init.name not in weights:
            assert int(np.prod(init.dims)) <= 8, init.name
    ops = {n.op_type for n in model.graph.node}
    assert "Loop" in ops and "Trilu" not in ops


def test_auto_switches_between_fused_and_blocked() -> None:
    config = CONFIGS["d48h3hd20"]
    model, module = _model(config, functools.partial(auto_core, threshold=20, block=8),
                           MIN_OPSET_ATTENTION_OP)
    onnx.checker.check_model(model, full_check=True)
    _check(model, module, [1, 7, 19, 20, 21, 45])  # fused below 20, blocked from 20


def test_reference_evaluator_runs_plain_variant() -> None:
    config = MHAConfig(dim=16, heads=2, qkv_bias=True)
    model, module = _model(config, functools.partial(
        blocked_core, block=3, use_attention_op=False), MIN_OPSET_PLAIN)
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = module(x).numpy()
    got = ReferenceEvaluator(model).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
