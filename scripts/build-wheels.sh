#!/usr/bin/env bash
# Builds the Python wheels that install without cargo, one per architecture, and the sdist:
#
#   dist/tokenrace-VERSION-py3-none-manylinux_2_28_x86_64.whl    (and _aarch64, _s390x)
#   dist/tokenrace-VERSION.tar.gz                                 the sdist (pip builds it with cargo)
#
# The package is pure ctypes: a wheel holds the binding's .py files and the stripped library,
# tokenrace/libtokenrace.so, and no Python ABI, so one py3-none wheel serves every CPython >= 3.9.
# Each wheel is then checked:
#   - `auditwheel show`: consistent with manylinux_2_28_<arch> (nothing linked but glibc, no
#     symbol version newer than GLIBC_2.28);
#   - installed and used: x86-64 natively, pip into a fresh venv whose PATH has no cargo (with
#     python3, and again with every other python3.9 ... python3.14 on PATH); aarch64
#     and s390x under qemu-user, with Debian bookworm's own python3 and numpy for that
#     architecture (scripts/foreign-python.sh unpacks them into target/wheels/root-<arch>; the
#     foreign pip installs the wheel, which also proves it accepts the tag there). Each one runs
#     scripts/wheel-draw.py (seeded draws, filters, float16, logprobs) and its output must equal
#     tests/wheel-draw.expected, the same on every architecture.
#
# Cross builds use zig as the C toolchain and linker (cargo-zigbuild, target <triple>.2.28): zig
# links against a glibc 2.28 ABI of its own for every architecture, so one tool gives all three
# wheels their manylinux floor from any Linux host, without a manylinux container or a sysroot
# per architecture. Debian's cross gcc (what scripts/cross-s390x.sh uses to test s390x) links
# against the host's glibc 2.36, whose symbol versions (pthread symbols moved into libc at 2.34)
# no manylinux_2_28 system has. ziglang and cargo-zigbuild come from PyPI into a tool venv,
# target/wheels/tools, when they are not on PATH; rustup adds the Rust targets.
#
# Usage: scripts/build-wheels.sh [--arch LIST] [--no-qemu] [--no-sdist] [--out DIR]
#        scripts/build-wheels.sh --from-build LIB
#   --arch LIST        comma-separated, of x86_64,aarch64,s390x (the default: all three)
#   --no-qemu          build and check the foreign wheels but do not run them
#   --no-sdist         no sdist (by default it is made and a wheel is built from it with cargo)
#   --out DIR          where the wheels go (default dist/)
#   --from-build LIB   no zig, no foreign wheels: the x86-64 wheel from a library cargo already
#                      built on this host (scripts/test-install.sh passes target/release's), tagged
#                      with the glibc that library needs, then installed and drawn as above. It
#                      checks the wheel's assembly, install and draws, not the manylinux floor,
#                      which only the zig build gives. What CI runs.
# Where qemu-user or Debian's apt is missing, the foreign runs are skipped, saying so.
# Each architecture's library builds once (target/wheels/cargo, reused by later runs; about 3
# minutes per architecture on 2 cores). Exits non-zero on any failure or difference.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
arches="x86_64,aarch64,s390x" qemu=1 sdist=1 out="$repo/dist" from_build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arches="${2:?--arch needs a list}"; shift 2 ;;
    --arch=*) arches="${1#--arch=}"; shift ;;
    --no-qemu) qemu=0; shift ;;
    --no-sdist) sdist=0; shift ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --from-build) from_build="${2:?--from-build needs the library}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "build-wheels: unknown option $1" >&2; usage ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$repo/target/wheels"
mkdir -p "$work"
START=$SECONDS
say() { echo "build-wheels [$((SECONDS - START))s]: $*"; }
fail() { echo "build-wheels: FAIL: $*" >&2; exit 1; }
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
expected="$repo/tests/wheel-draw.expected"
tmp="$(mktemp -d /tmp/tokenrace-wheels.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# PATH without any directory that holds cargo or rustc: the installs must not need them.
no_cargo_path() {
  local p="" d
  IFS=: read -ra dirs <<<"$PATH"
  for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ ! -x "$d/cargo" ] && [ ! -x "$d/rustc" ] && p="${p:+$p:}$d"
  done
  echo "$p"
}

# The draws of scripts/wheel-draw.py, without its first line (the path and SIMD level).
compare_draws() {  # ARCH FILE
  tail -n +2 "$2" >"$2.cmp"
  if ! cmp -s "$expected" "$2.cmp"; then
    diff "$expected" "$2.cmp" >&2 || true
    fail "$1: the wheel's seeded draws differ from tests/wheel-draw.expected"
  fi
  say "$1: $(head -1 "$2" | sed 's/^# //'); draws equal tests/wheel-draw.expected ($(grep -c . "$2.cmp") lines)"
}

