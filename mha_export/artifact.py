"""The artifact folder: what an export writes, atomically, and how the checker reads it back.

    DIR/model.onnx | model.pt   the exported model, one file per export target (export/targets.py)
                                (+ model.onnx.data only beyond protobuf's 2 GB)
    DIR/config.json             config, export settings, declared inputs/outputs/dynamic axes,
                                versions
    DIR/weights.safetensors     the source weights the model was made from (the checker's truth)
    DIR/parity.json             the report of the check run at export (absent with --no-check)
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from .config import MHAConfig
from .errors import UsageError, raise_if_interrupted
from .layer.layouts import AttentionBase
from .signature import INT8, Signature, signature_from_meta
from .weights.kv_quant import INT8_CACHE_TAG, KVCacheSpec
from .weights.quantize import QuantSpec
from .weights.quantizers import quant_spec_from_record

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
REPORT_FILE = "parity.json"
KIND_SUFFIX = {"full": "", "masked": "-masked", "kv-cache": "-kv", "static-cache": "-static"}


@dataclass(frozen=True)
class Artifact:
    """An artifact folder read back: config.json parsed once, its config and declared I/O."""

    path: Path
    meta: dict[str, Any]
    config: MHAConfig
    signature: Signature  # the named inputs/outputs it declares (config.json "io")

    @property
    def export(self) -> dict[str, Any]:
        return self.meta["export"]

    @property
    def quantization(self) -> Optional[QuantSpec]:
        """The projections' weight-only quantization recorded at export, or None."""
        q = self.export.get("quantize")
        return None if q is None else quant_spec_from_record(q)

    @property
    def kv_cache(self) -> Optional[KVCacheSpec]:
        """An int8 cache's recorded scales, or None (the float cache)."""
        record = self.export.get("kv_cache")
        return None if record is None else KVCacheSpec.from_dict(record)

    def load_source_module(self, float_cache: bool = False) -> AttentionBase:
        """The eager module of the function the file holds, rebuilt from config + source
        weights (never from the model file): for a quantized artifact, its projections hold the
        dequantized weights re-derived with the recorded QuantSpec; for an int8 cache, it
        quantizes on write and dequantizes on read with the recorded scales (``float_cache``:
        the same layer with a float cache, what the int8 cache is measured against)."""
        module = self.load_unquantized_module()
        if (spec := self.quantization) is not None:
            from .weights.dequantized import reference_module
            module = reference_module(module, spec, self.export.get("dtype", "float32"))
        if (cache := self.kv_cache) is not None and not float_cache:
            import torch
            module.use_int8_cache(torch.from_numpy(cache.key.scale),
                                  torch.from_numpy(cache.value.scale))
        return module

    def load_unquantized_module(self) -> AttentionBase:
        """The eager module of the source weights as they are (what quantizing is measured
        against)."""
        from .weights.source import load_source
        return load_source(self.config, self.path / WEIGHTS_FILE).module


def read_artifact(path: str | Path) -> Artifact:
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"artifact folder not found: {path}")
    cfg = path / CONFIG_FILE
    if not cfg.is_file():
        raise UsageError(f"{path} is not an mha-export artifact (no {CONFIG_FILE})")
    try:
        meta = json.loads(cfg.read_text())
        config = MHAConfig.from_dict(meta["config"])
        signature = signature_from_meta(config, meta)
        model_file = meta["export"]["file"]
        _check_quantization(meta["export"].get("quantize"))
        _check_kv_cache(meta["export"].get("kv_cache"), config, signature)
    except (ValueError, KeyError, TypeError, AttributeError, UsageError) as e:
        raise UsageError(f"{cfg}: corrupt artifact config ({e.__class__.__name__}: {e})") from None
    for needed in (model_file, WEIGHTS_FILE):
        if not (path / needed).is_file():
            raise UsageError(f"{path}: missing {needed}")
    return Artifact(path, meta, config, signature)


def _check_quantization(record: Any) -> None:
    """A quantize record that QuantSpec cannot read is a corrupt config, now."""
    if record is not None:
        quant_spec_from_record(dict(record))


def _check_kv_cache(record: Any, config: MHAConfig, signature: Signature) -> None:
    """An int8 cache's record must fit the layer and agree with the declared buffers."""
    if (record is not None) != (signature.cache_dtype == INT8):
        raise ValueError("export.kv_cache and the declared cache dtype disagree")
    if record is not None:
        spec = KVCacheSpec.from_dict(record)
        if not all(s.fits(config.kv_heads, config.head_dim) for s in (spec.key, spec.value)):
            raise ValueError("the int8 cache's scales do not fit kv_heads x head_dim")


def default_folder(config: MHAConfig, fmt: str, kind: str = "full",
                   root: str | Path = "models", quant: Optional[QuantSpec] = None,
                   int8_cache: bool = False) -> Path:
    """models/split-h12-d768-onnx, models/split-h12-d768-kv-onnx (decode-step model),
    models/split-h12-d768-static-int4-onnx (quantized projections),
    models/split-h12-d768-static-int4-kv8-onnx (and an int8 cache), ..."""
    tag = (f"-{quant.tag}" if quant else "") + (f"-{INT8_CACHE_TAG}" if int8_cache else "")
    return Path(root) / f"{config.slug()}{KIND_SUFFIX[kind]}{tag}-{fmt}"


def prepare_destination(dest: Path, force: bool) -> None:
    """Refuse to clobber an artifact without force; fail early on an unwritable parent."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise UsageError(f"{dest} already holds files: pass --force to replace it")
    parent = dest.parent if dest.parent != Path("") else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create output folder {parent}: {e.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"output folder {parent} is not writable")


@contextlib.contextmanager
def staged_folder(dest: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces dest in one rename.

    On any exception the staging folder is removed and dest is left as it was."""
    prepare_destination(dest, force)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    except OSError as e:
        raise UsageError(f"cannot create artifact folder {dest}: {e.strerror}") from None
    os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes 0700; publish with normal permissions
    try:
        yield stage
        raise_if_interrupted()  # never publish what an interruption cut short
        for f in stage.iterdir():  # some writers (safetensors) create 0600 files
            os.chmod(f, 0o666 & ~_umask())
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
            stage.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            stage.rename(dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def write_json_atomic(path: str | Path, data: Any) -> None:
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                   dir=path.parent if str(path.parent) else ".")
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
