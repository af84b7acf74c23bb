#!/usr/bin/env bash
# The full lint, run before every commit: formatting, and clippy on every target of the
# workspace (the library, the benchmark crate bench/, every test and example) with warnings as
# errors. CI runs the formatting check and clippy on the library and the benchmark only (a second
# check build of every test target does not fit its time limit on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The fuzz targets are their own crate (fuzz/, built with nightly by cargo-fuzz); a check build
# on stable keeps them compiling as the C structs grow.
cargo check --manifest-path fuzz/Cargo.toml --bins --quiet
