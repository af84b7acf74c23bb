#!/usr/bin/env python3
"""Instructions per value of one counted run, from insncount.so's output.

attribute.py COUNTS LIB NM BASE VALUES [TOP]
  COUNTS  insncount.so's file ("addr_hex insns" lines)
  LIB     the libtokenrace.so the run loaded, NM the nm that reads it
  BASE    its load address (count_driver prints it), hex
  VALUES  the logits (or noise values) of the run, to divide by
Prints "lib X.XX" (the library's instructions per value) and its TOP functions (default 6)."""
import bisect
import re
import subprocess
import sys


def main():
    counts, lib, nm, base, values = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4], 16), int(sys.argv[5])
    top = int(sys.argv[6]) if len(sys.argv) > 6 else 6
    syms = []
    out = subprocess.run([nm, "-C", "--defined-only", "-S", lib], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split(None, 3)
        if len(f) == 4 and f[2] in "tTwW":
            syms.append((int(f[0], 16), int(f[1], 16), re.sub(r"::h[0-9a-f]{16}$", "", f[3])))
    syms.sort()
    starts = [s[0] for s in syms]
    end = max(a + n for a, n, _ in syms)
    inlib, by = 0, {}
    for line in open(counts):
        addr, n = line.split()
        off, n = int(addr, 16) - base, int(n)
        if not 0 <= off < end:
            continue
        inlib += n
        i = bisect.bisect_right(starts, off) - 1
        name = syms[i][2] if i >= 0 and off < syms[i][0] + max(syms[i][1], 1) else "?"
        by[name] = by.get(name, 0) + n
    print(f"lib {inlib / values:.2f}")
    for name, n in sorted(by.items(), key=lambda kv: -kv[1])[:top]:
        short = re.sub(r"<[^<>]*>", "", re.sub(r"<[^<>]*>", "", name))
        print(f"  {n / values:7.3f} {100 * n / max(inlib, 1):5.1f}%  {short[:110]}")


main()
