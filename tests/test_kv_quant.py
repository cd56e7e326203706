"""An int8 KV cache's arithmetic (lossy/int8_cache/codes.py) is what ONNX Runtime's CPU
GroupQueryAttention computes with kv_cache_bit_width=8: the codes it writes into the app's buffer
(bound in place, as the static cache is) and the attention over the dequantized cache, per
tensor and per channel; the reference tells apart the faults issue 24 plants."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mha_export.errors import UsageError
from mha_export.lossy.int8_cache.codes import KVScale, calibrate

N, K, H, C = 4, 2, 16, 32  # query heads, kv heads, head size, buffer capacity


def gqa_int8(scale_shape: list[int], quant_type: str) -> ort.InferenceSession:
    """One GroupQueryAttention over int8 buffers (B = 1) with static k/v scales."""
    f, i8, i32 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.INT32
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (
        ("q", f, [1, None, N * H]), ("k", f, [1, None, K * H]), ("v", f, [1, None, K * H]),
        ("past_key", i8, [1, K, C, H]), ("past_value", i8, [1, K, C, H]),
        ("seqlens_k", i32, [1]), ("total", i32, []), ("k_scale", f, scale_shape),
        ("v_scale", f, scale_shape))]
    node = helper.make_node(
        "GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total",
                                "", "", "", "", "", "k_scale", "v_scale"],
        ["y", "present_key", "present_value"], domain="com.microsoft", num_heads=N,
        kv_num_heads=K, kv_cache_bit_width=8, k_quant_type=quant_type, v_quant_type=quant_type)
    outputs = [helper.make_tensor_value_info("y", f, None),
               helper.make_tensor_value_info("present_key", i8, None),
               helper.make_tensor_value_info("present_value", i8, None)]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 21),
                                             helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def step_in_place(session, buffers: dict, q, k, v, past: int, scales: dict) -> np.ndarray:
    """One call writing T = q.shape[1] tokens at position ``past`` of the int8 buffers, bound
    as both past and present (the static cache's contract): y."""
    values = {n: ort.OrtValue.ortvalue_from_numpy(b) for n, b in buffers.items()}
    binding = session.io_binding()
    t = q.shape[1]
    feeds = {"q": q, "k": k, "v": v, "seqlens_k": np.array([past + t - 1], np.int32),
             "total": np.array(past + t, np.int32), **scales}
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    binding.bind_output("y", "cpu")  # outputs come back in the order they were bound
    for name in ("past_key", "past_value"):
        binding.bind_ortvalue_input(name, values[name])
        binding.bind_ortvalue_output(name.replace("past", "present"), values[name])
    session.run_with_iobinding(binding)
    out = dict(zip(["y", "present_key", "present_value"], binding.get_outputs()))
    assert out["present_key"].data_ptr() == values["past_key"].data_ptr()  # written in place
    return out["y"].numpy()


def attention(q, keys, values, scale: float) -> np.ndarray:
    """Causal attention of T queries at the end of S cached keys, in float64: (1, T, N*H)."""
    t, s = q.shape[1], keys.shape[2]
    qh = q.reshape(1, t, N, H).transpose(0, 2, 1, 3).astype(np.float64)  # (1, N, T, H)
    kh = np.repeat(keys, N // K, axis=1).astype(np.float64)  # (1, N, S, H)
    vh = np.repeat(values, N // K, axis=1).astype(np.float64)
    scores = qh @ kh.transpose(0, 1, 3, 2) * scale  # (1, N, T, S)
    future = np.arange(s)[None, :] > (s - t + np.arange(t))[:, None]
    scores = np.where(future, -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3).reshape(1, t, N * H)


def to_heads(x: np.ndarray) -> np.ndarray:
    return x.reshape(1, x.shape[1], K, H).transpose(0, 2, 1, 3)  # (1, K, T, H)


@pytest.mark.parametrize("granularity", ["tensor", "channel"])
def test_the_node_writes_and_reads_exactly_the_reference_codes(granularity):
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((1, 6, 2 * K * H)).astype(np.float32) * 2
    keys, values = np.split(prompt, 2, axis=-1)
    kscale = calibrate(to_heads(keys), granularity, margin=0.8)  # some entries clip
    vscale = calibrate(to_heads(values), granularity, margin=0.8)
    shape = [1] if granularity == "tensor" else [1, K, 1, H]
    session = gqa_int8(shape, kscale.quant_type)
    buffers = {n: np.zeros((1, K, C, H), np.int8) for n in ("past_key", "past_value")}
    scales = {"k_scale": kscale.scale, "v_scale": vscale.scale}
    q = rng.standard_normal((1, 6, N * H)).astype(np.float32)
    y = step_in_place(session, buffers, q, keys, values, 0, scales)
    assert np.array_equal(buffers["past_key"][:, :, :6], kscale.quantize(to_heads(keys)))
    assert np.array_equal(buffers["past_value"][:, :, :6], vscale.quantize(to_heads(values)))
    assert kscale.clipped(to_heads(keys)) > 0  # the margin made some keys clip, not wrap
    # a single-token step over the 6 written entries reads them dequantized
    step = rng.standard_normal((1, 1, 2 * K * H)).astype(np.float32)
    qs = rng.standard_normal((1, 1, N * H)).astype(np.float32)
    y1 = step_in_place(session, buffers, qs, *np.split(step, 2, axis=-1), 6, scales)
    want = attention(qs, kscale.dequantize(buffers["past_key"][:, :, :7]),
                     vscale.dequantize(buffers["past_value"][:, :, :7]), H ** -0.5)
    assert np.abs(y1 - want).max() < 1e-5 * max(1.0, np.abs(want).max())
    assert y.shape == (1, 6, N * H) and np.isfinite(y).all()


def test_round_half_to_even_and_clip_at_minus_128_not_wrap():
    s = KVScale("tensor", np.array([0.1], np.float32))
    x = np.array([0.05, 0.15, 0.25, -0.05, -0.15, 20.0, -20.0], np.float32).reshape(1, 1, 1, -1)
    session = gqa_int8([1], "PER_TENSOR")
    buffers = {n: np.zeros((1, K, C, H), np.int8) for n in ("past_key", "past_value")}
    row = np.zeros((1, 1, K * H), np.float32)
    row[0, 0, :7] = x.reshape(-1)
    step_in_place(session, buffers, np.zeros((1, 1, N * H), np.float32), row, row, 0,
                  {"k_scale": s.scale, "v_scale": s.scale})
    node = buffers["past_key"][0, 0, 0, :7]
    assert np.array_equal(node, s.quantize(x).reshape(-1))
    assert list(node) == [0, 2, 2, 0, -2, 127, -128]  # half to even; clipped, never wrapped
    floor = np.floor(x.reshape(-1) / 0.1).astype(np.int64)
    assert not np.array_equal(node, floor)  # the floor-on-write fault differs from the node


def test_calibration_scales_and_bad_input():
    x = np.zeros((2, K, 3, H))
    x[1, 1, 2, 5] = -12.7
    per_tensor, per_channel = calibrate(x, "tensor"), calibrate(x, "channel")
    assert per_tensor.scale.shape == (1,) and per_tensor.scale[0] == pytest.approx(0.1)
    assert per_channel.scale.shape == (1, K, 1, H)
    assert per_channel.scale[0, 1, 0, 5] == pytest.approx(0.1)
    assert per_channel.scale[0, 0, 0, 0] > 0  # an all-zero channel: a tiny, valid scale
    with pytest.raises(UsageError, match="granularity"):
        calibrate(x, "row")
    with pytest.raises(UsageError, match="batch, kv_heads, seq, head_dim"):
        calibrate(x[0], "tensor")


def test_rotary_pairs_are_scaled_by_their_norm_so_no_position_clips():
    """A rotated key's channel ranges over its pair's norm as the position turns it: scales
    from the pair norms (a calibration run sees few positions) clip at none."""
    from mha_export.config import MHAConfig
    from mha_export.lossy.int8_cache.calibration import rotary_partners
    c = MHAConfig(dim=64, heads=4, rotary="half", rotary_dim=12)
    partners = rotary_partners(c)
    assert list(partners[:12]) == [6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5]
    assert (partners[12:] == -1).all()
    interleaved = rotary_partners(c.replace(rotary="interleaved"))
    assert list(interleaved[:4]) == [1, 0, 3, 2]
    rng = np.random.default_rng(2)
    keys = rng.standard_normal((1, 1, 50, 16))  # seen at one position (angle 0)
    scale = calibrate(keys, "channel", partners=partners)
    plain = calibrate(keys, "channel")
    angle = 1.1  # a later position turns pair (i, i + 6)
    turned = keys.copy()
    a, b = keys[..., :6], keys[..., 6:12]
    turned[..., :6], turned[..., 6:12] = a * np.cos(angle) - b * np.sin(angle), \
        a * np.sin(angle) + b * np.cos(angle)
    assert scale.clipped(turned) == 0 < plain.clipped(turned)
    assert (scale.scale[..., 12:] == plain.scale[..., 12:]).all()  # unrotated: as before
