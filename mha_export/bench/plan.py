"""What a bench run measures (``BenchPlan``: `mha-export bench`'s options as one record) and
the options read into it: the forms and quantizations named, the layer measured (an
artifact's, a checkpoint's or the options' own), the C++ programs of a `make cpp` folder."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import UsageError
from ..lossy.projections.rtn import QuantSpec
from ..lossy.projections.source import SOURCE, SourceQuantSpec


@dataclass(frozen=True)
class BenchPlan:
    """``kv_cache``: the decode-step models (x, attention_mask, past_key, past_value), e.g.
    T=1 over past 128..4096, or a long prefill; ``static_cache``: the in-place models over a
    buffer of ``capacity`` entries, against eager torch's growing-cache step (the baseline
    row) and its own in-place step; ``runners``: more runners (OpenVINO, another target's);
    ``cpp``: a folder holding the built C++ programs (``make cpp``), timed on the same files;
    ``command``: kept in the report; ``quantize``: each form also with quantized projections;
    ``cold``: each row steps a ring of independent instances larger than the last-level cache
    (driver.py's ``RING``); ``int8_cache`` (static cache): each form that builds one also with
    an int8 cache, its scales calibrated on synthetic inputs; ``dtype``: the ONNX models' and
    torch's (float16 / bfloat16: what GPUs run); ``cuda_graph`` (static cache, CUDA): the step
    also replayed as a CUDA graph (runner ort-cuda-graph)."""

    seq_lens: Sequence[int] = (128, 512, 2048, 8192, 16384)
    batch: int = 1
    providers: Sequence[str] = ("cpu", "cuda")
    forms: Optional[Sequence[str]] = None  # None: every form that builds the call
    threads: int = 2
    seed: int = 0
    mem_limit_gib: float = 16.0
    budget_s: float = 2.0
    kv_cache: bool = False
    past_lens: Sequence[int] = (0,)
    static_cache: bool = False
    capacity: int = 8192
    runners: Sequence[str] = ()
    cpp: Optional[Path] = None
    command: str = ""
    quantize: Sequence[QuantSpec] = ()
    cold: bool = False
    int8_cache: bool = False
    dtype: str = "float32"
    cuda_graph: bool = False

    @property
    def kind(self) -> str:
        """The signature kind of the models measured."""
        return "static-cache" if self.static_cache else "kv-cache" if self.kv_cache else "full"

    @property
    def points(self) -> list[tuple[int, int]]:
        """Every (T, past) measured (past 0 for full-sequence models)."""
        return [(t, p) for t in self.seq_lens
                for p in (self.past_lens if self.kind != "full" else [0])]


def forms_named(forms: Optional[str], known: Sequence[str]) -> Optional[list[str]]:
    """--forms a,b as form names (None: the bench's default)."""
    chosen = None if forms is None else [f.strip() for f in forms.split(",") if f.strip()]
    if chosen is not None and (not chosen or set(chosen) - set(known)):
        raise UsageError(f"--forms: choose from {', '.join(known)}, got {forms!r}")
    return chosen


def quantization_named(names: Optional[str], levels: Optional[list[int]]) -> list:
    """--quantize int4,int8,source x --accuracy-level 1,4 as QuantSpecs (default block and
    symmetry); source as a SourceQuantSpec whose blocks the bench reads once the GGUF layer is
    loaded (``layer_measured``)."""
    from ..lossy.projections.rtn import NAMES
    if names is None:
        return []
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    if not chosen:
        raise UsageError(f"--quantize: expected int4, int8, source or several (int4,int8), "
                         f"got {names!r}")
    for n in chosen:
        if n not in (*NAMES, SOURCE):
            raise UsageError(f"--quantize {n!r}: choose one of {', '.join((*NAMES, SOURCE))}")

    def spec(name: str, level: Optional[int]):
        fields = {} if level is None else {"accuracy_level": level}
        return SourceQuantSpec(**fields) if name == SOURCE else QuantSpec.named(name, **fields)
    return [spec(n, level) for n in chosen for level in (levels or [None])]


def layer_measured(artifact: Optional[str], fields: dict, quantize: list,
                   int8_cache: bool) -> tuple:
    """(source, quantize, int8 cache) of a bench run: an artifact's source weights (its own
    quantization and cache when none are asked for), or the layer the config ``fields`` (and
    weights, layer, seed) describe; a GGUF's kept blocks read once the layer is loaded."""
    from ..lossy.projections.step import kept_blocks
    from ..weights.source import Source, load_source
    weights, layer, seed = (fields.pop(k) for k in ("weights", "layer", "seed"))
    if artifact:
        from ..artifact import read_artifact
        art = read_artifact(artifact)  # its source weights; its quantization measured as such
        source = Source(art.config, art.load_plain_module(),
                        art.meta.get("weights", {}).get("source", {}))
        quantize = quantize or ([art.spec("quantize")] if art.spec("quantize") else [])
        int8_cache = int8_cache or art.spec("int8-cache") is not None  # calibrated anew
    else:
        source = load_source(None, weights, layer, seed, fields)
    return source, [kept_blocks(source, q, "float32") if q.quantizer == SOURCE else q
                    for q in quantize], int8_cache


def timed_targets(runners: Sequence[str]) -> list:
    """The export targets whose own files a run times: TorchScript's (its row is always
    there), and each other whose runner is among ``runners`` (not ONNX: its models are the
    run's variants)."""
    from ..targets.registry import TARGETS
    timed = {*runners, "torchscript"}
    return [t for t in TARGETS.values()
            if t.name != "onnx" and any(k.name in timed for k in t.runners)]


def cpp_folder(folder: Optional[str], runners: Sequence[str]) -> Optional[Path]:
    """--cpp: the `make cpp` folder, checked before any work (every program it will run
    exists: TorchScript's always, another target's with a runner of its file)."""
    if folder is None:
        return None
    needed = [t.cpp_program for t in timed_targets(runners) if t.cpp_program]
    missing = [p for p in needed if not (Path(folder) / p).is_file()]
    if missing:
        raise UsageError(f"--cpp {folder}: no {', '.join(missing)} there (build with `make cpp`)")
    return Path(folder).resolve()
