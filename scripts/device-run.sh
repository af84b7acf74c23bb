#!/usr/bin/env bash
# Runs the bundle of scripts/device-bundle.sh on another x86-64 host (from the repository root):
# every Rust test at every SIMD level that host supports, the Python tests (torch's too, where
# torch is installed), and a short benchmark of each level. Writes logs to $OUT (or .device/out).
set -uo pipefail
OUT=${OUT:-.device/out}
mkdir -p "$OUT"
# The test executables read files through the manifest directory they were built in.
built=$(sed -n 's/^manifest dir: //p' .device/manifest)
if [ "$built" != "$PWD" ] && [ ! -e "$built" ]; then mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"; fi
export TOKENRACE_LIB_DIR=$PWD/.device/lib TOKENRACE_LIBRARY=$PWD/.device/lib/libtokenrace.so
lscpu | grep -E "Model name|^CPU\(s\)" > "$OUT/cpu.txt"; grep -o -w 'avx512[a-z]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> "$OUT/cpu.txt"
status=0
for t in .device/bin/*; do
  name=$(basename "$t")
  # The header test reads the build's OUT_DIR. (The benchmark's own tests, in bench/, are not
  # bundled: the benchmark runs below.)
  "$t" --test-threads 8 --skip committed_header_is_current > "$OUT/rust-$name.log" 2>&1 || status=1
  echo "$name: $(grep -E '^test result' "$OUT/rust-$name.log" | tail -1)"
done
.device/bin/draw levels_exercised --nocapture 2>&1 | grep '^simd levels'
python3 -m pytest -q tests/python > "$OUT/pytest.log" 2>&1 || status=1
tail -n 3 "$OUT/pytest.log"
for simd in avx512 avx2 portable; do
  TOKENRACE_SIMD=$simd .device/tokenrace-bench --vocab 151936 --rows 1,32 --dtype f32 --threads 1 --placement hot \
    --profile peaked,flat --path greedy,race-inline,step,step-penalties,step-bitmask --reps 15 \
    --json "$OUT/bench-$simd.json" > "$OUT/bench-$simd.txt" 2>&1 || status=1
done
# Speculative verification: verifying 32 requests x 4 drafts against a plain draw of the 160 rows, per level.
for simd in avx512 avx2 portable; do
  TOKENRACE_SIMD=$simd .device/tokenrace-bench --verify --profile peaked,flat --threads 1,16 --reps 15 \
    --json "$OUT/verify-$simd.json" > "$OUT/verify-$simd.txt" 2>&1 || status=1
done
for t in 1 16; do
  PYTHONPATH=bindings/python python3 bench/compare.py --verify --threads $t \
    --verify-json "$OUT/verify-torch-$t.json" > "$OUT/verify-torch-$t.txt" 2>&1 || status=1
done
# The fused sampling step against vLLM's torch CPU path for the same step, 1 and 16 threads.
for t in 1 16; do
  PYTHONPATH=bindings/python python3 bench/compare.py --step --threads $t \
    --step-json "$OUT/step-$t.json" > "$OUT/step-$t.txt" 2>&1 || status=1
done
exit $status
