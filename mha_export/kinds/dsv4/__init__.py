"""DeepSeek-V4's attention (``deepseek_v4``; docs/deepseek-v4.md): its sliding_attention layer,
eager, read from a checkpoint folder. Not yet a registered kind (no MHAConfig section, graph
forms or cache): the compressed layer types are refused in one line."""
