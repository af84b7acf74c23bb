#!/usr/bin/env bash
# Runs every test: the Rust integration tests (C and C++ programs included), the C programs
# again under valgrind's memcheck, the Python binding's tests, the crate's unit tests, then the
# installs (scripts/test-install.sh: install.sh under a prefix, pkg-config, CMake, pip in a fresh
# venv). Installs what the Python tests import; the install test needs cmake and pkg-config.
#
# Builds, on a 2-core machine where they take most of the time:
# - the integration tests build the library once, with both of its crate types: the shared
#   object it leaves in target/debug/deps (the test profile, optimised) is the one the C programs
#   and the Python tests load;
# - the unit tests are a second build of the whole crate (cfg(test)): unoptimised (they are
#   small) and in their own target directory, built in the background while memcheck and the
#   Python tests run (an optimised second build was a third of CI's time);
# - the installs build the release library once (install.sh and pip share the build).
set -euo pipefail
cd "$(dirname "$0")/.."
export TOKENRACE_LIB_DIR="$PWD/target/debug/deps"
stamp() { echo "[test.sh $(date +%T), ${SECONDS}s] $*"; }

# Every tool the run needs, checked before anything is built.
missing=()
for tool in cargo cc c++ python3 cmake pkg-config readelf; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=("python3-venv")
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: missing: ${missing[*]}" >&2
  echo "  on Debian/Ubuntu: apt-get install build-essential cmake pkg-config binutils python3-venv valgrind" >&2
  echo "  Rust: curl -sSf https://sh.rustup.rs | sh -s -- -y   (.ci/run installs all of it)" >&2
  exit 1
fi
command -v valgrind >/dev/null 2>&1 || echo "test.sh: valgrind is not installed: the memcheck step will be skipped"

# --workspace: the benchmark crate's quick run (bench/tests) too. The runs of single tests below
# name it as well: the benchmark's derive macros add features to the build script's dependencies
# (cbindgen's syn and proc-macro2), so a run without it would build the library a second time.
stamp "building the integration tests (the first build of the crate takes several minutes on 2 cores)"
cargo test --workspace --no-run --test '*' 2>&1 | grep -v '^ *Executable' >&2
stamp "running the integration tests"
cargo test --workspace --quiet --test '*'
stamp "integration tests done"
unit_env=(env CARGO_TARGET_DIR="$PWD/target/unit" CARGO_PROFILE_TEST_OPT_LEVEL=0)
"${unit_env[@]}" cargo test --quiet --lib --no-run >target/unit-build.log 2>&1 &
unit_build=$!
# Which SIMD levels the Rust tests exercised on this machine (they test every supported one).
cargo test --workspace --quiet --test draw levels_exercised -- --nocapture 2>&1 | grep '^simd levels' || true
# The C and C++ programs again under valgrind's memcheck (any invalid access or leak fails), in
# the background beside the Python tests: both are mostly one thread.
if command -v valgrind >/dev/null 2>&1; then
  TOKENRACE_VALGRIND=1 cargo test --workspace --quiet --test c_abi >target/memcheck.log 2>&1 &
  memcheck=$!
else
  echo "memcheck: skipped (valgrind is not installed; .ci/run installs it)"
  memcheck=
fi
if [ -d tests/python ]; then
  # In a virtualenv of its own (target/test-venv): never into the system's Python, which Debian
  # refuses (externally-managed-environment) and a user would not want changed.
  venv="$PWD/target/test-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  stamp "python: installing numpy and pytest into $venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
  stamp "python: running the binding's tests (-rs: the reason of every skip is printed)"
  TOKENRACE_LIBRARY="$TOKENRACE_LIB_DIR/libtokenrace.so" "$venv/bin/python" -m pytest -q -rs tests/python
fi
if [ -n "$memcheck" ]; then
  wait "$memcheck" || { cat target/memcheck.log; echo "memcheck: FAILED" >&2; exit 1; }
  echo "memcheck: $(grep '^test result' target/memcheck.log | tail -1)"
fi
stamp "python done"
wait "$unit_build" || { cat target/unit-build.log; exit 1; }
"${unit_env[@]}" cargo test --quiet --lib
stamp "unit tests done"
./scripts/test-install.sh
