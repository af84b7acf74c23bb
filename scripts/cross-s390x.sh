#!/usr/bin/env bash
# Builds tokenrace for s390x-unknown-linux-gnu (big-endian IBM Z, where the portable kernels are
# what runs), runs its tests under qemu-user, and checks that a C program's seeded draws and
# logprobs (c_tests/seeded_dump.c) are byte-identical on x86-64 (every level it has, 1 and 4
# threads) and on s390x (scalar and portable, 1 and 4 threads).
#
# Usage: scripts/cross-s390x.sh [--if-available] [--quick] [--no-tests]
#   --if-available  if the cross toolchain is not installed, print "skipped: <reason>" and exit 0
#                   (for CI) instead of installing it
#   --quick         under qemu, run the unit tests only (not the draw, filters, mass and reference
#                   integration tests, which take about 35 minutes there)
#   --no-tests      run no tests under qemu, only the seeded-draw comparison
#
# On a Debian 12 (bookworm) x86-64 host, as root or through sudo, it installs what is missing:
#   - from bookworm: gcc-s390x-linux-gnu, libc6-dev-s390x-cross, qemu-user-static;
#   - unpacked under $S390X_TOOLS (default target/s390x-tools), not installed: Debian's rustc
#     with its amd64 standard library and LLVM (bookworm-security), and the s390x standard
#     library of the same version from trixie, through an s390x-only apt source and a priority-1
#     pin that are removed again afterwards (as is the s390x dpkg architecture, if this added it).
# Builds use their own target directory, target/s390x, with debug info off (with it, LLVM takes
# tens of minutes per build). Each build takes about 10 minutes on 2 cores.
# Exits non-zero on any failure or difference; the last line is a summary.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

IF_AVAILABLE=0
TESTS=full
for arg in "$@"; do
  case "$arg" in
    --if-available) IF_AVAILABLE=1 ;;
    --quick) TESTS=lib ;;
    --no-tests) TESTS=none ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "cross-s390x: unknown option $arg (see --help)" >&2
      exit 2
      ;;
  esac
done

TARGET=s390x-unknown-linux-gnu
TOOLS="${S390X_TOOLS:-$ROOT/target/s390x-tools}"
OUT="$ROOT/target/s390x"
SYSROOT=/usr/s390x-linux-gnu
# The versions the recipe was run with; override if the archive has moved on.
RUST_DEB_VERSION="${S390X_RUST_DEB_VERSION:-1.96.0+dfsg1-1~deb12u2}"
RUST_LIB_SUFFIX="${S390X_RUST_LIB_SUFFIX:-1.96}"
LLVM_PACKAGE="${S390X_LLVM_PACKAGE:-libllvm22}"
LLVM_DEB_VERSION="${S390X_LLVM_DEB_VERSION:-1:22.1.8-1~deb12u1}"
STD_S390X_DEB_VERSION="${S390X_STD_DEB_VERSION:-1.96.0+dfsg1-1~deb13u1+b1}"
APT_SOURCE=/etc/apt/sources.list.d/tokenrace-s390x-trixie.sources
APT_PIN=/etc/apt/preferences.d/tokenrace-s390x-trixie

START=$(date +%s)
STEP="start"
elapsed() {
  local s=$(($(date +%s) - START))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}
log() { echo "cross-s390x [$(elapsed)]: $*"; }
on_exit() {
  local rc=$?
  cleanup_apt
  if [ "$rc" -ne 0 ]; then
    echo "cross-s390x: FAILED at step '$STEP' after $(elapsed) (exit $rc)"
  fi
}
trap on_exit EXIT

# --- What is missing ---------------------------------------------------------------------------

missing() {
  if [ "$(uname -m)" != x86_64 ]; then
    echo "this script cross-builds from x86-64 (this is $(uname -m))"
    return 0
  fi
  command -v s390x-linux-gnu-gcc >/dev/null 2>&1 || { echo "s390x-linux-gnu-gcc is not installed"; return 0; }
  [ -e "$SYSROOT/include/stdio.h" ] || { echo "the s390x C library (libc6-dev-s390x-cross) is not installed"; return 0; }
  command -v qemu-s390x-static >/dev/null 2>&1 || { echo "qemu-s390x-static is not installed"; return 0; }
  [ -x "$TOOLS/usr/bin/rustc" ] || { echo "no Debian rustc unpacked at $TOOLS"; return 0; }
  [ -d "$TOOLS/usr/lib/rustlib/$TARGET/lib" ] || { echo "no s390x standard library unpacked at $TOOLS"; return 0; }
  return 1
}

# --- Installing it -----------------------------------------------------------------------------

AS_ROOT=()
need_root() {
  if [ "$(id -u)" -eq 0 ]; then
    AS_ROOT=()
  elif command -v sudo >/dev/null 2>&1; then
    AS_ROOT=(sudo)
  else
    echo "cross-s390x: installing needs root (or sudo)" >&2
    exit 1
  fi
}

