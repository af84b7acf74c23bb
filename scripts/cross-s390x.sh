#!/usr/bin/env bash
# The s390x cross-check, now one target of scripts/cross-check.sh (s390x, aarch64, ppc64le): kept
# for CI (.ci/run) and old notes. Options as before:
#   --if-available  print "skipped: <reason>" and exit 0 when the toolchain is missing
#   --quick         under qemu, the unit tests only;  --no-tests  no tests, only the dump check
# (default: the unit tests and the draw integration test under qemu). Unlike before it does not
# install the toolchain: run scripts/cross/install.sh s390x (or cross-check.sh --install) once.
set -euo pipefail
args=(--tests full)
for a in "$@"; do
  case $a in
    --if-available) args+=(--if-available) ;;
    --quick) args+=(--tests lib) ;;
    --no-tests) args+=(--tests none) ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cross-s390x: unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done
exec "$(dirname "$0")/cross-check.sh" "${args[@]}" s390x