# x86-64: a fresh venv, pip install the wheel (numpy from PyPI), no cargo on PATH, from /.
run_native() {  # WHEEL [PYTHON]
  local python="${2:-python3}" venv clean_path
  venv="$tmp/venv-x86_64-$(basename "$python")"
  "$python" -m venv "$venv"
  clean_path="$(no_cargo_path)"
  env PATH="$venv/bin:$clean_path" sh -c '! command -v cargo >/dev/null' || fail "cargo is still on PATH"
  env PATH="$venv/bin:$clean_path" "$venv/bin/pip" install --quiet --disable-pip-version-check "$1" \
    >"$tmp/pip-x86_64.log" 2>&1 || { cat "$tmp/pip-x86_64.log"; fail "x86_64: pip install $(basename "$1")"; }
  (cd / && env -u TOKENRACE_LIBRARY -u PYTHONPATH PATH="$venv/bin:$clean_path" \
    "$venv/bin/python" "$repo/scripts/wheel-draw.py") >"$tmp/draw-x86_64.txt" \
    || { cat "$tmp/draw-x86_64.txt"; fail "x86_64: scripts/wheel-draw.py with the installed wheel"; }
  grep -q "from $venv/lib/python3[.0-9]*/site-packages/tokenrace/libtokenrace.so," "$tmp/draw-x86_64.txt" \
    || fail "x86_64: the venv did not load the wheel's library: $(head -1 "$tmp/draw-x86_64.txt")"
  compare_draws "x86_64 (CPython $("$venv/bin/python" -c 'import platform; print(platform.python_version())'))" \
    "$tmp/draw-x86_64.txt"
}

# aarch64, s390x: Debian's python3 for the architecture under qemu-user; its pip installs the wheel.
run_foreign() {  # ARCH WHEEL
  local arch="$1" wheel="$2" root="$work/root-$1" qemu_bin site="$tmp/site-$1"
  qemu_bin="$(command -v "qemu-$arch" || command -v "qemu-$arch-static" || true)"
  if [ -z "$qemu_bin" ]; then
    say "$arch: skipped the install and draws under qemu: qemu-$arch is not installed (apt-get install qemu-user)"
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1 && [ ! -x "$root/usr/bin/python3" ]; then
    say "$arch: skipped the install and draws under qemu: no $root and no apt-get to make it"
    return 0
  fi
  ./scripts/foreign-python.sh "$arch" "$root"
  "$qemu_bin" -L "$root" "$root/usr/bin/python3" -m pip install --quiet --disable-pip-version-check \
    --no-deps --no-index --target "$site" "$wheel" >"$tmp/pip-$arch.log" 2>&1 \
    || { cat "$tmp/pip-$arch.log"; fail "$arch: pip install $(basename "$wheel") under qemu"; }
  (cd / && env -u TOKENRACE_LIBRARY PYTHONPATH="$site" PATH="$(no_cargo_path)" \
    "$qemu_bin" -L "$root" "$root/usr/bin/python3" "$repo/scripts/wheel-draw.py") >"$tmp/draw-$arch.txt" \
    || { cat "$tmp/draw-$arch.txt"; fail "$arch: scripts/wheel-draw.py under qemu"; }
  grep -q "from $site/tokenrace/libtokenrace.so," "$tmp/draw-$arch.txt" \
    || fail "$arch: python did not load the wheel's library: $(head -1 "$tmp/draw-$arch.txt")"
  compare_draws "$arch (qemu-user, Debian python3 $("$qemu_bin" -L "$root" "$root/usr/bin/python3" -c 'import platform; print(platform.python_version())'))" \
    "$tmp/draw-$arch.txt"
}

if [ -n "$from_build" ]; then
  [ -f "$from_build" ] || fail "--from-build: no $from_build"
  cp "$from_build" "$tmp/libtokenrace.so"
  # As shipped: no symbol table, no debug info (the exported tokenrace_* symbols stay).
  strip --strip-unneeded "$tmp/libtokenrace.so"
  wheel="$(python3 scripts/make-wheel.py --lib "$tmp/libtokenrace.so" --arch x86_64 --glibc auto --out "$out")"
  say "x86_64: $(basename "$wheel") ($(( $(stat -c %s "$wheel") / 1024 )) KiB) from $from_build (host glibc: the manylinux_2_28 floor is checked by scripts/build-wheels.sh without --from-build)"
  run_native "$wheel"
  exit 0
fi

