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
from .lossy.registry import STEPS, folder_tag, recorded
from .signature import Signature, signature_from_meta

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
REPORT_FILE = "parity.json"
SUMMARY_FILE = "layers.json"  # a fan-out folder's summary (fanout/records.py)
EVAL_EXPORTS_FILE = "eval-exports.json"  # eval --exports: whose layers the folder keeps
EVAL_OPTIONS_FILE = "eval-options.json"  # eval: the options a kept layer was exported with
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
    def specs(self) -> dict[str, Any]:
        """The lossy steps recorded at export (lossy/registry.py), by name: their specs."""
        return recorded(self.export)

    def spec(self, step: str) -> Any:
        """One lossy step's recorded spec ("quantize", "int8-cache"), or None."""
        if step not in {s.name for s in STEPS}:
            raise KeyError(f"no lossy step {step!r}")
        return self.specs.get(step)

    def load_source_module(self, without: tuple[str, ...] = ()) -> AttentionBase:
        """The eager module of the function the file holds, rebuilt from config + source
        weights (never from the model file): each recorded lossy step's reference applied in
        turn (quantized projections: the dequantized weights re-derived with the recorded spec;
        an int8 cache: quantizing on write, dequantizing on read with the recorded scales);
        ``without``: the steps left out (what one step is measured against)."""
        module = self.load_plain_module()
        for step in STEPS:
            if step.name not in without and (spec := step.spec(self.export)) is not None:
                module = step.reference(module, spec, self.export)
        return module

    def load_plain_module(self) -> AttentionBase:
        """The eager module of the source weights as they are, before any lossy step."""
        from .weights.source import load_source
        return load_source(self.config, self.path / WEIGHTS_FILE).module


def read_artifact(path: str | Path) -> Artifact:
    path = Path(path)
    if path.is_file():
        raise UsageError(f"{path} is a file: give the artifact folder that holds it "
                         f"({path.parent})")
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
        for step in STEPS:
            step.validate(meta["export"], config, signature)
    except (ValueError, KeyError, TypeError, AttributeError, UsageError) as e:
        raise UsageError(f"{cfg}: corrupt artifact config ({e.__class__.__name__}: {e})") from None
    for needed in (model_file, WEIGHTS_FILE):
        if not (path / needed).is_file():
            raise UsageError(f"{path}: missing {needed}")
    return Artifact(path, meta, config, signature)


def default_folder(config: MHAConfig, fmt: str, kind: str = "full",
                   root: str | Path = "models", specs: Optional[dict[str, Any]] = None,
                   tag: str = "") -> Path:
    """models/split-h12-d768-onnx, models/split-h12-d768-kv-onnx (decode-step model),
    models/split-h12-d768-static-int4-onnx (quantized projections),
    models/split-h12-d768-static-int4-kv8-onnx (and an int8 cache),
    models/split-h12-d768-bf16-onnx (the target's options: ``tag``), ...: ``specs``, the
    lossy steps' by name, tag it. ``kind``: the call asked for (signature.signature_kind's: a
    KV-shared layer's calls are named alike, its slug saying what it is)."""
    return Path(root) / (f"{config.slug()}{KIND_SUFFIX[kind]}{folder_tag(specs or {})}{tag}"
                         f"-{fmt}")


def is_artifact_folder(folder: Path) -> bool:
    """An artifact's config.json: a JSON object with its "config" and "export" records (a
    checkpoint's config.json has neither)."""
    try:
        meta = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("config"), dict) \
        and isinstance(meta.get("export"), dict)


def made_by_us(folder: Path) -> Optional[str]:
    """What mha-export wrote this folder as ("artifact", "layers": a fan-out with its summary,
    "eval-exports": eval's kept layers), or None: the only folders --force may replace. Each
    by its record's contents, not a file's name alone."""
    if _json_with(folder / SUMMARY_FILE, "layers", list):
        return "layers"
    if _json_with(folder / EVAL_EXPORTS_FILE, "weights", str):
        return "eval-exports"
    return "artifact" if is_artifact_folder(folder) else None


