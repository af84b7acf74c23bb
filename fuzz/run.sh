#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 600), one after another, then
# prints per target the executions, exec/s, coverage, new corpus units and any crash.
#
#   ./run.sh [SECONDS]     (0: build only)
#
# Environment:
#   FUZZ_NO_BUILD=1     use the binaries already in FUZZ_BIN_DIR (e.g. copied from another machine;
#                       a NAME.gz there is unpacked to NAME first)
#   FUZZ_BIN_DIR=DIR    where the binaries are (default target/x86_64-unknown-linux-gnu/release)
#   FUZZ_TARGETS="..."  which targets (default: draw_c_abi verify_c_abi step_state_c_abi config_env pool_sequence)
#   FUZZ_FORK=N         run each target as N libFuzzer processes (-fork=N; crashes do not stop it)
#   FUZZ_PARALLEL=1     run every target at once (else one after another)
#   FUZZ_OUT=DIR        also copy the summary, each log's tail and final stats, and the crash
#                       inputs into DIR (for a run on another machine)
#   FUZZ_ARGS="..."     more libFuzzer flags
# Needs nightly and cargo-fuzz to build (`cargo install cargo-fuzz --locked`); running the
# built binaries needs neither. Results: corpus/<target>/, artifacts/<target>/ (crashes),
# logs/<target>.log; see README.md.
set -euo pipefail
cd "$(dirname "$0")"

SECS=${1:-600}
TARGETS=${FUZZ_TARGETS:-"draw_c_abi verify_c_abi step_state_c_abi config_env pool_sequence"}
BIN_DIR=${FUZZ_BIN_DIR:-target/x86_64-unknown-linux-gnu/release}
FORK=${FUZZ_FORK:-0}

if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  # The C++ runtime of libFuzzer linked statically (the ASan runtime always is), so that the
  # binaries run on another x86-64 Linux without a compiler installed.
  libstdcxx=$(g++ -print-file-name=libstdc++.a 2>/dev/null || true)
  if [ -n "$libstdcxx" ] && [ -f "$libstdcxx" ]; then
    export CXXSTDLIB_STATIC=1
    export RUSTFLAGS="${RUSTFLAGS:-} -L native=$(dirname "$libstdcxx")"
  else
    echo "run.sh: no libstdc++.a found: the binaries will need libstdc++.so.6 where they run" >&2
  fi
  # Release optimisations with debug assertions and overflow checks (cargo-fuzz's default).
  cargo +nightly fuzz build --release --debug-assertions
  echo "== shared libraries of the built targets (ldd):"
  for t in $TARGETS; do
    echo "-- $t"
    ldd "$BIN_DIR/$t" | sed 's/^/   /'
  done
fi

if [ "${FUZZ_NO_BUILD:-0}" = 1 ]; then
  for t in $TARGETS; do
    if [ ! -x "$BIN_DIR/$t" ] && [ -f "$BIN_DIR/$t.gz" ]; then
      gunzip -c "$BIN_DIR/$t.gz" >"$BIN_DIR/$t" && chmod +x "$BIN_DIR/$t"
    fi
  done
fi

if [ "$SECS" = 0 ]; then
  exit 0 # build only (libFuzzer's -max_total_time=0 would mean no limit)
fi

mkdir -p logs
# One target: libFuzzer for SECS seconds into logs/<target>.log.
fuzz_one() {
  local t=$1
  local bin="$BIN_DIR/$t"
  mkdir -p "corpus/$t" "artifacts/$t"
  local args=(-max_total_time="$SECS" -print_final_stats=1 -timeout=60 -rss_limit_mb=4096
        -artifact_prefix="artifacts/$t/")
  if [ "$FORK" -gt 0 ]; then
    args+=(-fork="$FORK" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  # shellcheck disable=SC2206
  args+=(${FUZZ_ARGS:-})
  echo "== $t: ${SECS}s ($bin ${args[*]} corpus/$t)"
  local rc=0
  # A hard stop a little after SECS (-fork loads its seed corpus before its clock starts;
  # SIGINT 10 s after, on which libFuzzer prints its stats and exits, SIGKILL 5 s later).
  local stop=()
  if command -v timeout >/dev/null; then stop=(timeout -s INT -k 5 $((SECS + 10))); fi
  "${stop[@]}" "$bin" "${args[@]}" "corpus/$t" >"logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"logs/$t.rc"
}

for t in $TARGETS; do
  [ -x "$BIN_DIR/$t" ] || { echo "run.sh: $BIN_DIR/$t is missing (build first)" >&2; exit 2; }
done
if [ "${FUZZ_PARALLEL:-0}" = 1 ]; then
  # Every target at once (e.g. 4 targets x FUZZ_FORK=4 on 16 cores).
  for t in $TARGETS; do fuzz_one "$t" & done
  wait
else
  for t in $TARGETS; do fuzz_one "$t"; done
fi

summary=()
failed=0
for t in $TARGETS; do
  bin="$BIN_DIR/$t"
  log="logs/$t.log"
  rc=$(cat "logs/$t.rc")
  # libFuzzer's own final numbers; the last status line (#N ... cov: ... ft: ...) as a fallback.
  # (`|| true`: with -fork libFuzzer prints no stat:: lines, and pipefail would end the script.)
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}' || true)
  rate=$(grep -o 'stat::average_exec_per_sec: [0-9]*' "$log" | tail -1 | awk '{print $2}' || true)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  [ -n "$execs" ] || execs=$(echo "$last" | sed -E 's/^#([0-9]+).*/\1/')
  [ -n "$rate" ] || rate=$(echo "$last" | grep -o 'exec/s: [0-9]*' | awk '{print $2}' || true)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}' || true)
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}' || true)
  units=$(find "corpus/$t" -type f | wc -l)
  crashes=$(find "artifacts/$t" -type f | wc -l)
  line="$t: rc $rc, executions ${execs:-?}, exec/s ${rate:-?}, cov ${cov:-?}, ft ${ft:-?}, corpus $units, artifacts $crashes"
  summary+=("$line")
  echo "$line"
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    failed=1
    echo "-- $t: crash report (from $log):"
    grep -E 'panicked at|ERROR: |SUMMARY: |deadly signal|Test unit written|timeout after|out-of-memory|the environment check failed|failed in the child' "$log" | head -20 | sed 's/^/   /' || true
    for a in "artifacts/$t"/*; do
      [ -f "$a" ] && echo "   reproduce: $bin $a"
    done
  fi
done

echo "== summary (${SECS}s per target; logs in $(pwd)/logs, crashes in $(pwd)/artifacts)"
printf '%s\n' "${summary[@]}"
if [ -n "${FUZZ_OUT:-}" ]; then
  # What comes back from another machine: the summary, each log's last lines and final stats,
  # the crash inputs.
  mkdir -p "$FUZZ_OUT"
  printf '%s\n' "${summary[@]}" >"$FUZZ_OUT/summary.txt"
  for t in $TARGETS; do
    mkdir -p "$FUZZ_OUT/$t"
    tail -n 60 "logs/$t.log" >"$FUZZ_OUT/$t/log-tail.txt"
    grep -E '^stat::|panicked at|ERROR: |SUMMARY: |failed in the child' "logs/$t.log" | head -200 >"$FUZZ_OUT/$t/stats.txt" || true
    cp -r "artifacts/$t" "$FUZZ_OUT/$t/artifacts"
  done
fi
exit "$failed"
