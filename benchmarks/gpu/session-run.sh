#!/usr/bin/env bash
# One device call (2026-11-27, issue 48): parity of the bf16 and CUDA-graph paths on the GPU,
# the product's own bench of the 8B step, then benchmarks/gpu/speed.py, all under one budget.
# Set-up as for run-speed.sh (the ORT-GPU pieces already in /tmp/ortgpu, .gpu/ carried: the
# snapshot in .gpu/src, these scripts beside it). Results: $OUT/*.json|md|txt + session.tgz.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d); mkdir -p "$R/m"
exec > >(tee -a "$OUT/session.log") 2>&1
wheel=/tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
[ -n "${SKIP_INSTALL:-}" ] || { cat /tmp/ortgpu/part.* > "$wheel" && python3 -m pip install -q \
  --no-index --no-deps --target /tmp/site "$wheel"; } || { echo "install failed"; ls -la /tmp/ortgpu; exit 3; }
echo "installed at $((SECONDS - T0)) s"
cd .gpu/src
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
MX="python3 -m mha_export"
pack() { tar -czf "$OUT/session.tgz" -C "$R" --exclude='./m' . ; echo "packed at $((SECONDS-T0)) s"; }
TO="timeout -k 5"
echo "commit $(cat COMMIT)"; date -u
$TO 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

# 1. CUDA tests: the replayed graph passes and a stale replay fails (fp16, fp32); bf16 on CUDA
$TO 120 python3 -m pytest -q -p no:cacheprovider -rs tests/test_static_cache.py -k "replayed or refuses" \
  ${BF16_TESTS:-} > "$R/pytest.txt" 2>&1; echo "pytest rc=$?" >> "$R/pytest.txt"; tail -6 "$R/pytest.txt"
pack

# 2. the CLI's check on a 12 x 768 static step in fp16 and bf16: ort-cuda and the replayed graph
for dt in float16 bfloat16; do
  $TO 60 $MX onnx --heads 12 --dim 768 --kv-heads 4 --rotary half --static-cache --dtype $dt \
    -o "$R/m/static-$dt" --no-check > "$R/export-$dt.txt" 2>&1 || { tail -2 "$R/export-$dt.txt"; continue; }
  $TO 90 $MX check "$R/m/static-$dt" --runners ort-cuda,ort-cuda-graph --require-cuda \
    --seq-lens 1,7,64 --batch-sizes 1,3 --past-lens 0,100 --json "$R/check-static-$dt.json" \
    > "$R/check-static-$dt.txt" 2>&1; echo "rc=$?" >> "$R/check-static-$dt.txt"
  grep -E "ort-cuda|PASS|FAIL|rc=" "$R/check-static-$dt.txt" | head -8
done
pack

# 3. the product's bench: the 8B static step, fp16, device-resident, with and without a graph
$TO 120 $MX bench --preset llama3-8b --static-cache --seq-lens 1 --past-lens 1024,8192 \
  --capacity 8200 --providers cuda --dtype float16 --cuda-graph --forms auto,contrib-gqa \
  --threads 8 --budget 0.3 --json "$R/bench-8b-static-fp16.json" > "$R/bench.txt" 2>&1
echo "bench rc=$?" >> "$R/bench.txt"; tail -16 "$R/bench.txt"
pack

# 4. speed.py with what is left (the call must end inside 9.5 minutes)
left=$(( 515 - (SECONDS - T0) )); budget=$(( left > 320 ? 290 : left - 30 ))
echo "speed.py budget $budget s"
if [ "$budget" -gt 60 ]; then
  $TO $((budget + 40)) python3 benchmarks/gpu/speed.py --out "$R/speed" --budget "$budget" \
    > "$R/speed.log" 2>&1; echo "speed rc=$?" >> "$R/speed.log"; tail -30 "$R/speed.log"
  for f in gpu-speed.json gpu-speed.md gpu-speed.txt; do [ -f "$R/speed/$f" ] && cp "$R/speed/$f" "$OUT/"; done
fi
for f in check-static-float16.json check-static-bfloat16.json bench-8b-static-fp16.json; do
  [ -f "$R/$f" ] && cp "$R/$f" "$OUT/"; done
pack
echo "total $((SECONDS - T0)) s"; ls -la "$OUT"
