#!/usr/bin/env bash
# The multi-core and peer measurements of docs/performance.md, on a host with many cores and
# torch (run through the device tool with target/release carried; results go to $OUT).
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
BENCH=target/release/tokenrace-bench   # cargo build --release -p tokenrace-bench
export TOKENRACE_LIBRARY=$PWD/target/release/libtokenrace.so
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200 > "$OUT/cpu.txt"
# Scaling: 256 rows and 1 row of a large vocabulary, 1..16 threads, hot.
$BENCH --vocab 163840 --rows 256 --dtype f32 --profile peaked --placement hot \
  --threads 1,2,4,8,16 --path greedy,race-inline,race-external-logexp --reps 15 --json "$OUT/scaling.json" > "$OUT/scaling.txt" 2>&1
$BENCH --vocab 262144 --rows 1 --dtype f32 --profile peaked --placement hot \
  --threads 1,2,4,8,16 --path greedy,race-inline --reps 50 --json "$OUT/one-row.json" >> "$OUT/scaling.txt" 2>&1
# Against numpy and torch on the same inputs, 2 and 16 threads.
for t in 2 16; do
  python3 bench/compare.py --threads $t --rows 1,8,32,128,256 --vocab 163840 --reps 20 \
    --json "$OUT/compare-$t.json" > "$OUT/compare-$t.txt" 2>&1
done
tail -n 30 "$OUT"/scaling.txt "$OUT"/compare-*.txt
