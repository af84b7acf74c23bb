#!/usr/bin/env python3
"""Assembles the tokenrace wheel for one platform from an already built libtokenrace.so.

    scripts/make-wheel.py --lib PATH --arch x86_64|aarch64|s390x [--glibc 2.28|auto] [--out DIR]

A wheel is a zip: ``tokenrace/*.py`` (the ctypes binding, copied from bindings/python),
``tokenrace/libtokenrace.so`` (the library as given: strip it first) and
``tokenrace-<version>.dist-info/`` with METADATA (from pyproject.toml), WHEEL (Root-Is-Purelib:
false, one tag ``py3-none-manylinux_<glibc>_<arch>``) and RECORD (sha256 of every file). The
package has no Python ABI (it loads the library with ctypes), so one wheel serves every CPython
that pyproject's requires-python allows, and neither setuptools-rust nor a Python ABI tag is
involved. Entries are sorted and dated SOURCE_DATE_EPOCH (default 1980-01-01), so the same inputs
give the same bytes.

Before writing, the library itself is checked (its ELF headers, read here, no tool needed): its
machine is ARCH's; it needs no shared library outside the manylinux policy's list (glibc's own:
libc, libm, libdl, libpthread, librt, the loader; and libgcc_s); and no GLIBC_ symbol version
newer than the tag's glibc. ``--glibc auto`` tags the wheel with the newest version the library
needs instead (for a library built by a plain cargo on a newer glibc: it then installs only where
that glibc is). Prints the wheel's path.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import struct
import sys
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PACKAGE = os.path.join(REPO, "bindings", "python", "tokenrace")

# e_machine of each architecture, and the loader its glibc names in DT_NEEDED.
ARCHES = {"x86_64": (62, "ld-linux-x86-64.so.2"), "aarch64": (183, "ld-linux-aarch64.so.1"),
          "s390x": (22, "ld64.so.1")}
# The manylinux policy's libraries that a C library built by rustc can need (auditwheel's
# policy lists a few more, for X11 and GLib, which this library never links).
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                  "libgcc_s.so.1", "libutil.so.1", "libresolv.so.2"}


class ElfInfo:
    def __init__(self, machine, needed, glibc_versions):
        self.machine, self.needed, self.glibc_versions = machine, needed, glibc_versions


def read_elf(path) -> ElfInfo:
    """Machine, DT_NEEDED and the GLIBC_x.y versions of .gnu.version_r, of a 64-bit ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"make-wheel: {path} is not a 64-bit ELF file")
    e = "<" if data[5] == 1 else ">"
    (machine,) = struct.unpack_from(e + "H", data, 18)
    shoff, = struct.unpack_from(e + "Q", data, 40)
    shentsize, shnum = struct.unpack_from(e + "HH", data, 58)
    sections = []
    for i in range(shnum):
        name, stype, _flags, _addr, off, size, link, info, _align, _entsize = struct.unpack_from(
            e + "IIQQQQIIQQ", data, shoff + i * shentsize)
        sections.append((stype, off, size, link, info))

    def cstr(strtab, at):
        base = sections[strtab][1] + at
        return data[base:data.index(b"\0", base)].decode()

    needed, versions = [], set()
    for stype, off, size, link, info in sections:
        if stype == 6:  # SHT_DYNAMIC
            for at in range(off, off + size, 16):
                tag, val = struct.unpack_from(e + "qQ", data, at)
                if tag == 0:
                    break
                if tag == 1:  # DT_NEEDED
                    needed.append(cstr(link, val))
        elif stype == 0x6FFFFFFE:  # SHT_GNU_verneed: info entries
            at = off
            for _ in range(info):
                _ver, cnt, _file, aux, nxt = struct.unpack_from(e + "HHIII", data, at)
                a = at + aux
                for _ in range(cnt):
                    _hash, _fl, _other, name, anext = struct.unpack_from(e + "IHHII", data, a)
                    versions.add(cstr(link, name))
                    a += anext
                at += nxt
    glibc = sorted({tuple(int(x) for x in m.group(1).split("."))
                    for v in versions if (m := re.fullmatch(r"GLIBC_([0-9.]+)", v))})
    return ElfInfo(machine, needed, glibc)


