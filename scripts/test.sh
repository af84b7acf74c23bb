#!/usr/bin/env bash
# Runs every test: the release library is built once (the C programs and the Python tests use
# it), then the Rust unit and integration tests (C and C++ programs included), then the Python
# binding's tests. Installs what the Python tests import. From a clean checkout on a 2-core
# machine the builds take most of the time (about 5 minutes; the tests themselves about 1).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --lib --quiet
export TOKENRACE_LIB_DIR="$PWD/target/release"
cargo test --quiet
# The C and C++ programs again under valgrind's memcheck: any invalid access or leak fails.
if command -v valgrind >/dev/null 2>&1; then
  TOKENRACE_VALGRIND=1 cargo test --quiet --test c_abi
else
  echo "memcheck: skipped (valgrind is not installed; .ci/run installs it)"
fi
# Which SIMD levels the Rust tests exercised on this machine (they test every supported one).
cargo test --quiet --test draw levels_exercised -- --nocapture 2>&1 | grep '^simd levels' || true
if [ -d tests/python ]; then
  python3 -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
  TOKENRACE_LIBRARY="$TOKENRACE_LIB_DIR/libtokenrace.so" python3 -m pytest -q tests/python
fi
