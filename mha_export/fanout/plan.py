"""The units of work of a run over a checkpoint's layers, decided before any starts: which
layers, each layer's folder, the memory each is expected to need, and its fingerprint
(export/fingerprint.py: what ``--resume`` and ``eval --exports`` compare).

    checkpoint + --layers (export) | DIR's layer folders (check) -> [LayerJob] (work.py runs one)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..address import Address, address_key, parse_address
from ..artifact import CONFIG_FILE, WEIGHTS_FILE, read_artifact
from ..check.plan import CheckOptions, largest_case_bytes
from ..errors import UsageError, require_positive
from ..export.fingerprint import export_stamp
from ..export.pipeline import checked_export
from ..targets.registry import TARGETS
from ..graph.forms import DEFAULT
from ..signature import make_signature
from ..weights.source import (checkpoint_layers, checkpoint_modules, non_attention_layers,
                              select_layers)

EXPORT, CHECK = "export", "check"  # a job's action
LAYER_FOLDER = "layer-{layer}"  # layer-3, or layer-3.1 (an N.M address: address.py)
# A worker's memory, estimated (measured on SmolLM2-135M's layers, AMD Zen 3, 2026-11-25: a
# worker with torch, ONNX Runtime and the GGUF reader loaded 421 MiB, its peak 724-754 MiB,
# the sweep's largest case 191 MiB): the runtimes, the module's copies (eager fp32, the fp64
# reference, the file, the runtime's session) and the sweep's largest case with room.
BASE_BYTES = 512 * 2**20
WEIGHT_COPIES = 12
CASE_FACTOR = 1.5


@dataclass(frozen=True)
class LayerJob:
    """Everything one worker needs for one layer (picklable; no open files)."""

    action: str  # EXPORT | CHECK
    layer: Address
    folder: str  # absolute: the workers write there (a filesystem they all see)
    target: str  # the export target: onnx, torchscript, aoti
    weights: Optional[str]
    options: dict  # export_artifact's keywords (EXPORT)
    check_options: Optional[dict]  # check_parity's keywords; None: export without a check
    threads: int  # intra-op threads of torch and every runtime in the worker
    memory: int  # bytes the worker is expected to need (Ray reserves them)
    fingerprint: str
    timeout: Optional[float] = None  # seconds, from the layer's start


def estimate_bytes(weight_bytes: int, case_bytes: int, target: str = "onnx") -> int:
    """A worker's bytes for one layer of ``target`` (its ``worker_bytes`` on top)."""
    extra = TARGETS[target].worker_bytes if target in TARGETS else 0
    return int(BASE_BYTES + extra + WEIGHT_COPIES * weight_bytes + CASE_FACTOR * case_bytes)


def export_jobs(target: str, weights: str, spec: str, output: str | Path, options: dict,
                check_options: Optional[dict], threads: int, timeout: Optional[float],
                memory: Optional[int]) -> tuple[list[LayerJob], dict[Address, str]]:
    """One job per chosen attention layer of the checkpoint: DIR/layer-{L}/; and the chosen
    layers that are not softmax attention, by type (a hybrid model's: rows of their own). The
    first attention layer is loaded here, so that options the checkpoint or the target refuse
    are bad input before any work; its memory estimate is every layer's (a checkpoint's
    attention layers share a shape) unless given."""
    _require_settings(threads, timeout, memory)
    chosen = select_layers(spec, checkpoint_layers(weights),
                           modules=checkpoint_modules(weights))
    others = non_attention_layers(weights, chosen)
    layers = [layer for layer in chosen if layer not in others]
    if not layers:
        raise UsageError(f"--layers {spec}: none of them is softmax attention ("
                         + ", ".join(f"{i}: {kind}" for i, kind in others.items())[:200] + ")")
    estimate = _preflight(target, weights, layers[0], options, check_options)
    root = Path(output).resolve()
    return [LayerJob(EXPORT, layer, str(root / LAYER_FOLDER.format(layer=layer)), target,
                     weights, options, check_options, threads, memory or estimate,
                     export_stamp(target, weights, options, check_options, layer), timeout)
            for layer in layers], others


def _preflight(target: str, weights: str, layer: Address, options: dict,
               check_options: Optional[dict]) -> int:
    """Refuse what the export refuses for every layer, as it refuses it (its request checks,
    export/pipeline.py, on this layer); the layer's memory estimate."""
    asked = checked_export(target, weights=weights, layer=layer, check_options=check_options,
                           **options)
    source = asked.source
    case = 0 if check_options is None else largest_case_bytes(
        source.config, make_signature(source.config, asked.kind),
        options.get("attention") or DEFAULT, _check_opts(check_options))
    return estimate_bytes(_weight_bytes(source.module), case, target)


def _weight_bytes(module) -> int:
    return 4 * sum(p.numel() for p in module.parameters())  # fp32


def _check_opts(check_options: dict) -> CheckOptions:
    """The export-time check's options (its quick sweep unless told)."""
    keys = ("seq_lens", "batch_sizes", "past_lens", "sweep")
    return CheckOptions(**{"sweep": "quick",
                           **{k: check_options[k] for k in keys if check_options.get(k)}})


def layer_folders(folder: str | Path) -> dict[Address, Path]:
    """DIR's layer folders (layer-{L} holding config.json), by layer address."""
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"{folder}: no such folder")
    found = {}
    for sub in root.iterdir():
        prefix, _, index = sub.name.partition("-")
        address = _address(index)
        if prefix == "layer" and address is not None and (sub / CONFIG_FILE).is_file():
            found[address] = sub
    return dict(sorted(found.items(), key=lambda item: address_key(item[0])))


def _address(text: str) -> Optional[Address]:
    """A layer folder's address (layer-3: 3, layer-3.1: "3.1"), or None: not one."""
    try:
        return parse_address(text) if text.strip() == text else None
    except ValueError:
        return None


def is_layers_folder(folder: str | Path) -> bool:
    """A folder of layer folders (a run over a checkpoint), not one artifact."""
    root = Path(folder)
    return root.is_dir() and not (root / CONFIG_FILE).is_file() and bool(
        (root / "layers.json").is_file() or layer_folders(root))


def check_jobs(folder: str | Path, check_options: dict, threads: int,
               timeout: Optional[float], memory: Optional[int],
               made: Optional[dict[Address, str]] = None) -> list[LayerJob]:
    """One job per layer folder of DIR, each checked as `check DIR/layer-{L}` would be;
    ``made``: each layer's export fingerprint (kept in its row, for --resume)."""
    _require_settings(threads, timeout, memory)
    found = layer_folders(folder)
    if not found:
        raise UsageError(f"{folder}: no layer folders (layer-N/ with config.json) in it")
    jobs = []
    for layer, path in found.items():
        art = read_artifact(path)  # its config: the weights stay on disk (80 layers of 0.6 GB)
        weights = path / WEIGHTS_FILE
        need = memory or estimate_bytes(
            weights.stat().st_size if weights.is_file() else 0,
            largest_case_bytes(art.config, art.signature, art.export.get("attention"),
                               _check_opts(check_options)), art.meta.get("format", "onnx"))
        jobs.append(LayerJob(CHECK, layer, str(path.resolve()), art.meta.get("format", ""),
                             None, {}, check_options, threads, need,
                             (made or {}).get(layer, ""), timeout))
    return jobs


def _require_settings(threads: int, timeout: Optional[float], memory: Optional[int]) -> None:
    require_positive("--threads", threads)
    if timeout is not None and not timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {timeout}")
    if memory is not None and not memory > 0:
        raise UsageError(f"--memory-per-layer must be > 0, got {memory}")
