"""Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2), one package: its settings (the
config's latent section, torch-free), the eager layer, the ONNX layer and graph forms, and its
kind record (kind.py) that the registry lists."""
