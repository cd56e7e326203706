"""DeepSeek-V4's attention (``deepseek_v4``; docs/deepseek-v4.md): its three layer types, eager
(full-sequence and cached calls, TorchScript-able), read from a checkpoint folder; a registered
kind (``dsv4``): settings.py (torch-free: the layer's shape and MHAConfig's section), layer.py
and compressed.py (eager), module.py (the layer on the project's module interface), names.py
(its tensor names), checkpoint.py (a folder's layer), kind.py (the registry's record)."""
