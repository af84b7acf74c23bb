#!/usr/bin/env python3
"""Keeps the README's examples equal to the files they show.

A fenced block right after a line ``<!-- example: PATH -->`` holds the whole of PATH. With no
argument this rewrites those blocks from the files; with ``--check`` it only reports the blocks
that differ (exit 1), which tests/python/test_readme.py does on every test run.
"""

import os
import re
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
README = os.path.join(REPO, "README.md")
BLOCK = re.compile(r"(<!-- example: (?P<path>\S+) -->\n```(?P<lang>\w*)\n)(?P<body>.*?)(```\n)", re.S)


def synced(text):
    """The README text with every example block replaced by its file, and the stale paths."""
    stale = []

    def replace(m):
        with open(os.path.join(REPO, m["path"])) as f:
            body = f.read()
        if not body.endswith("\n"):
            body += "\n"
        if body != m["body"]:
            stale.append(m["path"])
        return m.group(1) + body + m.group(5)

    return BLOCK.sub(replace, text), stale


def example_paths(text):
    return [m["path"] for m in BLOCK.finditer(text)]


def main():
    with open(README) as f:
        text = f.read()
    new, stale = synced(text)
    if "--check" in sys.argv[1:]:
        for p in stale:
            print(f"README.md: the block of {p} differs from the file (run scripts/sync-readme.py)")
        return 1 if stale else 0
    if stale:
        with open(README, "w") as f:
            f.write(new)
        print("README.md: updated " + ", ".join(stale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
