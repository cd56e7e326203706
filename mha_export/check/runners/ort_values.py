"""Arrays across ONNX Runtime's Python API (torch-free): OrtValues on the CPU or a device, and
half precision — bfloat16 crosses only as its bits, typed, and is read back from its bytes or
widened by a Cast on the device; every runner gives float32 outputs."""
from __future__ import annotations

import ctypes
import functools

import ml_dtypes
import numpy as np

ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

def ortvalue(a: np.ndarray, device: str = "cpu"):
    """``a`` as an OrtValue (on CPU: sharing its memory); bfloat16 as its bits, typed."""
    import onnxruntime as ort
    if a.dtype not in BITS:
        return ort.OrtValue.ortvalue_from_numpy(a, device, 0)
    if device == "cpu":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits_of(a), BITS[a.dtype][1])
    value = device_buffer(list(a.shape), a.dtype, device)
    value.update_inplace(bits_of(a))
    return value

def device_buffer(shape: list[int], dtype: np.dtype, device: str):
    """An uninitialised OrtValue on ``device``; bfloat16 by its ONNX element type."""
    import onnxruntime as ort
    kind = BITS[dtype][1] if dtype in BITS else dtype.type
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), kind, device, 0)

def bits_of(a: np.ndarray) -> np.ndarray:
    """What ONNX Runtime's Python API takes for ``a``: a bfloat16 array as its uint16 bits."""
    return a.view(BITS[a.dtype][0]) if a.dtype in BITS else a

def host_array(value) -> np.ndarray:
    """An OrtValue's contents as a numpy array (a copy); bfloat16 (its ``numpy()`` says "No
    corresponding Numpy type") read from its bytes on CPU, widened to float32 on the device
    by a Cast there (exact)."""
    dtype = np.dtype(NUMPY_DTYPES.get(value.data_type(), np.float32))
    if dtype not in BITS:
        return value.numpy()
    if value.device_name().lower() != "cpu":
        return _widened_on_device(value)
    raw = (ctypes.c_char * value.tensor_size_in_bytes()).from_address(value.data_ptr())
    return np.frombuffer(raw, BITS[dtype][0]).reshape(value.shape()).view(dtype).copy()

@functools.lru_cache(maxsize=None)
def _bf16_widener(provider: str):
    """A one-Cast session (bfloat16 -> float32) on ``provider``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT)], "widen",
        [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, None)],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 19)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    return ort.InferenceSession(model.SerializeToString(), providers=[provider])

def _widened_on_device(value) -> np.ndarray:
    session = _bf16_widener(ORT_PROVIDERS["cuda"])
    binding = session.io_binding()
    binding.bind_ortvalue_input("a", value)
    binding.bind_output("b", "cpu")
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()

def widened(a: np.ndarray) -> np.ndarray:
    """A half-precision output as float32 (as every runner gives its outputs), else as is."""
    return a.astype(np.float32) if a.dtype in HALF_PRECISION else a

NUMPY_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
          "tensor(bfloat16)": ml_dtypes.bfloat16, "tensor(int64)": np.int64,
          "tensor(int8)": np.int8}

# the half-precision dtypes -> the precision a runner's row names
HALF_PRECISION = {np.dtype(np.float16): "fp16", np.dtype(ml_dtypes.bfloat16): "bf16"}

# dtypes ONNX Runtime's Python API (1.31) cannot take from numpy: (their bits, ONNX element type)
BITS = {np.dtype(ml_dtypes.bfloat16): (np.uint16, 16)}  # TensorProto.BFLOAT16
