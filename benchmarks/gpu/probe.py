"""ORT CUDA probe in a fresh process: does a session really run on CUDAExecutionProvider?
argv[1]: 'torch' = import torch first; 'preload' = ort.preload_dlls() only; 'bare' = neither.
argv[2] (optional): RLIMIT_AS in GiB (the bench worker's cap) before anything loads."""
import sys, resource
mode = sys.argv[1]
if len(sys.argv) > 2:
    lim = int(float(sys.argv[2]) * 2**30); resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
if mode == "torch":
    import torch
    x = torch.ones(4, device="cuda"); print("torch cuda ok", float(x.sum()))
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
if mode == "preload":
    ort.preload_dlls()
g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "g",
    [helper.make_tensor_value_info("A", TensorProto.FLOAT, [64, 64]),
     helper.make_tensor_value_info("B", TensorProto.FLOAT, [64, 64])],
    [helper.make_tensor_value_info("C", TensorProto.FLOAT, [64, 64])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 9
try:
    s = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    a = np.random.rand(64, 64).astype(np.float32)
    c = s.run(None, {"A": a, "B": a})[0]
    print(f"probe[{mode}{',AS='+sys.argv[2] if len(sys.argv)>2 else ''}]: providers={s.get_providers()} err={abs(c - a @ a).max():.2e}")
except Exception as e:
    print(f"probe[{mode}]: FAILED {type(e).__name__}: {str(e)[:300]}")
