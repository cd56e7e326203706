#!/usr/bin/env bash
# The GPU speed questions in one call on a lent NVIDIA H200 (benchmarks/gpu/speed.py: decode
# step with and without CUDA graphs, prefill, int4, parity of what was timed). Set-up, here, as
# for cuda-run.sh: `bash ../shared/gpu/stage-ort-gpu.sh`; `mkdir -p .gpu/src && git archive HEAD
# | tar -x -C .gpu/src && git rev-parse --short HEAD > .gpu/src/COMMIT && cp benchmarks/gpu/*
# .gpu/`. There: carry each .ortgpu piece to /tmp/ortgpu, then in one call install the wheel
# into /tmp/site and run `bash .gpu/run-speed.sh` (carry .gpu). It runs the snapshot in .gpu/src
# (the tree it is started in when there is none). speed.py keeps to its own budget (350 s by
# default; --budget) and writes its JSON after every row; `timeout -k 5 420` bounds it anyway,
# so the whole call stays inside 7 minutes. Results: $OUT/gpu-speed.{json,md,txt} and
# $OUT/gpu-speed.tgz (those, the run log, the torch probe's log). Extra arguments go to speed.py
# (e.g. --sections ABG --budget 200).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d); D="$R/gpu-speed"; mkdir -p "$D"
[ -d .gpu/src ] && cd .gpu/src
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
  echo "commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"; date -u
  timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} > "$D/run.log" 2>&1
cat "$D/run.log"
timeout -k 5 420 python3 benchmarks/gpu/speed.py --out "$D" "$@" 2>&1 | tee -a "$D/run.log"
echo "speed.py rc=${PIPESTATUS[0]} at $((SECONDS - T0)) s" | tee -a "$D/run.log"
for f in gpu-speed.json gpu-speed.md gpu-speed.txt; do
  [ -f "$D/$f" ] && cp "$D/$f" "$OUT/"
done
tar -czf "$OUT/gpu-speed.tgz" -C "$R" gpu-speed
echo "packed at $((SECONDS - T0)) s"; ls -la "$OUT"
