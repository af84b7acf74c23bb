#!/usr/bin/env bash
# Installs what scripts/cross-check.sh and scripts/cross-count.sh need for TARGET... (s390x,
# aarch64, ppc64le) on a Debian 12 (bookworm) x86-64 host, as root or through sudo:
#   - from bookworm: gcc-<triple>, libc6-dev-<arch>-cross, qemu-user (takes -plugin), cc;
#   - unpacked under $CROSS_TOOLS (default target/cross-tools), not installed: Debian's rustc
#     with its amd64 standard library and LLVM (bookworm-security), and each target's standard
#     library of the same version: from bookworm-security where it is built (arm64, ppc64el), else
#     from trixie (s390x), through a foreign-architecture apt source pinned at priority 1, removed
#     again afterwards with the dpkg architectures this added.
# The versions are those the recipe was run with (override with the CROSS_* variables below).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
V="${CROSS_RUST_DEB_VERSION:-1.96.0+dfsg1-1~deb12u2}"
LIB_SUFFIX="${CROSS_RUST_LIB_SUFFIX:-1.96}"
LLVM="${CROSS_LLVM_PACKAGE:-libllvm22}=${CROSS_LLVM_DEB_VERSION:-1:22.1.8-1~deb12u1}"
TRIXIE_V="${CROSS_TRIXIE_STD_VERSION:-1.96.0+dfsg1-1~deb13u1+b1}"
SRC=/etc/apt/sources.list.d/tokenrace-cross.sources
PIN=/etc/apt/preferences.d/tokenrace-cross
AS_ROOT=()
[ "$(id -u)" -eq 0 ] || AS_ROOT=(sudo)
DL=$(mktemp -d /tmp/tokenrace-cross.XXXXXX)
[ "$(id -u)" -ne 0 ] || chown _apt "$DL" 2>/dev/null || true
added=()
cleanup() {
  "${AS_ROOT[@]}" rm -f "$SRC" "$PIN"
  for a in "${added[@]}"; do "${AS_ROOT[@]}" dpkg --remove-architecture "$a" || true; done
  "${AS_ROOT[@]}" apt-get update -qq || true
  rm -rf "$DL"
}
trap cleanup EXIT
pkgs=(qemu-user)
arches=()
for t in "$@"; do
  pkgs+=("gcc-$(gnu_of "$t")" "libc6-dev-$(debarch_of "$t")-cross")
  arches+=("$(debarch_of "$t")")
done
"${AS_ROOT[@]}" apt-get update -qq
"${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
mkdir -p "$CROSS_TOOLS"
if [ ! -x "$CROSS_TOOLS/usr/bin/rustc" ]; then
  (cd "$DL" && apt-get download -qq "rustc-web=$V" "libstd-rust-web-$LIB_SUFFIX=$V" "libstd-rust-web-dev=$V" "$LLVM")
fi
for a in "${arches[@]}"; do
  dpkg --print-foreign-architectures | grep -qx "$a" || { "${AS_ROOT[@]}" dpkg --add-architecture "$a"; added+=("$a"); }
done
printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: trixie" "Components: main" \
  "Architectures: ${arches[*]}" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" | "${AS_ROOT[@]}" tee "$SRC" >/dev/null
printf '%s\n' "Package: *" "Pin: release n=trixie" "Pin-Priority: 1" | "${AS_ROOT[@]}" tee "$PIN" >/dev/null
"${AS_ROOT[@]}" apt-get update -qq
for t in "$@"; do
  a=$(debarch_of "$t")
  [ ! -d "$CROSS_TOOLS/usr/lib/rustlib/$(triple_of "$t")/lib" ] || continue
  (cd "$DL" && { apt-get download -qq "libstd-rust-web-dev:$a=$V" 2>/dev/null || apt-get download -qq "libstd-rust-web-dev:$a=$TRIXIE_V"; })
done
for d in "$DL"/*.deb; do [ -e "$d" ] && dpkg -x "$d" "$CROSS_TOOLS"; done
echo "install: $(LD_LIBRARY_PATH="$CROSS_TOOLS/usr/lib/x86_64-linux-gnu" "$CROSS_TOOLS/usr/bin/rustc" --version); targets: $(ls "$CROSS_TOOLS/usr/lib/rustlib" | tr '\n' ' ')"
