#!/usr/bin/env bash
# Cross-checks tokenrace on s390x (big-endian IBM Z), aarch64 and ppc64le under qemu-user:
#   1. builds the release library for each target (and for x86-64, the reference);
#   2. runs c_tests/seeded_dump.c (seeded draws, filters, logprobs, the sampling step, verify;
#      f32, bf16, f16) at every level of every target on each qemu CPU of scripts/cross/lib.sh
#      (one per branch of the run-time detection: s390x with and without vector-enhancements-2
#      and without any vector facility; aarch64 max and cortex-a72), 1 and 4 threads, and compares
#      each dump byte for byte with x86-64's: a level the CPU lacks must be refused (exit 2),
#      every other dump must be identical; it also prints the level `auto` picks on each CPU;
#   3. with --tests lib|full, runs the unit tests (lib) or also the draw integration test (full)
#      under qemu, on the first CPU of each target.
#
# Usage: scripts/cross-check.sh [--if-available] [--install] [--tests none|lib|full] [TARGET...]
#   TARGET        s390x, aarch64, ppc64le (default: all three; a target whose toolchain is
#                 missing is reported as skipped)
#   --if-available  exit 0 with "skipped: <reason>" when no target can be built (for CI)
#   --install     first install what is missing (Debian 12 x86-64, root or sudo): the cross gcc
#                 and C library and qemu-user from bookworm, and Debian's rustc 1.96 with the
#                 targets' standard libraries unpacked (not installed) under target/cross-tools
#   --tests       which tests to run under qemu (default none; lib takes 15-30 minutes a target
#                 on 2 cores, most of it the build)
# Env: CROSS_THREADS (the thread counts of each dump, default "1 4"), CROSS_CPUS_<target> (the
#      "CPU:LEVEL ..." list of scripts/cross/lib.sh's cpus_of, e.g. CROSS_CPUS_s390x=max:vxe2 for
#      a shorter run on a loaded machine: every level of that one CPU).
# Exits non-zero on any failure or difference; the last line is a summary.
set -euo pipefail
. "$(dirname "$0")/cross/lib.sh"
cd "$ROOT"

IF_AVAILABLE=0 INSTALL=0 TESTS=none TARGETS=()
while [ $# -gt 0 ]; do
  case $1 in
    --if-available) IF_AVAILABLE=1 ;;
    --install) INSTALL=1 ;;
    --tests) TESTS=$2; shift ;;
    s390x | aarch64 | ppc64le) TARGETS+=("$1") ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cross-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(s390x aarch64 ppc64le)
START=$(date +%s)
log() { echo "cross-check [$(( ($(date +%s) - START) / 60 ))m$(( ($(date +%s) - START) % 60 ))s]: $*"; }

if [ "$INSTALL" = 1 ]; then
  "$(dirname "$0")/cross/install.sh" "${TARGETS[@]}"
fi

ready=()
for t in "${TARGETS[@]}"; do
  why=$(missing_for "$t")
  if [ -n "$why" ]; then log "$t: skipped: $why"; else ready+=("$t"); fi
