#!/usr/bin/env bash
# Installs tokenrace as a user would and uses it from outside the repository:
#   1. scripts/install.sh into a fresh prefix; checks the soname, the symlinks, that the library
#      is stripped, the headers, the .pc and CMake files;
#   2. examples/c/draw.c built through `pkg-config --cflags --libs tokenrace`, run; then every
#      build and run line of the README as written (scripts/readme-commands.py), the in-tree
#      link against target/release included;
#   3. examples/cmake (find_package(tokenrace): the C example linked to tokenrace::tokenrace, the
#      C++ dlopen example on tokenrace::headers), built and run;
#   4. a fresh virtualenv, `pip install .`, then the numpy example run from another directory
#      with the library the wheel bundles;
#   5. the wheel of scripts/build-wheels.sh --from-build (from step 1's library), pip-installed
#      into a fresh venv with no cargo on PATH, its seeded draws compared.
# Needs cmake and pkg-config (.ci/run installs them) and PyPI (pip fetches setuptools-rust and
# numpy). scripts/test.sh runs it last; run it alone after changing packaging.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
work="$(mktemp -d /tmp/tokenrace-install.XXXXXX)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
fail() { echo "test-install: FAIL: $*" >&2; exit 1; }
for tool in cmake pkg-config readelf; do
  command -v "$tool" >/dev/null 2>&1 \
    || fail "$tool is not installed (apt-get install cmake pkg-config binutils; .ci/run installs them)"
done

# 1. The install and its layout.
./scripts/install.sh "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "install.sh"; }
version="$(cargo pkgid | sed 's/.*[#@]//')"
lib="$prefix/lib/libtokenrace.so.$version"
[ -f "$lib" ] || fail "no $lib"
soname="$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
[ "$soname" = "libtokenrace.so.0.2" ] || fail "soname is '$soname', expected libtokenrace.so.0.2"
for link in libtokenrace.so.0.2 libtokenrace.so; do
  [ "$(readlink "$prefix/lib/$link")" = "libtokenrace.so.$version" ] || fail "$link is not a symlink to the library"
done
if readelf -S "$lib" | grep -q '\.debug_'; then fail "$lib has debug sections (it should be stripped)"; fi
for f in include/tokenrace/tokenrace.h include/tokenrace/tokenrace.hpp include/tokenrace/tokenrace_llama.h lib/pkgconfig/tokenrace.pc \
         lib/cmake/tokenrace/tokenraceConfig.cmake lib/cmake/tokenrace/tokenraceConfigVersion.cmake; do
  [ -f "$prefix/$f" ] || fail "no $prefix/$f"
done
echo "install: $lib ($(( $(stat -c %s "$lib") / 1024 )) KiB, stripped, soname $soname)"

# 2. A C program through pkg-config, compiled outside the repository.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[ "$(pkg-config --modversion tokenrace)" = "$version" ] || fail "pkg-config --modversion"
# Relocatable: a copy of the prefix elsewhere answers with its own paths.
cp -a "$prefix" "$work/moved"
moved_libdir="$(PKG_CONFIG_PATH="$work/moved/lib/pkgconfig" pkg-config --variable=libdir tokenrace)"
[ "$(realpath "$moved_libdir")" = "$work/moved/lib" ] || fail "the .pc file is not relocatable: libdir $moved_libdir"
rm -rf "$work/moved"
cd "$work"
# shellcheck disable=SC2046
cc "$repo/examples/c/draw.c" -o draw -Wall -Wextra -Werror -std=c11 \
  $(pkg-config --cflags --libs tokenrace) -Wl,-rpath,"$(pkg-config --variable=libdir tokenrace)" -lm
./draw >draw.out || { cat draw.out; fail "examples/c/draw.c (pkg-config) failed"; }
grep -q '^row 0: token [0-9]*, .*(greedy)$' draw.out && grep -q '^refused: .*top_p\[1\]' draw.out \
  || { cat draw.out; fail "unexpected output of examples/c/draw.c"; }
echo "pkg-config: examples/c/draw.c built and ran"
# The README's own build and run lines, exactly as written (against this prefix and the build
# tree install.sh just built): a missing -lm or soname link fails here.
(cd "$repo" && python3 scripts/readme-commands.py "$prefix") || fail "a README line failed as written"

# 3. A CMake project through find_package(tokenrace).
cmake -S "$repo/examples/cmake" -B cmake-build -DCMAKE_PREFIX_PATH="$prefix" >cmake.log 2>&1 \
  || { cat cmake.log; fail "cmake configure"; }
cmake --build cmake-build >>cmake.log 2>&1 || { cat cmake.log; fail "cmake build"; }
./cmake-build/draw >cmake-draw.out || { cat cmake-draw.out; fail "the CMake-built draw failed"; }
cmp -s draw.out cmake-draw.out || fail "the CMake-built and pkg-config-built programs disagree"
./cmake-build/dlopen_server "$prefix/lib/libtokenrace.so.0.2" >server.out \
  || { cat server.out; fail "the CMake-built dlopen_server failed"; }
echo "cmake: find_package(tokenrace), draw and dlopen_server built and ran"

# 4. pip install . into a fresh virtualenv; the example runs from another directory.
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$repo" >pip.log 2>&1 \
  || { cat pip.log; fail "pip install ."; }
mkdir elsewhere && cd elsewhere
env -u TOKENRACE_LIBRARY "$work/venv/bin/python" "$repo/examples/python/numpy_draw.py" >numpy.out \
  || { cat numpy.out; fail "examples/python/numpy_draw.py in the fresh venv"; }
bundled="$(env -u TOKENRACE_LIBRARY "$work/venv/bin/python" -c 'import tokenrace; print(tokenrace.library_path())')"
case "$bundled" in
  "$work/venv/"*/site-packages/tokenrace/libtokenrace*.so) ;;
  *) fail "the venv loads $bundled, not the library bundled in its site-packages" ;;
esac
echo "pip: installed in a fresh venv, examples/python/numpy_draw.py ran on $(basename "$bundled") ($(( $(stat -c %s "$bundled") / 1024 )) KiB)"

# 5. The wheel, as scripts/build-wheels.sh makes it, from the release library step 1 built (no
#    second build; without zig, so tagged with this host's glibc: the manylinux_2_28 floor and the
#    aarch64 and s390x wheels are checked by running scripts/build-wheels.sh itself), installed
#    with pip into a fresh venv whose PATH has no cargo, and drawn with: its seeded tokens must
#    equal tests/wheel-draw.expected, which the manylinux wheels of every architecture match.
[ "$(basename "$bundled")" = libtokenrace.so ] \
  || fail "pip install . bundled $(basename "$bundled"), not libtokenrace.so (setup.py names it without a Python ABI tag)"
release_lib="${CARGO_TARGET_DIR:-target}/release/libtokenrace.so"
case "$release_lib" in /*) ;; *) release_lib="$repo/$release_lib" ;; esac
"$repo/scripts/build-wheels.sh" --from-build "$release_lib" --out "$work/wheels" || fail "the x86-64 wheel"
echo "wheels: the x86-64 wheel installed without cargo and drew the expected tokens (manylinux wheels for x86_64, aarch64, s390x: scripts/build-wheels.sh)"
