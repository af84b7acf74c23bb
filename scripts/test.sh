#!/usr/bin/env bash
# Runs every test: Rust unit and integration tests (C programs included), then the Python
# binding's tests against a release build. Installs what the Python tests import.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --quiet
cargo build --release --quiet
if [ -d tests/python ]; then
  python3 -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
  TOKENRACE_LIBRARY="$PWD/target/release/libtokenrace.so" python3 -m pytest -q tests/python
fi
