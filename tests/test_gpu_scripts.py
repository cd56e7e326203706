"""benchmarks/gpu/issue64.sh, the one prepared GPU call (its CPU dry run, `--cpu-dry-run`, runs
every command on the CPU provider at tiny shapes: minutes, run by hand before a GPU call): here
its syntax, and the forms it checks are the registry's (a form added later is included)."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "issue64.sh"


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_it_checks_every_form_of_the_registry_in_both_half_dtypes(tmp_path):
    """PARTS=parity with a stub `python -m mha_export` that records its calls."""
    import sys
    from mha_export.kinds.registry import FORMS
    calls = tmp_path / "calls.txt"
    stub = tmp_path / "py"
    stub.write_text(f"#!/bin/sh\nif [ \"$1\" = -m ]; then echo \"$@\" >> {calls}; exit 0; fi\n"
                    f"exec {sys.executable} \"$@\"\n")
    stub.chmod(0o755)
    env = {**os.environ, "PY": str(stub), "OUT": str(tmp_path / "out"), "PARTS": "parity",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = calls.read_text().splitlines()
    for form in FORMS:
        for dtype in ("float16", "bfloat16"):
            assert any(f"--attention {form} --static-cache --dtype {dtype}" in c for c in lines)
    checks = [c for c in lines if " check " in c]
    assert len(checks) == 2 * len(FORMS) and all("--runners ort-cpu" in c for c in checks)
    assert (tmp_path / "out" / "issue64.tgz").is_file()