def check_library(path, arch, glibc):
    """The glibc floor the tag will say (a (major, minor) tuple), after checking the library."""
    info = read_elf(path)
    machine, loader = ARCHES[arch]
    if info.machine != machine:
        raise SystemExit(f"make-wheel: {path} is for ELF machine {info.machine}, not {arch} ({machine})")
    outside = [n for n in info.needed if n not in ALLOWED_NEEDED and n != loader]
    if outside:
        raise SystemExit(f"make-wheel: {path} needs {', '.join(outside)}, outside the manylinux policy")
    newest = info.glibc_versions[-1] if info.glibc_versions else (2, 17)
    newest = newest[:2]
    if glibc == "auto":
        return max(newest, (2, 17))
    floor = tuple(int(x) for x in glibc.split("."))
    if newest > floor:
        raise SystemExit(
            f"make-wheel: {path} needs GLIBC_{newest[0]}.{newest[1]}, newer than the tag's {glibc} "
            "(build it with cargo-zigbuild's --target <triple>.2.28, as scripts/build-wheels.sh does, "
            "or pass --glibc auto)")
    return floor


def metadata(project) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}",
             f"Summary: {project['description']}"]
    lic = project.get("license")
    if isinstance(lic, str):
        lines.append(f"License: {lic}")
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    lines.append("Description-Content-Type: text/markdown")
    with open(os.path.join(REPO, project["readme"]), encoding="utf-8") as f:
        readme = f.read()
    return "\n".join(lines) + "\n\n" + readme


def record_line(name, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="the built (and stripped) libtokenrace.so")
    ap.add_argument("--arch", required=True, choices=sorted(ARCHES))
    ap.add_argument("--glibc", default="2.28", help="the manylinux glibc floor, or auto (default 2.28)")
    ap.add_argument("--out", default=os.path.join(REPO, "dist"))
    args = ap.parse_args()

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(REPO, "Cargo.toml"), "rb") as f:
        crate_version = tomllib.load(f)["package"]["version"]
    if project["version"] != crate_version:
        raise SystemExit(f"make-wheel: pyproject's version {project['version']} is not Cargo.toml's {crate_version}")
    floor = check_library(args.lib, args.arch, args.glibc)
    name, version = project["name"], project["version"]
    tag = f"py3-none-manylinux_{floor[0]}_{floor[1]}_{args.arch}"
    dist_info = f"{name}-{version}.dist-info"

    files = []  # (archive name, bytes, executable)
    for entry in sorted(os.listdir(PACKAGE)):
        if entry.endswith(".py"):
            with open(os.path.join(PACKAGE, entry), "rb") as f:
                files.append((f"tokenrace/{entry}", f.read(), False))
    with open(args.lib, "rb") as f:
        # The plain name: _ffi.bundled_paths() looks for it first.
        files.append(("tokenrace/libtokenrace.so", f.read(), True))
    files.append((f"{dist_info}/METADATA", metadata(project).encode(), False))
    wheel = ("Wheel-Version: 1.0\nGenerator: tokenrace scripts/make-wheel.py\n"
             f"Root-Is-Purelib: false\nTag: {tag}\n")
    files.append((f"{dist_info}/WHEEL", wheel.encode(), False))
    files.append((f"{dist_info}/top_level.txt", b"tokenrace\n", False))
    record = [record_line(n, d) for n, d, _ in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), False))

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}-{version}-{tag}.whl")
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    import time
    date = time.gmtime(max(epoch, 315532800))[:6]
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d, exe in files:
            info = zipfile.ZipInfo(n, date)
            info.external_attr = (0o100755 if exe else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    os.replace(tmp, path)
    print(path)


if __name__ == "__main__":
    sys.exit(main())
