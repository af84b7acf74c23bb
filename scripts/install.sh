#!/usr/bin/env bash
# Builds libtokenrace (release) and installs it under PREFIX as a C library:
#
#   PREFIX/lib/libtokenrace.so.0.2.0                 the shared object, stripped, soname libtokenrace.so.0.2
#   PREFIX/lib/libtokenrace.so.0.2, libtokenrace.so  symlinks (the loader's name, the linker's name)
#   PREFIX/include/tokenrace/tokenrace.h, tokenrace.hpp, tokenrace_llama.h (llama.cpp sampler)
#   PREFIX/lib/pkgconfig/tokenrace.pc                pkg-config --cflags --libs tokenrace
#   PREFIX/lib/cmake/tokenrace/tokenraceConfig*.cmake  find_package(tokenrace) -> tokenrace::tokenrace
#
# This is cargo-c's layout and soname scheme (0.y.z -> libtokenrace.so.0.y). By default the
# script writes it itself with cargo alone; `--cargo-c` has `cargo cinstall` write the library,
# headers and .pc file instead (installing cargo-c first when it is missing: a source build of
# several minutes; its prebuilt binaries are on GitHub, which CI machines may not reach) and adds
# the CMake files, which cargo-c does not write.
#
# Usage: scripts/install.sh PREFIX [--libdir DIR] [--cargo-c]
#   --libdir DIR   library directory relative to PREFIX (default: lib)
#   DESTDIR=/stage scripts/install.sh /usr   stages the files under /stage/usr for packaging
#
# Needs cargo and a C linker; installs Rust through rustup when cargo is missing.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }

prefix="" libdir="lib" use_cargo_c=0
while [ $# -gt 0 ]; do
  case "$1" in
    --libdir) libdir="${2:?--libdir needs a directory}"; shift 2 ;;
    --libdir=*) libdir="${1#--libdir=}"; shift ;;
    --cargo-c) use_cargo_c=1; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "install.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$prefix" ] || { echo "install.sh: one PREFIX only (got $prefix and $1)" >&2; usage; }; prefix="$1"; shift ;;
  esac
done
[ -n "$prefix" ] || { echo "install.sh: PREFIX is missing" >&2; usage; }
case "$prefix" in /*) ;; *) prefix="$PWD/$prefix" ;; esac
case "$libdir" in /*) echo "install.sh: --libdir is relative to PREFIX (got $libdir)" >&2; exit 2 ;; esac
prefix="${prefix%/}"
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  . "$HOME/.cargo/env"
fi
command -v cc >/dev/null 2>&1 || { echo "install.sh: a C linker (cc) is needed: apt-get install gcc" >&2; exit 1; }

version="$(cargo pkgid | sed 's/.*[#@]//')"
major="${version%%.*}" rest="${version#*.}" minor="${rest%%.*}" patch="${rest#*.}"
case "$major.$minor" in
  0.0) sover="0.0.$patch" ;;
  0.*) sover="0.$minor" ;;
  *) sover="$major" ;;
esac
soname="libtokenrace.so.$sover"
stage="${DESTDIR:-}$prefix"
lib_dest="$stage/$libdir"
inc_dest="$stage/include/tokenrace"

if [ "$use_cargo_c" = 1 ]; then
  if ! cargo cinstall --version >/dev/null 2>&1; then
    echo "install.sh: installing cargo-c (cargo install --locked cargo-c)"
    if ! cargo install --locked cargo-c 2>/tmp/tokenrace-cargo-c.$$; then
      # The newest cargo-c may need a newer rustc; cargo names the newest one this rustc builds.
      fallback="$(sed -n 's/.*`cargo-c \([^`]*\)` supports rustc.*/\1/p' /tmp/tokenrace-cargo-c.$$ | head -1)"
      [ -n "$fallback" ] || { cat /tmp/tokenrace-cargo-c.$$ >&2; exit 1; }
      cargo install --locked cargo-c --version "$fallback"
    fi
    rm -f /tmp/tokenrace-cargo-c.$$
  fi
  cargo cinstall --release --library-type cdylib --prefix "$prefix" --libdir "$prefix/$libdir" \
    ${DESTDIR:+--destdir "$DESTDIR"}
else
  # The library as `cargo build --release` and the demo (`cargo run --release --bin tokenrace-demo`)
  # build it, so that one build serves all three.
  echo "install.sh: building the release library (cargo build --release --lib; several minutes the first time)"
  build_start=$SECONDS
  cargo build --release --lib
  echo "install.sh: built in $((SECONDS - build_start)) s"
  built="${CARGO_TARGET_DIR:-target}/release/libtokenrace.so"
  install -d "$lib_dest" "$inc_dest" "$lib_dest/pkgconfig"
  install -m 0755 "$built" "$lib_dest/libtokenrace.so.$version"
  ln -sf "libtokenrace.so.$version" "$lib_dest/$soname"
  ln -sf "libtokenrace.so.$version" "$lib_dest/libtokenrace.so"
  install -m 0644 include/tokenrace.h include/tokenrace.hpp include/tokenrace_llama.h "$inc_dest/"
  # Relocatable: the .pc file finds the prefix from its own place (${pcfiledir}).
  pc_up=".."
  for _ in $(echo "$libdir" | tr '/' ' '); do pc_up="$pc_up/.."; done
  sed -e "s|@PC_TO_PREFIX@|$pc_up|; s|@LIBDIR@|$libdir|; s|@VERSION@|$version|" \
    packaging/tokenrace.pc.in >"$lib_dest/pkgconfig/tokenrace.pc"
fi
# Shipped without debug info or local symbols (the exported tokenrace_* symbols stay).
if command -v strip >/dev/null 2>&1; then
  strip --strip-unneeded "$lib_dest/libtokenrace.so.$version"
fi

# The CMake package: paths relative to the config file, so the tree can move.
cmake_dest="$lib_dest/cmake/tokenrace"
up="../.."
for _ in $(echo "$libdir" | tr '/' ' '); do up="$up/.."; done
install -d "$cmake_dest"
for f in tokenraceConfig.cmake tokenraceConfigVersion.cmake; do
  sed -e "s|@CONFIG_TO_PREFIX@|$up|; s|@LIBDIR@|$libdir|g; s|@VERSION@|$version|g" \
      -e "s|@SONAME@|$soname|; s|@MAJOR@|$major|g; s|@MINOR@|$minor|g" \
    "packaging/cmake/$f.in" >"$cmake_dest/$f"
done

size="$(stat -c %s "$lib_dest/libtokenrace.so.$version")"
cat <<EOF
tokenrace $version installed under $prefix${DESTDIR:+ (staged in $DESTDIR)}:
  $prefix/$libdir/libtokenrace.so.$version ($((size / 1024)) KiB, soname $soname)
  $prefix/include/tokenrace/tokenrace.h, tokenrace.hpp, tokenrace_llama.h
  $prefix/$libdir/pkgconfig/tokenrace.pc, $prefix/$libdir/cmake/tokenrace/tokenraceConfig.cmake
Build against it:
  PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig cc app.c \$(pkg-config --cflags --libs tokenrace) -Wl,-rpath,$prefix/$libdir
  cmake -DCMAKE_PREFIX_PATH=$prefix ...   (find_package(tokenrace) / tokenrace::tokenrace)
(-Wl,-rpath, or LD_LIBRARY_PATH, is needed unless $prefix/$libdir is on the loader's path.)
EOF
