# Shared by scripts/cross-check.sh and scripts/cross-count.sh (sourced): the targets, their
# toolchains and the qemu CPUs that take each branch of the run-time level detection.
#
# A target is named s390x, aarch64 or ppc64le. What it needs on an x86-64 host:
#   - a rustc with the target's standard library: $CROSS_RUSTC if set; else `rustc` when it has
#     the target (rustup target add ...); else the Debian rustc unpacked under $CROSS_TOOLS
#     (default target/cross-tools; `scripts/cross-check.sh --install` unpacks it there, and
#     target/s390x-tools, where the former cross-s390x.sh put it, is looked at too);
#   - the target's gcc and C library (gcc-<triple>, libc6-dev-<arch>-cross) and qemu-user.
# Builds go to target/cross/<target>, with debug info off (LLVM takes tens of minutes with it).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CROSS_TOOLS="${CROSS_TOOLS:-$ROOT/target/cross-tools}"

triple_of() {
  case $1 in
    s390x) echo s390x-unknown-linux-gnu ;;
    aarch64) echo aarch64-unknown-linux-gnu ;;
    ppc64le) echo powerpc64le-unknown-linux-gnu ;;
    *) return 1 ;;
  esac
}
gnu_of() {
  case $1 in
    s390x) echo s390x-linux-gnu ;;
    aarch64) echo aarch64-linux-gnu ;;
    ppc64le) echo powerpc64le-linux-gnu ;;
  esac
}
debarch_of() {
  case $1 in
    s390x) echo s390x ;;
    aarch64) echo arm64 ;;
    ppc64le) echo ppc64el ;;
  esac
}
qemu_of() { echo "qemu-$1"; }

# The qemu CPUs of each target, "CPU:WHAT": each branch of the detection is taken by one
# (`auto` picks the level named after the colon).
cpus_of() {
  case $1 in
    # max: z15+ facilities (vector-enhancements-2); then without VXE2 (a z14), without any
    # vector facility (a z12 and older).
    s390x) echo "max:vxe2 max,vxeh2=off:scalar max,vx=off,vxeh=off,vxeh2=off:scalar" ;;
    # NEON is aarch64's baseline: every CPU has it.
    aarch64) echo "max:neon cortex-a72:neon" ;;
    ppc64le) echo "power10:portable power9:portable" ;;
  esac
}
# The levels each target builds, lowest first.
levels_of() {
  case $1 in
    s390x) echo "scalar portable vxe2" ;;
    aarch64) echo "scalar portable neon" ;;
    ppc64le) echo "scalar portable" ;;
  esac
}

# The rustc that has TARGET's standard library, or nothing.
rustc_for() {
  local t c
  t=$(triple_of "$1")
  for c in "${CROSS_RUSTC:-}" rustc "$CROSS_TOOLS/usr/bin/rustc" "$ROOT/target/s390x-tools/usr/bin/rustc"; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    local sysroot
    sysroot=$(LD_LIBRARY_PATH="$(dirname "$(dirname "$(command -v "$c")")")/lib/x86_64-linux-gnu" "$c" --print sysroot 2>/dev/null) || continue
    if [ -d "$sysroot/lib/rustlib/$t/lib" ]; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

# Why TARGET cannot be built and run here (empty when it can).
missing_for() {
  local g
  g=$(gnu_of "$1")
  [ "$(uname -m)" = x86_64 ] || { echo "these scripts cross-build from x86-64 (this is $(uname -m))"; return; }
  command -v "$g-gcc" >/dev/null 2>&1 || { echo "$g-gcc is not installed"; return; }
  [ -e "/usr/$g/include/stdio.h" ] || { echo "the $1 C library (libc6-dev-$(debarch_of "$1")-cross) is not installed"; return; }
  command -v "$(qemu_of "$1")" >/dev/null 2>&1 || { echo "$(qemu_of "$1") (qemu-user) is not installed"; return; }
  rustc_for "$1" >/dev/null || { echo "no rustc with the $(triple_of "$1") standard library (see scripts/cross-check.sh --install)"; return; }
}

# cargo for TARGET with its rustc, in target/cross/TARGET, without debug info; qemu (at the
# first of cpus_of) as the runner of `cargo test`.
cross_cargo() {
  local name=$1 t g rc upper cpu
  shift
  t=$(triple_of "$name")
  g=$(gnu_of "$name")
  rc=$(rustc_for "$name")
  upper=$(echo "$t" | tr 'a-z-' 'A-Z_')
  cpu=${CROSS_TEST_CPU:-$(cpus_of "$name" | awk '{print $1}' | cut -d: -f1)}
  env RUSTC="$rc" \
    LD_LIBRARY_PATH="$(dirname "$(dirname "$rc")")/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "CARGO_TARGET_${upper}_LINKER=$g-gcc" \
    "CARGO_TARGET_${upper}_RUNNER=$(qemu_of "$name") -cpu $cpu -L /usr/$g" \
    CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 CARGO_PROFILE_RELEASE_DEBUG=0 \
    CARGO_TARGET_DIR="$ROOT/target/cross/$name" \
    nice -n "${CROSS_NICE:-10}" cargo "$@"
}

# Builds TARGET's release library; prints its directory. The soname link is made (build.rs
# gives the library its soname, libtokenrace.so.0.y for 0.y.z; the loader looks for that).
cross_build_lib() {
  local name=$1 dir so
  cross_cargo "$name" build --release --lib --target "$(triple_of "$name")" >&2 || return 1
  dir="$ROOT/target/cross/$name/$(triple_of "$name")/release"
  so=$(readelf -d "$dir/libtokenrace.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ -z "$so" ] || ln -sf libtokenrace.so "$dir/$so"
  echo "$dir"
}