# The tools: zig and cargo-zigbuild (PyPI), auditwheel (PyPI), the Rust targets (rustup).
tools="$work/tools"
if ! command -v cargo-zigbuild >/dev/null 2>&1 || ! command -v auditwheel >/dev/null 2>&1; then
  if [ ! -x "$tools/bin/cargo-zigbuild" ] || [ ! -x "$tools/bin/auditwheel" ]; then
    say "installing ziglang, cargo-zigbuild and auditwheel from PyPI into $tools"
    python3 -m venv "$tools"
    "$tools/bin/pip" install --quiet --disable-pip-version-check ziglang cargo-zigbuild auditwheel build
  fi
  # cargo-zigbuild finds zig through `python3 -m ziglang` when no zig is on PATH.
  export PATH="$tools/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || fail "cargo is needed to build the wheels (https://rustup.rs)"

IFS=, read -ra arch_list <<<"$arches"
for arch in "${arch_list[@]}"; do
  case "$arch" in x86_64|aarch64|s390x) ;; *) fail "unknown architecture $arch (x86_64, aarch64, s390x)" ;; esac
  triple="$arch-unknown-linux-gnu"
  if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$triple"; then
    rustup target add "$triple"
  fi
  say "$arch: cargo zigbuild --release --lib --target $triple.2.28"
  # Stripped by the linker (symbols and debug info); the exported tokenrace_* symbols stay.
  CARGO_TARGET_DIR="$work/cargo" CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_INCREMENTAL=0 \
    cargo zigbuild --quiet --release --lib --target "$triple.2.28"
  lib="$work/cargo/$triple/release/libtokenrace.so"
  wheel="$(python3 scripts/make-wheel.py --lib "$lib" --arch "$arch" --out "$out")"
  say "$arch: $(basename "$wheel") ($(( $(stat -c %s "$wheel") / 1024 )) KiB; library $(( $(stat -c %s "$lib") / 1024 )) KiB)"
  auditwheel show "$wheel" >"$tmp/audit-$arch.txt" 2>&1 || { cat "$tmp/audit-$arch.txt"; fail "$arch: auditwheel show"; }
  tr '\n' ' ' <"$tmp/audit-$arch.txt" | grep -q "consistent with the following platform tag: \"manylinux_2_28_$arch\"" \
    || { cat "$tmp/audit-$arch.txt"; fail "$arch: auditwheel does not find the wheel manylinux_2_28_$arch"; }
  say "$arch: auditwheel show: $(tr '\n' ' ' <"$tmp/audit-$arch.txt" | sed 's/  */ /g')"
  if [ "$arch" = x86_64 ]; then
    if [ "$(uname -m)" = x86_64 ]; then
      run_native "$wheel"
      # One wheel for every CPython >= 3.9: the same file in each other one found on PATH
      # (a pyenv shim of a version not selected fails the first command and is passed over).
      others=""
      for minor in 9 10 11 12 13 14; do
        other="$(command -v "python3.$minor" || true)"
        [ -n "$other" ] && "$other" -c 'import venv, ensurepip' 2>/dev/null || continue
        [ "$("$other" -c 'import sys; print(sys.version_info[:2])')" = "$(python3 -c 'import sys; print(sys.version_info[:2])')" ] && continue
        run_native "$wheel" "$other"
        others="$others 3.$minor"
      done
      say "x86_64: other CPythons the wheel was installed into and drew with:${others:- none on PATH (put python3.9 ... python3.14 on PATH to try them)}"
    else say "x86_64: not run (this host is $(uname -m))"; fi
  elif [ "$qemu" = 1 ]; then
    run_foreign "$arch" "$wheel"
  else
    say "$arch: not run under qemu (--no-qemu)"
  fi
done

if [ "$sdist" = 1 ]; then
  py="python3"
  if ! "$py" -c 'import build' 2>/dev/null; then
    [ -x "$tools/bin/python3" ] || python3 -m venv "$tools"
    "$tools/bin/python3" -c 'import build' 2>/dev/null \
      || "$tools/bin/pip" install --quiet --disable-pip-version-check build
    py="$tools/bin/python3"
  fi
  "$py" -m build --sdist --outdir "$out" . >"$tmp/sdist.log" 2>&1 || { cat "$tmp/sdist.log"; fail "python -m build --sdist"; }
  sdist_file="$out/tokenrace-$version.tar.gz"
  [ -f "$sdist_file" ] || fail "no $sdist_file"
  say "sdist: $(basename "$sdist_file") ($(( $(stat -c %s "$sdist_file") / 1024 )) KiB); building a wheel from it with cargo"
  CARGO_TARGET_DIR="$work/cargo" "$py" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    --wheel-dir "$tmp/from-sdist" "$sdist_file" >"$tmp/sdist-wheel.log" 2>&1 \
    || { cat "$tmp/sdist-wheel.log"; fail "pip wheel $(basename "$sdist_file")"; }
  built="$(ls "$tmp/from-sdist/"*.whl)"
  case "$(basename "$built")" in
    "tokenrace-$version-py3-none-linux_$(uname -m).whl") ;;
    *) fail "the sdist built $(basename "$built"), expected tokenrace-$version-py3-none-linux_$(uname -m).whl" ;;
  esac
  "$py" -m zipfile -l "$built" >"$tmp/sdist-wheel.txt"
  grep -q '^tokenrace/libtokenrace.so ' "$tmp/sdist-wheel.txt" \
    || { cat "$tmp/sdist-wheel.txt"; fail "the sdist's wheel has no tokenrace/libtokenrace.so"; }
  say "sdist: builds with cargo into $(basename "$built") (tokenrace/libtokenrace.so inside)"
fi
say "done: $(cd "$out" && ls tokenrace-"$version"* | tr '\n' ' ')"
