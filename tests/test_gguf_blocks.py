"""GGUF weights' own blocks as MatMulNBits inputs (lossy/projections/gguf_blocks.py): equal to gguf-py's
dequantize for every supported type, and run through ONNX Runtime's MatMulNBits kernel."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mha_export.errors import UsageError
from mha_export.lossy.projections.gguf_blocks import (CONVERTERS, MATMUL_NBITS_TYPES, SourceBlocks,
                                            is_float_type, source_blocks)

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

U = 2.0 ** -24  # fp32 unit roundoff
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf-py quantizes these
# byte offsets of each block's fp16 fields (d, and m / dmin where there is one)
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _fp16(rng, size) -> np.ndarray:
    """Finite fp16 values of many magnitudes and both signs: 10% zero, some subnormal."""
    v = rng.choice([-1, 1], size) * 10.0 ** rng.uniform(-4, 0, size)
    v[rng.random(size) < 0.1] = 0
    v[rng.random(size) < 0.05] = 3e-6  # an fp16 subnormal
    return v.astype(np.float16)


def random_raw(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes with sane fp16 fields, and some sub-blocks of scale 0."""
    rng = np.random.default_rng(seed)
    qk, size = gguf.GGML_QUANT_SIZES[T[name]]
    b = rng.integers(0, 256, (n * k // qk, size), dtype=np.uint8)
    for at in FP16_FIELDS[name]:
        b[:, at:at + 2] = _fp16(rng, b.shape[0]).view(np.uint8).reshape(-1, 2)
    some = rng.random(b.shape[0]) < 0.3  # blocks with a zeroed sub-block scale
    if name == "Q2_K":
        b[some, :4] &= 0xF0  # sub-blocks 0-3: scale 0, min kept
    elif name == "Q3_K":
        b[some, 96] &= 0xF0  # sub-block 0: 6-bit scale 32, i.e. sc - 32 == 0
        b[some, 104] = (b[some, 104] & 0xFC) | 2
    elif name in ("Q4_K", "Q5_K"):
        b[some, 4] &= 0xC0  # sub-block 0: scale 0, min kept
        b[rng.random(b.shape[0]) < 0.1, 4:16] = 0  # every scale and min 0
    elif name == "Q6_K":
        b[some, 192:196] = 0
    return b.reshape(n, -1)


def quantized_raw(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """gguf-py's own quantization of random weights, with all-zero and constant blocks."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05 + rng.normal(0, 0.02, (n, 1))).astype(np.float32)
    w[0, :32] = 0
    w[1, 32:64] = 0.37  # Q4_1 / Q5_1: d = 0, m = 0.37
    w[2, :64] = -1.5
    return quantize(w, T[name])


def raws(name: str) -> list[tuple[str, np.ndarray, int]]:
    cases = [("random", random_raw(name, 12, 512), 512), ("random", random_raw(name, 8, 256, 1),
                                                          256)]
    if name in QUANTIZABLE:
        cases += [("quantized", quantized_raw(name, 16, 256), 256)]
    return cases


def gap(blocks: SourceBlocks, ref: np.ndarray) -> tuple[float, float]:
    """(max |ours - gguf| / max|w|, max of |ours - gguf| over its fp32 rounding bound)."""
    ours = blocks.dequantized()
    diff = np.abs(ours.astype(np.float64) - ref)
    zp = np.abs(blocks.zero_points.astype(np.float64))[..., None]
    bound = 4 * U * np.abs(blocks.scales.astype(np.float64))[..., None] * (blocks.codes + zp)
    bound = bound.reshape(ours.shape) + 1e-38
    return float(diff.max() / max(np.abs(ref).max(), 1e-30)), float((diff / bound).max())


def test_registry_matches_gguf():
    assert MATMUL_NBITS_TYPES == tuple(CONVERTERS)
    for name, conv in CONVERTERS.items():
        assert gguf.GGML_QUANT_SIZES[T[name]] == (conv.qk, conv.type_size), name
        assert conv.bits in (2, 4, 8) and conv.block in (16, 32) and conv.qk % conv.block == 0


@pytest.mark.parametrize("name", MATMUL_NBITS_TYPES)
def test_dequantized_equals_gguf(name):
    conv = CONVERTERS[name]
    for kind, raw, k in raws(name):
        b = source_blocks(raw, name, k)
        n = raw.shape[0]
        assert (b.bits, b.block_size, b.k) == (conv.bits, conv.block, k)
        assert b.codes.shape == (n, k // conv.block, conv.block) and b.codes.dtype == np.uint8
        assert b.scales.shape == b.zero_points.shape == (n, k // conv.block)
        assert b.scales.dtype == np.float32
        assert int(b.codes.max()) < 2 ** b.bits
        ref = dequantize(raw, T[name]).astype(np.float64)
        assert np.isfinite(ref).all()
        if not b.float_zero_points:  # the integer forms: gguf's float32 values, bit for bit
            assert not b.needs_zero_points
            np.testing.assert_array_equal(b.dequantized(), ref.astype(np.float32))
        relative, over_bound = gap(b, ref)
        assert over_bound <= 1, (name, kind, relative, over_bound)
        assert relative <= 1e-6, (name, kind, relative)


@pytest.mark.parametrize("name", [n for n in MATMUL_NBITS_TYPES if CONVERTERS[n].qk == 256])
def test_dead_sub_blocks_are_exact(name):
    """Sub-blocks of scale 0 (a constant -dmin * min, or 0) keep their exact value."""
    raw = random_raw(name, 8, 256, 2)
    b = source_blocks(raw, name, 256)
    ref = dequantize(raw, T[name]).reshape(b.scales.shape + (-1,))
    if b.float_zero_points:
        dead = (b.scales == 1) & (b.codes == 0).all(-1)
        assert dead.any()
        np.testing.assert_array_equal(b.dequantized().reshape(ref.shape)[dead], ref[dead])
        assert (ref[dead] == ref[dead][:, :1]).all()  # constant
    else:
        dead = b.scales == 0
        assert dead.any()
        assert (ref[dead] == 0).all()


def test_constant_block_with_d_zero():
    """Q4_1 of a constant block: d = 0, w = m; the float zero point -m / d is undefined."""
    raw = quantized_raw("Q4_1", 16, 256)
    b = source_blocks(raw, "Q4_1", 256)
    assert b.scales[1, 1] == 1 and (b.codes[1, 1] == 0).all()
    assert (b.dequantized()[1, 32:64] == dequantize(raw, T.Q4_1)[1, 32:64]).all()
    assert b.dequantized()[1, 40] == np.float32(np.float16(0.37))


# ONNX Runtime's kernel ------------------------------------------------------------------------

def matmul_nbits(parts: list[SourceBlocks], accuracy_level: int) -> ort.InferenceSession:
    """Y = A @ sum(W_i)^T, one MatMulNBits per part (an Add after two)."""
    nodes, inits, outs = [], [], []
    n, k = parts[0].n, parts[0].k
    for i, b in enumerate(parts):
        names = [f"B{i}", f"scales{i}"]
        inits += [numpy_helper.from_array(b.packed(), names[0]),
                  numpy_helper.from_array(b.scales.reshape(-1), names[1])]
        if b.needs_zero_points:
            names.append(f"zp{i}")
            inits.append(numpy_helper.from_array(b.packed_zero_points(), names[2]))
        outs.append(f"Y{i}" if len(parts) > 1 else "Y")
        nodes.append(helper.make_node("MatMulNBits", ["A"] + names, [outs[-1]],
                                      domain="com.microsoft", K=k, N=n, bits=b.bits,
                                      block_size=b.block_size, accuracy_level=accuracy_level))
    if len(parts) > 1:
        nodes.append(helper.make_node("Add", outs, ["Y"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])], initializer=inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the expected refusal below: no error log
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def ort_error(parts: list[SourceBlocks], ref_w: np.ndarray, accuracy_level: int) -> float:
    x = np.random.default_rng(3).standard_normal((5, ref_w.shape[1])).astype(np.float32)
    expected = x.astype(np.float64) @ ref_w.T
    y = matmul_nbits(parts, accuracy_level).run(None, {"A": x})[0]
    return float(np.abs(y - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("name", MATMUL_NBITS_TYPES)
def test_onnxruntime_matmul_nbits(name):
    raw = random_raw(name, 16, 512, 4)
    b = source_blocks(raw, name, 512)
    ref = dequantize(raw, T[name]).astype(np.float64)
    forms = [[b]]
    if b.bits == 8 and b.float_zero_points:  # ORT 1.31's CPU kernel: float zero points 2/4 bits
        forms.append(list(b.split_high_bit()))
    for parts in forms:
        try:
            error = ort_error(parts, ref, 1)
        except Exception as e:  # noqa: BLE001: the one refusal allowed, for the 8-bit float form
            assert len(forms) == 2 and parts is forms[0], e
            assert "Only 2b and 4b" in str(e)
            continue
        assert error < 5e-6, (name, len(parts), error)
        level4 = ort_error(parts, ref, 4)  # int8 activations where the kernel has them: report
        print(f"{name} x{len(parts)}: level 1 {error:.1e}, level 4 {level4:.1e}")
        assert level4 < 0.1


# Rows, sizes, refusals ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q2_K"])
def test_take_rows(name):
    raw = random_raw(name, 16, 256, 5)
    b = source_blocks(raw, name, 256)
    # llama.cpp's q/k permutation undone for 2 heads of 8 rows, then a random order
    for idx in (np.arange(16).reshape(2, -1, 2).swapaxes(1, 2).reshape(-1),
                np.random.default_rng(0).permutation(16)):
        moved = b.take_rows(idx)
        ref = dequantize(raw, T[name])[idx]
        assert gap(moved, ref.astype(np.float64))[1] <= 1
        np.testing.assert_array_equal(moved.dequantized(), b.dequantized()[idx])
        np.testing.assert_array_equal(moved.packed(), source_blocks(raw[idx], name, 256).packed())


def test_split_high_bit_sums_to_the_weight():
    b = source_blocks(random_raw("Q5_K", 8, 256, 6), "Q5_K", 256)
    low, high = b.split_high_bit(2)
    assert (low.bits, high.bits) == (4, 2) and not high.needs_zero_points
    np.testing.assert_allclose(low.dequantized() + high.dequantized(), b.dequantized(),
                               rtol=0, atol=8 * U * np.abs(b.dequantized()).max())
    with pytest.raises(UsageError, match="5-bit"):
        source_blocks(random_raw("Q8_0", 4, 256), "Q8_0", 256).split_high_bit()


def test_packing_and_bytes():
    b = source_blocks(random_raw("Q4_0", 4, 256), "Q4_0", 256)
    assert b.packed().shape == (4, 8, 16)
    assert (b.packed()[..., 0] & 0x0F).tolist() == b.codes[..., 0].tolist()
    assert b.stored_bytes() == 4 * 256 // 2 + 4 * 4 * 8  # no zero points: the default 8
    q2 = source_blocks(random_raw("Q2_K", 4, 256), "Q2_K", 256)
    assert q2.packed().shape == (4, 16, 4)
    assert q2.packed_zero_points().dtype == np.float32 and q2.packed_zero_points().size == 64
    # as the graph stores float zero points: packed zero points 0 and one fp32 min a block
    assert q2.stored_bytes() == 4 * 256 // 4 + 2 * 4 * 4 * 16 + 4 * (16 * 2 // 8)


@pytest.mark.parametrize("name", ["IQ4_NL", "TQ1_0", "MXFP4", "IQ2_XS", "Q8_K", "NOT_A_TYPE"])
def test_unsupported_types(name):
    with pytest.raises(UsageError, match=f"{name} has no exact MatMulNBits form"):
        source_blocks(np.zeros((2, 64), np.uint8), name, 256)


def test_float_types_and_bad_input():
    for t in ("F32", "F16", "BF16", T.F16):
        assert is_float_type(t)
        with pytest.raises(UsageError, match="float type, not quantized"):
            source_blocks(np.zeros((2, 512), np.uint8), t, 256)
    assert not is_float_type("Q4_K")
    with pytest.raises(UsageError, match="K a multiple of 256"):
        source_blocks(np.zeros((2, 144), np.uint8), T.Q4_K, 200)
    with pytest.raises(UsageError, match="got shape"):
        source_blocks(np.zeros((2, 100), np.uint8), "Q8_0", 64)
    raw = random_raw("Q8_0", 2, 64)
    raw[0, :2] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(UsageError, match="NaN or Inf"):
        source_blocks(raw, "Q8_0", 64)
    flat = random_raw("Q4_0", 3, 64)
    assert source_blocks(flat.reshape(-1), "Q4_0", 64).n == 3
