"""Where an ExecuTorch static-cache step's time goes, by ExecuTorch's own profiler (etdump):
each instruction of forward (an operator on ExecuTorch's CPU kernels, or a delegated XNNPACK
subgraph, named by the operators inside it), its median over the steps.

    .venv/bin/python benchmarks/executorch_profile.py PROGRAM.pte [--steps 200] [--past 1024]
        [--threads 2] [--top 12] [--json FILE]

PROGRAM.pte: an `mha-export executorch --static-cache` program (its folder's config.json says
its kernels and rows). The program's cache is reset, then each step is one token at --past.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import types
from pathlib import Path

import torch


def etdump_module():
    """executorch.devtools.etdump.serialize without executorch.devtools' __init__ (which
    imports the Inspector and pandas, not installed here)."""
    import executorch
    if "executorch.devtools" not in sys.modules:
        package = types.ModuleType("executorch.devtools")
        package.__path__ = [str(Path(list(executorch.__path__)[0]) / "devtools")]
        sys.modules["executorch.devtools"] = package
    from executorch.devtools.etdump import serialize
    return serialize


def profile(path: Path, steps: int, past: int, threads: int) -> dict[str, float]:
    from executorch.extension.pybindings import portable_lib as pl
    record = json.loads((path.parent / "config.json").read_text())["export"]
    if record.get("cache", {}).get("kernels") == "llm":
        from mha_export.targets.executorch.install import load_llm_kernels
        load_llm_kernels()
    pl._unsafe_reset_threadpool(threads)
    module = pl._load_for_executorch(str(path), enable_etdump=True, debug_buffer_size=0)
    module.run_method("reset_cache", [])
    rows = record["bounds"]["batch"]
    d_in = module.method_meta("forward").input_tensor_meta(0).sizes()[-1]
    inputs = [torch.randn(rows, 1, d_in), torch.full((rows,), past, dtype=torch.long)]
    if module.method_meta("forward").num_inputs() == 3:  # a rotary layer's position_ids
        inputs.append(torch.full((rows, 1), past, dtype=torch.long))
    for _ in range(steps):
        module.run_method("forward", inputs)
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "run.etdp"
        module.write_etdump_result_to_file(str(dump))
        etdump = etdump_module().deserialize_from_etdump_flatcc(dump.read_bytes())
    times: dict[str, list[float]] = collections.defaultdict(list)
    for run in etdump.run_data:
        for event in run.events or []:
            p = event.profile_event
            if p is None or p.name in (None, "OPERATOR_CALL") or "load_method" in p.name \
                    or p.name == "Method::init":
                continue
            name = p.name.replace("native_call_", "")
            if name == "DELEGATE_CALL":
                name = f"XNNPACK subgraph #{p.instruction_id}"
            elif name != "Method::execute":
                name = f"{name} #{p.instruction_id}"
            times[name].append((p.end_time - p.start_time) / 1e6)
    return {k: statistics.median(v) for k, v in times.items() if len(v) >= steps // 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--past", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    medians = profile(a.program, a.steps, a.past, a.threads)
    total = medians.pop("Method::execute")
    print(f"{a.program}: one step at past {a.past}, median {total:.3f} ms ({a.steps} steps)")
    for name, ms in sorted(medians.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {name:40s} {ms:8.3f} ms  {ms / total:6.1%}")
    rest = total - sum(medians.values())
    print(f"  {'(between instructions)':40s} {rest:8.3f} ms  {rest / total:6.1%}")
    if a.json:
        a.json.write_text(json.dumps({"program": str(a.program), "past": a.past,
                                      "step_ms": total, "instructions_ms": medians}, indent=1))


if __name__ == "__main__":
    main()
