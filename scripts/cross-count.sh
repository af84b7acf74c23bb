#!/usr/bin/env bash
# Counts the instructions tokenrace executes per logit on s390x, aarch64 and ppc64le, under
# qemu-user with the plugin scripts/cross/insncount.c, and prints the table of
# docs/performance.md ("Other architectures"). These are instruction counts under emulation,
# not time: they show whether a loop vectorises and how many instructions a value costs, and
# compare levels and targets, but a count says nothing of latencies, memory or a real CPU's width.
#
# Workloads (scripts/cross/count_driver.c, through the C API, one thread): greedy, the race,
# top-p 0.9, top-k 50 (ROWS x VOCAB peaked f32 rows, CALLS draws, inline seeded noise), the race
# on flat rows, top-p 0.9 with the kept-set outputs (threshold, count, mass, bitmask: the
# kept_scan kernel), and the noise pool's E and ln E (POOL_ROWS x VOCAB values, at the best level
# of the CPU: the pool always runs there). Only instructions inside libtokenrace count; each is divided by
# the run's logits (or noise values).
#
# Usage: scripts/cross-count.sh [--if-available] [TARGET...]   (default: s390x aarch64 x86_64;
#   x86_64 is this host's release build under qemu-x86_64 -cpu max: the AVX2 yardstick)
# Env: COUNT_ROWS (64), COUNT_VOCAB (151936), COUNT_CALLS (2), COUNT_POOL_ROWS (16),
#      COUNT_SPECS_<target> (override the "CPU:LEVEL ..." list below), COUNT_TOP (functions to
#      show per run, default 0). Toolchains: see scripts/cross/lib.sh.
set -euo pipefail
. "$(dirname "$0")/cross/lib.sh"
cd "$ROOT"
IF_AVAILABLE=0 TARGETS=()
for a in "$@"; do
  case $a in
    --if-available) IF_AVAILABLE=1 ;;
    s390x | aarch64 | ppc64le | x86_64) TARGETS+=("$a") ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cross-count: unknown argument $a (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(s390x aarch64 x86_64)
ROWS=${COUNT_ROWS:-64} VOCAB=${COUNT_VOCAB:-151936} CALLS=${COUNT_CALLS:-2} POOL_ROWS=${COUNT_POOL_ROWS:-16}
TOP=${COUNT_TOP:-0}

# CPU:LEVEL of each line of the table (auto: the level the CPU's detection picks).
specs_of() {
  local v="COUNT_SPECS_$1"
  if [ -n "${!v:-}" ]; then echo "${!v}"; return; fi
  case $1 in
    s390x) echo "max:scalar max:portable max:vxe2 max,vxeh2=off:auto" ;;
    aarch64) echo "max:scalar max:portable max:neon" ;;
    ppc64le) echo "power10:scalar power10:portable" ;;
    x86_64) echo "max:avx2" ;;
  esac
}

OUT="$ROOT/target/cross/count"
mkdir -p "$OUT"
cc -O2 -Wall -Wextra -shared -fPIC -o "$OUT/insncount.so" scripts/cross/insncount.c
any=0
echo "| target, qemu CPU, level | greedy | race | top-p 0.9 | top-k 50 | race, flat rows | top-p 0.9 + kept set | pool E / value | pool ln E / value |"
echo "|---|---|---|---|---|---|---|---|---|"
for t in "${TARGETS[@]}"; do
  if [ "$t" = x86_64 ]; then
    command -v qemu-x86_64 >/dev/null 2>&1 || { echo "cross-count: x86_64 skipped: qemu-x86_64 is not installed" >&2; continue; }
    nice -n "${CROSS_NICE:-10}" cargo build --release --lib >&2
    lib="$ROOT/target/release" CC=cc NM=nm SYSROOT=()
    so=$(readelf -d "$lib/libtokenrace.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ -z "$so" ] || ln -sf libtokenrace.so "$lib/$so"
  else
    why=$(missing_for "$t")
    if [ -n "$why" ]; then echo "cross-count: $t skipped: $why" >&2; continue; fi
    g=$(gnu_of "$t")
    lib=$(cross_build_lib "$t") CC=$g-gcc NM=$g-nm SYSROOT=(-L "/usr/$g")
  fi
  any=1
  "$CC" -O2 -Wall -Wextra -Werror -Iinclude scripts/cross/count_driver.c -L"$lib" -ltokenrace -o "$OUT/count_driver-$t"
  # One counted run: prints the library's instructions per value; sets LEVEL_GOT.
  run_one() {
    local cpu=$1 level=$2 w=$3 rows=$4 calls=$5 stem
    stem="$OUT/$t-${cpu//,/_}-$level-$w" # no comma: qemu splits -plugin's options at commas
    "qemu-$t" -cpu "$cpu" "${SYSROOT[@]}" -E LD_LIBRARY_PATH="$lib" -plugin "$OUT/insncount.so,out=$stem.counts" \
      "$OUT/count_driver-$t" "$level" "$w" "$rows" "$VOCAB" "$calls" >"$stem.out" 2>"$stem.err" ||
      { echo "cross-count: $t -cpu $cpu $level $w failed: $(head -c 300 "$stem.err")" >&2; return 1; }
    python3 scripts/cross/attribute.py "$stem.counts" "$lib/libtokenrace.so" "$NM" "$(sed -n 's/^base 0x//p' "$stem.out")" \
      "$(sed -n 's/^values //p' "$stem.out")" "$TOP" >"$stem.attr"
    LEVEL_GOT=$(sed -n 's/^level //p' "$stem.out")
    [ "$TOP" = 0 ] || sed -n '2,$p' "$stem.attr" | sed "s/^/    $t $cpu $LEVEL_GOT $w: /" >&2
    sed -n 's/^lib //p' "$stem.attr"
  }
  # The pool of each CPU (at its best level), shown on the line of that level.
  declare -A pool_level=() pool_cells=()
  for spec in $(specs_of "$t"); do
    cpu=${spec%%:*}
    [ -z "${pool_level[$cpu]:-}" ] || continue
    e=$(run_one "$cpu" auto poolexp "$POOL_ROWS" 1)
    pool_level[$cpu]=$(sed -n 's/^level //p' "$OUT/$t-${cpu//,/_}-auto-poolexp.out")
    l=$(run_one "$cpu" auto poollog "$POOL_ROWS" 1)
    pool_cells[$cpu]="$e | $l"
  done
  for spec in $(specs_of "$t"); do
    cpu=${spec%%:*} level=${spec#*:}
    cells=()
    for w in greedy race topp topk flat kept; do
      cells+=("$(run_one "$cpu" "$level" "$w" "$ROWS" "$CALLS")")
    done
    got=$(sed -n 's/^level //p' "$OUT/$t-${cpu//,/_}-$level-greedy.out")
    pool=" | "
    if [ "${pool_level[$cpu]}" = "$got" ]; then pool=${pool_cells[$cpu]}; pool_level[$cpu]=shown; fi
    echo "| $t, $cpu, $got$([ "$level" = auto ] && echo " (auto)") | ${cells[0]} | ${cells[1]} | ${cells[2]} | ${cells[3]} | ${cells[4]} | ${cells[5]} | $pool |"
  done
done
if [ "$any" = 0 ]; then
  [ "$IF_AVAILABLE" = 1 ] && { echo "cross-count: skipped: no target can be built here"; exit 0; }
  exit 1
fi
echo "(instructions executed inside libtokenrace per logit, per noise value for the pool, under qemu-user: counts, not time; rows $ROWS x vocab $VOCAB x $CALLS calls, pool $POOL_ROWS rows)"
