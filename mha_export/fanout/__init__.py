"""Every layer of a checkpoint, exported and checked — one unit of work per layer, on this
machine or fanned out on a Ray cluster — with a verdict per layer in DIR/layers.json.

    checkpoint, --layers -> jobs (plan.py) -> an executor (executors/: local processes | Ray
    tasks) runs run_layer (work.py) per job in its worker's runtime (executors/worker.py)
    -> LayerRecords -> DIR/layers.json (records.py)

    DIR/layer-{L}/   each layer's artifact folder, as `--layer L -o DIR/layer-{L}` writes it
    DIR/layers.json  {"layers": [{"layer": L, "status": ..., "folder": ...}, ...], "passed": ...}
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from ..artifact import foreign_files, made_by_us, refuse_foreign
from ..errors import UsageError
from ..lossy import registry as lossy
from .executors import DEFAULT as DEFAULT_EXECUTOR, EXECUTORS, Work, make_executor
from .plan import (CHECK, EXPORT, LAYER_FOLDER, check_jobs, export_jobs, is_layers_folder,
                   layer_folders)
from .records import STATUSES, SUMMARY_FILE, LayerRecord, Summary, format_summary, read_summary
from .run import Progress, resumable as _resumable, run_jobs
from .work import run_layer
from ..weights.source import why_left

__all__ = ["export_layers", "check_layers", "is_layers_folder", "EXECUTORS", "STATUSES",
           "Summary", "LayerRecord", "format_summary", "read_summary", "SUMMARY_FILE"]


def export_layers(target: str, weights: str | Path, layers: str, output: str | Path, *,
                  executor: str = DEFAULT_EXECUTOR, jobs: Optional[int] = None,
                  ray_address: Optional[str] = None, threads: int = 1,
                  timeout: Optional[float] = None, memory: Optional[int] = None,
                  resume: bool = False, force: bool = False, validate: bool = True,
                  check_options: Optional[dict] = None,
                  progress: Progress = lambda s, running, r: None, work: Work = run_layer,
                  **options) -> Summary:
    """Export (and check) ``layers`` (``all``, ``A-B``, ``L,L,...``) of a checkpoint into
    ``output``/layer-{L}/, each as ``export_<target>(weights=..., layer=L)`` would, run by the
    named executor. ``threads``: intra-op threads per layer (pinned: verdicts do not depend on
    the executor); ``memory``: bytes a layer needs (default: estimated, plan.py);
    ``timeout``: seconds per layer; ``resume``: keep the layers an earlier run left passing
    with the same options and weights; ``force``: replace what the folder holds; ``work``:
    the unit of work (``run_layer``; a caller's own wraps it, picklable by reference)."""
    root = Path(output)
    _require_free(root, force, resume)
    chosen = make_executor(executor, jobs, ray_address)  # bad names refused before any work
    checking = dict(check_options or {}) if validate else None
    weights = str(Path(weights).resolve())  # the workers' own working folders differ
    options = {**options, **{k: str(Path(f).resolve()) for k, f in lossy.files(options).items()
                             if f is not None}}
    plan, others = export_jobs(target, weights, layers, root, options, checking, threads,
                               timeout, memory)
    if force:
        _clear(root)
    kept = _resumable(root, plan) if resume else {}
    kept.update({layer: LayerRecord.not_attention(layer, kind, why_left(kind))
                 for layer, kind in others.items()})
    summary = Summary(EXPORT, target, weights, lossy.as_json(options), checking or {}, {})
    return run_jobs(plan, chosen, summary, root, kept, progress, work)


def check_layers(folder: str | Path, *, executor: str = DEFAULT_EXECUTOR,
                 jobs: Optional[int] = None, ray_address: Optional[str] = None,
                 threads: int = 1, timeout: Optional[float] = None,
                 memory: Optional[int] = None, progress: Progress = lambda s, running, r: None,
                 work: Work = run_layer, **check_options) -> Summary:
    """Check every layer folder of ``folder`` (a run of ``export_layers``), each as
    ``check_parity`` would, and rewrite its layers.json with the new statuses. Each row keeps
    the fingerprint of its export (a layer that fails here is exported again by --resume); the
    rows of layers without a folder (their export failed) are kept as they were."""
    chosen = make_executor(executor, jobs, ray_address)
    if check_options.get("inputs"):  # the workers' own working folders differ
        check_options["inputs"] = str(Path(check_options["inputs"]).resolve())
    earlier = read_summary(folder, strict=False)
    made = {r.layer: r.fingerprint for r in earlier.records} if earlier else {}
    plan = check_jobs(folder, check_options, threads, timeout, memory, made)
    checked = {job.layer for job in plan}
    kept = {r.layer: r for r in earlier.records if r.layer not in checked} if earlier else {}
    summary = Summary(CHECK, earlier.target if earlier else plan[0].target,
                      earlier.weights if earlier else None,
                      earlier.options if earlier else {},
                      earlier.check_options if earlier else {}, {},
                      last_check=_plain(check_options))
    return run_jobs(plan, chosen, summary, folder, kept, progress, work)


def _plain(options: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}


def _require_free(root: Path, force: bool, resume: bool) -> None:
    """An existing folder is replaced only when asked (--force), or gone on from (--resume),
    and only when it is a fan-out folder (its layers.json): anyone else's files are kept (a
    layer folder holding one is refused)."""
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root} exists and is not a folder")
    if force and resume:
        raise UsageError("--force replaces the folder's layers, --resume keeps the passing "
                         "ones: pass one")
    if not (root.is_dir() and any(root.iterdir())):
        return
    if made_by_us(root) != "layers":
        raise UsageError(f"{root} holds files but no {SUMMARY_FILE}: it is not a layers folder "
                         "of mha-export; choose a new or empty folder")
    if not (force or resume):
        raise UsageError(f"{root} already holds layers: pass --force to replace them "
                         "or --resume to keep the passing ones")
    if force:  # each layer folder goes whole (_clear): a file mha-export did not write stays
        refuse_foreign(root, [f"{sub.name}/{name}" for sub in layer_folders(root).values()
                              for name in foreign_files(sub)])


def _clear(root: Path) -> None:
    """--force: the folder's layer folders and summary go (the run writes them anew)."""
    if root.is_dir():
        for folder in layer_folders(root).values():
            shutil.rmtree(folder)
        (root / SUMMARY_FILE).unlink(missing_ok=True)
