"""Deployment-sized layer shapes by name (``bench --preset``): one attention layer of a model
people ship, as the CLI's config options, so a user measures the layer they deploy without
typing its shape. Values from each model's published config.json; an option given on the
command line wins over the preset's.

A new preset is one entry here: CLI option names (cli/options.py, MLA's from its section) ->
values.
"""
from __future__ import annotations

from .errors import UsageError

PRESETS: dict[str, dict] = {
    # meta-llama/Meta-Llama-3-8B: hidden 4096, 32 heads, 8 kv heads, head 128, rope 500000
    "llama3-8b": dict(dim=4096, heads=32, kv_heads=8, head_dim=128, rotary="half",
                      rope_theta=500000.0, qkv_bias=False, out_bias=False,
                      max_seq_len=8192),
    # Qwen/Qwen2.5-7B: hidden 3584, 28 heads, 4 kv heads, head 128, q/k/v biases, rope 1e6
    "qwen2.5-7b": dict(dim=3584, heads=28, kv_heads=4, head_dim=128, rotary="half",
                       rope_theta=1000000.0, qkv_bias=True, out_bias=False,
                       max_seq_len=32768),
    # deepseek-ai/DeepSeek-V2-Lite: hidden 2048, 16 heads, MLA latent 512, no q LoRA,
    # nope 128 + rope 64, v 128
    "deepseek-v2-lite": dict(dim=2048, heads=16, kv_lora_rank=512, qk_nope_head_dim=128,
                             qk_rope_head_dim=64, v_head_dim=128, rotary="interleaved",
                             out_bias=False, max_seq_len=4096),
}


def preset_options(name: str | None) -> dict:
    """The preset's config options ({} for None); an unknown name is bad input."""
    if name is None:
        return {}
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])
