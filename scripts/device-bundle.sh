#!/usr/bin/env bash
# Packs what a run on another x86-64 host needs into .device/ (ignored by git): the Rust test
# executables (stripped), the release library and the benchmark. Used to run the AVX-512 level,
# which this project's own machines lack, on the 16-core AVX-512 host:
#   ./scripts/device-bundle.sh && <on the host, from the repository root> bash scripts/device-run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device && mkdir -p .device/bin .device/lib
# The benchmark first: it builds the library with the feature `internals` (its own crate's
# dependency), and the plain library build after it leaves target/release/libtokenrace.so as
# install.sh and the demo build it.
cargo build --release -p tokenrace-bench --quiet
cargo build --lib --release --quiet
cargo test --no-run --quiet --message-format=json 2>/dev/null | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        if "bin" in m["target"]["kind"]:
            continue
        name = "lib" if "rlib" in m["target"]["kind"] else m["target"]["name"]
        shutil.copy(m["executable"], os.path.join(".device/bin", name))
'
cp target/release/libtokenrace.so .device/lib/
cp target/release/tokenrace-bench .device/
strip .device/bin/* .device/lib/libtokenrace.so .device/tokenrace-bench
echo "manifest dir: $PWD" > .device/manifest
du -sh .device