done
if [ ${#ready[@]} -eq 0 ]; then
  if [ "$IF_AVAILABLE" = 1 ]; then echo "cross-check: skipped: no target can be built here"; exit 0; fi
  echo "cross-check: no target can be built here (see --install)" >&2
  exit 1
fi

OUT="$ROOT/target/cross"
DUMPS="$OUT/dumps"
rm -rf "$DUMPS"
mkdir -p "$DUMPS"
CFLAGS=(-O2 -Wall -Wextra -Werror -ffp-contract=off -Iinclude)

log "x86-64: cargo build --release --lib"
nice -n "${CROSS_NICE:-10}" cargo build --release --lib
so=$(readelf -d target/release/libtokenrace.so | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -z "$so" ] || ln -sf libtokenrace.so "target/release/$so"
cc "${CFLAGS[@]}" c_tests/seeded_dump.c -Ltarget/release -ltokenrace -o "$OUT/seeded_dump-x86_64"
REF=""
runs=() refused=() differ=() failed=()
THREADS=${CROSS_THREADS:-1 4}
for level in scalar portable avx2 avx512; do
  for threads in $THREADS; do
    f="$DUMPS/x86_64-$level-$threads.txt"
    rc=0
    LD_LIBRARY_PATH="$ROOT/target/release" "$OUT/seeded_dump-x86_64" "$level" "$threads" >"$f" 2>"$f.err" || rc=$?
    if [ $rc -eq 2 ]; then refused+=("x86_64/$level"); continue; fi
    [ $rc -eq 0 ] || { failed+=("x86_64/$level/$threads"); continue; }
    [ -n "$REF" ] || REF=$f
    cmp -s "$REF" "$f" || differ+=("x86_64/$level/$threads")
    runs+=("x86_64/$level/$threads")
  done
done
log "x86-64 reference: $(tail -1 "$REF")"

summary=()
for t in "${ready[@]}"; do
  g=$(gnu_of "$t")
  log "$t: cargo build --release --lib --target $(triple_of "$t") ($(rc=$(rustc_for "$t"); LD_LIBRARY_PATH="$(dirname "$(dirname "$rc")")/lib/x86_64-linux-gnu" "$rc" --version 2>/dev/null || true))"
  lib=$(cross_build_lib "$t")
  "$g-gcc" "${CFLAGS[@]}" c_tests/seeded_dump.c -L"$lib" -ltokenrace -o "$OUT/seeded_dump-$t"
  "$g-gcc" "${CFLAGS[@]}" scripts/cross/count_driver.c -L"$lib" -ltokenrace -o "$OUT/count_driver-$t"
  cpus_var="CROSS_CPUS_$t"
  for spec in ${!cpus_var:-$(cpus_of "$t")}; do
    cpu=${spec%%:*} want=${spec#*:}
    q=("$(qemu_of "$t")" -cpu "$cpu" -L "/usr/$g" -E LD_LIBRARY_PATH="$lib")
    auto=$("${q[@]}" "$OUT/count_driver-$t" auto greedy 2 4096 1 | sed -n 's/^level //p')
    for level in $(levels_of "$t"); do
      for threads in $THREADS; do
        f="$DUMPS/$t-$cpu-$level-$threads.txt"
        rc=0
        "${q[@]}" "$OUT/seeded_dump-$t" "$level" "$threads" >"$f" 2>"$f.err" || rc=$?
        if [ $rc -eq 2 ]; then refused+=("$t/$cpu/$level"); break; fi
        [ $rc -eq 0 ] || { failed+=("$t/$cpu/$level/$threads: $(head -c 200 "$f.err")"); continue; }
        if cmp -s "$REF" "$f"; then runs+=("$t/$cpu/$level/$threads"); else differ+=("$t/$cpu/$level/$threads"); fi
      done
    done
    # The level auto picks on this CPU.
    if [ "$auto" = "$want" ]; then auto_note="auto picks $auto"; else auto_note="auto picks $auto, not $want"; failed+=("$t -cpu $cpu: $auto_note"); fi
    log "$t -cpu $cpu: $auto_note"
    summary+=("$t -cpu $cpu: $auto_note")
  done
  if [ "$TESTS" != none ]; then
    tests=(--lib)
    [ "$TESTS" = full ] && tests+=(--test draw)
    log "$t: cargo test ${tests[*]} under qemu -cpu $(cpus_of "$t" | awk '{print $1}' | cut -d: -f1)"
    if cross_cargo "$t" test --target "$(triple_of "$t")" "${tests[@]}" 2>&1 | tee "$OUT/$t-test.log" | grep -E "^test result|FAILED|panicked"; then :; fi
    if grep -q "test result: FAILED\|error\[" "$OUT/$t-test.log" || ! grep -q "test result: ok" "$OUT/$t-test.log"; then
      failed+=("$t tests (see $OUT/$t-test.log)")
    else
      summary+=("$t tests: $(grep -o 'test result: ok\. [0-9]* passed' "$OUT/$t-test.log" | awk '{s += $4} END {print s}') passed")
    fi
  fi
done

for s in "${summary[@]}"; do echo "  $s"; done
[ ${#refused[@]} -eq 0 ] || echo "  refused (level not on that CPU): ${refused[*]}"
for d in "${differ[@]}"; do
  echo "cross-check: DIFFERS from x86-64: $d"
done
for f in "${failed[@]}"; do echo "cross-check: FAILED: $f"; done
if [ ${#differ[@]} -gt 0 ] || [ ${#failed[@]} -gt 0 ]; then exit 1; fi
echo "cross-check: OK in $(( ($(date +%s) - START) / 60 )) min: seeded dump ($(tail -1 "$REF")) byte-identical over ${#runs[@]} runs: ${runs[*]}"
