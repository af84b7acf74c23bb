#!/usr/bin/env python3
"""Runs the README's build and run lines exactly as written, so that none of them can rot.

Every line of a fenced block of README.md (comment markers ``#``, `` *`` and ``//`` stripped,
backslash continuations joined) that starts like a command a user types to build or run against
tokenrace (``cc``, ``g++``, ``cmake``, ``export PKG_CONFIG_PATH=``, ``./draw``,
``./dlopen_server``, ``./build/``) is run by bash, in order, in a scratch directory where
``examples``, ``include`` and ``target`` are the repository's, with the word ``PREFIX`` replaced
by an installed prefix. The first line that fails stops the run (exit 1), naming it.

Usage: scripts/readme-commands.py PREFIX [--list]
"""

import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STARTS = ("cc ", "g++ ", "c++ ", "cmake ", "export PKG_CONFIG_PATH=", "./draw", "./dlopen_server", "./build/")
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
COMMENT = re.compile(r"^\s*(?:#|//|/?\*)\s?")


def commands(readme):
    """The command lines of the README's fenced blocks, continuations joined, in order."""
    out = []
    for block in FENCE.findall(readme):
        pending = ""
        for raw in block.splitlines():
            line = COMMENT.sub("", raw, count=1).strip()
            if pending:
                line = pending + " " + line
                pending = ""
            if line.endswith("\\"):
                pending = line[:-1].rstrip()
                continue
            # A trailing comment after two spaces explains the line; it is not part of it.
            line = re.split(r"\s{2,}#\s", line)[0].rstrip()
            if line.startswith(STARTS):
                out.append(line)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prefix = os.path.abspath(sys.argv[1])
    with open(os.path.join(REPO, "README.md")) as f:
        lines = commands(f.read())
    if "--list" in sys.argv:
        print("\n".join(lines))
        return
    with tempfile.TemporaryDirectory(prefix="tokenrace-readme.") as work:
        for name in ("examples", "include", "target"):
            os.symlink(os.path.join(REPO, name), os.path.join(work, name))
        # One shell for all of them: an `export` reaches the lines after it.
        script = ""
        for line in lines:
            # The word PREFIX alone (not CMAKE_PREFIX_PATH's).
            shown = re.sub(r"(?<![A-Za-z_])PREFIX(?![A-Za-z_])", prefix, line)
            # A line fails when any command of it does (`a && b` included).
            script += f"echo '+ {shown}' >&2\n{{ {shown} ; }} >/dev/null || exit 1\n"
        run = subprocess.run(["bash", "-c", script], cwd=work, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"readme-commands: a README line failed as written:\n{run.stderr}")
    print(f"readme-commands: {len(lines)} README lines ran as written")


if __name__ == "__main__":
    main()
