import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from mha_export import MHAConfig, build_module
from mha_export.onnx_graph import CORES, DYNAMIC_AXES, MAX_OPSET, MIN_OPSET, build_model

FORMS = sorted(CORES)
CONFIGS = [MHAConfig(dim=64, heads=4, qkv_bias=True),
           MHAConfig(dim=48, heads=3, head_dim=20, d_in=40, layout="fused", qkv_bias=True),
           MHAConfig(dim=32, heads=2, layout="stacked"),
           MHAConfig(dim=32, heads=4, causal=False, out_bias=False)]


def _run(model, x):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.slug() + ("" if c.causal else "-noncausal"))
def test_matches_eager_at_lengths_never_seen(form, config):
    if form == "contrib-gqa" and (not config.causal or config.head_dim % 8):
        pytest.skip("GroupQueryAttention: causal only, head_dim % 8 == 0 (export refuses others)")
    m = build_module(config, seed=0)
    model = build_model(config, m.to_weights(), form, MIN_OPSET[form])
    onnx.checker.check_model(model, full_check=True)
    for b, t in [(1, 1), (3, 7), (2, 33), (1, 300)]:
        x = np.random.default_rng(t).standard_normal((b, t, config.d_in)).astype(np.float32)
        with torch.inference_mode():
            expected = m(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(_run(model, x), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("form", FORMS)
def test_io_declares_symbolic_batch_and_seq(form):
    c = MHAConfig(dim=64, heads=4)
    model = build_model(c, build_module(c, seed=0).to_weights(), form, MIN_OPSET[form])
    for vi, width in ((model.graph.input[0], 64), (model.graph.output[0], 64)):
        dims = vi.type.tensor_type.shape.dim
        assert [dims[0].dim_param, dims[1].dim_param, dims[2].dim_value] == ["batch", "seq", width]
    assert DYNAMIC_AXES["x"] == {0: "batch", 1: "seq"}


@pytest.mark.parametrize("form", FORMS)
def test_no_baked_mask_or_sequence_sized_constant(form):
    """Nothing in the graph has a max_seq_len-sized dimension (the textbook buffer would)."""
    c = MHAConfig(dim=64, heads=4, max_seq_len=96)
    model = build_model(c, build_module(c, seed=0).to_weights(), form, MIN_OPSET[form])
    for t in model.graph.initializer:
        assert 96 not in t.dims, t.name
        if not t.name.endswith((".weight", ".bias")):  # only the weights are larger than a few values
            assert np.prod(t.dims) <= 8, t.name


@pytest.mark.parametrize("form", FORMS)
def test_every_supported_opset_loads(form):
    c = MHAConfig(dim=32, heads=2)
    w = build_module(c, seed=0).to_weights()
    x = np.ones((1, 3, 32), np.float32)
    outs = [_run(build_model(c, w, form, opset), x) for opset in range(MIN_OPSET[form], MAX_OPSET + 1)]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], atol=1e-6)


@pytest.mark.parametrize("config, msg", [(MHAConfig(dim=32, heads=2, causal=False), "always causal"),
                                         (MHAConfig(dim=48, heads=4), "head_dim % 8")])
def test_gqa_refuses_what_its_kernel_cannot_do(config, msg):
    from mha_export import UsageError
    with pytest.raises(UsageError, match=msg):
        build_model(config, build_module(config, seed=0).to_weights(), "contrib-gqa", 17)
