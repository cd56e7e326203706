"""DeepSeek-V4's attention (``deepseek_v4``; docs/deepseek-v4.md): its three layer types, eager
(full-sequence and cached calls, TorchScript-able), read from a checkpoint folder. Not yet a
registered kind (no MHAConfig section, graph forms or export targets)."""
