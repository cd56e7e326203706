"""Weight-only block quantization (lossy/projections/rtn.py): the packed layout is the one ONNX
Runtime's MatMulNBits kernel reads, proven by running the kernel against the dequantized weights."""
import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mha_export.errors import UsageError
from mha_export.lossy.projections.rtn import BITS, BLOCK_SIZES, QuantSpec, quantize

SPECS = [QuantSpec(b, s, sym) for b, s, sym in itertools.product(BITS, BLOCK_SIZES, (True, False))]


def matmul_nbits(q, accuracy_level: int = 1) -> ort.InferenceSession:
    """One MatMulNBits node over q's packed weights: A (B, T, K) -> (B, T, N)."""
    n, k = q.codes.shape[0], q.k
    inits = [numpy_helper.from_array(q.packed(), "B"), numpy_helper.from_array(q.scales.reshape(-1),
                                                                                "scales")]
    if not q.spec.symmetric:
        inits.append(numpy_helper.from_array(q.packed_zero_points(), "zero_points"))
    node = helper.make_node("MatMulNBits", ["A"] + [i.name for i in inits], ["Y"],
                            domain="com.microsoft", K=k, N=n, bits=q.spec.bits,
                            block_size=q.spec.block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("A", TensorProto.FLOAT,
                                                                          [None, None, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, None, n])],
                              initializer=inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def relative_error(q, session) -> float:
    x = np.random.default_rng(1).standard_normal((2, 5, q.k)).astype(np.float32)
    expected = x.astype(np.float64) @ q.dequantized().astype(np.float64).T
    return float(np.abs(session.run(None, {"A": x})[0] - expected).max() / np.abs(expected).max())


def weight(n: int = 48, k: int = 100) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((n, k)) * 0.05).astype(np.float32)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"int{s.bits}-b{s.block_size}-"
                                                      f"{'sym' if s.symmetric else 'asym'}")
def test_the_kernel_computes_exactly_the_dequantized_weights(spec):
    """K = 100 is no multiple of any block size: the padded last block is read right too."""
    q = quantize(weight(), spec)
    assert relative_error(q, matmul_nbits(q)) < 1e-5


@pytest.mark.parametrize("spec", SPECS[:4], ids=str)
def test_round_to_nearest_error_is_within_half_a_step(spec):
    w = weight()
    q = quantize(w, spec)
    step = np.repeat(q.scales, spec.block_size, axis=1)[:, :w.shape[1]]
    assert np.all(np.abs(q.dequantized() - w) <= step / 2 * (1 + 1e-6))


def test_int8_activations_cost_more_than_fp32_compute_and_are_not_exact():
    """accuracy_level 4 quantizes the activations to int8 per block: measured ~5e-3 of max|y|."""
    q = quantize(weight(256, 768), QuantSpec(4, 32))
    assert relative_error(q, matmul_nbits(q, accuracy_level=1)) < 1e-5
    assert 1e-4 < relative_error(q, matmul_nbits(q, accuracy_level=4)) < 3e-2


@pytest.mark.parametrize("fault", ["one block's scale x 1.1", "a nibble flipped",
                                   "a zero point off by one"])
def test_a_wrong_packing_is_caught(fault):
    """The comparison above can fail: each fault moves the kernel's result off the reference."""
    spec = QuantSpec(4, 32, symmetric=fault != "a zero point off by one")
    q = quantize(weight(), spec)
    if fault == "one block's scale x 1.1":
        q.scales[3, 1] *= 1.1
    elif fault == "a nibble flipped":
        q.codes[5, 0, 7] ^= 0b1000
    else:
        q.zero_points[2, 2] = (q.zero_points[2, 2] + 1) % 16
    faulty = matmul_nbits(q)
    original = quantize(weight(), spec)
    assert relative_error(original, faulty) > 1e-4


def test_bad_specs_are_refused_in_one_line():
    for bad in (dict(bits=3), dict(block_size=48), dict(quantizer="gptq")):
        with pytest.raises(UsageError, match="choose one of"):
            QuantSpec(**bad)
