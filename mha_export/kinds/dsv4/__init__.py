"""DeepSeek-V4's attention (``deepseek_v4``; docs/deepseek-v4.md): its three layer types, eager
(full-sequence and cached calls, TorchScript-able); a registered kind (``dsv4``): settings.py
(torch-free: the layer's shape and MHAConfig's section), layer.py and compressed.py (eager),
module.py (the layer on the project's module interface), names.py (its tensor names: the family
record, weights/families/deepseek_v4.py, reads a checkpoint's layer by them), graph.py,
graph_compressed.py and graph_state.py (its ONNX graph code), kind.py (the registry's record)."""
