#!/usr/bin/env bash
# Runs every test: the Rust unit and integration tests (C and C++ programs included), the C
# programs again under valgrind's memcheck, the Python binding's tests, then the installs
# (scripts/test-install.sh: install.sh under a prefix, pkg-config, CMake, pip in a fresh venv).
# Installs what the Python tests import; the install test needs cmake and pkg-config. The crate is compiled once: `cargo test` builds the library with both of
# its crate types, so the shared object it leaves in target/debug/deps (the test profile,
# optimised) is the one the C programs and the Python tests load; no separate release build.
# The installs build the release library once (install.sh and pip share the build). From a
# clean checkout on a 2-core machine the builds take most of the time.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOKENRACE_LIB_DIR="$PWD/target/debug/deps"
stamp() { echo "[test.sh $(date +%T), ${SECONDS}s] $*"; }
cargo test --quiet
stamp "cargo test done"
# The C and C++ programs again under valgrind's memcheck: any invalid access or leak fails.
if command -v valgrind >/dev/null 2>&1; then
  TOKENRACE_VALGRIND=1 cargo test --quiet --test c_abi
else
  echo "memcheck: skipped (valgrind is not installed; .ci/run installs it)"
fi
# Which SIMD levels the Rust tests exercised on this machine (they test every supported one).
cargo test --quiet --test draw levels_exercised -- --nocapture 2>&1 | grep '^simd levels' || true
stamp "memcheck done"
if [ -d tests/python ]; then
  python3 -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
  TOKENRACE_LIBRARY="$TOKENRACE_LIB_DIR/libtokenrace.so" python3 -m pytest -q tests/python
fi
stamp "python done"
./scripts/test-install.sh
