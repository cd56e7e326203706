"""What a bench run times of the ExecuTorch target (its record's ``programs``): the float
program and the ONNX variants it holds too (int4 with int8 activations, torchao's 8da4w); a
static-cache run: each also on ExecuTorch's LLM kernels (``executorch-llm...``) where they
compute the layer and load here. Each program's axes are bounded by the run's longest call
(ExecuTorch plans its memory for the longest call its bounds allow: a step's program plans no
prefill)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...config import MHAConfig
from ..base import BenchRun, ExportTarget
from .install import llm_kernels_missing
from .rows import llm_kernels_refusal


def variants(target: ExportTarget, run: BenchRun) -> dict[str, dict]:
    """The run's programs by model key: {"specs", "record", "kernels"}."""
    held = {f"executorch-{key[len(v['form']) + 1:]}": {"specs": v["specs"], "record": v["record"]}
            for key, v in run.variants.items() if v["specs"] and builds_all(target, v["specs"])}
    programs = {key: {**v, "kernels": "aten"}
                for key, v in {"executorch": {"specs": {}, "record": {}}, **held}.items()}
    if run.kind != "static-cache" or _llm_refused(run.config):
        return programs
    return {**programs, **{"executorch-llm" + key[len("executorch"):]: {**v, "kernels": "llm"}
                           for key, v in programs.items()}}


def builds_all(target: ExportTarget, specs: dict) -> bool:
    """Whether the program holds every lossy step of an ONNX variant (its record's ``builds``)."""
    return all(step in target.builds and target.builds[step](spec) is None
               for step, spec in specs.items())


def _llm_refused(config: MHAConfig) -> bool:
    return bool(llm_kernels_refusal(config) or llm_kernels_missing())


def programs(target: ExportTarget, run: BenchRun) -> dict[str, tuple[Path, dict]]:
    """Each program written, by model key -> (path, its rows' record); batch the run's, a
    static cache of the run's capacity (else the longest call), seq the longest call's."""
    length = run.capacity or max(t + p for t, p in run.points)
    bounded = replace(run.config, max_seq_len=length)
    out = {}
    for key, v in variants(target, run).items():
        path = run.folder / f"{key}.pte"
        target.prepare(run.module, bounded, run.sig, max_batch=run.batch, specs=v["specs"],
                       kernels=v["kernels"], max_seq=max(t for t, _ in run.points)).write(path)
        out[key] = (path, v["record"])
    return out
