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
cargo test --quiet --test '*'
stamp "integration tests done"
unit_env=(env CARGO_TARGET_DIR="$PWD/target/unit" CARGO_PROFILE_TEST_OPT_LEVEL=0)
"${unit_env[@]}" cargo test --quiet --lib --no-run >target/unit-build.log 2>&1 &
unit_build=$!
# Which SIMD levels the Rust tests exercised on this machine (they test every supported one).
cargo test --quiet --test draw levels_exercised -- --nocapture 2>&1 | grep '^simd levels' || true
# The C and C++ programs again under valgrind's memcheck (any invalid access or leak fails), in
# the background beside the Python tests: both are mostly one thread.
if command -v valgrind >/dev/null 2>&1; then
  TOKENRACE_VALGRIND=1 cargo test --quiet --test c_abi >target/memcheck.log 2>&1 &
  memcheck=$!
else
  echo "memcheck: skipped (valgrind is not installed; .ci/run installs it)"
  memcheck=
fi
if [ -d tests/python ]; then
  python3 -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
  TOKENRACE_LIBRARY="$TOKENRACE_LIB_DIR/libtokenrace.so" python3 -m pytest -q tests/python
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
