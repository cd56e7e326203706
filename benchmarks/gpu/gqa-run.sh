#!/usr/bin/env bash
# contrib-gqa and auto's static cache on CUDA after the shape-only total (run from the repo root).
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/m
cd .gpu/src; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
MX="python3 -m mha_export"; echo "commit $(cat COMMIT)"
v() { local name=$1 x=$2 p=$3
  timeout 60 $MX onnx --heads 12 --dim 768 --kv-heads 4 $x -o $R/m/$name --no-check --force > $R/export-$name.txt 2>&1 &&
  timeout 170 $MX check $R/m/$name --providers $p --require-cuda --json $R/parity-$name.json > $R/check-$name.txt 2>&1; echo "rc=$?" >> $R/check-$name.txt; }
export -f v; export R MX
pids=()
bash -c "v gqa-fp16 '--attention contrib-gqa --dtype float16' cpu,cuda" & pids+=($!)
bash -c "v gqa-static-fp16 '--attention contrib-gqa --static-cache --dtype float16' cpu,cuda" & pids+=($!)
bash -c "v auto-static-fp16 '--attention auto --static-cache --dtype float16' cpu,cuda" & pids+=($!)
bash -c "v gqa-static-int8-fp16 '--attention contrib-gqa --static-cache --dtype float16 --kv-cache-dtype int8' cuda" & pids+=($!)
bash -c "v gqa-fp32 '--attention contrib-gqa' cuda" & pids+=($!)
bash -c "v auto-static-fp32 '--attention auto --static-cache' cuda" & pids+=($!)
timeout 100 python3 ../probe_gqa.py cuda > $R/probe.txt 2>&1
wait "${pids[@]}"
for f in $R/check-*.txt; do echo "== $(basename $f)"; grep -vE "^\S*20[0-9][0-9]-" $f | grep -E "^(ort-cuda|PASS|FAIL|rc=)" | head -8 | cut -c1-260; done
grep -v "^\S*20[0-9][0-9]-" $R/probe.txt | cut -c1-200
tar -czf $OUT/gqa-results.tgz -C $R --exclude=./m .