ADDED_ARCH=0
APT_CHANGED=0
cleanup_apt() {
  if [ "$APT_CHANGED" -eq 1 ]; then
    APT_CHANGED=0
    "${AS_ROOT[@]}" rm -f "$APT_SOURCE" "$APT_PIN"
    if [ "$ADDED_ARCH" -eq 1 ]; then
      "${AS_ROOT[@]}" dpkg --remove-architecture s390x || true
    fi
    # Drop the trixie lists again.
    "${AS_ROOT[@]}" apt-get update -qq || true
    log "removed the temporary trixie apt source and pin"
  fi
  if [ -n "${DL:-}" ] && [ -d "$DL" ]; then
    rm -rf "$DL"
  fi
}

unpack_all() {
  local deb
  for deb in "$DL"/*.deb; do
    dpkg -x "$deb" "$TOOLS"
  done
  rm -f "$DL"/*.deb
}

install_missing() {
  command -v apt-get >/dev/null 2>&1 || { echo "cross-s390x: needs a Debian host (apt-get)" >&2; exit 1; }
  need_root
  STEP="install"
  DL="$(mktemp -d /tmp/cross-s390x.XXXXXX)"
  # apt downloads as its sandbox user when it runs as root.
  if [ "$(id -u)" -eq 0 ]; then chown _apt "$DL" 2>/dev/null || true; fi
  local pkgs=()
  command -v s390x-linux-gnu-gcc >/dev/null 2>&1 || pkgs+=(gcc-s390x-linux-gnu)
  [ -e "$SYSROOT/include/stdio.h" ] || pkgs+=(libc6-dev-s390x-cross)
  command -v qemu-s390x-static >/dev/null 2>&1 || pkgs+=(qemu-user-static)
  log "apt-get update"
  "${AS_ROOT[@]}" apt-get update -qq
  if [ "${#pkgs[@]}" -gt 0 ]; then
    log "installing ${pkgs[*]}"
    "${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
  fi
  mkdir -p "$TOOLS"
  if [ ! -x "$TOOLS/usr/bin/rustc" ]; then
    log "unpacking rustc-web $RUST_DEB_VERSION and $LLVM_PACKAGE $LLVM_DEB_VERSION into $TOOLS"
    (cd "$DL" && apt-get download -qq "rustc-web=$RUST_DEB_VERSION" "libstd-rust-web-$RUST_LIB_SUFFIX=$RUST_DEB_VERSION" \
      "libstd-rust-web-dev=$RUST_DEB_VERSION" "$LLVM_PACKAGE=$LLVM_DEB_VERSION")
    unpack_all
  fi
  if [ ! -d "$TOOLS/usr/lib/rustlib/$TARGET/lib" ]; then
    log "unpacking libstd-rust-web-dev:s390x $STD_S390X_DEB_VERSION (trixie) into $TOOLS"
    if ! dpkg --print-foreign-architectures | grep -qx s390x; then
      "${AS_ROOT[@]}" dpkg --add-architecture s390x
      ADDED_ARCH=1
    fi
    APT_CHANGED=1
    printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: trixie" "Components: main" \
      "Architectures: s390x" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" |
      "${AS_ROOT[@]}" tee "$APT_SOURCE" >/dev/null
    printf '%s\n' "Package: *" "Pin: release n=trixie" "Pin-Priority: 1" | "${AS_ROOT[@]}" tee "$APT_PIN" >/dev/null
    "${AS_ROOT[@]}" apt-get update -qq
    (cd "$DL" && apt-get download -qq "libstd-rust-web-dev:s390x=$STD_S390X_DEB_VERSION")
    unpack_all
    cleanup_apt
  fi
  rm -rf "$DL"
  DL=
}

if reason="$(missing)"; then
  if [ "$IF_AVAILABLE" -eq 1 ]; then
    echo "cross-s390x: skipped: $reason"
    trap - EXIT
    exit 0
  fi
  log "$reason: installing"
  install_missing
  if reason="$(missing)"; then
    echo "cross-s390x: still missing after the install: $reason" >&2
    exit 1
  fi
fi
log "toolchain: $(LD_LIBRARY_PATH="$TOOLS/usr/lib/x86_64-linux-gnu" "$TOOLS/usr/bin/rustc" --version), $(s390x-linux-gnu-gcc --version | head -1), $(qemu-s390x-static --version | head -1)"

# --- Building and testing ----------------------------------------------------------------------

QEMU=(qemu-s390x-static -L "$SYSROOT")
S390X_LIB="$OUT/$TARGET/release"

# cargo with the Debian compiler, for s390x, in its own target directory, without debug info.
s390x_cargo() {
  env RUSTC="$TOOLS/usr/bin/rustc" \
    LD_LIBRARY_PATH="$TOOLS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    CARGO_TARGET_S390X_UNKNOWN_LINUX_GNU_LINKER=s390x-linux-gnu-gcc \
    CARGO_TARGET_S390X_UNKNOWN_LINUX_GNU_RUNNER="${QEMU[*]}" \
    CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 CARGO_PROFILE_RELEASE_DEBUG=0 \
    CARGO_TARGET_DIR="$OUT" \
    cargo "$@"
}

mkdir -p "$OUT"
TEST_SUMMARY="no tests run under qemu"
if [ "$TESTS" != none ]; then
  tests=(--lib)
  [ "$TESTS" = full ] && tests+=(--test draw --test filters --test mass --test reference)
  STEP="cargo test --target $TARGET ${tests[*]}"
  log "$STEP (build and run under qemu-user)"
  s390x_cargo test --target "$TARGET" "${tests[@]}" 2>&1 | tee "$OUT/test.log"
  passed=$(grep -o 'test result: ok\. [0-9]* passed' "$OUT/test.log" | awk '{s += $4; n++} END {printf "%d tests in %d binaries", s, n}')
  TEST_SUMMARY="s390x tests (${tests[*]}) passed: $passed"
  log "$TEST_SUMMARY"
fi

STEP="cargo build --target $TARGET --release --lib"
log "$STEP"
s390x_cargo build --target "$TARGET" --release --lib
STEP="cargo build --release (x86-64)"
log "$STEP"
cargo build --release --lib

# The libraries carry a soname (build.rs: libtokenrace.so.0.2 for 0.2.z); the loader looks for it.
for dir in "$ROOT/target/release" "$S390X_LIB"; do
  so=$(readelf -d "$dir/libtokenrace.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ -z "$so" ] || ln -sf libtokenrace.so "$dir/$so"
done

STEP="seeded-draw comparison"
CFLAGS=(-O2 -Wall -Wextra -Werror -ffp-contract=off -Iinclude)
cc "${CFLAGS[@]}" c_tests/seeded_dump.c -Ltarget/release -ltokenrace -o "$OUT/seeded_dump-x86_64"
s390x-linux-gnu-gcc "${CFLAGS[@]}" c_tests/seeded_dump.c -L"$S390X_LIB" -ltokenrace -o "$OUT/seeded_dump-s390x"
DUMPS="$OUT/dumps"
rm -rf "$DUMPS"
mkdir -p "$DUMPS"
runs=()
for level in scalar portable avx2 avx512; do
  for threads in 1 4; do
    rc=0
    LD_LIBRARY_PATH="$ROOT/target/release" "$OUT/seeded_dump-x86_64" "$level" "$threads" \
      >"$DUMPS/x86_64-$level-$threads.txt" 2>"$DUMPS/x86_64-$level-$threads.err" || rc=$?
    if [ "$rc" -eq 2 ]; then
      rm -f "$DUMPS/x86_64-$level-$threads.txt"
      continue
    elif [ "$rc" -ne 0 ]; then
      cat "$DUMPS/x86_64-$level-$threads.err" >&2
      exit 1
    fi
    runs+=("x86_64-$level-$threads")
  done
done
for level in scalar portable; do
  for threads in 1 4; do
    "${QEMU[@]}" -E LD_LIBRARY_PATH="$S390X_LIB" "$OUT/seeded_dump-s390x" "$level" "$threads" \
      >"$DUMPS/s390x-$level-$threads.txt" 2>"$DUMPS/s390x-$level-$threads.err" ||
      { cat "$DUMPS/s390x-$level-$threads.err" >&2; exit 1; }
    runs+=("s390x-$level-$threads")
  done
done
# The avx2 level must be refused on s390x, not silently replaced.
rc=0
"${QEMU[@]}" -E LD_LIBRARY_PATH="$S390X_LIB" "$OUT/seeded_dump-s390x" avx2 1 >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { echo "cross-s390x: s390x accepted the avx2 level (exit $rc)" >&2; exit 1; }

base="${runs[0]}"
differ=()
for run in "${runs[@]:1}"; do
  if ! cmp -s "$DUMPS/$base.txt" "$DUMPS/$run.txt"; then
    differ+=("$run")
    echo "cross-s390x: $run differs from $base:"
    diff "$DUMPS/$base.txt" "$DUMPS/$run.txt" | head -20 || true
  fi
done
rows=$(grep -c '^call ' "$DUMPS/$base.txt")
totals=$(tail -1 "$DUMPS/$base.txt")
if [ "${#differ[@]}" -gt 0 ]; then
  STEP="seeded-draw comparison (${#differ[@]} of ${#runs[@]} runs differ)"
  exit 1
fi
STEP="done"
echo "cross-s390x: OK in $(elapsed): $TEST_SUMMARY; seeded dump ($totals, $rows lines) byte-identical over ${#runs[@]} runs: ${runs[*]}"
