"""What a quantized Hugging Face checkpoint costs and runs when it is kept as shipped
(--quantize source): a Llama-3-8B-shaped attention layer (4096 wide, 32 heads, 8 kv heads,
head 128) written in each format as its writers write it (tests/quant_writers.py; the
compressed-tensors folders by compressed-tensors' own compressors), then timed by `mha-export
bench` beside the fp32 export of the same weights (the format's dequantization), one cached
step at past 1024, cold, in one run per format.

    .venv/bin/python benchmarks/quantized_checkpoints.py [--formats gptq,...] [--out DIR]
        [--cpu TAG] [--accuracy-level 1|4]

Writes DIR/quantized-<format>[-l4]-<cpu>.json (bench's JSON) and prints bench's tables. Level 1
(fp32 compute) is --quantize source's default; level 4 (int8 activations) is the user's choice
for speed (float8 weights have no such level)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from quant_writers import (awq_tensors, compressed_tensors, fp8_tensors,  # noqa: E402
                           gptq_tensors, quantized_folder)

LLAMA3_8B = dict(model_type="llama", hidden_size=4096, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, num_hidden_layers=1,
                 intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                 rope_theta=500000.0, rms_norm_eps=1e-5)
INT8_CHANNEL = dict(num_bits=8, type="int", strategy="channel", symmetric=True)
FORMATS = {  # name: (quantization_config, writer)
    "gptq-int4-g128": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True,
                        "desc_act": False, "checkpoint_format": "gptq"},
                       lambda w: gptq_tensors(w, 4, 128, True, False, True)),
    "gptq-int4-g128-act-order": ({"quant_method": "gptq", "bits": 4, "group_size": 128,
                                  "sym": True, "desc_act": True, "checkpoint_format": "gptq"},
                                 lambda w: gptq_tensors(w, 4, 128, True, True, True)),
    "awq-int4-g128": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                       "version": "gemm"}, lambda w: awq_tensors(w, 128)),
    "ct-w8a16-channel": ({"quant_method": "compressed-tensors", "format": "pack-quantized",
                          "config_groups": {"g": {"targets": ["Linear"],
                                                  "weights": INT8_CHANNEL}}},
                         lambda w: compressed_tensors(w, INT8_CHANNEL, "pack-quantized")),
    "fp8-blocks-128": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                        "weight_block_size": [128, 128]}, lambda w: fp8_tensors(w, (128, 128))),
}


def float_layer(folder: Path) -> None:
    """config.json and layer 0's attention projections, N(0, 0.02) as transformers inits."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    g = torch.Generator().manual_seed(0)
    shapes = {"q_proj": (4096, 4096), "k_proj": (1024, 4096), "v_proj": (1024, 4096),
              "o_proj": (4096, 4096)}
    save_file({f"model.layers.0.self_attn.{n}.weight": torch.randn(s, generator=g) * 0.02
               for n, s in shapes.items()}, str(folder / "model.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cpu", default="cpu", help="a tag for the file names (e.g. amd-zen3)")
    ap.add_argument("--accuracy-level", default="1", choices=("1", "4"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "float"
        float_layer(base)
        for name in args.formats.split(","):
            qcfg, write = FORMATS[name]
            folder = Path(tmp) / name
            quantized_folder(base, folder, qcfg, lambda module, w: write(w))
            level = "" if args.accuracy_level == "1" else f"-l{args.accuracy_level}"
            out = Path(args.out) / f"quantized-{name}{level}-{args.cpu}.json"
            subprocess.run([sys.executable, "-m", "mha_export", "bench", "--weights",
                            str(folder), "--layer", "0", "--static-cache", "--seq-lens", "1",
                            "--past-lens", "1024", "--forms", "auto", "--quantize", "source",
                            "--accuracy-level", args.accuracy_level, "--cold", "--json",
                            str(out)], check=True)


if __name__ == "__main__":
    main()
