#!/usr/bin/env bash
# The second device call of 2026-11-27 (issue 48), after session-run.sh showed every graph
# capture refused (the auto form's If, shape computations on the CPU) and bf16 sessions failing
# on Pad: the replayed graph (sessions with fixed dimensions) checked and benched, bf16 on
# CUDA checked. Set-up as for session-run.sh. Results: $OUT/*.json|txt + graph.tgz.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d); mkdir -p "$R/m"
exec > >(tee -a "$OUT/graph.log") 2>&1
wheel=/tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
[ -n "${SKIP_INSTALL:-}" ] || { cat /tmp/ortgpu/part.* > "$wheel" && python3 -m pip install -q \
  --no-index --no-deps --target /tmp/site "$wheel"; } || { echo "install failed"; exit 3; }
cd .gpu/src
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
MX="python3 -m mha_export"
pack() { tar -czf "$OUT/graph.tgz" -C "$R" --exclude='./m' . ; echo "packed at $((SECONDS-T0)) s"; }
TO="timeout -k 5"
echo "commit $(cat COMMIT)"; date -u

$TO 90 python3 -m pytest -q -p no:cacheprovider -rs tests/test_static_cache.py -k "replayed" \
  > "$R/pytest.txt" 2>&1; echo "pytest rc=$?" >> "$R/pytest.txt"
grep -E "passed|failed|Error|assert" "$R/pytest.txt" | head -12
pack

for dt in float16 bfloat16; do
  for form in auto blocked; do
    $TO 60 $MX onnx --heads 12 --dim 768 --kv-heads 4 --rotary half --static-cache --dtype $dt \
      --attention $form -o "$R/m/static-$form-$dt" --no-check > "$R/export-$form-$dt.txt" 2>&1 || continue
    runners=ort-cuda; [ $form = auto ] && runners=ort-cuda,ort-cuda-graph
    $TO 75 $MX check "$R/m/static-$form-$dt" --runners $runners --require-cuda \
      --seq-lens 1,7,64 --batch-sizes 1,3 --past-lens 0,100 --json "$R/check-$form-$dt.json" \
      > "$R/check-$form-$dt.txt" 2>&1; echo "rc=$?" >> "$R/check-$form-$dt.txt"
    echo "== $form $dt"; grep -E "^ort-cuda|^(PASS|FAIL)|rc=" "$R/check-$form-$dt.txt" | head -6
  done
done
pack

for dt in float16 bfloat16; do
  q=""; [ $dt = float16 ] && q="--quantize int4"
  $TO 150 $MX bench --preset llama3-8b --static-cache --seq-lens 1 --past-lens 1024,8192 \
    --capacity 8200 --providers cuda --dtype $dt --cuda-graph --forms auto $q \
    --threads 8 --budget 0.3 --json "$R/bench-graph-$dt.json" > "$R/bench-$dt.txt" 2>&1
  echo "bench $dt rc=$?" >> "$R/bench-$dt.txt"; grep -vE "^\[" "$R/bench-$dt.txt" | tail -14
  [ -f "$R/bench-graph-$dt.json" ] && cp "$R/bench-graph-$dt.json" "$OUT/"
  pack
done
for f in check-auto-float16.json check-auto-bfloat16.json; do [ -f "$R/$f" ] && cp "$R/$f" "$OUT/"; done
echo "total $((SECONDS - T0)) s"; ls -la "$OUT"
