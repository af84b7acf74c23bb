#!/usr/bin/env bash
# Makes a small root folder with Debian's own python3 and numpy for a foreign architecture, to be
# run under qemu-user (scripts/build-wheels.sh installs each foreign wheel there and draws):
#
#   scripts/foreign-python.sh ARCH ROOT      ARCH: aarch64 | s390x (Debian's arm64 | s390x)
#   qemu-ARCH -L ROOT ROOT/usr/bin/python3 -c 'import numpy'
#
# The packages (python3, python3-numpy, python3-pip and what they depend on, libc6 included) come
# from this host's own apt sources through apt-get with a private state directory under ROOT:
# nothing on the host changes (no dpkg architecture is added, no package installed). They are
# unpacked with `dpkg -x`, not installed: no maintainer script runs (none is needed to import).
# Needs apt-get and dpkg (Debian or Ubuntu) and the network; about 60 MB of downloads per
# architecture. A ROOT that already has ROOT/usr/bin/python3 is kept as it is.
set -euo pipefail
arch="${1:?usage: foreign-python.sh ARCH ROOT}" root="${2:?usage: foreign-python.sh ARCH ROOT}"
case "$arch" in
  aarch64) deb_arch=arm64 ;;
  s390x) deb_arch=s390x ;;
  *) echo "foreign-python: unknown architecture $arch (aarch64 or s390x)" >&2; exit 2 ;;
esac
if [ -x "$root/usr/bin/python3" ]; then exit 0; fi
for tool in apt-get dpkg; do
  command -v "$tool" >/dev/null 2>&1 || { echo "foreign-python: $tool is needed (Debian or Ubuntu)" >&2; exit 1; }
done
mkdir -p "$root"
root="$(cd "$root" && pwd)"
apt_dir="$root.apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/cache"
: >"$apt_dir/status"
apt_opts=(
  -o "APT::Architecture=$deb_arch" -o "APT::Architectures::=$deb_arch"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::State::Status=$apt_dir/status"
  -o "Dir::Cache=$apt_dir/cache" -o "Dir::Cache::Archives=$apt_dir/archives"
  -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root" -o "Acquire::Languages=none"
)
echo "foreign-python: fetching Debian's python3 and numpy for $deb_arch (apt-get, private state in $apt_dir)"
apt-get "${apt_opts[@]}" -qq update
# With an empty status file apt resolves the whole closure, libc6 included.
apt-get "${apt_opts[@]}" -qq -y --no-install-recommends install --download-only \
  python3 python3-numpy python3-pip >/dev/null
n=0
for deb in "$apt_dir/archives/"*.deb; do
  dpkg -x "$deb" "$root"
  n=$((n + 1))
done
# bookworm's /lib is a symlink to usr/lib in an installed system; packages unpacked by dpkg -x
# put the loader under lib/ or usr/lib/ depending on the package, so give both names.
for d in lib lib64; do
  if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
    mkdir -p "$root/usr/$d"
    cp -a "$root/$d/." "$root/usr/$d/"
    rm -rf "${root:?}/$d"
  fi
  [ -e "$root/$d" ] || ln -s "usr/$d" "$root/$d"
done
# The links update-alternatives would make (numpy loads libblas.so.3 and liblapack.so.3).
for lib in "$root"/usr/lib/*/blas/lib*.so.* "$root"/usr/lib/*/lapack/lib*.so.*; do
  [ -e "$lib" ] || continue
  link="$(dirname "$(dirname "$lib")")/$(basename "$lib")"
  [ -e "$link" ] || ln -s "$(basename "$(dirname "$lib")")/$(basename "$lib")" "$link"
done
[ -x "$root/usr/bin/python3" ] || { echo "foreign-python: no usr/bin/python3 after unpacking $n packages" >&2; exit 1; }
echo "foreign-python: $n packages unpacked into $root ($(du -sm "$root" | cut -f1) MB)"
