#!/usr/bin/env bash
# One batched command on a lent GPU machine (../shared/GPU.md), as run 2026-11-25 on an H100
# (docs/performance.md#cuda). Set-up, here: `bash ../shared/gpu/stage-ort-gpu.sh`; `mkdir -p
# .gpu/src && git archive HEAD | tar -x -C .gpu/src && git rev-parse --short HEAD >
# .gpu/src/COMMIT && cp benchmarks/gpu/* .gpu/` (.gpu/ and .ortgpu/ in .git/info/exclude). There:
# carry each .ortgpu piece to /tmp/ortgpu, then in one call install the wheel into /tmp/site and
# run `bash .gpu/cuda-run.sh` (carry .gpu). Runs the snapshot in .gpu/src (a tree being edited
# beside it would travel half-written). Every step is under a timeout and the results are packed
# at checkpoints: a hung step (ORT CUDA under an address-space cap hung once) costs its own
# minutes, not the call. ORT's CUDA sessions log verbosely at every run: keep the per-form
# limits generous.
set -uo pipefail
exec > >(tee -a "${OUT:-/tmp/out}/log.txt") 2>&1
T0=$SECONDS
OUT=${OUT:-/tmp/out}; R=$(mktemp -d); mkdir -p "$R/m"
cd .gpu/src
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
MX="python3 -m mha_export"
pack() { tar -czf "$OUT/cuda-results.tgz" -C "$R" --exclude='./m' . ; echo "packed at $((SECONDS-T0)) s"; }
TO="timeout -k 5"
{
  echo "commit $(cat COMMIT)"; date -u; $TO 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $TO 45 python3 - <<'PY2'
import torch, onnxruntime as ort, onnx, numpy
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())
print("onnx", onnx.__version__, "numpy", numpy.__version__)
PY2
  echo "env rc=$?"
  for m in preload torch bare; do $TO 30 python3 ../probe.py $m; echo "probe $m rc=$?"; done
} 2>&1 | tee "$R/env.txt"
pack

# 1. parity: one background job per form (fp32 TF32, fp32 no-TF32, fp16, growing and static
# cache: a form that cannot build one refuses at export in a line), pytest beside.
# FORMS / FORM_LIMIT / BENCH_FORMS / BENCH_SEQ narrow a rerun.
export OMP_NUM_THREADS=2
FORMS=${FORMS:-auto decomposed attention-op blocked blocked-plain contrib-mha contrib-gqa}
variant() {  # name, export flags, check flags
  local f=$1 name=$2 xflags=$3 cflags=$4
  if $TO 60 $MX onnx --heads 12 --dim 768 --kv-heads ${KV_HEADS:-12} --attention $f $xflags -o "$R/m/$name" --no-check --force > "$R/export-$name.txt" 2>&1; then
    $TO 150 $MX check "$R/m/$name" $cflags --require-cuda --json "$R/parity-$name.json" > "$R/check-$name.txt" 2>&1; echo "rc=$?" >> "$R/check-$name.txt"
  fi
}
parity() {
  local f=$1
  variant $f $f "" "--providers cpu,cuda"
  variant $f $f-notf32 "" "--providers cuda --no-tf32"
  variant $f $f-fp16 "--dtype float16" "--providers cpu,cuda"
  variant $f $f-kv "--kv-cache" "--providers cuda"
  variant $f $f-static "--static-cache" "--providers cuda"
  variant $f $f-static-fp16 "--static-cache --dtype float16" "--providers cuda"
}
export R MX TO KV_HEADS; export -f parity variant; pids=()
for f in $FORMS; do timeout -k 5 ${FORM_LIMIT:-300} bash -c "parity $f" & pids+=($!); done
NX=""; python3 -c "import xdist" 2>/dev/null && NX="-n 6"
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider $NX tests/test_parity.py tests/test_runners.py \
  tests/test_static_cache.py tests/test_cli.py::test_require_cuda_without_gpu_exits_1 \
  tests/test_quantized.py::test_the_fp32_compute_twin_accompanies_ort_cpu_only > "$R/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$R/pytest.txt"; tail -4 "$R/pytest.txt"
wait "${pids[@]}"
echo "parity+pytest done at $((SECONDS-T0)) s"
for f in "$R"/check-*.txt; do echo "== $(basename $f)"; grep -E "ort-cuda|PASS|FAIL|rc=" "$f" | head -6; done
unset OMP_NUM_THREADS
pack

# 2. bench (alone on the machine): prefill on ORT CUDA vs torch CUDA SDPA (fp32/fp16)
left=$((${BENCH_END:-470} - (SECONDS-T0)))
bt=$(( left > 200 ? 180 : left ))
echo "bench timeout $bt s"
BF=""; [ -n "${BENCH_FORMS:-}" ] && BF="--forms $BENCH_FORMS"
timeout -k 5 $bt $MX bench --providers cuda --seq-lens ${BENCH_SEQ:-128,4096} $BF --threads 8 --budget 0.3 \
  --mem-limit-gib 4096 --json "$R/bench-cuda.json" 2>&1 | tee "$R/bench.txt"; echo "bench rc=$?" | tee -a "$R/bench.txt"
[ -f "$R/bench-cuda.json" ] && $TO 30 $MX bench --from-json "$R/bench-cuda.json" --markdown > "$R/bench.md" 2>&1
pack
echo "total $((SECONDS-T0)) s"; ls -la "$OUT"