def _json_with(path: Path, key: str, kind: type) -> bool:
    """``path`` is a JSON object whose ``key`` holds a ``kind``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get(key), kind)


def foreign_files(folder: Path) -> list[str]:
    """What an artifact folder holds that mha-export did not write there (a user's notes, a
    folder), sorted: replacing the folder would delete it. Its own: the model file its record
    names (and ONNX's external data), config.json, the source weights, the report, eval's
    record of its options, and a check's report on it (`check DIR --json DIR/ci.json`: by
    its contents)."""
    own = {CONFIG_FILE, WEIGHTS_FILE, REPORT_FILE, EVAL_OPTIONS_FILE}
    try:
        model = json.loads((folder / CONFIG_FILE).read_text())["export"]["file"]
    except (OSError, ValueError, KeyError, TypeError):
        model = None
    if isinstance(model, str):
        own |= {model, f"{model}.data"}
    return sorted(p.name for p in folder.iterdir() if not p.is_file() or not (
        p.name in own or p.suffix == ".json" and _is_check_report(p)))


def _is_check_report(path: Path) -> bool:
    """A JSON report of mha-export's check (CheckReport.to_dict: the artifact checked and the
    results)."""
    return _json_with(path, "artifact", str) and _json_with(path, "results", list)


def refuse_foreign(folder: Path, foreign: list[str]) -> None:
    """--force replaces only what mha-export wrote: anything else in the folder is named, and
    nothing is touched."""
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if foreign[3:] else "")
        raise UsageError(f"{folder} holds {shown}, which mha-export did not write: --force "
                         "replaces only an artifact's own files; move "
                         f"{'it' if len(foreign) == 1 else 'them'} or choose another folder")


def require_ours(folder: Path, force: bool, replaced: str = "replace it") -> None:
    """A non-empty folder is written into only when mha-export made it and --force says so;
    a folder of anyone else's files, or an artifact holding a file mha-export did not write,
    is refused whatever the flags: every file is kept."""
    if not (folder.is_dir() and any(folder.iterdir())):
        return
    made = made_by_us(folder)
    if made is None:
        raise UsageError(f"{folder} holds files but is not an mha-export artifact or layers "
                         "folder: its files are kept; choose a new or empty folder (--force "
                         "replaces only those)")
    if made == "artifact":
        refuse_foreign(folder, foreign_files(folder))
    if not force:
        raise UsageError(f"{folder} already holds an mha-export artifact: pass --force to "
                         f"{replaced}")


def check_destination(dest: Path, force: bool) -> Path:
    """Refuse to clobber an artifact without force, and anyone else's folder at all, creating
    nothing (an export asks before it builds anything); where the staging folder goes."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a folder")
    where = _absolute(dest)
    if where.exists() and where.resolve() in Path.cwd().resolve().parents:
        raise UsageError(f"the working folder is inside {dest}, which would be replaced: run "
                         "from elsewhere")
    require_ours(dest, force)
    parent = where if _holds_cwd(where) else where.parent
    found = _existing_ancestor(parent)  # where the folders up to the staging folder start
    if found is not None and not found.is_dir():
        raise UsageError(f"cannot create output folder {dest}: {found} is a file")
    if found is not None and not os.access(found, os.W_OK):
        raise UsageError(f"output folder {found} is not writable")
    return parent


def prepare_destination(dest: Path, force: bool) -> None:
    """``check_destination``, then the staging folder's parent made; fail early on an
    unwritable parent."""
    parent = check_destination(dest, force)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create output folder {parent}: {e.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"output folder {parent} is not writable")


def _absolute(path: Path) -> Path:
    """``path`` made absolute and normalised ("." -> the working folder, which has a name)."""
    return Path(os.path.abspath(path))


def _existing_ancestor(folder: Path) -> Optional[Path]:
    """``folder`` or its nearest ancestor that exists."""
    return next((p for p in (folder, *folder.parents) if p.exists()), None)


def _holds_cwd(folder: Path) -> bool:
    """The working folder is ``folder``: replacing it by a rename would leave the user's shell
    in a deleted folder, so its contents are replaced instead."""
    return folder.exists() and Path.cwd().resolve() == folder.resolve()


@contextlib.contextmanager
def staged_folder(dest: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces dest in one rename (or, where dest holds
    the working folder, dest's contents are replaced by its files).

    On any exception the staging folder is removed and dest is left as it was."""
    prepare_destination(dest, force)
    dest = _absolute(dest)
    in_place = _holds_cwd(dest)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp",
                                      dir=dest if in_place else dest.parent))
    except OSError as e:
        raise UsageError(f"cannot create artifact folder {dest}: {e.strerror}") from None
    os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes 0700; publish with normal permissions
    try:
        yield stage
        raise_if_interrupted()  # never publish what an interruption cut short
        for f in stage.iterdir():
            readable(f)
        _publish(stage, dest, in_place)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _publish(stage: Path, dest: Path, in_place: bool) -> None:
    if in_place:  # the staged files move in (each replacing its old self), then the rest goes
        made = {new.name for new in stage.iterdir()}
        for name in made:
            os.replace(stage / name, dest / name)
        stage.rmdir()
        for old in dest.iterdir():
            if old.name not in made:
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    elif dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
        stage.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        stage.rename(dest)


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


def readable(path: Path) -> None:
    """The mode a new file gets from the umask (some writers, safetensors, create 0600)."""
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
