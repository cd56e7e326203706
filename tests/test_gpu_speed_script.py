"""benchmarks/gpu/speed.py (the one-call GPU speed run) in its CPU smoke mode: every code path
the CPU provider can take, tiny shapes, 2 iterations (about 20 s here; bounded at 100 s)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "speed.py"


def test_smoke_mode_runs_clean_and_proves_parity(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--smoke",
                           "--budget", "90", "--out", str(tmp_path / "out"),
                           "--models", str(tmp_path / "models")],
                          capture_output=True, text=True, timeout=100, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    doc = json.loads((out / "gpu-speed.json").read_text())
    rows = doc["rows"]
    assert doc["env"]["onnxruntime"] and doc["env"]["finished_s"] < 90
    assert (out / "gpu-speed.md").read_text().startswith("# GPU speed")
    assert len((out / "gpu-speed.txt").read_text().splitlines()) >= len(rows)

    # nothing failed that was not meant to: errors are refusals, skips, or bf16's export
    for r in rows:
        if r["error"] and not r.get("skipped"):
            assert r["dtype"] == "bfloat16" and r["mode"] == "ort", r

    copy = [r for r in rows if r["section"] == "A"]
    assert copy and copy[0]["bandwidth_GBps"] > 0

    # B: the static step on every form that builds one, fp16 and int4, each timed and
    # passing parity (y and the written cache slot); the cache written in place
    decode = [r for r in rows if r["section"] == "B" and r["mode"] == "ort" and not r["error"]]
    forms = {r["form"] for r in decode}
    assert {"auto", "decomposed", "blocked", "blocked-plain", "contrib-gqa"} <= forms
    assert {r["dtype"] for r in decode} == {"float16", "float16+int4"}
    for r in decode:
        assert r["median_ms"] > 0 and r["iters"] >= 2 and r["in_place"], r
        assert r["parity"]["pass"] and set(r["parity"]["parts"]) == {
            "y", "key_slot", "value_slot"}, r
        assert r["floor_ms"] > 0 and 0 < r["floor_fraction"], r
        assert r["parity_rule_matches_comparator"], r
        # fresh inputs copied into the bound buffers pass; the stale control fails
        assert len(r["parity"]["replays"]) == 3
        assert r["parity"]["stale_control"]["control_ok"], r
    int4 = [r for r in decode if r["dtype"] == "float16+int4"]
    assert int4 and all(r["matmulnbits_on"] for r in int4)

    torch_rows = [r for r in rows if r["section"] == "B" and r["mode"] == "torch"]
    assert {r["dtype"] for r in torch_rows} == {"float16", "bfloat16"}
    assert all(r["parity"]["pass"] and r["parity"]["stale_control"]["control_ok"]
               for r in torch_rows)

    # graph rows say they need CUDA (no graph on the CPU: no stale control to show)
    graphs = [r for r in rows if r["mode"] in ("ort-cuda-graph", "torch-cuda-graph")]
    assert graphs and all(r.get("skipped") and "needs CUDA" in r["error"] for r in graphs)

    # C: prefill, every form that builds each layer vs the eager module, fp16 and fp32
    prefill = [r for r in rows if r["section"] == "C" and not r["error"]]
    assert {r["form"] for r in prefill if r["mode"] == "ort"} >= {
        "auto", "decomposed", "attention-op", "blocked", "blocked-plain", "contrib-gqa"}
    assert {r["dtype"] for r in prefill} == {"float16", "float32", "float32+tf32"}
    assert all(r["parity"]["pass"] and r["median_ms"] > 0 for r in prefill)
