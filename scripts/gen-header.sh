#!/usr/bin/env bash
# Regenerates include/tokenrace.h from src/ffi/ (cbindgen runs in build.rs, into OUT_DIR; the
# header test copies it into the source tree when TOKENRACE_BLESS is set).
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENRACE_BLESS=1 cargo test --quiet --lib committed_header_is_current
git --no-pager diff --stat -- include/tokenrace.h
