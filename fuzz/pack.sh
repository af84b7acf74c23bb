#!/usr/bin/env bash
# Packs the built fuzz targets for another machine: each binary without its debug sections
# (symbols stay, so backtraces name functions) and gzipped, into bin/ (ignored by git), for
#   FUZZ_NO_BUILD=1 FUZZ_BIN_DIR=bin ./run.sh SECONDS      (which unpacks bin/NAME.gz first)
# Build first (`./run.sh 0`).
set -euo pipefail
cd "$(dirname "$0")"
SRC=${FUZZ_BIN_DIR:-target/x86_64-unknown-linux-gnu/release}
TARGETS=${FUZZ_TARGETS:-"draw_c_abi verify_c_abi step_state_c_abi config_env pool_sequence"}
rm -rf bin && mkdir -p bin
for t in $TARGETS; do
  strip --strip-debug -o "bin/$t" "$SRC/$t"
  gzip -9 -f "bin/$t"
done
ls -l bin
du -sh bin
