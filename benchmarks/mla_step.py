"""One decode step of a DeepSeek-V2-Lite-shaped MLA layer (hidden 2048, 16 heads, kv_lora_rank
512, rope 64, nope 128, v 128, no q LoRA; random weights), side by side in one process:

- transformers 5.23's ``DeepseekV2Attention`` with its DynamicCache of P latents (cropped back
  to P after each call): it re-expands the whole latent cache through kv_b_proj every step;
- the eager layer (kinds/mla/layer.py) in its expanded and absorbed forms over the same cache;
- the ONNX static-cache step as `mha-export onnx --static-cache` writes it (the default form
  ``latent``: a decode step runs its absorbed core) in ONNX Runtime, buffers of capacity 8192
  bound in place (IO binding), as an app runs it.

    .venv/bin/python benchmarks/mla_step.py [--pasts 128,1024,4096] [--out FILE.json]

Medians of repeated calls, 2 threads; transformers is a test-only dependency of the package.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

from mha_export.check.runners.ort import OrtRunner
from mha_export.config import MHAConfig
from mha_export.env import machine_info
from mha_export.targets.registry import TARGETS
from mha_export.kinds.registry import build_module
from mha_export.signature import make_signature

SHAPE = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
             kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
             q_lora_rank=None, num_hidden_layers=1, intermediate_size=64, vocab_size=64,
             n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
             moe_intermediate_size=16, first_k_dense_replace=1, max_position_embeddings=16384)
CAPACITY, THREADS = 8192, 2


def median_ms(fn, budget_s: float = 2.0, min_reps: int = 5) -> float:
    fn()  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def layers():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("deepseek_v2", **SHAPE),
                                             attn_implementation="sdpa").eval()
    attn = model.model.layers[0].self_attn
    c = model.config
    config = MHAConfig(dim=c.hidden_size, heads=c.num_attention_heads, rotary="interleaved",
                       rope_theta=c.rope_parameters["rope_theta"], out_bias=False, latent=dict(
                           kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim,
                           qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim))
    ours = build_module(config)
    ours.load_state_dict(attn.state_dict())
    return model, attn, ours


def transformers_step(model, attn, past: int):
    x = torch.randn(1, 1, 2048)
    pos = torch.tensor([[past]])
    rope = model.model.rotary_emb(x, pos)
    cache = DynamicCache(config=model.config)
    cache.update(torch.randn(1, 1, past, 512), torch.randn(1, 1, past, 64), 0)

    def step():
        with torch.inference_mode():
            attn(x, attention_mask=None, past_key_values=cache, position_embeddings=rope)
        cache.crop(-1)  # back to the P latents it held
    return step


def eager_step(ours, past: int, absorbed: bool):
    x, latent, k_rot = torch.randn(1, 1, 2048), torch.randn(1, 1, past, 512), \
        torch.randn(1, 1, past, 64)
    pos = torch.tensor([[past]])

    def step():
        with torch.inference_mode():
            ours.attend(x, None, latent, k_rot, pos, absorbed)
    return step


def onnx_step(runner, past: int):
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 1, 2048)).astype(np.float32),
             "past_key": np.zeros((1, 1, CAPACITY, 512), np.float32),
             "past_value": np.zeros((1, 1, CAPACITY, 64), np.float32),
             "past_lengths": np.array([past]), "position_ids": np.array([[past]])}
    prepared = runner.prepare(feeds)
    return lambda: runner.run_prepared(prepared)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pasts", default="128,1024,4096")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    model, attn, ours = layers()
    path = Path("/tmp/mla_step.onnx")
    sig = make_signature(ours.config, "static-cache")
    TARGETS["onnx"].prepare(ours, ours.config, sig).write(path)  # the default form: latent
    runner = OrtRunner(sig, path, "cpu", THREADS)
    rows = []
    for past in (int(p) for p in args.pasts.split(",")):
        row = {"past": past,
               "transformers_ms": median_ms(transformers_step(model, attn, past)),
               "eager_expanded_ms": median_ms(eager_step(ours, past, False)),
               "eager_absorbed_ms": median_ms(eager_step(ours, past, True)),
               "onnx_latent_ms": median_ms(onnx_step(runner, past))}
        rows.append(row)
        print(json.dumps(row))
    result = {"machine": machine_info(), "threads": THREADS, "capacity": CAPACITY,
              "shape": SHAPE, "rows": rows,
              "cache_bytes_per_token": {"latent_fp32": 4 * (512 + 64),
                                        "expanded_fp32": 4 * 16 * (128 + 64 + 128)}}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
